"""`mdlm export`: a Hugging Face-style folder that mdlm loads back and the Hub can host.

    FOLDER/
      config.json        the layout's own config (a DiT: the reference's MDLMConfig fields;
                         LLaDA, Dream: the release's; GPT-2 and hf-mlm: theirs) plus an "mdlm"
                         section: the full training config, data metadata, state, weights kind
      model.safetensors  the weights under the layout's names (a DiT: the reference's
                         backbone.*, so its own Hugging Face class can load it too); shards and
                         model.safetensors.index.json past 5 GB (released.py)
      tokenizer files    the tokeniser's own files (chat template included) and
                         mdlm_tokenizer.json (no pickles)
      README.md          model card: architecture, usage, evaluation results, training config

Which layout each backbone gets is export_layouts.py's; a fine-tuned or LoRA-merged LLaDA or
Dream becomes a folder in its release's layout, which the released loaders read back. No
Python code is written: loading needs no trust_remote_code.

config.json's "mdlm" section (with its "format" and the list of "files") marks the folder as
an mdlm export: `--overwrite` replaces only such a folder, never the source checkpoint or
its run, and swaps the new folder in so that a kill leaves one whole version.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import __version__
from ..build import config_dict
from ..errors import MdlmError
from ..io.files import remove_stale_temporaries, swap_folder, temporary
from .export_layouts import export_layout
from .folder import LoadedModel
from .load import adapter_of, load_checkpoint
from .model_card import model_card, read_results

FORMAT = 1
# merged against unmerged logits, relative to their size: float32 rounding of W + (a / r) B A
MERGE_TOLERANCE = 1e-4
# weights in bf16 / fp16: this many of the dtype's eps (bf16: 0.125 of the logits' size; the
# merged model must also be closer to the unmerged one than the base is: verify_merge)
ROUNDING_STEPS = 16


def weights_kind(loaded: LoadedModel, ema: bool) -> str:
    """'ema' or 'raw' for an mdlm run; what the source recorded for imported weights."""
    if "weights" in loaded.state:
        return str(loaded.state["weights"])
    return "ema" if ema and (loaded.path / "ema.safetensors").is_file() else "raw"


def mdlm_section(loaded: LoadedModel, weights: str) -> dict:
    """config.json's "mdlm" section: everything mdlm needs to reload the export."""
    return {
        "format": FORMAT,
        "version": __version__,
        "weights": weights,
        "tokenizer": loaded.tokenizer.describe(),
        "config": config_dict(loaded.config),
        "data": loaded.data_meta,
        "state": loaded.state,
    }


def export_folder(loaded: LoadedModel, out: str | Path, *,
                  weights: str,
                  results: list[dict] | None = None,
                  overwrite: bool = False,
                  hub_id: str | None = None) -> Path:
    """Write the folder beside `out` in the backbone's layout (export_layouts.py), then swap it
    in (files.swap_folder); `hub_id` is where it will be pushed, for the model card's usage
    line."""
    layout = export_layout(loaded)  # refused before anything is written
    out = Path(out)
    check_export_target(loaded, out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out.parent, name=out.name)
    tmp = temporary(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        config = layout.write(loaded, tmp, mdlm_section(loaded, weights))  # tokeniser too
        card = model_card(loaded, config, results or [], hub_id or str(out), layout.card(loaded))
        (tmp / "README.md").write_text(card)
        config["mdlm"]["files"] = sorted({"config.json", *(p.name for p in tmp.iterdir())})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        swap_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def export_files(folder: Path) -> list[str] | None:
    """The files an mdlm export wrote (its marker: config.json's "mdlm" section), or None
    when `folder` is not an mdlm export."""
    try:
        meta = json.loads((folder / "config.json").read_text()).get("mdlm")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(meta, dict) or "format" not in meta:
        return None
    files = meta.get("files")
    if not isinstance(files, list):  # no list of files: the whole folder counts as the export
        return [p.name for p in folder.iterdir()]
    return [str(f) for f in files]


def check_export_target(loaded: LoadedModel, out: Path, overwrite: bool) -> None:
    """Refuse (in one line) any --out whose replacement could lose something: the source
    checkpoint, its run, a folder holding either, a file, or a folder mdlm did not export."""
    source = loaded.path.resolve()
    run = source.parent.parent if source.parent.name == "checkpoints" else source
    target = out.resolve()
    protected_folders = ((run, "the run being exported"),
                         (source, "the checkpoint being exported"))
    for protected, what in protected_folders:
        if target == protected or target in protected.parents or protected in target.parents:
            raise MdlmError(
                f"--out {out} overlaps {what} ({protected}); choose a folder outside it"
            )
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise MdlmError(f"{out} is a file or a link; choose a folder for --out")
    if not any(out.iterdir()):
        return
    if not overwrite:
        raise MdlmError(
            f"{out} already exists and is not empty; choose another --out or pass --overwrite"
        )
    written = export_files(out)
    if written is None:
        raise MdlmError(
            f"{out} is not a folder mdlm export wrote (no 'mdlm' section in its config.json); "
            "--overwrite replaces only an earlier export, so choose another --out"
        )
    foreign = sorted(p.name for p in out.iterdir() if p.name not in written)
    if foreign:
        raise MdlmError(
            f"{out} holds files the earlier export did not write ({', '.join(foreign[:3])}); "
            "move them away or choose another --out"
        )


def probe_batch(loaded: LoadedModel, length: int = 64) -> torch.Tensor:
    """The fixed random rows both checks compare logits on (seed 0), every third position
    masked, as the samplers' inputs are."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, loaded.model.vocab_size, (2, min(length, loaded.length)), generator=gen)
    x[:, ::3] = loaded.mask_id
    return x


@torch.no_grad()
def verify_export(loaded: LoadedModel, folder: Path, length: int = 64) -> float:
    """Reload the folder and compare logits on a fixed random batch; returns the max abs
    difference."""
    reloaded = load_checkpoint(folder, device="cpu")
    if reloaded.tokenizer.fingerprint != loaded.tokenizer.fingerprint:
        raise MdlmError(f"{folder}: the exported tokenizer does not reload identically")
    x = probe_batch(loaded, length)
    device = next(loaded.model.parameters()).device
    a = loaded.model(x.to(device)).float().cpu()
    b = reloaded.model(x).float()
    return float((a - b).abs().max())


def merge_tolerance(dtype: torch.dtype) -> float:
    """How far merged logits may be from unmerged ones, relative to their size: float32
    rounding of W + (a / r) B A, or, for weights kept in bf16 / fp16 (the releases of LLaDA and
    Dream), the rounding of every merged weight to that precision and of the computation in it
    (a few percent of the logits' size on the tiny test models: ROUNDING_STEPS of its eps)."""
    if dtype == torch.float32 or not dtype.is_floating_point:
        return MERGE_TOLERANCE
    return max(MERGE_TOLERANCE, ROUNDING_STEPS * torch.finfo(dtype).eps)


@torch.no_grad()
def verify_merge(loaded: LoadedModel, base: str, adapter: Path) -> str:
    """The merged weights (`loaded`) against the base with the adapter unmerged (peft's layers,
    W x + (alpha / r) B A x): the same logits up to rounding (merge_tolerance), and closer to
    them than the base itself (the adapter switched off), or an error."""
    from ..models.lora import adapters_off, load_adapter

    unmerged = load_adapter(load_checkpoint(base, device="cpu").model, adapter, merge=False)
    x = probe_batch(loaded)
    a, b = loaded.model(x).float(), unmerged.eval()(x).float()
    with adapters_off(unmerged):
        effect = float((unmerged(x).float() - b).abs().max())  # what the adapter changes
    dtype = next(loaded.model.parameters()).dtype
    diff, scale = float((a - b).abs().max()), float(b.abs().max())
    if diff > merge_tolerance(dtype) * max(scale, 1.0) or (effect > 0 and diff >= effect):
        raise MdlmError(f"merging {adapter} changed the logits by {diff:.3g} (of {scale:.3g}; "
                        f"the adapter itself changes them by {effect:.3g}); the export is not "
                        "the adapted model")
    precision = "" if dtype == torch.float32 else f", {str(dtype).removeprefix('torch.')} " \
        "rounding of the merged weights"
    return f"Verified: the merged adapter gives the unmerged model's logits (max difference " \
           f"{diff:.2g}{precision}; the adapter changes them by {effect:.2g})"


def push_to_hub(folder: Path, repo_id: str, *, private: bool = False) -> str:
    """Upload the folder to a model repo (created if needed); returns its URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    from ..io.hub import hub_offline

    if hub_offline():
        raise MdlmError(
            f"cannot push to {repo_id!r}: the Hugging Face Hub is unreachable (no network); "
            f"{folder} is complete, upload it later with `hf upload {repo_id} {folder}`"
        )
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                          commit_message=f"Upload MDLM model exported by mdlm {__version__}")
    except LocalTokenNotFoundError:
        raise MdlmError(f"cannot push to {repo_id!r}: not logged in to the Hugging Face Hub; "
                        "run `hf auth login` or set HF_TOKEN") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        text = str(e).strip()
        reason = text.splitlines()[0] if text else type(e).__name__
        raise MdlmError(f"cannot push to {repo_id!r}: {reason}") from None
    return f"https://huggingface.co/{repo_id}"


@dataclass
class ExportOptions:
    """`mdlm export`'s choices: where to write, which weights, and what to do after."""

    out: str
    raw_weights: bool = False  # the raw weights instead of the EMA
    results: list[str] = field(default_factory=list)  # evaluation records for the model card
    overwrite: bool = False
    verify: bool = True  # reload the export and check it gives identical logits
    push_to_hub: str | None = None  # a Hugging Face model repo (owner/name) to upload to
    private: bool = False  # create that repo as private
    threads: int | None = None
    adapter: str | None = None  # a LoRA adapter folder merged into the exported weights


def export_checkpoint(checkpoint: str, options: ExportOptions, *,
                      on_step: Callable[[str], None]) -> Path:
    """Export, verify and push a checkpoint as `options` ask; `on_step` says what each step
    did. Returns the folder written."""
    from ..runtime import Runtime

    Runtime.create("cpu", threads=options.threads or 0)
    records = read_results(options.results)
    ema = not options.raw_weights
    loaded = load_checkpoint(checkpoint, ema=ema, device="cpu", adapter=options.adapter)
    folder = export_folder(loaded, options.out, weights=weights_kind(loaded, ema),
                           results=records, overwrite=options.overwrite,
                           hub_id=options.push_to_hub)
    on_step(f"Exported {loaded.path} to {folder}")
    if options.verify:
        diff = verify_export(loaded, folder)
        if diff != 0.0:
            raise MdlmError(f"{folder} reloads with different logits (max difference "
                            f"{diff:.3g})")
        on_step("Verified: the export reloads with identical logits")
        merged_in = adapter_of(checkpoint, ema=ema, adapter=options.adapter)
        if merged_in is not None:
            on_step(verify_merge(loaded, *merged_in))
    if options.push_to_hub:
        url = push_to_hub(folder, options.push_to_hub, private=options.private)
        on_step(f"Pushed to {url}")
    return folder
