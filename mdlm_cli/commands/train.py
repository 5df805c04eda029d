"""`mdlm train`."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from ..config import resolve_config
from .common import PresetOpt, SetOpt, app, console, err_console, user_errors


@app.command("train")
def train_cmd(
    preset: PresetOpt = "demo",
    overrides: SetOpt = None,
    out: Annotated[str | None, typer.Option(help="Run folder (default runs/<preset>).")] = None,
    resume: Annotated[bool, typer.Option(
        help="Continue the run in --out from its latest checkpoint (start it if there is none).")] = False,
    max_steps: Annotated[int | None, typer.Option(help="Optimizer steps.")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | cuda:N | mps.")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    time_limit: Annotated[float, typer.Option(help="Stop after this many minutes (0 = no limit).")] = 0.0,
    print_config: Annotated[bool, typer.Option(help="Print the resolved config.")] = True,
) -> None:
    """Train a masked diffusion LM. With no options: the offline demo on this machine.

    Under torchrun it trains data-parallel on every rank (DDP; --set train.parallel=fsdp for FSDP2).
    SIGTERM saves a checkpoint after the current step and exits (continue with --resume).

    [dim]Examples:[/]
      mdlm train                                   # demo: ~10 min on 2 CPU cores, offline
      mdlm train --preset test --max-steps 20      # seconds
      mdlm train --preset owt --set train.micro_batch_size=32
      mdlm train --preset demo --resume            # continue runs/demo
      torchrun --nproc-per-node 8 -m mdlm_cli train --preset owt --resume   # 8 GPUs
    """
    from ..distributed import is_main_process
    from ..train import train

    with user_errors():
        cfg = resolve_config(preset, overrides or [], {
            "train.out_dir": out, "train.max_steps": max_steps, "train.device": device,
            "train.seed": seed})
        if print_config and is_main_process():
            err_console.rule(f"config: {cfg.name}")
            err_console.print(cfg.to_yaml().rstrip(), highlight=False, markup=False)
            err_console.rule()
        result = train(cfg, resume=resume, console=err_console, time_limit_s=time_limit * 60)
        if not is_main_process():
            return
        if result.stopped_by:
            console.print(f"[bold yellow]Stopped[/] by {result.stopped_by} at step {result.step}; "
                          f"checkpoint: {result.checkpoint}; continue with --resume")
            return
        console.print(f"[bold green]Done[/]: {result.step} steps, {result.tokens_seen:,} tokens, "
                      f"{result.train_seconds / 60:.1f} min, {result.tokens_per_second:,.0f} tokens/s")
        if result.final_valid is not None:
            final = result.final_valid
            kind, rel = ("exact NLL", "=") if final.exact else (final.kind or "bound", final.relation)
            line = (f"Validation {kind}: {result.final_valid.nats_per_token:.4f} nats/token, "
                    f"PPL {rel} {result.final_valid.perplexity:.2f}")
            if result.unigram_nats is not None:
                line += f" (unigram baseline {math.exp(result.unigram_nats):.2f})"
            console.print(line)
        console.print(f"Checkpoint: {result.checkpoint}")
