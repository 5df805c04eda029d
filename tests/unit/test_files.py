"""files.py, run_lock.py and run_folder.py: swaps that survive a kill, clean-up of what dead
processes left, the run lock, the metrics log, and the config keys --resume compares."""

import errno
import json
import os
import socket
import subprocess
import sys

import pytest
from safetensors import SafetensorError

from mdlm_cli.build import resolve_config
from mdlm_cli.config import resume_differences
from mdlm_cli.data.sources import read_text_file
from mdlm_cli.errors import MdlmError
from mdlm_cli.io.files import remove_stale_temporaries, swap_folder, write_failure
from mdlm_cli.io.safe_load import python3_name
from mdlm_cli.train.run_folder import read_metrics, truncate_metrics
from mdlm_cli.train.run_lock import RunLock


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def folder(path, text):
    path.mkdir()
    (path / "f").write_text(text)
    return path


def test_swap_folder_keeps_a_whole_copy_at_every_instant(tmp_path, monkeypatch):
    final = folder(tmp_path / "step-1", "old")
    swap_folder(folder(tmp_path / "new", "new"), final)
    assert (final / "f").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]

    real, calls = os.replace, []

    def killed_after_first(src, dst):  # the process dies between the two renames
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(os, "replace", killed_after_first)
    with pytest.raises(KeyboardInterrupt):
        swap_folder(folder(tmp_path / "newer", "newer"), final)
    monkeypatch.undo()
    aside = tmp_path / f".step-1.old-{os.getpid()}"
    assert not final.exists() and (aside / "f").read_text() == "new"
    pid = dead_pid()
    os.rename(aside, tmp_path / f".step-1.old-{pid}")  # as a later process finds it
    assert remove_stale_temporaries(tmp_path) == ["restored step-1 from an interrupted replacement"]
    assert (final / "f").read_text() == "new"


def test_only_dead_processes_temporaries_are_removed(tmp_path):
    dead, alive = dead_pid(), os.getppid()
    folder(tmp_path / f".step-2.tmp-{dead}", "partial")
    folder(tmp_path / f".step-3.tmp-{alive}", "being written")
    folder(tmp_path / "step-4", "kept")
    folder(tmp_path / f".step-4.old-{dead}", "superseded")  # the swap finished: the copy goes
    (tmp_path / f".latest.tmp-{dead}").write_text("x")
    (tmp_path / "notes.tmp-1").write_text("not ours")
    done = remove_stale_temporaries(tmp_path)
    assert len(done) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f".step-3.tmp-{alive}", "step-4", "notes.tmp-1"])


def test_write_failures_are_one_line_and_say_nothing_was_lost(tmp_path):
    for error in (OSError(errno.ENOSPC, "No space left on device", "x"),
                  SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
                  RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing "
                               "file data/0: file write failed")):
        message = str(write_failure(error, tmp_path, "the checkpoint of step 2"))
        assert message.startswith(f"no space left on the device holding {tmp_path}") and "nothing was lost" in message
    message = str(write_failure(OSError(errno.EROFS, "Read-only file system", "y"), tmp_path, "it"))
    assert "read-only file system" in message and "\n" not in message


def test_run_lock_is_exclusive_records_its_holder_and_goes(tmp_path):
    run = tmp_path / "run"
    with RunLock(run):
        record = json.loads((run / "lock").read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        with pytest.raises(MdlmError, match=f"being trained by process {os.getpid()}"):
            RunLock(run).acquire()
    assert not run.exists()  # created for the lock, left empty: removed
    run.mkdir()
    (run / "lock").write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    with pytest.warns(UserWarning, match="took over a stale lock"), RunLock(run):
        assert json.loads((run / "lock").read_text())["pid"] == os.getpid()
    assert run.is_dir() and not (run / "lock").exists()


def test_run_lock_without_flock_trusts_the_recorded_pid(tmp_path, monkeypatch):
    monkeypatch.setattr("mdlm_cli.train.run_lock.fcntl", None)
    run = tmp_path / "run"
    run.mkdir()
    (run / "lock").write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    with pytest.raises(MdlmError, match=f"process {os.getppid()}"):
        RunLock(run).acquire()
    (run / "lock").write_text(json.dumps({"pid": dead_pid(), "host": "other-node"}))
    with pytest.raises(MdlmError, match="other-node"):
        RunLock(run).acquire()


def test_metrics_log_drops_a_torn_last_line_only(tmp_path):
    log = tmp_path / "metrics.jsonl"
    good = [json.dumps({"step": s, "loss": 1.0}) for s in (1, 2, 3)]
    log.write_text("\n".join(good) + "\n")
    mtime = log.stat().st_mtime_ns
    truncate_metrics(log, 3)
    assert log.stat().st_mtime_ns == mtime  # nothing to drop: not rewritten
    truncate_metrics(log, 2)
    assert log.read_text().splitlines() == good[:2]
    log.write_text(good[0] + "\n" + '{"step": 2, "lo')
    with pytest.warns(UserWarning, match="torn last line"):
        assert read_metrics(log) == ([good[0]], True)
    log.write_text(good[0] + "\n{oops\n" + good[1] + "\n")
    with pytest.raises(MdlmError, match="line 2 is not JSON"):
        read_metrics(log)


def test_resume_compares_what_is_trained_not_how():
    saved = resolve_config("test")
    assert resume_differences(saved, resolve_config("test", ["train.max_steps=99", "train.eval_every=3",
                                                           "train.save_every=3", "train.threads=1",
                                                           "train.device=cpu", "train.compile=true",
                                                           "train.micro_batch_size=4"])) == {}
    changed = resolve_config("demo")  # another preset of another size: data, model, optimisation, batch
    keys = set(resume_differences(saved, changed))
    assert {"data.length", "model.hidden_size", "optim.lr", "train.ema"} <= keys  # (both batch 16)
    assert resume_differences(saved, resolve_config("test", ["diffusion.schedule=cosine"])) == {
        "diffusion.schedule": ["loglinear", "cosine"]}


def test_pickled_python2_names_resolve_to_what_unpickling_would_call():
    assert python3_name("commands.call") == "subprocess.call"
    assert python3_name("__builtin__.eval") == "builtins.eval"
    assert python3_name("collections.OrderedDict") == "collections.OrderedDict"


def test_text_files_refuse_binary_data_but_keep_stray_bytes(tmp_path):
    ok = tmp_path / "ok.txt"
    ok.write_bytes("caf\u00e9 ".encode() * 500 + b"\xff")  # one bad byte in real text: replaced
    assert read_text_file(ok).endswith("\ufffd")
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"text\x00more")
    with pytest.raises(MdlmError, match="NUL bytes"):
        read_text_file(nul)


def test_every_from_pretrained_passes_trust_remote_code_false():
    import ast
    from pathlib import Path

    import mdlm_cli

    calls = []
    for path in Path(mdlm_cli.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_pretrained":
                flag = [k.value for k in node.keywords if k.arg == "trust_remote_code"]
                calls.append((path.name, node.lineno, flag))
    assert len(calls) >= 4 and all(flag and isinstance(flag[0], ast.Constant) and flag[0].value is False
                                   for _, _, flag in calls), calls
