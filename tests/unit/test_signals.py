"""Issue 33: the first SIGTERM stops gracefully, the second at once, leaving the last checkpoint
as it was. Subprocesses in a deliberately slow step (a patched `gradient_step` / `generate`)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SLOW = """
import pathlib, sys, time
marker, target, argv = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
module_name, name = target.rsplit(".", 1)
import importlib
module = importlib.import_module(module_name)
real = getattr(module, name)

def slow(*args, **kwargs):
    if name != "gradient_step" or args[1] >= 1:  # train: after the checkpoint of step 1
        marker.write_text("slow")
        for _ in range(600):  # a slow step: 60 s of work that a graceful stop waits for
            time.sleep(0.1)
    return real(*args, **kwargs)

setattr(module, name, slow)
from mdlm_cli.cli import app
sys.argv = ["mdlm", *argv]
app()
"""


def start(tmp_path: Path, target: str, argv: list[str]) -> tuple[subprocess.Popen, Path, Path]:
    marker, log = tmp_path / "marker", tmp_path / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW, str(marker), target, *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )
    deadline = time.monotonic() + 240  # the set-up before the slow step: seconds on an idle machine
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"never reached the slow step: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc, marker, log


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_train_second_sigterm_stops_at_once_and_leaves_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc, _, log = start(
        tmp_path,
        "mdlm_cli.train.loop.gradient_step",
        [
            "train",
            "--preset",
            "test",
            "--out",
            str(out),
            "--max-steps",
            "5",
            "--no-print-config",
            "--set",
            "train.save_every=1",
            "--set",
            "train.log_every=1",
        ],
    )
    before = snapshot(out / "checkpoints")
    assert any(name.startswith("step-00000001") for name in before), before
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(
        signal.SIGTERM
    )  # a duplicate, as GNU timeout sends (the child, then its group)
    time.sleep(1.5)
    assert proc.poll() is None, "the first SIGTERM waits for the step"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("a second SIGTERM did not stop the run")
    assert time.monotonic() - t0 < 5
    assert code == 128 + signal.SIGTERM
    assert snapshot(out / "checkpoints") == before
    text = log.read_text()
    assert "SIGTERM: stopping after this step with a checkpoint; send it again" in text
    assert (
        "second signal (SIGTERM): stopped at once; the last saved checkpoint stays as it was"
        in text
    )


def test_sample_first_sigterm_stops_as_ctrl_c_does(tmp_path):
    run = tmp_path / "run"
    trained = subprocess.run(
        [
            sys.executable,
            "-m",
            "mdlm_cli",
            "train",
            "--preset",
            "test",
            "--out",
            str(run),
            "--max-steps",
            "1",
            "--no-print-config",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    proc, _, log = start(
        tmp_path,
        "mdlm_cli.sample.generate.generate",
        ["sample", "-c", str(run), "-n", "1", "--quiet"],
    )
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("SIGTERM did not stop sample")
    text = log.read_text()
    assert code == 130 and "SIGTERM: stopping; send it again" in text and "interrupted" in text, (
        text[-2000:]
    )
    assert "Traceback" not in text


def _sleep_in_child(ready) -> None:
    ready.set()
    time.sleep(60)


def test_a_forked_child_is_stopped_by_sigterm_and_the_parent_hears_nothing():
    """lm-eval's bootstrap pool forks workers and ends them with SIGTERM: each must die at once
    (not raise KeyboardInterrupt) and its signal must not reach the parent's watcher, which
    would take two such workers for a first and a second signal of its own."""
    import multiprocessing

    from mdlm_cli.signals import StopSignals

    fork = multiprocessing.get_context("fork")
    with StopSignals(first="stopping") as stop:
        assert signal.getsignal(signal.SIGTERM) == stop._interrupt
        for _ in range(2):
            ready = fork.Event()
            child = fork.Process(target=_sleep_in_child, args=(ready,))
            child.start()
            assert ready.wait(30)
            child.terminate()  # SIGTERM, as Pool.terminate sends it
            child.join(30)
            assert child.exitcode == -signal.SIGTERM
        time.sleep(0.3)  # the watcher thread would have read the children's bytes by now
        assert stop.count == 0 and stop.received is None
