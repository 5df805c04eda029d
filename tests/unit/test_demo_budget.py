"""`make demo` stays within its time budget on a 2-core CPU, counted in tokens (not timed): the
demo trains on at most 9 minutes' worth of tokens at the speed its model measured on 2 idle
AMD EPYC cores without bf16 units (fp32, BENCHMARKS.md, "The demo recipe": 5,227 tokens/s for
the 4x192 DiT; CPUs with AMX are faster), so set-up, data, sampling and the infill fit in 15
minutes. Its AR twin (`make demo-ar`) trains on the same tokens."""

from pathlib import Path

from mdlm_cli.build import resolve_config

DEMO_TOKENS_PER_S = 5_000  # below the measured 5,227
TRAINING_BUDGET_S = 9 * 60  # of `make demo`'s 15 minutes


def training_tokens(preset: str) -> int:
    cfg = resolve_config(preset)
    return cfg.train.max_steps * cfg.train.global_batch_size * cfg.data.length


def test_make_demo_trains_within_its_budget():
    tokens = training_tokens("demo")
    assert tokens / DEMO_TOKENS_PER_S <= TRAINING_BUDGET_S, (
        f"demo trains on {tokens:,} tokens: {tokens / DEMO_TOKENS_PER_S / 60:.1f} min at "
        f"{DEMO_TOKENS_PER_S:,} tokens/s, over the {TRAINING_BUDGET_S / 60:.0f}-minute budget")


def test_the_ar_twin_and_the_baselines_train_on_the_demo_tokens_with_its_blocks():
    demo = resolve_config("demo")
    for preset in ("demo-ar", "demo-sedd", "demo-d3pm"):
        cfg = resolve_config(preset)
        assert training_tokens(preset) == training_tokens("demo"), preset
        assert (cfg.model.hidden_size, cfg.model.n_blocks) == (
            demo.model.hidden_size, demo.model.n_blocks), preset


def test_the_makefile_runs_what_the_budget_counts():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    demo = makefile.split("\ndemo: ")[1].split("\n\n")[0]
    assert "train --preset demo " in demo and "--infill" in demo
    assert "train --preset demo-ar" not in demo  # the twin is `make demo-ar`, outside the budget
    assert "train --preset demo-ar " in makefile.split("\ndemo-ar: ")[1].split("\n\n")[0]
