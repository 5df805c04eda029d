import json

import pytest
import torch
from typer.testing import CliRunner

from mdlm_cli import engine
from mdlm_cli.cli import app
from mdlm_cli.config import ModelConfig
from mdlm_cli.engine.schedules import LogLinear
from mdlm_cli.models import DiffusionDenoiser, DiT
from mdlm_cli.sample.bench import (
    BenchDraws,
    BenchReport,
    BenchRow,
    TimedDenoiser,
    WholeBatchCount,
    run_config,
    sweep,
)

V, L = 20, 48


class Recorder:
    """Uniform logits; records, per call, which rows had positions to predict."""

    supports_output_mask = True
    time_agnostic = True

    def __init__(self):
        self.rows_with_work = 0
        self.rows = 0

    def __call__(self, z, t, output_mask=None):
        self.rows += z.shape[0]
        self.rows_with_work += int(output_mask.any(1).sum())
        return torch.zeros(int(output_mask.sum()), V + 1)


def test_cache_calls_equal_steps_with_a_change():
    plain, cached = Recorder(), Recorder()
    kw = dict(num_samples=8, length=L, mask_id=V, steps=200)
    a, s_plain = engine.sample(plain, sampler="ancestral", generator=torch.Generator().manual_seed(0),
                               return_stats=True, **kw)
    whole = WholeBatchCount()
    b, s_cache = engine.sample(cached, sampler="ancestral-cache", generator=torch.Generator().manual_seed(0),
                               return_stats=True, on_changes=whole, **kw)
    assert torch.equal(a, b)
    # the plain run saw, at every step, which sequences unmask something: exactly the cached run's calls
    assert s_cache.sequence_evals == plain.rows_with_work == cached.rows
    assert s_plain.sequence_evals == plain.rows > 3 * s_cache.sequence_evals
    # whole-batch invalidation (the reference) calls at every step where any sequence changed
    assert whole.calls > s_cache.sequence_evals / 8


def tiny_denoiser():
    model = DiT(ModelConfig(hidden_size=32, n_blocks=1, n_heads=2, cond_dim=8, dropout=0.0), V + 1)
    return DiffusionDenoiser(model.eval(), LogLinear())


def test_counters_and_timing_of_each_sampler():
    den = tiny_denoiser()
    for sampler, steps in (("ancestral", 30), ("ancestral-cache", 30), ("first-hitting", None)):
        draws = BenchDraws(num_samples=4, length=L, mask_id=V, repeats=2, seed=0, device=torch.device("cpu"))
        row = run_config(den, engine.SamplingSettings(sampler, steps), draws, batch_size=2)
        assert isinstance(row, BenchRow)
        assert row.ncs <= L and row.ncs > 0  # draws only where a position unmasks
        assert 0.0 <= row.network_share <= 1.0 and abs(row.overhead_share + row.network_share - 1) < 1e-9
        assert row.seconds_per_sample_min <= row.seconds_per_sample <= row.seconds_per_sample_max
        if sampler == "first-hitting":
            assert row.nfe == L and row.ncs == L and row.steps is None
        elif sampler == "ancestral":
            assert row.nfe <= steps + 1
        else:
            assert row.nfe <= row.nfe_whole_batch <= steps + 1


def test_timed_denoiser_accumulates():
    den = TimedDenoiser(tiny_denoiser(), torch.device("cpu"))
    den(torch.full((1, 8), V), torch.ones(1))
    assert den.seconds > 0 and den.supports_output_mask


def test_cli_end_to_end_json_schema(tmp_path):
    out = tmp_path / "b.json"
    result = CliRunner().invoke(app, ["bench-sampler", "--preset", "test", "--steps", "5,10", "-n", "2",
                                      "--batch-size", "1,2", "--repeats", "1", "--precision", "fp64,fp32",
                                      "--samplers", "ancestral,ancestral-cache,first-hitting", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert {"device", "dtype", "threads", "torch", "seed", "length", "vocab_size", "command"} <= set(data["meta"])
    # 2 precisions x (2 ancestral samplers x 2 steps + first-hitting) x 2 batch sizes
    assert len(data["results"]) == 2 * (2 * 2 + 1) * 2
    keys = {"sampler", "steps", "batch_size", "precision", "seconds_per_sample", "seconds_per_sample_min",
            "seconds_per_sample_max", "tokens_per_second", "nfe", "ncs", "overhead_share", "nfe_whole_batch"}
    assert all(keys <= set(r) for r in data["results"])
    assert "ancestral-cache" in result.output


def test_cli_rejects_bad_lists():
    result = CliRunner().invoke(app, ["bench-sampler", "--preset", "test", "--steps", "ten"])
    assert result.exit_code == 1 and "comma-separated integers" in result.output


def test_option_lists_add_rows_to_the_samplers_that_read_them():
    configs = sweep(["first-hitting", "threshold", "remdm", "ancestral"], [10, 20], ["fp64"],
                    {"tokens_per_step": [1, 4], "threshold": [0.5], "eta": [0.0, 0.1]})
    by = {}
    for how in configs:
        by.setdefault(how.sampler, []).append((how.steps, dict(how.options)))
    assert by["first-hitting"] == [(None, {"tokens_per_step": 1}), (None, {"tokens_per_step": 4})]
    assert by["threshold"] == [(None, {"threshold": 0.5})]
    assert len(by["remdm"]) == 4 and by["ancestral"] == [(10, {}), (20, {})]


def test_rows_carry_their_options_and_samples():
    kept = []
    how = engine.SamplingSettings("threshold", options={"threshold": 0.0})
    draws = BenchDraws(num_samples=4, length=L, mask_id=V, repeats=2, seed=3, device=torch.device("cpu"))
    row = run_config(tiny_denoiser(), how, draws, batch_size=2, on_tokens=kept.append)
    assert row.nfe == 1 and row.options == {"threshold": 0.0} and row.setting == "threshold=0.0"
    assert len(kept) == 1 and kept[0].shape == (4, L)  # the first timed run's samples, seed 3
    again = engine.sample(tiny_denoiser(), sampler="threshold", num_samples=4, length=L, mask_id=V, batch_size=2,
                          threshold=0.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(kept[0], again)


def test_cli_warns_about_options_no_sampler_reads():
    result = CliRunner().invoke(app, ["bench-sampler", "--preset", "test", "--samplers", "first-hitting", "-n", "1",
                                      "--batch-size", "1", "--repeats", "1", "--eta", "0.1", "--tokens-per-step", "2"])
    assert result.exit_code == 0, result.output
    assert "--eta does not apply to first-hitting" in result.output
    assert "--tokens-per-step does not apply" not in result.output
    bad = CliRunner().invoke(app, ["bench-sampler", "--preset", "test", "--threshold", "2"])
    assert bad.exit_code == 1 and "--threshold must be in [0, 1]" in bad.output
    bad = CliRunner().invoke(app, ["bench-sampler", "--preset", "test", "--reference-text", "test"])
    assert bad.exit_code == 1 and "needs --judge" in bad.output


def test_frontier_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    from mdlm_cli.sample.frontier import Quality, Reference
    from mdlm_cli.sample.frontier_plot import plot_frontier

    def row(sampler, steps, options, nfe, ppl, entropy):
        q = Quality(4, ppl, 3.0, 0.1, 2.0, entropy, 0.05)
        return BenchRow(sampler, steps, 4, "fp64", 4, 1, 0.1 * nfe, 0.1 * nfe, 0.1 * nfe, 100.0, nfe, 48.0, 10,
                        None, None, 0.9, 0.1, options, q)

    report = BenchReport(meta={"model": "m", "length": L, "judge": "j"}, results=[
        row("ancestral", 10, {}, 10, 30.0, 2.8), row("ancestral", 100, {}, 40, 28.0, 2.7),
        row("threshold", None, {"threshold": 0.5}, 5, 20.0, 2.0),
        row("threshold", None, {"threshold": 0.9}, 20, 25.0, 2.5),
        row("first-hitting", None, {}, 48, 29.0, 2.8)])
    report.reference = Reference("test", L, 4, 8, Quality(32, 5.0, 1.6, 0.01, 1.6, 2.8, 0.01),
                                 {"gen_ppl": (4.5, 5.5), "entropy": (2.7, 2.9), "nats_per_char": (1.5, 1.7)})
    for x in ("seconds", "nfe"):
        path = tmp_path / f"frontier-{x}.png"
        plot_frontier(report, str(path), x=x)
        assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"


def test_frontier_plot_gets_a_mauve_panel_and_the_band_judges_mauve(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from mdlm_cli.sample.frontier import Quality, Reference
    from mdlm_cli.sample.frontier_plot import plot_frontier

    def row(steps, mauve):
        q = Quality(4, 30.0, 3.0, 0.1, 2.0, 2.8, 0.05, mauve=mauve, mauve_sd=0.02)
        return BenchRow("ancestral", steps, 4, "fp64", 4, 1, 0.1, 0.1, 0.1, 100.0, steps, 48.0, 10,
                        None, None, 0.9, 0.1, {}, q)

    band = {"gen_ppl": (25.0, 35.0), "entropy": (2.7, 2.9), "mauve": (0.8, 0.95)}
    report = BenchReport(meta={"model": "m", "length": L, "judge": "j"},
                         results=[row(10, 0.5), row(100, 0.9)])
    real = Quality(32, 30.0, 3.0, 0.01, 2.0, 2.8, 0.01, mauve=0.9)
    report.reference = Reference("test", L, 4, 8, real, band)
    assert [report.reference.contains(r.quality) for r in report.results] == [False, True]
    unmeasured = Quality(4, 30.0, 3.0, 0.1, 2.0, 2.8, 0.05)
    assert report.reference.contains(unmeasured)  # no MAUVE: judged on gen PPL and entropy
    figures = []
    original = plt.subplots
    try:
        plt.subplots = lambda *a, **k: figures.append(original(*a, **k)) or figures[-1]
        plot_frontier(report, str(tmp_path / "f.png"))
    finally:
        plt.subplots = original
    assert len(figures[0][1]) == 3 and figures[0][1][2].get_ylabel() == "MAUVE"


def test_default_rows_are_every_exact_sampler_of_the_objective(tmp_path):
    """MDLM's rows include SEDD's analytic sampler (through the SUBS -> score conversion): Table 10;
    the inexact samplers are frontier points, benchmarked when named."""
    from mdlm_cli.objectives import OBJECTIVES

    result = CliRunner().invoke(app, ["bench-sampler", "--preset", "test", "--steps", "3", "-n", "1",
                                      "--batch-size", "1", "--repeats", "1", "--json", str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    rows = {r["sampler"] for r in json.loads((tmp_path / "b.json").read_text())["results"]}
    assert rows == {n for n in OBJECTIVES["mdlm"].sampler_names if engine.SAMPLERS[n].exact}


def test_rows_report_network_calls_per_second_and_their_mfu():
    from mdlm_cli.perf import ModelFlops, Peak
    from mdlm_cli.sample.bench import run_bench

    counts = ModelFlops(matmul_params=1000, output_params=100)  # 2,000 FLOPs a token, 200 output
    draws = BenchDraws(num_samples=4, length=L, mask_id=V, repeats=1, seed=0, device=torch.device("cpu"))
    report = run_bench(tiny_denoiser(), sweep(["first-hitting"], [L], ["fp64"]), draws, batch_sizes=[2],
                       meta={}, speed=(counts, Peak(1e9, "test")))
    row = report.results[0]
    assert row.calls_per_second == pytest.approx(row.calls / (row.seconds_per_sample * 4))
    # every call runs all L positions and asks the output layer for the one it draws
    assert (row.input_tokens, row.output_rows) == (row.nfe * L, row.nfe)
    flops_per_s = (1800 * row.nfe * L + 200 * row.nfe) / row.seconds_per_sample
    assert row.mfu == pytest.approx(flops_per_s / 1e9)


def test_the_output_layer_counts_once_per_row_asked_for():
    from mdlm_cli.models.speed import model_flops

    model = tiny_denoiser().model
    counts = model_flops(model)
    assert counts.output_params == model.output_layer.linear.weight.numel() == (V + 1) * 32
    whole = counts.per_token(L, training=False) * L
    assert counts.sampling_call(L, L, output_rows=L) == whole  # every row asked for: a forward
    assert counts.sampling_call(L, L, output_rows=1) == whole - 2 * counts.output_params * (L - 1)


@pytest.mark.parametrize("net, width, dtype", [("fp32", 64, "fp32"), ("bf16", 64, "bf16 autocast"),
                                               ("auto", 64, "fp32"), ("auto", 192, "bf16 autocast")])
def test_the_network_precision_is_chosen_as_for_a_checkpoint(tmp_path, monkeypatch, net, width, dtype):
    monkeypatch.setenv("MDLM_CPU_BF16", "1")  # a CPU with bf16 units: auto follows the width rule
    out = tmp_path / "b.json"
    result = CliRunner().invoke(app, ["bench-sampler", "--preset", "test", "--set", f"model.hidden_size={width}",
                                      "--set", "model.n_heads=2", "--samplers", "first-hitting", "-n", "1",
                                      "--batch-size", "1", "--repeats", "1", "--net-precision", net,
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["meta"]["dtype"] == dtype


def test_the_real_text_row_puts_each_value_under_its_own_column():
    """The reference row leaves every speed column empty, whatever their number, so that its
    gen PPL sits under "gen PPL" and its MAUVE under "MAUVE"."""
    from types import SimpleNamespace

    from rich.table import Table

    from mdlm_cli.commands.bench import COLUMNS, QUALITY_COLUMNS, _add_reference_row

    table = Table(*COLUMNS, *QUALITY_COLUMNS)
    names = ("gen_ppl", "entropy", "dist_2", "self_bleu", "repetition_4", "mauve")
    q = SimpleNamespace(gen_ppl=3.5, nats_per_char=1.25, entropy=2.75, dist_2=0.875,
                        self_bleu=0.125, repetition_4=0.0, mauve=0.96875, mauve_sd=None)
    ref = SimpleNamespace(quality=q, band={n: (0.0, 9.0) for n in names}, split="test",
                          groups=8, per_group=32)
    _add_reference_row(table, ref)
    cell = {c.header: c._cells[0] for c in table.columns}
    assert cell["gen PPL"].startswith("3.50 [") and cell["nats/char"] == "1.2500"
    assert cell["MAUVE"].startswith("0.969 [") and cell["positions/call"] == ""
