"""`mdlm rl`'s loop: group-relative policy optimisation of a diffusion LM's LoRA adapter
(d1's diffu-GRPO and its successors, through the estimators' registry).

Each step: P prompts from the data set, G rollouts each drawn with the chosen sampler (the
policy, adapters on, no gradient), their rewards and group advantages; then mu inner
iterations, each with one mask seed shared by the policy, the old policy (the adapters as they
were when the rollouts were drawn) and the reference (the base: adapters off, nothing copied),
the clipped-ratio loss with k3 KL, one AdamW step each. A prompt's G rows share a length and
are scored together; the loss is averaged over the P groups. Held-out exact reward is measured
every `eval_every` steps on a fixed seed; metrics.jsonl, the adapter (peft's folder format)
and rl.json go to the output folder.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..config import LoraConfig
from ..errors import MdlmError
from ..models.lora import adapters_off, add_lora, prepare_base, trainable, write_adapter
from ..runtime import derive_seed
from .estimators import denoiser_logits, estimate, estimator_options, iteration_seeds
from .grpo import GrpoTerms, group_advantages, grpo_loss, scored_through_eos
from .rewards import load_reward
from .rollouts import Policy, completions_text, fill_template, read_prompts, rollouts
from .run_state import (
    RunState,
    check_out,
    restore_state,
    run_record,
    save_state,
    settings_record,
)


@dataclass(frozen=True)
class RLSettings:
    """`mdlm rl`'s choices (its flags)."""

    data: str  # JSONL of prompt/response (data/sft.py), or a registered example set
    out: Path
    reward: tuple[str, ...] = ("exact",)
    held_out: str | None = None  # the same format: exact reward measured on it
    estimator: str = "d1"
    # the estimator's options (rl.estimator_options), e.g. {"p_mask_prompt": 0.0}
    estimator_options: dict = field(default_factory=dict)
    group: int = 6  # G rollouts a prompt (d1: 6)
    prompts: int = 4  # P prompts a step
    iterations: int = 2  # mu inner iterations a step (d1: 12)
    clip: float = 0.5
    beta: float = 0.04
    kl_max: float = 10.0  # each token's k3 bounded here (0: unbounded, as d1)
    scale_rewards: bool = False  # divide advantages by the group's std (d1: no)
    lr: float = 1e-4
    max_steps: int = 100
    minutes: float = 0.0  # stop after this much time (0: max_steps only)
    answer_tokens: int = 16  # the completion's positions
    prompt_template: str = "{prompt}"  # each prompt's text in it (d1: its system prompt first)
    lora: LoraConfig = field(default_factory=lambda: LoraConfig(rank=16, alpha=32.0))
    eval_every: int = 10
    eval_rows: int = 64
    save_every: int = 100  # steps between the saved states --resume goes on from
    resume: bool = False  # go on from the folder's saved state (run_state.py)
    seed: int = 0

    def validate(self) -> RLSettings:
        for name in ("group", "prompts", "iterations", "max_steps", "answer_tokens",
                     "eval_every", "eval_rows", "save_every"):
            if getattr(self, name) < 1:
                raise MdlmError(f"--{name.replace('_', '-')} must be at least 1")
        if self.group < 2:
            raise MdlmError("--group must be at least 2: an advantage is a reward against its "
                            "group's mean")
        estimator_options(self.estimator, **self.estimator_options)  # one line if wrong
        if "{prompt}" not in self.prompt_template:
            raise MdlmError(f"--prompt-template {self.prompt_template!r} must hold {{prompt}}, "
                            "where each example's prompt goes")
        fill_template(self.prompt_template, "")
        self.terms.validate()
        if self.lora.rank < 1:
            raise MdlmError("--lora-rank must be at least 1: mdlm rl trains an adapter (the "
                            "reference is the base with it off)")
        return self

    @property
    def terms(self) -> GrpoTerms:
        return GrpoTerms(clip=self.clip, beta=self.beta, kl_max=self.kl_max)


@dataclass
class Group:
    """One prompt's rollouts, ready to score."""

    tokens: Tensor  # (G, L)
    completion: Tensor  # (G, L) bool
    scored: Tensor  # (G, L) bool: through the first EOS
    advantages: Tensor  # (G,)
    old: list[Tensor | None]  # per inner iteration: the old policy's estimate (None: the first)
    ref: list[Tensor]


def logp(policy: Policy, group: Group, settings: RLSettings, seed: int) -> Tensor:
    loaded = policy.loaded
    fn = denoiser_logits(loaded.denoiser(policy.rt.dtype))
    return estimate(settings.estimator, fn, group.tokens, group.completion,
                    mask_id=loaded.mask_id, seed=seed, **settings.estimator_options).logp


def prepare_group(policy: Policy, tokens: Tensor, start: int, advantages: Tensor,
                  settings: RLSettings, seeds: list[int]) -> Group:
    completion = torch.zeros_like(tokens, dtype=torch.bool)
    completion[:, start:] = True
    scored = scored_through_eos(tokens, completion, policy.end_ids)
    group = Group(tokens, completion, scored, advantages, [], [])
    model = policy.loaded.model
    model.eval()  # dropout off: the three policies see the same network
    with torch.no_grad():
        group.old = [None] + [logp(policy, group, settings, s) for s in seeds[1:]]
        with adapters_off(model):
            group.ref = [logp(policy, group, settings, s) for s in seeds]
    return group


def held_out_reward(policy: Policy, held: list[tuple[list[int], dict]], reward,
                    settings: RLSettings) -> float:
    """The mean reward of one completion per held-out prompt (seed fixed: comparable steps)."""
    scores, rows = [], held[: settings.eval_rows]
    drawn = rollouts(policy, [ids for ids, _ in rows], 1, settings.answer_tokens, settings.seed)
    for (ids, fields), tokens in zip(rows, drawn, strict=True):
        text = completions_text(policy, tokens, len(ids))
        scores += reward([fields.get("prompt", "")], text,
                         **{k: [v] for k, v in fields.items()})
    return sum(scores) / len(scores)


def adapt_policy(policy: Policy, settings: RLSettings, checkpoint: str) -> torch.optim.Optimizer:
    """The policy's module adapted (a fresh adapter on the base, as `mdlm train`'s LoRA runs
    hold it: bf16 where the run computes in bf16, nf4 with 4-bit) and its optimizer."""
    loaded = policy.loaded
    base = prepare_base(loaded.model, settings.lora, policy.rt)
    with torch.random.fork_rng(devices=[]):  # peft draws A from torch's RNG: --seed fixes it
        torch.manual_seed(settings.seed)
        loaded.model = add_lora(base, settings.lora, checkpoint)
    params = [p for _, p in trainable(loaded.model)]
    return torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)


def step(policy: Policy, optimizer, batch: list[tuple[list[int], dict]], reward,
         settings: RLSettings, seed: int) -> dict:
    """One GRPO step over `batch`'s prompts; returns its log record."""
    loaded, g = policy.loaded, settings.group
    seeds = iteration_seeds(settings.iterations, torch.Generator().manual_seed(seed))
    groups, rewards = [], []
    drawn = rollouts(policy, [ids for ids, _ in batch], g, settings.answer_tokens, seed)
    for (ids, fields), tokens in zip(batch, drawn, strict=True):
        start = len(ids)
        text = completions_text(policy, tokens, start)
        values = reward([fields.get("prompt", "")] * g, text,
                        **{k: [v] * g for k, v in fields.items()})
        r = torch.tensor(values, dtype=torch.float32)
        adv = group_advantages(r, g, scale=settings.scale_rewards).to(tokens.device)
        groups.append(prepare_group(policy, tokens, start, adv, settings, seeds))
        rewards += values
    stats = []
    loaded.model.train()
    for i, s in enumerate(seeds):
        # dropout's draws (the adapter's, the model's) from a stream of the step and iteration:
        # a resumed run draws what the uninterrupted one drew
        torch.manual_seed(derive_seed(settings.seed, "rl-dropout", seed, i))
        for group in groups:
            new = logp(policy, group, settings, s)
            loss, st = grpo_loss(new, group.old[i], group.ref[i], group.advantages,
                                 group.scored, settings.terms)
            if not torch.isfinite(loss):  # before it reaches the weights: nothing is lost
                raise MdlmError(f"the RL loss became {float(loss)} (the KL to the base "
                                f"overflowed, {float(st.kl):.3g}); lower --lr, raise "
                                "--beta or bound it with --kl-max")
            (loss / len(groups)).backward()
            stats.append(st)
        torch.nn.utils.clip_grad_norm_([p for _, p in trainable(loaded.model)], 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    mean = sum(rewards) / len(rewards)
    return {"reward_mean": mean,
            "reward_std": math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards)),
            "kl": float(sum(float(s.kl) for s in stats) / len(stats)),
            "clip_fraction": float(sum(float(s.clip_fraction) for s in stats) / len(stats)),
            "tokens": sum(int(gr.tokens.numel()) for gr in groups)}


def train_rl(policy: Policy, settings: RLSettings, checkpoint: str,
             on_step: Callable[[int, dict], None]) -> dict:
    """The loop; returns rl.json's record (written with the adapter into settings.out). With
    `settings.resume` it goes on from the folder's saved state (run_state.py)."""
    settings = settings.validate()
    out, resume = settings.out, settings.resume
    check_out(out, resume)
    tokenizer = policy.loaded.tokenizer
    examples = read_prompts(settings.data, tokenizer, settings.prompt_template)
    held = (read_prompts(settings.held_out, tokenizer, settings.prompt_template)
            if settings.held_out else [])
    reward = load_reward(list(settings.reward))
    optimizer = adapt_policy(policy, settings, checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    run = run_record(settings, checkpoint, policy.sampling)
    state = (restore_state(out, policy.loaded.model, optimizer, run, settings.eval_every)
             if resume else RunState())
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(settings.seed))
    t0 = time.perf_counter() - state.elapsed_s
    with (out / "metrics.jsonl").open("a" if resume else "w") as log:

        def evaluate(n: int) -> None:
            if held:
                state.evals.append({"step": n, "held_out_reward": held_out_reward(
                    policy, held, reward, settings)})
                log.write(json.dumps(state.evals[-1]) + "\n")
                on_step(n, state.evals[-1])

        if not resume:
            evaluate(0)
        while state.step < settings.max_steps:
            if settings.minutes and time.perf_counter() - t0 > 60 * settings.minutes:
                break
            n = state.step
            picks = [int(order[(n * settings.prompts + k) % len(examples)])
                     for k in range(settings.prompts)]
            record = step(policy, optimizer, [examples[i] for i in picks], reward, settings,
                          settings.seed + n)
            state.step, state.seen = n + 1, state.seen + record["tokens"]
            state.elapsed_s = time.perf_counter() - t0
            record.update(step=state.step, elapsed_s=state.elapsed_s,
                          tokens_per_s=state.seen / max(state.elapsed_s, 1e-9))
            log.write(json.dumps(record) + "\n")
            log.flush()
            on_step(state.step, record)
            if state.step % settings.eval_every == 0 and state.step < settings.max_steps:
                evaluate(state.step)
            if state.step % settings.save_every == 0:
                save_state(out, policy.loaded.model, optimizer, state, run)
        if not state.evals or state.evals[-1]["step"] != state.step:
            evaluate(state.step)
    return finish(policy, optimizer, settings, run, state)


def finish(policy: Policy, optimizer, settings: RLSettings, run: dict, state: RunState) -> dict:
    """The final adapter, the saved state and rl.json; returns rl.json's record."""
    out = settings.out
    save_state(out, policy.loaded.model, optimizer, state, run)
    (out / "adapter").mkdir(exist_ok=True)
    write_adapter(policy.loaded.model, out / "adapter")
    summary = {"checkpoint": run["checkpoint"], "steps": state.step, "seconds": state.elapsed_s,
               "held_out": state.evals, "settings": settings_record(settings)}
    (out / "rl.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary
