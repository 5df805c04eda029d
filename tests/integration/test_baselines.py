"""The paper's baselines end to end: every new preset trains, and SEDD and D3PM checkpoints go
through eval-ppl, sample, bench-sampler and export."""

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from mdlm_cli.build import resolve_config
from mdlm_cli.cli import app
from mdlm_cli.train.loop import train

runner = CliRunner()

NEW_PRESETS = ["lm1b-sedd", "owt-sedd", "lm1b-d3pm", "lm1b-T1000", "owt-tc", "text8-ar", "text8-sedd",
               "text8-d3pm", "demo-sedd", "demo-d3pm"]
# each preset's objective, switches and time conditioning, on test-sized data and network
SMALL = ["data.tokenizer=char", "data.length=32", "data.packing=chunk", "model.hidden_size=64", "model.n_blocks=2",
         "model.n_heads=2", "model.cond_dim=32", "model.dropout=0.0", "train.global_batch_size=8",
         "train.micro_batch_size=8", "train.max_steps=3", "train.log_every=1", "train.eval_every=100",
         "train.save_every=100", "train.device=cpu", "train.precision=fp32", "optim.warmup_steps=1",
         "train.time_budget=0", "train.compile=false"]


def run(*args, code=0):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text("\n\n".join(f"it was the best of times number {i}, it was the worst of times " * 3
                                for i in range(60)))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_each_new_preset_trains_three_steps(preset, corpus, tmp_path):
    paper = resolve_config(preset)
    cfg = resolve_config(preset, [*SMALL, f"data.dataset={corpus}", f"train.out_dir={tmp_path / 'run'}"])
    assert (cfg.diffusion.objective, cfg.diffusion.T, cfg.model.time_conditioning) == (
        paper.diffusion.objective, paper.diffusion.T, paper.model.time_conditioning)
    result = train(cfg, console=Console(quiet=True))
    assert result.step == 3 and len(result.losses) == 3 and all(0 < x < 50 for x in result.losses)
    assert result.final_valid is not None and result.final_valid.nats_per_token > 0


@pytest.fixture(scope="module")
def baselines(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("runs")
    base = ["train", "--preset", "test", "--no-print-config", "--max-steps", "6", "--set", f"data.dataset={corpus}",
            "--set", "model.time_conditioning=true"]
    run(*base, "--out", str(root / "sedd"), "--set", "diffusion.objective=sedd")
    run(*base, "--out", str(root / "d3pm"), "--set", "diffusion.objective=d3pm", "--set", "diffusion.T=50",
        "--set", "diffusion.zero_masking=false", "--set", "diffusion.carry_over=false")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("name, samplers, refused", [("sedd", ["analytic", "euler"], "first-hitting"),
                                                      ("d3pm", ["d3pm-ancestral"], "analytic")])
def test_sedd_and_d3pm_checkpoints_evaluate_sample_and_export(baselines, corpus, tmp_path, name, samplers, refused):
    ckpt = str(baselines / name)
    out = run("eval-ppl", "-c", ckpt, "--data", str(corpus), "--rows", "12", "-k", "3",
              "--json", str(tmp_path / "e.json"))
    assert "≤" in out and name in out
    record = json.loads((tmp_path / "e.json").read_text())["results"][0]
    assert record["kind"] == "bound" and record["mc_samples"] == 3 and record["standard_error"] > 0
    assert record["sequence_sd"] > 0 and record["sequence_var"] == pytest.approx(record["sequence_var"])
    for sampler in samplers:
        text = run("sample", "-c", ckpt, "-n", "2", "--sampler", sampler, "--steps", "8", "--quiet",
                   "--out", str(tmp_path / "s.jsonl"))
        assert f"{sampler}: " in text
        assert all(len(json.loads(x)["tokens"]) == 32 for x in (tmp_path / "s.jsonl").read_text().splitlines())
    result = runner.invoke(app, ["sample", "-c", ckpt, "--sampler", refused, "-n", "1"])
    assert result.exit_code == 1 and f"does not serve {name} models" in result.output
    assert len(result.output.strip().splitlines()) == 1
    bench = run("bench-sampler", "-c", ckpt, "--steps", "4", "-n", "2", "--batch-size", "2", "--repeats", "1")
    assert all(s in bench for s in samplers)
    run("export", "-c", ckpt, "--out", str(tmp_path / "export"))
    again = run("eval-ppl", "-c", str(tmp_path / "export"), "--data", str(corpus), "--rows", "12", "-k", "2")
    assert name in again


def test_bad_combinations_are_one_line_errors(tmp_path):
    for sets, message in [
        (["diffusion.objective=sedd"], "needs model.time_conditioning=true"),
        (["diffusion.objective=sedd", "model.time_conditioning=true", "diffusion.T=10"], "continuous-time"),
        (["diffusion.objective=d3pm"], "discrete-time (eq. 9)"),
        (["diffusion.zero_masking=false"], "use diffusion.objective=d3pm"),
        (["diffusion.objective=ar", "diffusion.carry_over=false"], "does not apply to the ar objective"),
    ]:
        args = ["train", "--preset", "test", "--out", str(tmp_path / "x")]
        for s in sets:
            args += ["--set", s]
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and message in result.output, (sets, result.output)
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
        assert not (tmp_path / "x").exists()  # nothing written
