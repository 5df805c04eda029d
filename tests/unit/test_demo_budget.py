"""`make demo` stays within its time budget on a 2-core CPU, counted in tokens (not timed): the
demo and its AR twin together train on at most 10 minutes' worth of tokens at the fp32 speed
measured for the demo on 2 idle cores (BENCHMARKS.md, table 13: 8,700-8,900 tokens/s; bf16
autocast, where the CPU has bf16 units, is 1.5x faster)."""

from pathlib import Path

from mdlm_cli.build import resolve_config

FP32_TOKENS_PER_S = 8_700  # the slower of the measured fp32 runs
TRAINING_BUDGET_S = 10 * 60  # of `make demo`'s 15 minutes; set-up, data, sampling take the rest


def training_tokens(preset: str) -> int:
    cfg = resolve_config(preset)
    return cfg.train.max_steps * cfg.train.global_batch_size * cfg.data.length


def test_make_demo_trains_within_its_budget():
    tokens = training_tokens("demo") + training_tokens("demo-ar")
    assert tokens / FP32_TOKENS_PER_S <= TRAINING_BUDGET_S, (
        f"demo + demo-ar train on {tokens:,} tokens: {tokens / FP32_TOKENS_PER_S / 60:.1f} min at "
        f"{FP32_TOKENS_PER_S:,} tokens/s, over the {TRAINING_BUDGET_S / 60:.0f}-minute budget")


def test_the_makefile_runs_what_the_budget_counts():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "train --preset demo " in makefile and "train --preset demo-ar " in makefile
    assert "--infill" in makefile
