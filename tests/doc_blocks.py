"""The ```python blocks of the docs as code to run (tests/unit/test_docs.py), and what they need
built for them: tiny trained runs under the names the pages give them, and a real `mdlm serve`.

A page's blocks run in order in one namespace, as a reader pastes them into one session (the
serving page's later blocks use the `client` of its first). A block is left out only where the
page says so, in a line of its own that is the last non-blank line before it:

    <!-- doc-test: skip (why this block cannot run offline) -->

Any other `doc-test:` marker, or one that is not right before a ```python block, is an error."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from mdlm_cli.cli import app

from .char_tokenizers import JSON_CHARS, chars_tokenizer, stop_server

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"<!--\s*doc-test:(.*?)-->")
SKIP = re.compile(r"\s*skip \((.+)\)\s*")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the page's line of the block's first line of code (1-based)
    code: str
    skip: str | None  # the reason its marker gives, or None: the block runs


def python_blocks(page: Path) -> list[Block]:
    """The page's ```python blocks in order, each with its skip marker's reason (if any)."""
    text = page.read_text()
    lines = text.splitlines()
    markers = {i for i, line in enumerate(lines) if MARKER.fullmatch(line.strip())}
    blocks = []
    for m in FENCE.finditer(text):
        if m.group(1) != "python":
            continue
        fence = text.count("\n", 0, m.start())  # the fence's line (0-based)
        above = next((i for i in range(fence - 1, -1, -1) if lines[i].strip()), None)
        reason = None
        if above in markers:
            skip = SKIP.fullmatch(MARKER.fullmatch(lines[above].strip()).group(1))
            if not skip:
                raise ValueError(f"{page.name}:{above + 1}: unknown marker {lines[above]!r}; "
                                 "the one marker is <!-- doc-test: skip (reason) -->")
            reason = skip.group(1)
            markers.discard(above)
        blocks.append(Block(page, fence + 2, m.group(2), reason))
    if markers:
        raise ValueError(f"{page.name}:{min(markers) + 1}: a doc-test marker not right before "
                         "a ```python block")
    return blocks


def run_blocks(blocks: list[Block], namespace: dict, replace: dict[str, str]) -> str:
    """Run the blocks that are not skipped, in order, in `namespace`; what they print. Each
    `replace` pair (the page's address of a server, say) must occur in some block. A traceback
    names the page and its line."""
    out = io.StringIO()
    for old in replace:
        assert any(old in b.code for b in blocks), f"no block names {old!r}"
    for b in blocks:
        if b.skip is not None:
            continue
        code = b.code
        for old, new in replace.items():
            code = code.replace(old, new)
        with contextlib.redirect_stdout(out):
            exec(compile("\n" * (b.line - 1) + code, str(b.page), "exec"), namespace)
    return out.getvalue()


def train(*args: str | Path) -> str:
    """`mdlm train ARGS` in this process, in the working directory; its output."""
    result = CliRunner().invoke(app, ["train", *map(str, args)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


# `make demo`'s runs/demo at a test size: the demo preset's data (text8-style characters of the
# embedded corpus, rows of 256) and objective, a 1x64 DiT, 2 steps on the CPU
DEMO_AT_TEST_SIZE = [
    "--preset", "demo", "--out", "runs/demo", "--max-steps", "2", "--device", "cpu",
    "--no-print-config", "--set", "train.time_budget=0", "--set", "train.compile=false",
    "--set", "model.hidden_size=64", "--set", "model.n_blocks=1", "--set", "model.n_heads=2",
    "--set", "model.cond_dim=32", "--set", "train.global_batch_size=8",
    "--set", "train.micro_batch_size=8", "--set", "train.eval_rows=16",
    "--set", "data.max_eval_rows=16",
]

# a character tokeniser that can write JSON, with a chat template: what the serving page's chat
# and json_schema blocks need (the demo's text8 characters have neither braces nor a template)
CHAT_CHARS = JSON_CHARS


def chat_chars_run(root: Path) -> Path:
    """A test-size MDLM run (L = 128, 2 steps) over CHAT_CHARS, trained on a lower-cased slice of
    the embedded corpus; its tokeniser is a transformers folder with a chat template."""
    from mdlm_cli.data.sources import get_source

    hf = chars_tokenizer(CHAT_CHARS)
    hf.save_pretrained(root / "chat-chars")
    text = " ".join(get_source("bigtxt").all_documents()[:3]).lower()
    text = re.sub(r"[^a-z0-9 .,:\-\"]+", " ", text)
    corpus = root / "chat-chars.txt"
    corpus.write_text("\n\n".join(text[i * 600:(i + 1) * 600] for i in range(60)))
    train("--preset", "test", "--out", root / "runs" / "chat-chars", "--max-steps", "2",
          "--no-print-config", "--set", f"data.tokenizer={root / 'chat-chars'}",
          "--set", f"data.dataset={corpus}", "--set", "data.length=128")
    return root / "runs" / "chat-chars"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@contextlib.contextmanager
def serving(checkpoint: Path, log: Path, limit_s: float = 120) -> Iterator[str]:
    """`mdlm serve -c CHECKPOINT` as a process on 127.0.0.1 at a free port, one thread; its URL
    once /health says ok. Stopped on the way out (SIGTERM, then SIGKILL after 30 s)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mdlm_cli", "serve", "-c", str(checkpoint), "--host", "127.0.0.1",
         "--port", str(port), "--threads", "1"],
        env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + limit_s
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                status, body = get(f"{url}/health")
                if status == 200 and json.loads(body)["status"] == "ok":
                    break
            time.sleep(0.25)
        else:
            raise AssertionError(f"the server did not come up:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        stop_server(proc)


def answered(metrics: str) -> dict[str, int]:
    """Requests answered 200 by endpoint, from the server's Prometheus text."""
    found = re.findall(r'^mdlm_requests_total\{endpoint="([^"]+)",status="200"\} (\S+)$',
                       metrics, re.M)
    return {endpoint: int(float(n)) for endpoint, n in found}
