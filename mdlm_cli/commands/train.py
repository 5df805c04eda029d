"""`mdlm train`."""

from __future__ import annotations

import math
from typing import Annotated

import typer
from rich.markup import escape

from ..build import config_yaml, resolve_config
from .app import app
from .console import console, err_console, user_errors
from .options import DeviceOpt, PresetOpt, SetOpt, ThreadsOpt, float_in, net_precision

TrainOutOpt = Annotated[str | None, typer.Option(help="Run folder (default runs/<preset>).")]
ResumeOpt = Annotated[bool, typer.Option(
    help="Continue the run in --out from its latest checkpoint (start it if there is none).")]
MaxStepsOpt = Annotated[int | None, typer.Option(help="Optimizer steps.")]
TrainSeedOpt = Annotated[int | None, typer.Option(help="Random seed.")]
TimeLimitOpt = Annotated[float, typer.Option(
    help="Stop after this many minutes (0 = no limit).", callback=float_in(0))]
TimeBudgetOpt = Annotated[float | None, typer.Option(
    help="train.time_budget: fit the schedule to this many minutes of training (max_steps "
         "becomes what the run's measured speed allows, at most --max-steps; 0 = off).",
    callback=float_in(0))]
PrintConfigOpt = Annotated[bool, typer.Option(help="Print the resolved config.")]
OverrideResumeOpt = Annotated[bool, typer.Option(
    help="With --resume: continue although the data, model, objective, optimisation or batch "
         "settings differ from the checkpoint's (the change is recorded in metrics.jsonl).")]
TrainPrecisionOpt = Annotated[str | None, typer.Option(
    callback=net_precision,
    help="train.precision: auto = bf16 autocast on CUDA and on CPUs with bf16 matrix units "
         "(AMX / AVX512-BF16), fp32 elsewhere.")]
HELP = """Train a masked diffusion LM. With no options: the offline demo on this machine.

    Under torchrun it trains data-parallel on every rank (DDP; --set train.parallel=fsdp for FSDP2).
    SIGTERM saves a checkpoint after the current step and exits (continue with --resume).
    One trainer per run folder (a lock); --resume of a finished run changes nothing.

    [dim]Examples:[/]
      mdlm train                                   # demo: 8 minutes of training, offline
      mdlm train --preset test --max-steps 20      # seconds
      mdlm train --preset demo --time-budget 3     # the demo's schedule fitted to 3 minutes
      mdlm train --preset owt --set train.micro_batch_size=32
      mdlm train --preset demo --resume            # continue runs/demo
      torchrun --nproc-per-node 8 -m mdlm_cli train --preset owt --resume   # 8 GPUs
    """


@app.command("train", help=HELP)
def train_cmd(
    preset: PresetOpt = "demo",
    overrides: SetOpt = None,
    out: TrainOutOpt = None,
    resume: ResumeOpt = False,
    max_steps: MaxStepsOpt = None,
    device: DeviceOpt = None,
    seed: TrainSeedOpt = None,
    time_limit: TimeLimitOpt = 0.0,
    time_budget: TimeBudgetOpt = None,
    print_config: PrintConfigOpt = True,
    override_resume_config: OverrideResumeOpt = False,
    threads: ThreadsOpt = None,
    precision: TrainPrecisionOpt = None,
) -> None:
    from ..distributed import is_main_process
    from ..train.init_from import check_source
    from ..train.loop import train
    from ..train.memory_check import check_train_memory

    with user_errors():
        cfg = resolve_config(preset, overrides or [], {
            "train.out_dir": out, "train.max_steps": max_steps, "train.device": device,
            "train.seed": seed, "train.threads": threads,
            "train.precision": precision, "train.time_budget": time_budget})
        if print_config and is_main_process():
            err_console.rule(f"config: {escape(cfg.name)}")
            err_console.print(config_yaml(cfg).rstrip(), highlight=False, markup=False)
            err_console.rule()
        if cfg.train.init_from and not resume:  # before the memory check measures its model
            check_source(cfg.train.init_from)
        check_train_memory(cfg)
        result = train(cfg, resume=resume, console=err_console, time_limit_s=time_limit * 60,
                       override_resume_config=override_resume_config)
        if is_main_process():
            _report(result)


def _report(result) -> None:
    from ..perf import mfu_text
    from ..train.log import nats_text

    if result.already_done:
        console.print(
            f"Already trained: {result.run_dir} is at step {result.step} (train.max_steps "
            "reached); nothing was run or written. "
            + ("Its steps were fitted to its time budget: --time-budget 0 --max-steps N trains "
               "on." if result.fitted else "Raise --max-steps to train on."),
            markup=False,
            highlight=False,
        )
    elif result.stopped_by:
        console.print(f"[bold yellow]Stopped[/] by {result.stopped_by} at step {result.step}; "
                      f"checkpoint: {escape(str(result.checkpoint))}; continue with --resume")
        return
    else:
        console.print(
            f"[bold green]Done[/]: {result.step} steps, {result.tokens_seen:,} tokens, "
            f"{result.train_seconds / 60:.1f} min, {result.tokens_per_second:,.0f} tokens/s"
            + (f", {mfu_text(result.mfu)}" if result.mfu is not None else "")
        )
    if result.final_valid is not None:
        final = result.final_valid
        kind, rel = (("exact NLL", "=") if final.exact
                     else (final.kind or "bound", final.relation))
        line = (f"Validation {kind}: {nats_text(final.nats_per_token, result.char_level)}, "
                f"PPL {rel} {final.perplexity:.2f}")
        if result.unigram_nats is not None:
            line += f" (unigram baseline {math.exp(result.unigram_nats):.2f})"
        console.print(line)
    console.print(f"Checkpoint: {result.checkpoint}", markup=False, highlight=False)
