"""The GPU check's driver: every part in its own process with its own time limit, one line
printed per part, JSON per part and a Markdown summary in one folder.

    python benchmarks/gpu_check.py --out DIR [--budget-s 540] [--only parity,sampling] [--dry-run]

`benchmarks/gpu_check.sh` installs what is missing first and then calls this; see
benchmarks/README.md. The parts: 1 pytest tests/gpu, 2 logits parity, 3 training
throughput, 4 sampling, 5 torchrun DDP / FSDP2, 6 the summary (DIR/summary.md and
DIR/summary.json). A part that fails, times out or lacks a package is recorded as such and
the next one runs; the budget shrinks the limits of the last parts so the whole run ends in
time. `--dry-run` runs every part on the CPU with the test preset's model and tiny sizes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESERVE_S = 15  # kept back from the budget for the summary
MIN_LIMIT_S = 20  # a part with less time left than this is skipped


@dataclass(frozen=True)
class Part:
    name: str
    title: str
    limit_s: int  # its own limit on a GPU (the dry run takes a fraction)
    needs: tuple[str, ...] = ()  # modules it imports beyond torch
    argv: tuple[str, ...] = field(default=())  # after the Python interpreter; {out} is replaced


PARTS = [
    Part("env", "0. machine", 60, (), ("benchmarks/gpu_parts.py", "env", "--out", "{out}")),
    Part(
        "pytest",
        "1. pytest tests/gpu",
        150,
        ("pytest", "yaml"),
        (
            "-m",
            "pytest",
            "tests/gpu",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "--junitxml={out}/pytest.xml",
        ),
    ),
    Part(
        "parity",
        "2. logits parity",
        90,
        ("yaml",),
        ("benchmarks/gpu_parts.py", "parity", "--out", "{out}"),
    ),
    Part(
        "throughput",
        "3. training throughput",
        200,
        ("yaml",),
        ("benchmarks/gpu_parts.py", "throughput", "--out", "{out}"),
    ),
    Part(
        "sampling",
        "4. sampling",
        150,
        ("yaml",),
        ("benchmarks/gpu_parts.py", "sampling", "--out", "{out}"),
    ),
    Part(
        "ddp",
        "5. torchrun DDP / FSDP2",
        120,
        ("yaml", "rich", "safetensors"),
        (
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "1",
            "benchmarks/gpu_ddp.py",
            "--out",
            "{out}",
        ),
    ),
]


def command(part: Part, out: Path, dry: bool) -> list[str]:
    argv = [a.replace("{out}", str(out)) for a in part.argv]
    if dry and part.name != "pytest":
        argv.append("--dry-run")
    return [sys.executable, *argv]


def child_env(dry: bool) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    if dry:
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's children on a shared CPU
    return env


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the part's process group (torchrun and its workers), SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def pytest_result(out: Path) -> dict:
    """Counts and one entry per test from pytest's JUnit XML."""
    try:
        root = ET.parse(out / "pytest.xml").getroot()
    except (OSError, ET.ParseError):
        return {"part": "pytest"}
    cases, counts = [], {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = (node.get("message") or node.text or "").strip().splitlines()[0:1]
                message = message[0] if message else ""
                break
        counts[outcome] += 1
        cases.append(
            {
                "name": f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}",
                "outcome": outcome,
                "seconds": float(case.get("time", 0)),
                "message": message,
            }
        )
    return {
        "part": "pytest",
        "counts": counts,
        "cases": cases,
        "headline": ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no tests",
    }


def finish(part: Part, out: Path, data: dict) -> dict:
    data = {"part": part.name, "title": part.title, **data}
    (out / f"{part.name}.json").write_text(json.dumps(data, indent=2, default=str))
    seconds = f" in {data['seconds']:.0f} s" if data.get("seconds") is not None else ""
    print(
        f"{part.title}: {data['status']}{seconds}: "
        f"{data.get('headline') or data.get('reason', '')}",
        flush=True,
    )
    return data


def run_part(part: Part, out: Path, dry: bool, deadline: float) -> dict:
    left = int(deadline - time.monotonic() - RESERVE_S)
    if left < MIN_LIMIT_S:
        return finish(part, out, {"status": "skipped", "reason": "out of the time budget"})
    limit = min(part.limit_s, left)
    missing = [m for m in part.needs if importlib.util.find_spec(m) is None]
    if missing:
        return finish(
            part,
            out,
            {
                "status": "skipped",
                "reason": f"needs {', '.join(missing)}, not installed (see install.log)",
            },
        )
    log = out / f"{part.name}.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(
            command(part, out, dry),
            cwd=ROOT,
            env=child_env(dry),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc, timed_out = proc.wait(timeout=limit), False
        except subprocess.TimeoutExpired:
            stop(proc)
            rc, timed_out = proc.returncode, True
    if part.name == "pytest":
        data = pytest_result(out)
    else:
        try:
            data = json.loads((out / f"{part.name}.json").read_text())
        except (OSError, json.JSONDecodeError):
            data = {}
    status = (
        "timeout" if timed_out else ("failed" if rc not in (0, None) else data.get("status", "ok"))
    )
    if status == "running":  # exited 0 without finishing its JSON
        status = "failed"
    data.update(status=status, seconds=time.monotonic() - t0, limit_s=limit, rc=rc, log=log.name)
    if status != "ok":
        data["log_tail"] = tail(log)
        data.setdefault(
            "headline", f"see {log.name}" + (f" (limit {limit} s)" if timed_out else "")
        )
    return finish(part, out, data)


def summarise(out: Path, results: list[dict]) -> None:
    """Part 6: summary.json (every part) and summary.md (tables for BENCHMARKS.md)."""
    from gpu_report import render

    env = next((r for r in results if r["part"] == "env"), {})
    try:
        install = json.loads((out / "install.json").read_text())
    except (OSError, json.JSONDecodeError):
        install = {}
    parts = [r for r in results if r["part"] != "env"]
    (out / "summary.json").write_text(
        json.dumps({"env": env, "install": install, "parts": parts}, indent=2, default=str)
    )
    (out / "summary.md").write_text(render(env, install, parts))
    ok = sum(r["status"] == "ok" for r in parts)
    print(f"6. summary: {ok} of {len(parts)} parts ok; {out / 'summary.md'}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check"))
    parser.add_argument(
        "--budget-s", type=float, default=540.0, help="Wall-clock budget of all parts."
    )
    parser.add_argument("--only", default="", help="Comma-separated part names (default: all).")
    parser.add_argument("--dry-run", action="store_true", help="Every part on the CPU, tiny sizes.")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = chosen - {p.name for p in PARTS}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {[p.name for p in PARTS]}")
    deadline = time.monotonic() + args.budget_s
    results = [
        run_part(p, args.out, args.dry_run, deadline)
        for p in PARTS
        if not chosen or p.name in chosen or p.name == "env"
    ]
    summarise(args.out, results)
    return 0 if all(r["status"] in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
