"""`mdlm export`: a Hugging Face-style folder that mdlm loads back and the Hub can host.

    FOLDER/
      config.json        the reference's MDLMConfig fields (vocab_size, model_length, hidden_dim,
                         cond_dim, n_blocks, n_heads, dropout, time_conditioning) plus an "mdlm"
                         section: the full training config, data metadata, state, weights kind
      model.safetensors  the DiT under the reference's names (backbone.*, rotary_emb.inv_freq
                         included), so the reference's own Hugging Face class can load it too
      tokenizer files    the tokeniser's own files and mdlm_tokenizer.json (no pickles)
      README.md          model card: architecture, usage, evaluation results, training config

No Python code is written: loading needs no trust_remote_code.

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
from safetensors.torch import save_file

from .. import __version__
from ..build import config_dict
from ..errors import MdlmError
from ..io.files import remove_stale_temporaries, swap_folder, temporary
from ..models import HFMaskedLM
from .folder import LoadedModel
from .formats.reference import hf_config, reference_state_dict
from .load import adapter_of, load_checkpoint
from .model_card import model_card, read_results

FORMAT = 1
# merged against unmerged logits, relative to their size: float32 rounding of W + (a / r) B A
MERGE_TOLERANCE = 1e-4


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


def write_model_files(loaded: LoadedModel, folder: Path, weights: str) -> dict:
    """model.safetensors and config.json; returns config.json's content. A DiT under the
    reference's names and fields; an hf-mlm model as the Hugging Face model's own folder
    (transformers loads it as it is), with mdlm's section added to its config.json."""
    if isinstance(loaded.model, HFMaskedLM):
        config = loaded.model.save_pretrained_folder(folder)
        config["mdlm"] = mdlm_section(loaded, weights)
    else:
        save_file(
            reference_state_dict(loaded.model),
            folder / "model.safetensors",
            metadata={"format": "pt"},
        )
        config = hf_config(loaded, mdlm_section(loaded, weights))  # the reference's fields + mdlm's
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config


def export_folder(loaded: LoadedModel, out: str | Path, *,
                  weights: str,
                  results: list[dict] | None = None,
                  overwrite: bool = False,
                  hub_id: str | None = None) -> Path:
    """Write the folder beside `out`, then swap it in (files.swap_folder); `hub_id` is where
    it will be pushed, for the model card's usage line."""
    from ..models import DiT

    # the formats export writes: the reference's, or HF's own
    if not isinstance(loaded.model, DiT | HFMaskedLM):
        raise MdlmError(
            "mdlm export writes the reference DiT format or a Hugging Face masked LM's; a "
            f"{loaded.config.model.backbone} model is shared as its run folder (safetensors, "
            "config.yaml, tokenizer files)"
        )
    if loaded.config.model.shift:  # the reference's config.json has no field that says it
        raise MdlmError("mdlm export of a shifted DiT (an AR run mdlm convert made a diffusion "
                        "model) is not done yet; share its run folder")
    out = Path(out)
    check_export_target(loaded, out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out.parent, name=out.name)
    tmp = temporary(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        config = write_model_files(loaded, tmp, weights)
        loaded.tokenizer.save(tmp)
        card = model_card(loaded, config, results or [], hub_id or str(out))
        (tmp / "README.md").write_text(card)
        config["mdlm"]["files"] = sorted(["config.json", *(p.name for p in tmp.iterdir())])
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
    protected_folders = ((run, "the run being exported"), (source, "the checkpoint being exported"))
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


@torch.no_grad()
def verify_merge(loaded: LoadedModel, base: str, adapter: Path) -> str:
    """The merged weights (`loaded`) against the base with the adapter unmerged (peft's layers,
    W x + (alpha / r) B A x): the same logits up to float rounding, or an error."""
    from ..models.lora import load_adapter

    unmerged = load_adapter(load_checkpoint(base, device="cpu").model, adapter, merge=False)
    x = probe_batch(loaded)
    a, b = loaded.model(x).float(), unmerged.eval()(x).float()
    diff, scale = float((a - b).abs().max()), float(b.abs().max())
    if diff > MERGE_TOLERANCE * max(scale, 1.0):
        raise MdlmError(f"merging {adapter} changed the logits by {diff:.3g} (of {scale:.3g}); "
                        "the export is not the adapted model")
    return f"Verified: the merged adapter gives the unmerged model's logits (max difference " \
           f"{diff:.2g})"


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
        raise MdlmError(f"cannot push to {repo_id!r}: not logged in to the Hugging Face Hub; run "
                        "`hf auth login` or set HF_TOKEN") from None
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
            raise MdlmError(f"{folder} reloads with different logits (max difference {diff:.3g})")
        on_step("Verified: the export reloads with identical logits")
        merged_in = adapter_of(checkpoint, ema=ema, adapter=options.adapter)
        if merged_in is not None:
            on_step(verify_merge(loaded, *merged_in))
    if options.push_to_hub:
        url = push_to_hub(folder, options.push_to_hub, private=options.private)
        on_step(f"Pushed to {url}")
    return folder
