"""Nothing lost, nothing run: export --overwrite, crash-safe re-saves, folders that ask to run
their own code, and model or user text that looks like rich markup. Real commands in
temporary folders."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mdlm_cli.build import resolve_config
from mdlm_cli.checkpoints.save import CheckpointContents, save_checkpoint
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.models import build_model

from ..reference_weights import hf_config, save_hf_folder
from .conftest import invoke, one_line_error

ROOT = Path(__file__).resolve().parents[2]


def tree(folder: Path) -> dict:
    """Every file under `folder` with its bytes: to assert that nothing changed."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def make_run(folder: Path, tokenizer: str = "char", step: int = 4) -> Path:
    """An mdlm run folder of the test preset (random weights) without training it."""
    cfg = resolve_config("test", [f"data.tokenizer={tokenizer}"])
    tok = load_tokenizer(tokenizer)
    torch.manual_seed(0)
    model = build_model(cfg.model, tok.vocab_size)
    data_meta = {"length": cfg.data.length, "packing": cfg.data.packing, "tokenizer": tok.describe(),
                 "source": {"name": "bigtxt"}}
    save_checkpoint(folder, step,
        CheckpointContents(model=model, ema_model=None, optimizer=None, cfg=cfg,
                           state={"step": step}, tokenizer=tok, data_meta=data_meta))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": step, "loss": 1.0}) + "\n")
    return folder


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("gpt2") / "run", tokenizer="gpt2")


# ----------------------------------------------------------------------------- 1. export --overwrite

def test_export_overwrite_never_deletes_the_run_or_an_unrelated_folder(tmp_path):
    run = make_run(tmp_path / "run")
    before = tree(run)
    for out in (run, run / "checkpoints" / "step-00000004", tmp_path):
        assert "overlaps" in one_line_error("export", "-c", run, "--out", out, "--overwrite")
    docs = tmp_path / "mydocs"
    docs.mkdir()
    (docs / "notes.txt").write_text("mine")
    assert "not a folder mdlm export wrote" in one_line_error("export", "-c", run, "--out", docs, "--overwrite")
    assert tree(run) == before and (docs / "notes.txt").read_text() == "mine"

    out = tmp_path / "exported"
    invoke("export", "-c", run, "--out", out)
    assert "files" in json.loads((out / "config.json").read_text())["mdlm"]  # the export's own marker
    invoke("export", "-c", run, "--out", out, "--overwrite")  # an earlier export is replaced
    (out / "mine.txt").write_text("keep")
    assert "mine.txt" in one_line_error("export", "-c", run, "--out", out, "--overwrite")
    assert (out / "mine.txt").read_text() == "keep"


def test_export_overwrite_is_atomic(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run")
    out = tmp_path / "exported"
    invoke("export", "-c", run, "--out", out)
    before = tree(out)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(out))

    monkeypatch.setattr("mdlm_cli.checkpoints.released.save_file", disk_full)
    assert "no space left" in one_line_error("export", "-c", run, "--out", out, "--overwrite")
    assert tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["exported", "run"]


# ----------------------------------------------------------------------------- 2. crash-safe re-save

KILL_AT_SWAP = """
import os, signal, sys
real = os.replace
def replace(src, dst):
    real(src, dst)
    if ".old-" in str(dst):  # the live step folder has just been moved aside for its re-save
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
from mdlm_cli.cli import main
sys.argv = ["mdlm", *sys.argv[1:]]
main()
"""


def child_env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_a_kill_during_a_re_save_loses_nothing(train_args, tmp_path):
    """Killed (SIGKILL) at the worst instant of re-saving step 4 (its final save after the
    periodic one): sampling falls back with a warning, --resume puts the step back."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", KILL_AT_SWAP, *train_args, "--out", str(out), "--max-steps", "4"],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    ckpts = out / "checkpoints"
    assert not (ckpts / "step-00000004").exists() and list(ckpts.glob(".step-00000004.old-*"))
    assert (out / "latest").read_text().strip() == "step-00000004"
    text = invoke("sample", "-c", out, "-n", "1", "--quiet")
    assert "warning:" in text and "missing or incomplete" in text and "NFE" in text
    resumed = " ".join(invoke(*train_args, "--out", out, "--max-steps", "6", "--resume").split())
    assert "restored step-00000004" in resumed and "removed .step-00000004.tmp-" in resumed
    assert "at step 4" in resumed and "took over a stale lock" in resumed
    assert not list(ckpts.glob(".step-*")) and (ckpts / "step-00000006").is_dir()


def test_a_pointer_to_a_missing_step_falls_back_with_a_warning(tmp_path):
    run = make_run(tmp_path / "run", step=2)
    save_checkpoint(run, 4,
        CheckpointContents(model=build_model(resolve_config("test").model, 35), ema_model=None,
                           optimizer=None, cfg=resolve_config("test"), state={"step": 4},
                           tokenizer=load_tokenizer("char"),
                           data_meta=json.loads((run / "checkpoints" / "step-00000002" / "data.json").read_text())))
    shutil.rmtree(run / "checkpoints" / "step-00000004")  # what the old re-save left after a kill
    text = invoke("sample", "-c", run, "-n", "1", "--quiet")
    assert "latest names step-00000004, which is missing" in " ".join(text.split()) and "step-00000002" in text
    shutil.rmtree(run / "checkpoints" / "step-00000002")
    message = one_line_error("sample", "-c", run)
    assert "names step-00000004" in message and "no other whole checkpoint" in message


# ----------------------------------------------------------------------------- 3. no remote code

EVIL_CODE = "import pathlib\npathlib.Path({marker!r}).write_text('the folder ran its own code')\n"


def evil_folder(folder: Path, marker: Path) -> Path:
    """An HF-style folder whose config asks transformers to run its evil.py (auto_map)."""
    save_hf_folder(folder, config={**hf_config(), "auto_map": {"AutoConfig": "evil.EvilConfig",
                                                               "AutoModelForCausalLM": "evil.EvilModel"}})
    (folder / "tokenizer_config.json").write_text("{}")  # no tokenizer_class: transformers asks the config
    (folder / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    return folder


@pytest.mark.parametrize("answer", [None, "y\n"])
def test_folders_that_ask_to_run_their_code_are_refused(answer, tmp_path):
    marker = tmp_path / "ran"
    folder = evil_folder(tmp_path / "evil", marker)
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"text": "hello"}) + "\n")
    for args in (("sample", "-c", folder, "-n", "1"), ("gen-ppl", "--samples", samples, "--judge", folder)):
        assert "own Python code" in one_line_error(*args, input=answer)
        assert not marker.exists()


def test_a_checkpoint_whose_config_names_its_modelling_code_still_loads_without_it(tmp_path):
    """config.json names code of its own (auto_map), no tokeniser files: mdlm reads the config itself."""
    marker = tmp_path / "ran"
    folder = evil_folder(tmp_path / "published", marker)
    (folder / "tokenizer_config.json").unlink()
    assert "NFE" in invoke("sample", "-c", folder, "-n", "1", "--quiet", input="y\n")
    assert not marker.exists()


def test_transformers_is_told_never_to_run_remote_code(tmp_path, monkeypatch):
    """Without mdlm's own check, transformers (trust_remote_code=False) still refuses: no prompt."""
    monkeypatch.setattr("mdlm_cli.io.safe_load.refuse_remote_code", lambda *a, **k: None)
    marker = tmp_path / "ran"
    folder = evil_folder(tmp_path / "evil", marker)
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"text": "hello"}) + "\n")
    for args in (("sample", "-c", folder, "-n", "1"), ("gen-ppl", "--samples", samples, "--judge", folder)):
        assert "error:" in invoke(*args, code=1, input="y\n")  # (transformers' own log noise aside)
        assert not marker.exists()


# ----------------------------------------------------------------------------- 4. markup-safe printing

def test_sample_text_that_looks_like_markup_is_printed_and_saved(gpt2_run, tmp_path):
    out = tmp_path / "s.jsonl"
    prompt = "[/] hello [bold red]x[/bold red]"
    text = invoke("sample", "-c", gpt2_run, "--prompt", prompt, "--length", "20", "-n", "1", "--out", out)
    assert prompt in text and json.loads(out.read_text())["text"].startswith(prompt)
    for stream in ("--stream", "--no-stream"):
        text = invoke("semi-ar", "-c", gpt2_run, "--prompt", prompt, "--length", "40", "--stride", "8", stream)
        assert prompt in text


def test_paths_and_names_that_look_like_markup(train_args, small_corpus, tmp_path, monkeypatch):
    from mdlm_cli.io.hub import hub_offline

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_offline.cache_clear()
    odd = tmp_path / "x["
    odd.mkdir()
    run = odd / "]run"  # the path reads x[/]run
    assert "Checkpoint:" in invoke(*train_args, "--out", run, "--max-steps", "1")
    doc = odd / "]doc.txt"
    shutil.copy(small_corpus, doc)
    assert "Prepared" in invoke("prepare-data", "--dataset", doc, "--tokenizer", "char", "--length", "32")
    assert "]doc" in invoke("eval-ppl", "-c", run, "--dataset", doc, "--rows", "2", "-k", "1")
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"text": "[bold red]x[/bold red] and [/] y"}) + "\n")
    assert "]judge" in one_line_error("gen-ppl", "--samples", samples, "--judge", odd / "]judge")  # after its status
    exported = odd / "]export"
    assert "Exported" in invoke("export", "-c", run, "--out", exported)
    assert "ancestral" in invoke("bench-sampler", "-c", exported, "--steps", "2", "-n", "1", "--batch-size", "1",
                                 "--repeats", "1", "--length", "8", "--samplers", "ancestral")
