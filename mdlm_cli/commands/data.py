"""`mdlm presets` and `mdlm prepare-data`."""

from __future__ import annotations

import math
import sys
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..build import resolve_config
from ..config import list_presets, load_preset
from ..data.tokenizers import TOKENIZERS
from .app import app
from .console import console, err_console, split_bars, user_errors
from .options import PresetOpt, SetOpt

DataDatasetOpt = Annotated[str | None, typer.Option(
    help="Data set name or local path (overrides the preset).")]
TokenizerOpt = Annotated[str | None, typer.Option(
    help=" | ".join([*TOKENIZERS, "folder", "hub id."]))]
DataLengthOpt = Annotated[int | None, typer.Option(help="Tokens per row (L).")]
PackingOpt = Annotated[str | None, typer.Option(
    help="wrap | pad | chunk | window | sft | sft-pack.")]
CacheDirOpt = Annotated[str | None, typer.Option(
    help="Cache root (default $MDLM_CACHE or ~/.cache/mdlm).")]
ForceOpt = Annotated[bool, typer.Option(help="Rebuild even if the cache exists.")]


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
            table.add_row(Text(preset, style="bold"), Text(description))
        console.print(table)


@app.command("prepare-data")
def prepare_data_cmd(
    preset: PresetOpt = "demo",
    dataset: DataDatasetOpt = None,
    tokenizer: TokenizerOpt = None,
    length: DataLengthOpt = None,
    packing: PackingOpt = None,
    cache_dir: CacheDirOpt = None,
    overrides: SetOpt = None,
    force: ForceOpt = False,
) -> None:
    """Tokenise and pack a data set into memory-mapped token files (cached; re-running is a no-op).

    [dim]Examples:[/]
      mdlm prepare-data                       # the embedded offline corpus (demo preset)
      mdlm prepare-data --preset demo-bpe     # the same corpus as GPT-2 BPE tokens
      mdlm prepare-data --preset owt          # OpenWebText with GPT-2 BPE (needs the Hub)
      mdlm prepare-data --dataset my.txt --tokenizer gpt2 --length 256
    """
    from rich.progress import Progress

    from ..data.store import prepare, prepared_folder

    with user_errors():
        cfg = resolve_config(preset, overrides or [], {
            "data.dataset": dataset, "data.tokenizer": tokenizer, "data.length": length,
            "data.packing": packing, "data.cache_dir": cache_dir})
        folder, source, _ = prepared_folder(cfg.data)
        if (folder / "meta.json").is_file() and not force:
            console.print(f"Already prepared: {folder}", markup=False, highlight=False)
            _print_data_summary(folder)
            return
        with Progress(console=err_console, transient=True) as progress:
            on_docs = split_bars(progress, f"{escape(source.name)} ")
            data = prepare(cfg.data, progress=on_docs, force=force)
        console.print(f"Prepared: {data.folder}", markup=False, highlight=False)
        _print_data_summary(data.folder)


def _print_data_summary(folder) -> None:
    from ..data.store import PreparedData

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
    console.print(line, markup=False)
