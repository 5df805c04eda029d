"""One trainer per run, --resume with another config, a torn metrics line, temporaries left by
a kill, and a finished run re-run (`make demo` twice). Real commands in temporary folders."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from .conftest import invoke, one_line_error
from .test_nothing_lost import ROOT, child_env, tree


@pytest.fixture(scope="module")
def finished_run(train_args, tmp_path_factory):
    """4 steps of the test preset, checkpoints at 2 and 4, final validation done."""
    out = tmp_path_factory.mktemp("runs") / "run"
    invoke(*train_args, "--out", out, "--max-steps", "4")
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    return out


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_trainer_is_refused_while_one_holds_the_run(run_copy, train_args):
    from mdlm_cli.train.run_lock import RunLock

    before = tree(run_copy)
    with RunLock(run_copy):
        message = one_line_error(*train_args, "--out", run_copy, "--max-steps", "6", "--resume")
        assert f"process {os.getpid()} on {socket.gethostname()}" in message and "is being trained" in message
    assert tree(run_copy) == before  # the refused trainer wrote nothing
    assert "Resumed from" in invoke(*train_args, "--out", run_copy, "--max-steps", "6", "--resume")
    assert not (run_copy / "lock").exists()


def test_a_stale_lock_is_taken_over_and_another_hosts_lock_is_not(run_copy, train_args, monkeypatch):
    (run_copy / "lock").write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    text = " ".join(invoke(*train_args, "--out", run_copy, "--max-steps", "6", "--resume").split())
    assert "took over a stale lock" in text and "at step 4" in text
    monkeypatch.setattr("mdlm_cli.train.run_lock.fcntl", None)  # a file system without flock: the record decides
    (run_copy / "lock").write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "then"}))
    assert "process 1 on elsewhere" in one_line_error(*train_args, "--out", run_copy, "--max-steps", "8", "--resume")
    (run_copy / "lock").write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    assert "at step 6" in invoke(*train_args, "--out", run_copy, "--max-steps", "8", "--resume")


@pytest.mark.slow
def test_two_real_trainers_then_a_kill_9(train_args, tmp_path):
    """A trainer in another process holds the run; killed with SIGKILL, it leaves a stale lock
    (taken over) and possibly temporaries (removed) and the run continues."""
    out = tmp_path / "run"
    args = [*train_args, "--out", str(out), "--max-steps", "100000", "--set", "train.save_every=1"]
    proc = subprocess.Popen([sys.executable, "-m", "mdlm_cli", *args], env=child_env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (out / "latest").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        message = one_line_error(*train_args, "--out", out, "--max-steps", "100000", "--resume")
        assert f"process {proc.pid}" in message
    finally:
        proc.kill()
        proc.wait()
    (out / "checkpoints" / f".step-99999999.tmp-{proc.pid}").mkdir(exist_ok=True)  # as if killed mid-save
    step = json.loads((out / "checkpoints" / (out / "latest").read_text().strip() / "state.json").read_text())["step"]
    text = " ".join(invoke(*train_args, "--out", out, "--max-steps", str(step + 1), "--resume").split())
    assert "took over a stale lock" in text and f"at step {step}" in text
    assert not list((out / "checkpoints").glob(".*"))


def test_resume_with_another_config_is_refused_unless_overridden(run_copy, train_args):
    before = tree(run_copy)
    message = one_line_error(*train_args, "--out", run_copy, "--max-steps", "6", "--resume",
                             "--set", "optim.lr=0.01", "--set", "data.length=16")
    assert "data.length: 32 -> 16" in message and "optim.lr: 0.003 -> 0.01" in message
    assert "--override-resume-config" in message and tree(run_copy) == before
    # what may change between sessions does not count
    invoke(*train_args, "--out", run_copy, "--max-steps", "6", "--resume", "--set", "train.eval_every=50",
           "--set", "train.keep_last=3", "--threads", "1")
    invoke(*train_args, "--out", run_copy, "--max-steps", "8", "--resume", "--set", "optim.lr=0.01",
           "--override-resume-config")
    records = [json.loads(line) for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert {"step": 6, "config_change": {"optim.lr": [0.003, 0.01]}} in records
    assert records[-1]["step"] == 8


def test_a_torn_last_metrics_line_does_not_block_resume(run_copy, train_args):
    torn = '{"step": 5, "loss": 2.7, "ppl_bo'
    with open(run_copy / "metrics.jsonl", "a") as log:
        log.write(torn)  # killed mid-write
    text = " ".join(invoke(*train_args, "--out", run_copy, "--max-steps", "6", "--resume").split())
    assert "dropped a torn last line" in text
    lines = (run_copy / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines) and not any(torn in line for line in lines)


def test_stale_temporaries_are_removed_at_the_next_resume(run_copy, train_args):
    pid = dead_pid()
    junk = [run_copy / "checkpoints" / f".step-00000006.tmp-{pid}", run_copy / f".latest.tmp-{pid}"]
    junk[0].mkdir()
    (junk[0] / "model.safetensors").write_bytes(b"partial")
    junk[1].write_text("step-0000")
    alive = run_copy / "checkpoints" / f".step-00000008.tmp-{os.getpid()}"  # a live writer's: kept
    alive.mkdir()
    invoke(*train_args, "--out", run_copy, "--max-steps", "6", "--resume")
    assert not any(p.exists() for p in junk) and alive.is_dir()


def test_a_finished_run_is_left_unchanged(run_copy, train_args):
    """What `make demo` does the second time: nothing is validated, written or appended."""
    before = tree(run_copy)
    mtimes = {p: p.stat().st_mtime_ns for p in run_copy.rglob("*") if p.is_file()}
    text = " ".join(invoke(*train_args, "--out", run_copy, "--max-steps", "4", "--resume").split())
    assert "Already trained" in text and "nothing was run or written" in text and "validation" not in text
    assert tree(run_copy) == before and {p: p.stat().st_mtime_ns for p in run_copy.rglob("*") if p.is_file()} == mtimes
    assert "NFE" in invoke("sample", "-c", run_copy, "-n", "1", "--quiet")  # make demo's next line


def test_char_models_report_nats_and_bits_per_char(train_args, tmp_path):
    text = " ".join(invoke(*train_args, "--out", tmp_path / "r", "--max-steps", "2").split())
    assert "Validation bound:" in text and "nats/char" in text and "bits/char" in text
    assert "nats/token" not in text
