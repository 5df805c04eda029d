"""`mdlm rl` from the CLI: rollouts, rewards, the GRPO update of a fresh adapter (the reference
is the base with it off), the log and the adapter that every command takes; a reward that
fails is one line."""

import json

import pytest
import torch

from mdlm_cli.config import LoraConfig
from mdlm_cli.models.lora import adapters_off, add_lora, trainable
from mdlm_cli.rl.tasks import AdditionTask, write_addition_task
from tests.unit.test_lora import dit

from .conftest import invoke, one_line_error

pytest.importorskip("peft")

# a reward with spread on an untrained model: the completion's first letter in a..m
FIRST_HALF = r"format:^[a-m]"


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_addition_task(AdditionTask(max_digits=1, train=40, held_out=8),
                               tmp_path_factory.mktemp("add"))


def rl_args(base, task, out, *more):
    return ["rl", "-c", base, "--data", task["train"], "--held-out", task["held_out"],
            "--out", out, "--group", "4", "--prompts", "2", "--answer-tokens", "4",
            "--steps", "4", "--eval-every", "2", "--eval-rows", "4", *more]


@pytest.mark.parametrize("estimator", ["d1", "coupled"])
def test_rl_updates_the_adapter_logs_and_the_adapter_loads(trained_runs, task, tmp_path,
                                                          estimator):
    _, base = trained_runs
    out = tmp_path / "rl"
    text = invoke(*rl_args(base, task, out, "--max-steps", "3", "--reward", FIRST_HALF,
                           "--estimator", estimator, "--lr", "0.05"))
    assert "held-out reward" in text and "Done: 3 steps" in text
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert any(r["reward_std"] > 0 for r in steps)  # advantages, so a gradient
    assert any(r["kl"] > 0 for r in steps[1:])  # the policy moved away from the base
    summary = json.loads((out / "rl.json").read_text())
    assert summary["settings"]["estimator"] == estimator
    invoke("eval-ppl", "-c", base, "--adapter", out / "adapter", "--split", "valid",
           "--rows", "8")


def test_the_reference_is_the_base_with_the_adapter_off():
    base = dit()
    adapted = add_lora(dit(), LoraConfig(rank=2), "base").eval()
    with torch.no_grad():
        for _, p in trainable(adapted):
            p.add_(0.5)
        tokens = torch.arange(12).view(1, 12)
        assert not torch.allclose(adapted(tokens, None), base(tokens, None))
        with adapters_off(adapted):
            torch.testing.assert_close(adapted(tokens, None), base(tokens, None))
        assert not torch.allclose(adapted(tokens, None), base(tokens, None))


def test_bad_rl_input_is_one_line(trained_runs, task, tmp_path, monkeypatch):
    _, base = trained_runs
    module = tmp_path / "bad_reward.py"
    module.write_text("def fn(prompts, completions, **fields):\n    return [1.0]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "returned 1 values" in one_line_error(*rl_args(base, task, tmp_path / "o",
                                                          "--reward", "bad_reward:fn"))
    assert "has no option" in one_line_error(*rl_args(base, task, tmp_path / "o",
                                                      "--estimator-option", "p=1"))
    assert "--group must be at least 2" in one_line_error(
        *rl_args(base, task, tmp_path / "o", "--group", "1"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "empty.jsonl" in one_line_error(*rl_args(base, {**task, "train": empty},
                                                    tmp_path / "o"))
