import json

import torch
from typer.testing import CliRunner

from mdlm_cli import engine
from mdlm_cli.bench import BenchRow, TimedDenoiser, WholeBatchCount, run_config
from mdlm_cli.cli import app
from mdlm_cli.config import ModelConfig
from mdlm_cli.engine.schedules import LogLinear
from mdlm_cli.models import DiffusionDenoiser, DiT

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
        row = run_config(den, sampler=sampler, steps=steps, batch_size=2, precision="fp64", num_samples=4,
                         length=L, mask_id=V, repeats=2, seed=0, device=torch.device("cpu"))
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


def test_default_rows_are_every_sampler_of_the_objective():
    """MDLM's rows include SEDD's analytic sampler (through the SUBS -> score conversion): Table 10."""
    result = CliRunner().invoke(app, ["bench-sampler", "--preset", "test", "--steps", "3", "-n", "1",
                                      "--batch-size", "1", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert all(name in result.output for name in ("ancestral-cache", "first-hitting", "analytic"))
