"""End to end through the CLI on the test preset: prepare -> train -> resume -> sample."""

import json

import pytest
from typer.testing import CliRunner

from mdlm_cli.cli import app

runner = CliRunner()


def run(*args, code=0):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


def losses(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if "loss" in x]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "full"
    base = ["train", "--preset", "test", "--no-print-config", "--set", "train.log_every=1",
            "--set", "train.eval_rows=32"]
    run(*base, "--out", str(out), "--max-steps", "12", "--set", "train.save_every=6",
        "--set", "train.eval_every=100")
    return out, base


@pytest.mark.slow
def test_train_then_resume_equals_uninterrupted_run(trained, tmp_path):
    full, base = trained
    part = tmp_path / "part"
    run(*base, "--out", str(part), "--max-steps", "6", "--set", "train.save_every=6",
        "--set", "train.eval_every=100")
    run(*base, "--out", str(part), "--max-steps", "12", "--set", "train.save_every=6",
        "--set", "train.eval_every=100", "--resume")
    assert losses(part) == losses(full)  # bit-identical trajectory on CPU
    assert len(losses(full)) == 12
    first, last = losses(full)[:3], losses(full)[-3:]
    assert sum(last) < sum(first)  # the loss goes down


@pytest.mark.slow
def test_checkpoint_layout_and_sampling(trained, tmp_path):
    full, _ = trained
    ckpt = full / "checkpoints" / (full / "latest").read_text().strip()
    for name in ("model.safetensors", "ema.safetensors", "optimizer.pt", "state.json", "config.yaml",
                 "model.json", "data.json", "tokenizer/mdlm_tokenizer.json"):
        assert (ckpt / name).is_file(), name
    # an intermediate checkpoint holds the training time so far (a run killed after it loses none)
    seconds = [json.loads((full / "checkpoints" / f"step-{s:08d}" / "state.json").read_text())["train_seconds"]
               for s in (6, 12)]
    assert 0 < seconds[0] < seconds[1]
    out = tmp_path / "s.jsonl"
    text = run("sample", "--checkpoint", str(full), "-n", "3", "--steps", "20", "--sampler", "ancestral-cache",
               "--out", str(out))
    assert "NFE" in text
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(records) == 3 and all(len(r["tokens"]) == 32 for r in records)
    assert {"text", "sampler", "nfe", "ncs", "seed", "precision", "checkpoint"} <= set(records[0])
    infill = run("sample", "--checkpoint", str(full), "-n", "1", "--infill", "the <mask:4> of", "--quiet")
    assert "first-hitting" in infill
    semi = run("semi-ar", "--checkpoint", str(full), "--length", "48", "--stride", "8", "--no-stream",
               "--sampler", "first-hitting")
    assert "48 tokens per sample" in semi


def test_user_errors_exit_1_with_one_line(tmp_path):
    for args, message in [
        (["train", "--preset", "nope"], "unknown preset"),
        (["train", "--preset", "test", "--set", "optim.learnrate=1"], "unknown key optim.learnrate"),
        (["train", "--preset", "test", "--set", "train.global_batch_size=10"], "multiple of"),
        (["sample", "--checkpoint", str(tmp_path / "missing")], "does not exist"),
        (["sample", "--checkpoint", str(tmp_path), "--sampler", "magic"], "unknown sampler"),
        (["prepare-data", "--dataset", str(tmp_path / "none.txt")], "unknown data set"),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output


def test_existing_run_is_not_overwritten(tmp_path):
    out = tmp_path / "r"
    (out / "checkpoints" / "step-00000001").mkdir(parents=True)
    result = runner.invoke(app, ["train", "--preset", "test", "--out", str(out), "--no-print-config"])
    assert result.exit_code == 1 and "--resume" in result.output


def test_presets_listing_and_show():
    assert "owt" in run("presets")
    assert "openwebtext" in run("presets", "owt")


@pytest.mark.slow
def test_flags_are_never_silently_ignored(trained):
    full, _ = trained
    base = ["sample", "--checkpoint", str(full), "-n", "2", "--quiet"]
    assert "ancestral-cache: " in run(*base, "--steps", "5")  # --steps alone: a step-based sampler
    assert "first-hitting takes no steps; --steps 5 is ignored" in run(*base, "--sampler", "first-hitting",
                                                                        "--steps", "5")
    out = run(*base, "--sampler", "ancestral", "--steps", "5", "--tokens-per-step", "2")
    assert "--tokens-per-step 2 does not apply to ancestral" in out
    result = runner.invoke(app, ["semi-ar", "--checkpoint", str(full), "--stride", "999"])
    assert result.exit_code == 1 and "stride must be between" in result.output  # an engine error, one line
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_fast_sampler_flags_apply_where_read(trained, tmp_path):
    full, _ = trained
    base = ["sample", "--checkpoint", str(full), "-n", "2", "--quiet"]
    out = run(*base, "--sampler", "threshold", "--threshold", "0", "--out", str(tmp_path / "t.jsonl"))
    record = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert record["nfe"] == 1 and record["threshold"] == 0.0 and record["sampler"] == "threshold"
    assert "--eta 0.1 does not apply to first-hitting" in run(*base, "--eta", "0.1")
    out = run(*base, "--sampler", "remdm", "--steps", "20", "--eta", "0.1", "--remdm-schedule", "rescale",
              "--k-schedule", "cosine")
    assert "--k-schedule cosine does not apply to remdm" in out and "--eta" not in out
    run(*base, "--sampler", "confidence", "--steps", "8", "--prompt", "ab")
    assert "must be one of: cap, rescale" in run(*base, "--remdm-schedule", "loop", code=1)
    out = run("semi-ar", "--checkpoint", str(full), "--length", "48", "--sampler", "confidence", "--steps", "4",
              "--no-stream", "--threshold", "0.5")
    assert "--threshold 0.5 does not apply to confidence" in out
