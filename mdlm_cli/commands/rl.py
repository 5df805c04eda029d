"""`mdlm rl`: group-relative policy optimisation of a LoRA adapter on a diffusion LM, with a
reward; the loop is `rl.loop.train_rl`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import app
from .console import console, user_errors
from .loading import loading_command, loading_from
from .options import SeedOpt, float_in
from .sampling_args import SamplingCommand, sampling_from
from .sampling_parse import resolved

HELP = """Reinforcement learning with a reward (diffu-GRPO and its successors: docs/rl.md).

Rollouts are drawn with the sampling flags (any sampler); each step scores G rollouts of P
prompts, and trains a fresh LoRA adapter on the clipped-ratio loss with a k3 KL to the base
(the adapter switched off). The adapter is written in peft's format to OUT/adapter: use it
with --adapter on any command.

A --preset (presets/rl/*.yaml; d1-gsm8k is d1's LLaDA-8B-Instruct GSM8K run) gives the
defaults; flags given still win. --dry-run prints what would run.

[dim]Examples:[/]
  mdlm rl --preset d1-gsm8k --out runs/d1-gsm8k --dry-run
  mdlm rl -c runs/add-sft --data add/train.jsonl --held-out add/held_out.jsonl --out runs/add-rl
  mdlm rl -c LLADA --data gsm8k.jsonl --reward exact --estimator coupled --group 6 --out rl
  mdlm eval-ppl -c runs/add-sft --adapter runs/add-rl/adapter
"""

DataOpt = Annotated[str, typer.Option(help="Prompts: JSONL of prompt/response (the response "
                                           "is the reference a reward reads).")]
HeldOutOpt = Annotated[str | None, typer.Option(help="Held-out prompts (same format): the mean "
                                                     "reward of one completion each, logged.")]
RLOutOpt = Annotated[Path, typer.Option("--out", help="Folder for metrics.jsonl, rl.json and "
                                                      "the adapter.")]
RewardOpt = Annotated[list[str] | None, typer.Option(
    help="A reward, repeatable and summed: exact, exact:FIELD, format:REGEX, json:SCHEMA, "
         "length:N, pkg.module:function, each optionally W*SPEC.")]
EstimatorOptionOpt = Annotated[list[str] | None, typer.Option(
    "--estimator-option", metavar="KEY=VALUE",
    help="An option of the estimator, repeatable (d1: p_mask_prompt; coupled: t_low, t_high, "
         "full_pass; elbo: samples, schedule, antithetic).")]
RLEstimatorOpt = Annotated[str, typer.Option(
    "--estimator", help="Likelihood estimator of the policy: d1, coupled or elbo.")]

RLPresetOpt = Annotated[str | None, typer.Option(
    "--preset", is_eager=True, callback=lambda ctx, value: _preset(ctx, value),
    help="A configuration of this command (presets/rl/NAME.yaml or a .yaml path) as its "
         "defaults; flags given still win.")]
RLDryRunOpt = Annotated[bool, typer.Option(
    help="Print the resolved settings and stop: nothing is loaded or trained.")]
PromptTemplateOpt = Annotated[str, typer.Option(
    help="Each prompt's text in this template, at {prompt} (d1: its format instructions "
         "first).")]
LoraDropoutOpt = Annotated[float, typer.Option(help="Dropout on the adapter's input.",
                                               callback=float_in(0.0, 1.0, high_in=False))]
LoraQuantizeOpt = Annotated[str, typer.Option(
    help="none, or 4bit: the base in nf4 (QLoRA; CUDA and bitsandbytes only).")]
GroupOpt = Annotated[int, typer.Option(help="Rollouts per prompt (G).")]
RLPromptsOpt = Annotated[int, typer.Option(help="Prompts per step (P).")]
IterationsOpt = Annotated[int, typer.Option(help="Inner iterations per step (mu).")]
ClipOpt = Annotated[float, typer.Option(help="PPO clip epsilon.",
                                        callback=float_in(0.0, 1.0, low_in=False))]
BetaOpt = Annotated[float, typer.Option(help="k3 KL weight.", callback=float_in(0.0))]
KlMaxOpt = Annotated[float, typer.Option(
    help="Bound of each token's k3 KL term (verl's low_var_kl: 10); 0: unbounded, as d1.",
    callback=float_in(0.0))]
RLLrOpt = Annotated[float, typer.Option(help="AdamW learning rate of the adapter.",
                                         callback=float_in(0.0, low_in=False))]
RLMaxStepsOpt = Annotated[int, typer.Option(help="GRPO steps at most.")]
MinutesOpt = Annotated[float, typer.Option(help="Stop after this many minutes (0: off).",
                                           callback=float_in(0.0))]
AnswerTokensOpt = Annotated[int, typer.Option(help="Positions of each completion.")]
LoraRankOpt = Annotated[int, typer.Option(help="The adapter's rank r.")]
LoraAlphaOpt = Annotated[float, typer.Option(help="The adapter's alpha.",
                                             callback=float_in(0.0, low_in=False))]
EvalEveryOpt = Annotated[int, typer.Option(help="Steps between held-out rewards.")]
SaveEveryOpt = Annotated[int, typer.Option(help="Steps between the states --resume goes on "
                                                "from (OUT/resume; also saved at the end).")]
RLResumeOpt = Annotated[bool, typer.Option(help="Go on from OUT's saved state, with the same "
                                                "settings (max steps, minutes and cadences may "
                                                "change).")]
RLEvalRowsOpt = Annotated[int, typer.Option(help="Held-out prompts scored.")]


@app.command("rl", help=HELP, cls=loading_command(SamplingCommand))
def rl_cmd(
    ctx: typer.Context,
    data: DataOpt,
    out: RLOutOpt,
    preset: RLPresetOpt = None,
    dry_run: RLDryRunOpt = False,
    held_out: HeldOutOpt = None,
    reward: RewardOpt = None,
    estimator: RLEstimatorOpt = "d1",
    estimator_option: EstimatorOptionOpt = None,
    group: GroupOpt = 6,
    prompts: RLPromptsOpt = 4,
    iterations: IterationsOpt = 2,
    clip: ClipOpt = 0.5,
    beta: BetaOpt = 0.04,
    kl_max: KlMaxOpt = 10.0,
    lr: RLLrOpt = 1e-4,
    max_steps: RLMaxStepsOpt = 100,
    minutes: MinutesOpt = 0.0,
    answer_tokens: AnswerTokensOpt = 16,
    prompt_template: PromptTemplateOpt = "{prompt}",
    lora_rank: LoraRankOpt = 16,
    lora_alpha: LoraAlphaOpt = 32.0,
    lora_dropout: LoraDropoutOpt = 0.0,
    lora_quantize: LoraQuantizeOpt = "none",
    eval_every: EvalEveryOpt = 10,
    eval_rows: RLEvalRowsOpt = 64,
    save_every: SaveEveryOpt = 100,
    resume: RLResumeOpt = False,
    seed: SeedOpt = 0,
) -> None:
    sampling, loading = sampling_from(ctx), loading_from(ctx)
    with user_errors():
        settings = _settings(ctx.params)
        (_show if dry_run else _run)(settings, loading, sampling)


def _run(settings, loading, sampling) -> None:
    from ..rl.loop import Policy, train_rl

    loaded, rt = loading.load()
    policy = Policy(loaded, rt, resolved(sampling, loaded))
    summary = train_rl(policy, settings, loading.checkpoint, on_step=_print)
    console.print(f"Done: {summary['steps']} steps in {summary['seconds']:.0f} s; adapter in "
                  f"{settings.out / 'adapter'}", markup=False, highlight=False)


def _settings(params: dict):
    """RLSettings from the command's own values (the loading and sampling groups are taken
    out before): the fields of the same name, the repeated and the LoRA flags gathered."""
    import dataclasses

    from ..config import LoraConfig
    from ..config.checks import check_choice
    from ..config.sections import QUANTIZE
    from ..rl.loop import RLSettings

    check_choice(params["lora_quantize"], QUANTIZE, "--lora-quantize")
    same = {f.name for f in dataclasses.fields(RLSettings)} & set(params)
    return RLSettings(
        **{k: params[k] for k in same - {"reward", "estimator_options", "lora"}},
        reward=tuple(params["reward"] or ["exact"]),
        estimator_options=_options(params["estimator_option"] or []),
        lora=LoraConfig(rank=params["lora_rank"], alpha=params["lora_alpha"],
                        dropout=params["lora_dropout"], quantize=params["lora_quantize"]),
    ).validate()


def _preset(ctx: typer.Context, value: str | None) -> str | None:
    """--preset's values become the command's defaults (click's default_map), so a flag given on
    the command line still wins; read before the other options are."""
    if value is None or ctx.resilient_parsing:
        return value
    from ..rl.presets import read_rl_preset

    valid = {p.name for p in ctx.command.params} - {"preset", "dry_run"}
    with user_errors():
        ctx.default_map = {**(ctx.default_map or {}), **read_rl_preset(value, valid)}
    return value


def _show(settings, loading, sampling) -> None:
    """--dry-run's report: the checkpoint, the RL settings and the rollouts' sampling flags."""
    import dataclasses
    import json

    record = {"checkpoint": loading.checkpoint, **dataclasses.asdict(settings),
              "sampling": dataclasses.asdict(sampling) if dataclasses.is_dataclass(sampling)
              else str(sampling)}
    console.print(json.dumps(record, indent=2, default=str), markup=False, highlight=False,
                  soft_wrap=True)
    console.print("Dry run: nothing loaded or trained.", markup=False, highlight=False)


def _options(given: list[str]) -> dict:
    """KEY=VALUE pairs, each value read as YAML (0.1, true, loglinear)."""
    import yaml

    from ..errors import MdlmError

    out = {}
    for pair in given:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise MdlmError(f"--estimator-option takes KEY=VALUE (got {pair!r})")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _print(step: int, record: dict) -> None:
    if "held_out_reward" in record:
        line = f"step {step}: held-out reward {record['held_out_reward']:.3f}"
    else:
        line = (f"step {step}: reward {record['reward_mean']:.3f} ± "
                f"{record['reward_std']:.3f}, "
                f"KL {record['kl']:.4f}, clipped {record['clip_fraction']:.3f}, "
                f"{record['tokens_per_s']:.0f} tokens/s")
    console.print(line, markup=False, highlight=False)
