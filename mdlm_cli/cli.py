"""`mdlm`: the command line. Thin: parse options, resolve the config, call one function."""

from __future__ import annotations

import math
import os
import sys
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from .config import list_presets, load_preset, resolve_config
from .errors import MdlmError

app = typer.Typer(
    name="mdlm",
    help="Train, evaluate and sample masked diffusion language models (MDLM).\n\n"
         "Start offline with [bold]mdlm train[/] (the embedded demo preset), then "
         "[bold]mdlm presets[/] to see the paper's configurations.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

PresetOpt = Annotated[str, typer.Option("--preset", "-p", help="Preset name (see `mdlm presets`) or a YAML file.")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", "-s", help="Override a config value, e.g. --set optim.lr=1e-4 (repeatable).")]


@contextmanager
def user_errors():
    """One red line and exit code 1 for user mistakes; tracebacks only with MDLM_DEBUG=1."""
    try:
        yield
    except MdlmError as e:
        if os.environ.get("MDLM_DEBUG"):
            raise
        err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        raise typer.Exit(130) from None


@app.command("presets")
def presets_cmd(
    name: Annotated[str | None, typer.Argument(help="Show this preset's YAML.")] = None,
) -> None:
    """List the shipped presets, or print one (copy it to a file to edit it).

    [dim]Examples:[/]
      mdlm presets
      mdlm presets owt > my.yaml   # then: mdlm train --preset my.yaml
    """
    with user_errors():
        if name:
            import yaml

            data = load_preset(name)
            data.pop("name", None)
            sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
            return
        table = Table("preset", "description", box=None)
        for preset, description in list_presets().items():
            table.add_row(f"[bold]{preset}[/]", description)
        console.print(table)


@app.command("prepare-data")
def prepare_data_cmd(
    preset: PresetOpt = "demo",
    dataset: Annotated[str | None, typer.Option(help="Data set name or local path (overrides the preset).")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="gpt2 | bert-base-uncased | char | folder | hub id.")] = None,
    length: Annotated[int | None, typer.Option(help="Tokens per row (L).")] = None,
    packing: Annotated[str | None, typer.Option(help="wrap | pad | chunk.")] = None,
    cache_dir: Annotated[str | None, typer.Option(help="Cache root (default $MDLM_CACHE or ~/.cache/mdlm).")] = None,
    overrides: SetOpt = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if the cache exists.")] = False,
) -> None:
    """Tokenise and pack a data set into memory-mapped token files (cached; re-running is a no-op).

    [dim]Examples:[/]
      mdlm prepare-data                       # the embedded offline corpus (demo preset)
      mdlm prepare-data --preset demo-char    # its character-level variant
      mdlm prepare-data --preset owt          # OpenWebText with GPT-2 BPE (needs the Hub)
      mdlm prepare-data --dataset my.txt --tokenizer gpt2 --length 256
    """
    from rich.progress import Progress

    from .data.sources import get_source
    from .data.store import prepare, prepared_folder

    with user_errors():
        cfg = resolve_config(preset, overrides or [], {
            "data.dataset": dataset, "data.tokenizer": tokenizer, "data.length": length,
            "data.packing": packing, "data.cache_dir": cache_dir})
        folder, source, _ = prepared_folder(cfg.data)
        if (folder / "meta.json").is_file() and not force:
            console.print(f"Already prepared: {folder}")
            _print_data_summary(folder)
            return
        get_source(cfg.data.dataset)
        with Progress(console=err_console, transient=True) as progress:
            tasks: dict[str, int] = {}

            def on_docs(split: str, n: int, total: int | None) -> None:
                if split not in tasks:
                    tasks[split] = progress.add_task(f"{source.name} {split}", total=total)
                progress.advance(tasks[split], n)

            data = prepare(cfg.data, progress=on_docs, force=force)
        console.print(f"Prepared: {data.folder}")
        _print_data_summary(data.folder)


def _print_data_summary(folder) -> None:
    from .data.store import PreparedData

    data = PreparedData(folder)
    meta = data.meta
    tok = meta["tokenizer"]
    table = Table("split", "documents", "rows", "tokens", box=None)
    for split, info in meta["splits"].items():
        table.add_row(split, f"{info['docs']:,}", f"{info['rows']:,}", f"{info['tokens']:,}")
    console.print(table)
    line = (f"tokenizer {tok['name']} (vocab {tok['vocab_size']}, mask id {tok['mask_id']}), "
            f"L={meta['length']}, packing {meta['packing']}")
    if meta.get("unigram_valid_nats") is not None:
        line += f"; unigram baseline on valid: PPL {math.exp(meta['unigram_valid_nats']):.1f}"
    console.print(line)


@app.command("train")
def train_cmd(
    preset: PresetOpt = "demo",
    overrides: SetOpt = None,
    out: Annotated[str | None, typer.Option(help="Run folder (default runs/<preset>).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its latest checkpoint.")] = False,
    max_steps: Annotated[int | None, typer.Option(help="Optimizer steps.")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | cuda:N | mps.")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    time_limit: Annotated[float, typer.Option(help="Stop after this many minutes (0 = no limit).")] = 0.0,
    print_config: Annotated[bool, typer.Option(help="Print the resolved config.")] = True,
) -> None:
    """Train a masked diffusion LM. With no options: the offline demo on this machine.

    [dim]Examples:[/]
      mdlm train                                   # demo: ~10 min on 2 CPU cores, offline
      mdlm train --preset test --max-steps 20      # seconds
      mdlm train --preset owt --set train.micro_batch_size=32
      mdlm train --preset demo --resume            # continue runs/demo
    """
    from .train import train

    with user_errors():
        cfg = resolve_config(preset, overrides or [], {
            "train.out_dir": out, "train.max_steps": max_steps, "train.device": device,
            "train.seed": seed})
        if print_config:
            err_console.rule(f"config: {cfg.name}")
            err_console.print(cfg.to_yaml().rstrip(), highlight=False, markup=False)
            err_console.rule()
        result = train(cfg, resume=resume, console=err_console, time_limit_s=time_limit * 60)
        console.print(f"[bold green]Done[/]: {result.step} steps, {result.tokens_seen:,} tokens, "
                      f"{result.train_seconds / 60:.1f} min, {result.tokens_per_second:,.0f} tokens/s")
        if result.final_valid is not None:
            line = (f"Validation bound: {result.final_valid.nats_per_token:.4f} nats/token, "
                    f"PPL ≤ {result.final_valid.perplexity:.2f}")
            if result.unigram_nats is not None:
                line += f" (unigram baseline {math.exp(result.unigram_nats):.2f})"
            console.print(line)
        console.print(f"Checkpoint: {result.checkpoint}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
