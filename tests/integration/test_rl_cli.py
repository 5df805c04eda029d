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


def test_the_d1_preset_validates_and_flags_given_win(tmp_path):
    """presets/rl/d1-gsm8k.yaml is d1's run as flags: it resolves without loading anything, and
    a flag on the command line replaces the preset's value."""
    text = invoke("rl", "--preset", "d1-gsm8k", "--out", tmp_path / "d1", "--dry-run")
    record = json.loads(text[: text.rindex("}") + 1])
    assert record["checkpoint"] == "GSAI-ML/LLaDA-8B-Instruct" and record["data"] == "gsm8k"
    assert (record["group"], record["iterations"], record["clip"], record["beta"]) == (6, 12, 0.5,
                                                                                      0.04)
    assert record["estimator_options"] == {"p_mask_prompt": 0.15} and record["kl_max"] == 0
    assert record["lora"]["rank"] == 128 and record["lora"]["quantize"] == "4bit"
    assert record["sampling"]["steps"] == 128 and record["sampling"]["temperature"] == 0.9
    assert record["sampling"]["options"] == {"k_schedule": "llada", "block_length": 32}
    assert record["prompt_template"].endswith("</answer>\n\n\n{prompt}")
    assert "Dry run" in text and not (tmp_path / "d1").exists()
    text = invoke("rl", "--preset", "d1-gsm8k", "--out", tmp_path / "d1", "--dry-run",
                  "--group", "4", "--steps", "64")
    record = json.loads(text[: text.rindex("}") + 1])
    assert record["group"] == 4 and record["sampling"]["steps"] == 64


def test_bad_presets_templates_and_quantization_are_one_line(trained_runs, task, tmp_path):
    _, base = trained_runs
    assert "unknown rl preset 'nope'; choose one of: d1-gsm8k" in one_line_error(
        "rl", "--preset", "nope", "--out", tmp_path / "o")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: x.jsonl\ngroop: 3\n")
    assert "unknown option groop" in one_line_error("rl", "--preset", bad, "--out", tmp_path)
    assert "must hold {prompt}" in one_line_error(
        *rl_args(base, task, tmp_path / "o", "--prompt-template", "no field"))
    assert "no other field" in one_line_error(
        *rl_args(base, task, tmp_path / "o", "--prompt-template", "{prompt} {x}"))
    clash = tmp_path / "clash.jsonl"
    clash.write_text(json.dumps({"prompt": "a", "response": "b", "completions": 1}) + "\n")
    assert "a field named 'completions' clashes" in one_line_error(
        *rl_args(base, {**task, "train": clash}, tmp_path / "o"))
    assert "--lora-quantize must be one of" in one_line_error(
        *rl_args(base, task, tmp_path / "o", "--lora-quantize", "8bit"))
    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in one_line_error(
            *rl_args(base, task, tmp_path / "o", "--lora-quantize", "4bit"))
    assert not (tmp_path / "o" / "adapter").exists()


def test_rewards_see_the_data_sets_fields_and_the_templated_prompt(trained_runs, tmp_path,
                                                                  monkeypatch):
    """A field beyond prompt/response (here `target`) reaches the reward, one value per
    completion; --prompt-template changes the prompt the model sees, not the one rewards get."""
    _, base = trained_runs
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"b{i}", "response": "c", "target": i}) + "\n"
                            for i in range(4)))
    module = tmp_path / "seen_reward.py"
    module.write_text("SEEN = []\n"
                      "def fn(prompts, completions, **fields):\n"
                      "    SEEN.append((list(prompts), list(fields['target'])))\n"
                      "    return [float(c[:1] < 'm') for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import seen_reward

    invoke("rl", "-c", base, "--data", data, "--out", tmp_path / "rl", "--group", "2",
           "--prompts", "1", "--answer-tokens", "4", "--steps", "4", "--max-steps", "2",
           "--reward", "seen_reward:fn", "--prompt-template", "a {prompt}")
    assert len(seen_reward.SEEN) == 2
    for prompts, targets in seen_reward.SEEN:
        assert len(set(targets)) == 1 and len(targets) == 2  # a prompt's value, G times
        assert prompts == [f"b{targets[0]}"] * 2


def test_a_resumed_rl_run_takes_the_steps_an_uninterrupted_one_takes(trained_runs, task,
                                                                    tmp_path):
    """2 steps, then --resume to 4, against 4 steps at once: the same records for steps 3 and
    4 (rewards, KL, clip fraction: the same rollouts and the same adapter and optimizer), and
    the same adapter at the end."""
    from safetensors.torch import load_file

    _, base = trained_runs
    more = ("--reward", FIRST_HALF, "--lr", "0.05", "--save-every", "2", "--eval-every", "3",
            "--lora-dropout", "0.2")  # dropout's draws must be the uninterrupted run's too
    whole, split = tmp_path / "whole", tmp_path / "split"
    invoke(*rl_args(base, task, whole, "--max-steps", "4", *more))
    invoke(*rl_args(base, task, split, "--max-steps", "2", *more))
    assert "already holds an RL run" in one_line_error(
        *rl_args(base, task, split, "--max-steps", "4", *more))
    assert "--resume: group was 4 in this run, now 3" in one_line_error(
        *rl_args(base, task, split, "--max-steps", "4", *more, "--resume", "--group", "3"))
    assert "--resume: sampling was" in one_line_error(
        *rl_args(base, task, split, "--max-steps", "4", *more, "--resume", "--temperature", "0.5"))
    invoke(*rl_args(base, task, split, "--max-steps", "4", *more, "--resume"))

    def records(folder):  # every record but the clock's
        lines = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")}
                for r in lines]

    # held-out at 0 and 3 (the cadence) and 4 (the end): the stop at 2 left no score behind
    assert [(r["step"], "held_out_reward" in r) for r in records(split)] == [
        (0, True), (1, False), (2, False), (3, False), (3, True), (4, False), (4, True)]
    for got, want in zip(records(split), records(whole), strict=True):
        assert got == pytest.approx(want)
    a = load_file(whole / "adapter" / "adapter_model.safetensors")
    b = load_file(split / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((split / "rl.json").read_text())["steps"] == 4
    assert "holds no saved RL state" in one_line_error(
        *rl_args(base, task, tmp_path / "fresh", "--resume"))
