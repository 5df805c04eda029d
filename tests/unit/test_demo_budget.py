"""`make demo` stays within its time budget on any CPU: its schedule is fitted to
`train.time_budget` minutes by the run's own clock (train/budget.py; tested in
tests/integration/test_time_budget.py), at most 9 of the 15 minutes `make demo` may take, so
set-up, data, the final validation, sampling and the infill fit in the rest. Counted in
tokens: the cap on steps must not end the demo early on the fastest CPU measured (2 Xeon cores
with AMX, bf16 and compiled: 20,703 tokens/s for the 4x192 DiT, BENCHMARKS.md table 13), or
the budget would not be what decides. Its AR twin (`make demo-ar`) trains for the same minutes;
the table `demo` trains the four objectives on the same fixed tokens."""

from pathlib import Path

from mdlm_cli import recipes
from mdlm_cli.build import resolve_config
from mdlm_cli.commands.app import command_flags

FASTEST_CPU_TOKENS_PER_S = 21_000  # above the measured 20,703
TRAINING_BUDGET_MIN = 9  # of `make demo`'s 15 minutes


def tokens(cfg, steps: int | None = None) -> int:
    return (steps or cfg.train.max_steps) * cfg.train.global_batch_size * cfg.data.length


def test_make_demo_trains_for_its_budget_and_the_cap_does_not_cut_it_short():
    cfg = resolve_config("demo")
    assert 0 < cfg.train.time_budget <= TRAINING_BUDGET_MIN
    cap_minutes = tokens(cfg) / FASTEST_CPU_TOKENS_PER_S / 60
    assert cap_minutes > cfg.train.time_budget, (
        f"the demo's cap of {cfg.train.max_steps} steps ends it after {cap_minutes:.1f} min on "
        f"the fastest CPU measured, before its {cfg.train.time_budget:g}-minute budget")


def test_the_ar_twin_trains_as_long_and_the_table_on_the_same_tokens():
    demo = resolve_config("demo")
    twin = resolve_config("demo-ar")
    assert (twin.train.time_budget, tokens(twin)) == (demo.train.time_budget, tokens(demo))
    models = recipes.load_recipe("demo", command_flags).models
    table_tokens = {name: tokens(resolve_config(m.preset, m.overrides), m.max_steps)
                    for name, m in models.items()}
    assert len(set(table_tokens.values())) == 1, table_tokens
    for name, m in models.items():
        cfg = resolve_config(m.preset, m.overrides)
        assert cfg.train.time_budget == 0, name  # fixed tokens: the objectives compare
        assert (cfg.model.hidden_size, cfg.model.n_blocks) == (
            demo.model.hidden_size, demo.model.n_blocks), name


def test_the_makefile_runs_what_the_budget_counts():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    demo = makefile.split("\ndemo: ")[1].split("\n\n")[0]
    assert "train --preset demo " in demo and "--infill" in demo
    assert "train --preset demo-ar" not in demo  # the twin is `make demo-ar`, outside the budget
    assert "train --preset demo-ar " in makefile.split("\ndemo-ar: ")[1].split("\n\n")[0]
