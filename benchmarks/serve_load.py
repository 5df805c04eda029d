"""Load test of `mdlm serve` (BENCHMARKS.md, "mdlm serve under load"): a bounded asyncio client
loop against a real server process on 127.0.0.1.

For each --max-batch (1 = batching off), a server is started; for each concurrency, a fixed
number of requests is sent (at most that many in flight, the whole loop under a time limit):
latency p50/p90/p99, samples/s, network calls per sample (from /metrics), and the server's
resident memory before and after. `--chaos` then runs rounds where 10% of the requests are
malformed and 10% are streams whose client hangs up after the first block: every well-formed
request must succeed, and the memory is read after each round.

    python benchmarks/serve_load.py --checkpoint runs/demo --requests 32 --concurrency 1,4,16 \
        --max-batch 1,16 --sampler ancestral --steps 16 --chaos --json serve-load.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MALFORMED = [b"{not json", b'{"prompt": "x", "temperature": -1}', b'{"prompt": "x", "n": 0}',
             b'{"prompt": "x", "max_tokens": 100000}', b"[]"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def network_calls(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("mdlm_network_calls_total "):
            return float(line.split()[1])
    return float("nan")


async def post(port: int, body: bytes, *, hang_up: bool = False, timeout: float = 300) -> int:
    """The HTTP status of one POST /v1/completions; `hang_up`: close after the first event."""
    async def go() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nConnection: close\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            status = int((await reader.readline()).split()[1])
            if hang_up:
                for _ in range(1000):  # bounded: headers, then the first event
                    line = await reader.readline()
                    if not line or line.startswith(b"data:"):
                        break
            else:
                await reader.read()
            return status
        finally:
            writer.close()

    return await asyncio.wait_for(go(), timeout)


async def load(port: int, bodies: list[tuple[bytes, bool]], concurrency: int,
               limit_s: float) -> tuple[list[float], list[int], float, int]:
    """(latencies of the answered requests, each request's status in order (0: not sent before
    the time limit, -1: no answer), wall seconds, requests not sent)."""
    gate, deadline = asyncio.Semaphore(concurrency), time.monotonic() + limit_s

    async def one(body: bytes, hang_up: bool) -> tuple[int, float | None]:
        async with gate:
            if time.monotonic() > deadline:
                return 0, None
            t0 = time.perf_counter()
            try:
                status = await post(port, body, hang_up=hang_up,
                                    timeout=max(deadline - time.monotonic(), 1))
            except (OSError, asyncio.TimeoutError):
                return -1, None
            return status, time.perf_counter() - t0 if status == 200 and not hang_up else None

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(b, h) for b, h in bodies))
    statuses = [s for s, _ in results]
    latencies = [t for _, t in results if t is not None]
    return latencies, statuses, time.perf_counter() - t0, statuses.count(0)


def start(args, max_batch: int, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "mdlm_cli", "serve", "-c", args.checkpoint, "--port", str(port),
           "--max-batch", str(max_batch), "--threads", str(args.threads),
           "--max-wait-ms", str(args.max_wait_ms), "--batch-padding", args.batch_padding,
           "--queue-size", "256", "--timeout", str(args.time_limit)]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    for _ in range(600):  # bounded: 5 minutes
        time.sleep(0.5)
        if proc.poll() is not None:
            break
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return proc
        except OSError:
            pass
    proc.kill()
    raise SystemExit(f"server did not start:\n{log.read_text()[-2000:]}")


def request_body(args, seed: int, stream: bool = False) -> bytes:
    body = {"prompt": "the ", "seed": seed, "sampler": args.sampler, "max_tokens": args.max_tokens}
    if args.steps:
        body["steps"] = args.steps
    if stream:  # a long semi-AR stream, so that the client hangs up in the middle of it
        body.update(stream=True, stride=args.stride, max_tokens=4 * args.max_tokens)
    return json.dumps(body).encode()


def percentile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def measure(args, port: int, pid: int, concurrency: int, max_batch: int) -> dict:
    bodies = [(request_body(args, seed), False) for seed in range(args.requests)]
    calls0, rss0 = network_calls(port), rss_mib(pid)
    latencies, statuses, wall, skipped = asyncio.run(load(port, bodies, concurrency,
                                                          args.time_limit))
    calls = network_calls(port) - calls0
    ok = sum(s == 200 for s in statuses)
    return {"max_batch": max_batch, "concurrency": concurrency, "requests": len(bodies), "ok": ok,
            "skipped": skipped, "p50": percentile(latencies, 50), "p90": percentile(latencies, 90),
            "p99": percentile(latencies, 99), "samples_per_s": ok / wall,
            "calls_per_sample": calls / max(ok, 1), "rss_before_mib": rss0,
            "rss_after_mib": rss_mib(pid)}


def chaos(args, port: int, pid: int) -> list[dict]:
    """Rounds of well-formed requests mixed with 10% malformed ones and 10% hang-ups."""
    rounds = []
    for r in range(args.chaos_rounds):
        bodies = []
        for i in range(args.requests):
            kind = i % 10
            if kind == 3:
                bodies.append((MALFORMED[(i // 10) % len(MALFORMED)], False))
            elif kind == 7:
                bodies.append((request_body(args, 1000 + i, stream=True), True))
            else:
                bodies.append((request_body(args, i), False))
        rss0 = rss_mib(pid)
        latencies, statuses, wall, skipped = asyncio.run(load(port, bodies, 16, args.time_limit))
        well_formed = [s for (b, _), s in zip(bodies, statuses, strict=True) if b not in MALFORMED]
        rounds.append({"round": r, "requests": len(bodies), "skipped": skipped,
                       "well_formed_failed": sum(s != 200 for s in well_formed),
                       "malformed_status": sorted({s for (b, _), s in zip(bodies, statuses,
                                                                           strict=True)
                                                   if b in MALFORMED}),
                       "rss_before_mib": rss0, "rss_after_mib": rss_mib(pid),
                       "p50": percentile(latencies, 50), "wall_s": wall})
        print(json.dumps(rounds[-1]), flush=True)
    return rounds


def table(rows: list[dict]) -> str:
    lines = ["| --max-batch | concurrency | requests ok | p50 s | p90 s | p99 s | samples/s | "
             "network calls / sample | server RSS before → after (MiB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['max_batch']} | {r['concurrency']} | {r['ok']}/{r['requests']} | "
                     f"{r['p50']:.2f} | {r['p90']:.2f} | {r['p99']:.2f} | "
                     f"{r['samples_per_s']:.2f} | "
                     f"{r['calls_per_sample']:.2f} | {r['rss_before_mib']:.0f} → "
                     f"{r['rss_after_mib']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="runs/demo")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--max-batch", default="1,16")
    ap.add_argument("--sampler", default="ancestral")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stride", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-wait-ms", type=float, default=20.0)
    ap.add_argument("--batch-padding", default="auto", choices=["auto", "always", "never"])
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds per loop")
    ap.add_argument("--chaos", action="store_true")
    ap.add_argument("--chaos-rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows, chaos_rounds = [], []
    batches = [int(x) for x in args.max_batch.split(",")]
    for max_batch in batches:
        port, log = free_port(), Path(f"/tmp/mdlm-serve-load-{os.getpid()}-{max_batch}.log")
        proc = start(args, max_batch, port, log)
        try:
            asyncio.run(load(port, [(request_body(args, 0), False)] * 2, 2, args.time_limit))
            for concurrency in (int(x) for x in args.concurrency.split(",")):
                rows.append(measure(args, port, proc.pid, concurrency, max_batch))
                print(json.dumps(rows[-1]), flush=True)
            if args.chaos and max_batch == max(batches):
                chaos_rounds = chaos(args, port, proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows,
                                               "chaos": chaos_rounds}, indent=1))


if __name__ == "__main__":
    main()
