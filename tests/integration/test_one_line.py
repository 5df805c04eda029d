"""One line, never a traceback: each mistake or I/O failure found by trying the toolkit as a
new user, and the newcomer friction around `make demo` and the help texts."""

import errno
import json
import re
import subprocess
import sys

import pytest
import torch

from mdlm_cli.cli import app
from mdlm_cli.config import list_presets

from .conftest import invoke, one_line_error
from .test_nothing_lost import ROOT, make_run

MODEL_COMMANDS = ("train", "sample", "semi-ar", "eval-ppl", "gen-ppl", "bench-sampler", "export", "serve",
                  "lm-eval")


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("char") / "run")


def test_disk_full_during_a_checkpoint_save(train_args, tmp_path, monkeypatch):
    """torch.save's error when the disk fills (seen on a full tmpfs); safetensors' and the OS's
    are the same message (tests/unit/test_files.py)."""
    out = tmp_path / "run"

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr("mdlm_cli.checkpoints.folder.torch.save", full)
    message = one_line_error(*train_args, "--out", out, "--max-steps", "2")
    assert f"no space left on the device holding {out}" in message and "nothing was lost" in message
    assert not list((out / "checkpoints").iterdir())  # no partial step folder, no temporary


def test_read_only_output_folders(char_run, train_args, tmp_path, monkeypatch):
    import mdlm_cli.io.files
    import mdlm_cli.train.run_lock

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(mdlm_cli.train.run_lock.os, "open", read_only)
    message = one_line_error(*train_args, "--out", tmp_path / "ro", "--max-steps", "2")
    assert "cannot lock the run folder" in message and "read-only file system" in message
    monkeypatch.undo()
    monkeypatch.setattr(mdlm_cli.io.files.Path, "write_text", read_only)
    message = one_line_error("sample", "-c", char_run, "-n", "1", "--out", tmp_path / "ro" / "s.jsonl")
    assert "read-only file system" in message
    monkeypatch.undo()
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert "file" in one_line_error("sample", "-c", char_run, "-n", "1", "--out", blocked / "s.jsonl")


def test_bad_text_inputs(char_run, tmp_path):
    binary = tmp_path / "noise.txt"
    binary.write_bytes(bytes(range(256)) * 40)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    not_utf8 = tmp_path / "latin.jsonl"
    not_utf8.write_bytes(json.dumps({"text": "x"}).encode() + b"\n\xff\xfe\xfa" * 50)
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text(json.dumps({"text": 123}) + "\n")
    for path, message in ((binary, "not text"), (empty, "holds no text"), (not_utf8, "not UTF-8"),
                          (numbers, "'text' must be a string")):
        assert message in one_line_error("prepare-data", "--dataset", path, "--tokenizer", "char")
    assert "'text' must be a string" in one_line_error("gen-ppl", "--samples", numbers, "--judge", char_run)
    assert "not UTF-8" in one_line_error("gen-ppl", "--samples", not_utf8, "--judge", char_run)


@pytest.mark.parametrize("args, message", [
    (["--set", "optim.betas=[1.5,0.9]"], "optim.betas must both be in [0, 1)"),
    (["--set", "optim.weight_decay=-0.1"], "optim.weight_decay must be at least 0"),
    (["--set", "optim.eps=0"], "optim.eps must be positive"),
    (["--out", "runs/{x}"], "train.out_dir may contain {name}"),
    (["--set", "train.seed=!!python/object/apply:os.system ['echo hi']"], "is not a plain YAML value"),
    (["--set", "train.threads=-2"], "train.threads must be"),
])
def test_config_mistakes(args, message):
    assert message in one_line_error("train", "--preset", "test", "--no-print-config", *args)


def test_sampling_flag_mistakes(char_run):
    for args, message in [
        (["--length", "0"], "--length must be at least 1"),
        (["--tokens-per-step", "0"], "--tokens-per-step must be at least 1"),
        (["--infill", "a <mask:99999999999> b"], "more than the sequence length of 32"),
    ]:
        assert message in one_line_error("sample", "-c", char_run, *args)
    assert "--stride must be at least 1" in one_line_error("semi-ar", "-c", char_run, "--stride", "0")
    assert "--length must be at least 1" in one_line_error("bench-sampler", "-c", char_run, "--length", "0")


def test_a_pickle_that_calls_a_function_is_refused_for_that_reason(tmp_path):
    class Payload:  # torch.save pickles subprocess.call under its Python 2 name, commands.call
        def __reduce__(self):
            return (subprocess.call, (["touch", str(tmp_path / "ran")],))

    torch.save({"state_dict": {}, "hyper_parameters": {"config": Payload()}}, tmp_path / "evil.ckpt")
    message = one_line_error("sample", "-c", tmp_path / "evil.ckpt")
    assert "references subprocess.call" in message and "refused" in message and not (tmp_path / "ran").exists()


# ----------------------------------------------------------------------------- newcomer friction

def help_text(command: str) -> str:
    return invoke(command, "--help")


def test_every_preset_named_in_the_help_exists():
    from mdlm_cli.rl.presets import list_rl_presets

    presets = set(list_presets())
    for command in app.registered_commands:
        known = set(list_rl_presets()) if command.name == "rl" else presets  # presets/rl/
        for name in re.findall(r"--preset ([\w.-]+)", help_text(command.name)):
            assert name.endswith(".yaml") or name in known, (command.name, name)


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_every_command_that_runs_a_model_takes_threads(command):
    assert "--threads" in help_text(command)


def test_threads_flag_sets_torch_threads(char_run):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        invoke("sample", "-c", char_run, "-n", "1", "--quiet", "--threads", "1")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_default_threads_leave_busy_cores_alone(monkeypatch):
    import mdlm_cli.runtime as runtime

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime, "TORCH_THREADS", 8)
    for load, threads in ((0.1, 8), (3.2, 5), (7.6, 1), (30.0, 1)):
        monkeypatch.setattr(runtime, "busy_cores", lambda load=load: load)
        assert runtime.default_threads() == threads
    # a high load average left by a job that has just ended does not count: only busy cores now
    monkeypatch.setattr(runtime, "busy_cores", lambda: 0.0)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert runtime.default_threads() == 8
    monkeypatch.setattr(runtime, "busy_cores", lambda: None)  # no /proc/stat: the load average
    assert runtime.default_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert runtime.default_threads() is None  # the environment decides


def test_plot_without_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert "pip install 'mdlm[plot]'" in one_line_error("bench-sampler", "--preset", "test", "--plot", "p.png")


def test_make_demo_and_the_readme_say_how_to_reach_mdlm():
    makefile = (ROOT / "Makefile").read_text()
    demo = makefile.split("\ndemo:")[1].split("\n\n")[0]
    assert "source $(VENV)/bin/activate" in demo.splitlines()[-1]
    readme = (ROOT / "README.md").read_text()
    two_commands = readme.split("## Two commands")[1].split("Measured on")[0]
    assert "source .venv/bin/activate" in two_commands and ".venv/bin/mdlm" in two_commands


def test_readme_lists_the_guarantees():
    section = (ROOT / "README.md").read_text().split("## The command line")[1].split("### Presets")[0]
    for guarantee in ("atomic", "lock", "remote code", "markup", "--override-resume-config"):
        assert guarantee in section, guarantee



def test_busy_cores_sees_a_spinning_process():
    """A process spinning on one core while this one sleeps counts as (at least most of) a busy core."""
    import time

    import mdlm_cli.runtime as runtime

    if runtime.busy_cores(0.05) is None:
        pytest.skip("no /proc/stat on this platform")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert runtime.busy_cores(0.3) >= 0.6
    finally:
        spinner.kill()
