"""DNA end to end through the CLI on the generated genome: dna-tiny trained a few steps with
MDLM, with AR (Mamba), with MLM and with SEDD; eval-ppl gives a bound, an exact value and a masked-token
value; the AR model samples through its recurrent cache; an MLM has no sampler."""

import json

import pytest
from typer.testing import CliRunner

from mdlm_cli.cli import app

pytest.importorskip("mambapy", reason="the DNA backbones need mambapy")
pytestmark = pytest.mark.slow

FAST = ["--set", "train.max_steps=2", "--set", "train.eval_every=100", "--set", "train.save_every=2",
        "--set", "train.eval_rows=16", "--set", "data.length=64", "--set", "train.micro_batch_size=8",
        "--set", "train.global_batch_size=8", "--no-print-config"]
OBJECTIVES = {"mdlm": [], "ar": ["--set", "model.backbone=mamba", "--set", "diffusion.objective=ar"],
              "mlm": ["--set", "diffusion.objective=mlm"],
              "sedd": ["--set", "diffusion.objective=sedd", "--set", "model.time_conditioning=true"]}


def test_dna_tiny_objectives_train_evaluate_and_sample(tmp_path):
    runner = CliRunner()
    kinds = {}
    for name, extra in OBJECTIVES.items():
        out = tmp_path / name
        result = runner.invoke(app, ["train", "--preset", "dna-tiny", "--out", str(out), *FAST, *extra])
        assert result.exit_code == 0, result.output
        result = runner.invoke(app, ["eval-ppl", "-c", str(out), "--rows", "16", "-k", "2", "--json",
                                     str(tmp_path / f"{name}.json")])
        assert result.exit_code == 0, result.output
        kinds[name] = json.loads((tmp_path / f"{name}.json").read_text())["results"][0]["kind"]
    assert kinds == {"mdlm": "bound", "ar": "exact", "mlm": "masked-token", "sedd": "bound"}
    result = runner.invoke(app, ["sample", "-c", str(tmp_path / "ar"), "-n", "2", "--length", "32"])
    assert result.exit_code == 0, result.output
    assert set("".join(result.output.split())) & set("ACGT")
    result = runner.invoke(app, ["sample", "-c", str(tmp_path / "sedd"), "-n", "1", "--length", "32", "--steps", "8"])
    assert result.exit_code == 0, result.output  # SEDD's analytic sampler through the Caduceus backbone
    assert set("".join(result.output.split())) & set("ACGT")
    result = runner.invoke(app, ["sample", "-c", str(tmp_path / "mlm"), "-n", "1"])
    assert result.exit_code == 1 and "no sampler" in result.output
