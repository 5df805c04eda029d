"""End to end through the CLI with a tiny BERT as the hf-mlm backbone: train -> sample -> export ->
eval-ppl on the export -> glue before and after."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from mdlm_cli.cli import app

from ..hf_models import save_tiny_mlm, write_corpus

runner = CliRunner()


def run(*args, code=0):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


@pytest.mark.slow
def test_tiny_bert_through_every_command(tmp_path):
    folder = save_tiny_mlm(tmp_path / "bert")
    corpus = write_corpus(tmp_path / "corpus.txt")
    preset = tmp_path / "tiny-bert.yaml"
    preset.write_text(yaml.safe_dump({
        "data": {"dataset": str(corpus), "tokenizer": str(folder), "length": 32},
        "model": {"backbone": "hf-mlm", "hf_model": str(folder)},
        "optim": {"lr": 3e-3, "warmup_steps": 2},
        "train": {"global_batch_size": 8, "micro_batch_size": 4, "max_steps": 16, "ema": 0.0, "log_every": 4,
                  "eval_every": 100, "save_every": 100}}))
    out = tmp_path / "run"
    text = run("train", "--preset", str(preset), "--out", str(out), "--no-print-config")
    assert "BertForMaskedLM 2x32" in text
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert losses[-1] < losses[0]
    samples = tmp_path / "s.jsonl"
    run("sample", "--checkpoint", str(out), "-n", "2", "--out", str(samples))
    assert all(4 not in json.loads(x)["tokens"] for x in samples.read_text().splitlines())  # no [MASK] left
    run("export", "--checkpoint", str(out), "--out", str(tmp_path / "export"))
    trained = json.loads((tmp_path / "export" / "config.json").read_text())["mdlm"]["state"]["valid_nats"]
    run("eval-ppl", "--checkpoint", str(tmp_path / "export"), "--split", "valid", "-k", "2",
        "--json", str(tmp_path / "e.json"))
    result = json.loads((tmp_path / "e.json").read_text())["results"][0]
    assert result["kind"] == "bound" and abs(result["nats_per_token"] - trained) < 0.5 * trained  # the same model
    rows = [{"sentence": f"the cat sat {'on the mat' if i % 2 else 'and it was'}", "label": i % 2} for i in range(40)]
    for split in ("train", "validation"):
        (tmp_path / "glue" / "sst2").mkdir(parents=True, exist_ok=True)
        (tmp_path / "glue" / "sst2" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for checkpoint in (str(folder), str(out)):  # before and after MDLM fine-tuning
        run("glue", "--checkpoint", checkpoint, "--tasks", "sst2", "--data", str(tmp_path / "glue"),
            "--epochs", "2", "--lr", "1e-3", "--json", str(tmp_path / "g.json"))
        record = json.loads((tmp_path / "g.json").read_text())["tasks"][0]
        assert record["task"] == "sst2" and 0.0 <= record["value"] <= 1.0 and record["validation"]["rows"] == 40
    run("glue", "--checkpoint", "runs/nope", "--tasks", "wnli", code=1)
