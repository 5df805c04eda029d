"""bd3lm's clipped noise schedules: the intervals searched, the choice of least variance, and the
chosen interval on the record (metrics.jsonl) and in the checkpoint (state.json)."""

import json

import numpy as np
import torch

from mdlm_cli.build import resolve_config
from mdlm_cli.data.store import TokenSplit
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.models import build_model
from mdlm_cli.objectives import bd3lm as bd3lm_module
from mdlm_cli.objectives import get_objective
from mdlm_cli.objectives.clipping import candidate_intervals, select_interval

TOK = load_tokenizer("char")
CPU = torch.device("cpu")


def test_the_candidates_are_the_whole_interval_then_each_width_slid_by_delta():
    assert candidate_intervals([0.5], 0.25, 1e-3, 4) == [
        (1e-3, 1.0), (1e-3, 0.5), (0.25, 0.75), (0.5, 1.0)]
    # the reference's search widths: starts 0, 0.05, ..., 1 - w (11 of width 0.5, 3 of 0.9)
    intervals = candidate_intervals([0.5, 0.9], 0.05, 1e-3, 16)
    assert len(intervals) == 1 + 11 + 3 and intervals[11] == (0.5, 1.0)
    assert all(0 < lo < hi <= 1.0 for lo, hi in intervals)
    assert candidate_intervals([0.5], 0.05, 1e-3, 1) == [(1e-3, 1.0), (1.0, 1.0)]  # L' = 1


def test_the_least_variance_wins_and_a_tie_goes_to_the_first():
    table = {(1e-3, 1.0): 3.0, (1e-3, 0.5): 9.0, (0.25, 0.75): 1.5, (0.5, 1.0): 2.0}
    assert select_interval(table) == (0.25, 0.75)
    assert select_interval({(1e-3, 1.0): 1.0, (0.5, 1.0): 1.0}) == (1e-3, 1.0)


def objective_and_split(*extra: str):
    cfg = resolve_config("test", ["diffusion.objective=bd3lm", "diffusion.block_size=8", *extra])
    objective = get_objective(cfg, TOK)
    torch.manual_seed(0)
    model = build_model(cfg.model, TOK.vocab_size).eval()
    x0 = torch.randint(8, 35, (6, 32), generator=torch.Generator().manual_seed(4))
    return cfg, objective, model, TokenSplit(x0.numpy(), np.full(6, 32, dtype=np.int32))


def test_the_search_sets_the_training_interval_from_the_variance_table(monkeypatch):
    fake = {(1e-3, 1.0): 3.0, (1e-3, 0.5): 9.0, (0.25, 0.75): 1.5, (0.5, 1.0): 2.0}
    seen = {}

    def fake_table(block_losses, intervals, batches):
        seen["intervals"], seen["batches"] = list(intervals), batches
        assert block_losses(intervals[0], 0).shape == (2, 4)  # a batch's (B, K) block losses
        return fake

    monkeypatch.setattr(bd3lm_module, "variance_table", fake_table)
    _, objective, model, split = objective_and_split("diffusion.clip_search_widths=[0.5]",
                                                     "diffusion.clip_search_delta=0.25")
    record = objective.after_validation(objective.denoiser(model), split, batch_size=2,
                                        device=CPU, seed=0)
    assert seen == {"intervals": list(fake), "batches": 3}
    assert record["clip"] == [0.25, 0.75] and objective.training_state() == {"clip": [0.25, 0.75]}
    assert set(record["clip_variance"]) == {"0.001-1", "0.001-0.5", "0.25-0.75", "0.5-1"}
    t = objective.training_times(0)(50, torch.Generator().manual_seed(0))
    assert t.min() >= 0.25 and t.max() <= 0.75
    bound = objective.draw_times(0)(50, torch.Generator().manual_seed(0))
    assert bound.min() < 0.1 and bound.max() > 0.9  # evaluation keeps the whole interval
    _, resumed, _, _ = objective_and_split("diffusion.clip_search_widths=[0.5]")
    resumed.load_training_state(objective.training_state())
    assert resumed.clip == (0.25, 0.75)


def test_the_real_table_prefers_a_narrow_interval_away_from_t_0():
    """The 1/t weight makes small t noisy: the whole interval is never the least variance."""
    _, objective, model, split = objective_and_split("diffusion.clip_search_widths=[0.5]")
    record = objective.after_validation(objective.denoiser(model), split, batch_size=3,
                                        device=CPU, seed=0)
    variances = record["clip_variance"]
    assert min(variances, key=variances.get) == "{:g}-{:g}".format(*record["clip"])
    assert record["clip"] != [1e-3, 1.0] and variances["0.001-0.5"] > variances["0.5-1"]


def test_no_search_without_widths():
    _, objective, model, split = objective_and_split()
    assert objective.after_validation(objective.denoiser(model), split, batch_size=2,
                                      device=CPU, seed=0) is None
    assert objective.training_state() == {}


def test_training_logs_and_saves_the_chosen_interval(tmp_path):
    from mdlm_cli.train.loop import train

    cfg = resolve_config("test", [
        "diffusion.objective=bd3lm", "diffusion.block_size=8", "diffusion.clip_search_widths=[0.5]",
        f"train.out_dir={tmp_path / 'run'}", "train.max_steps=11", "train.eval_every=10",
        "train.eval_rows=16"])
    result = train(cfg)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    chosen = [r for r in records if "clip" in r]
    assert len(chosen) == 1 and chosen[0]["step"] == 10
    state = json.loads((result.checkpoint / "state.json").read_text())
    assert state["objective_state"] == {"clip": chosen[0]["clip"]}
