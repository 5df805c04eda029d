"""Published MDLM weights: where they come from (the hub, a folder, a Lightning file) and
how they become a loaded model.

`load.load_checkpoint` hands every `--checkpoint` that is not an mdlm run or step
folder to `load_pretrained`, so all commands accept:

- a Hugging Face hub id such as `kuleshov-group/mdlm-owt`: huggingface_hub downloads
  config.json, the safetensors weights and any tokeniser files, never Python files (no
  remote code runs);
- a local Hugging Face-style folder (what `mdlm export` writes, or a download of a hub
  repo): config.json with the reference `MDLMConfig` fields (`vocab_size`, `model_length`,
  `hidden_dim`, `cond_dim`, `n_blocks`, `n_heads`, `dropout`, `time_conditioning`) and
  `model.safetensors` (or a sharded index, or `pytorch_model.bin` read with
  weights_only=True) holding the reference's `backbone.*` keys;
- a Hugging Face masked LM that transformers implements (config.json with model_type `bert`,
  `roberta`, ...: an `mdlm export` of an hf-mlm run, or any pretrained MLM such as
  `google-bert/bert-base-uncased`, or a pip-packaged one such as
  `sentence-transformers/all-MiniLM-L6-v2`, packaged.py): the hf-mlm backbone around it;
- SEDD's published models (`louaaron/sedd-small`, formats/sedd.py): SEDD's Hydra config in
  config.json and its DiT's weights under bare names, loaded into the sedd objective;
- a reference Lightning checkpoint (`.ckpt`; parameterization subs, sedd or d3pm): `state_dict`
  with `backbone.*` keys, the EMA
  in `ema.shadow_params` (a list in parameter order, as the reference's models/ema.py
  stores it) and the hyper-parameters of the pickled Hydra config, read as inert data
  (io/safe_load.py).

The names and fields of those formats, in both directions, are `formats/reference.py`'s.
Hyper-parameters come from the checkpoint (its config first, the weight shapes
otherwise), never from flags.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..build import config_from_dict, model_dict
from ..config import Config, TrainConfig
from ..data.tokenizers import (
    TOKENIZERS,
    ReferenceRun,
    Tokenizer,
    known_tokenizer,
    load_tokenizer,
    reference_tokenizer,
)
from ..errors import MdlmError
from ..io.hub import download
from ..io.packaged import resolve_model
from ..io.safe_load import plain, read_torch_file
from ..models import build_model
from ..models.hf_mlm import quiet_transformers
from ..objectives import get_objective
from .folder import LoadedModel, load_state_into, load_weights
from .formats import reference as ref
from .formats import sedd as sedd_format

TOKENIZER_FILES = (
    "mdlm_tokenizer.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
)
# rows per split a plain masked LM's evaluation data keeps (bert-ft's validation too)
PLAIN_MLM_ROWS = 100_000
# the data of a model whose tokeniser the reference never trained with: GPT-2's runs
_GPT2_RUN: ReferenceRun = TOKENIZERS["gpt2"].reference
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
RUN_ROOT = TrainConfig.out_dir.split("/")[0]  # "runs": `runs/NAME` is always a local run folder


@dataclass
class Source:
    # "hub" | "hf" (folder with config.json) | "torch" (Lightning .ckpt or a state-dict file)
    # | "packaged"
    kind: str
    location: str


def pretrained_source(path: str | Path, which: str = "latest") -> Source | None:
    """What `path` is, if it is not an mdlm run or step folder (None: let folder.py handle
    it)."""
    p = Path(path)
    if p.is_file():
        if p.suffix == ".safetensors" and (p.parent / "config.json").is_file():
            return Source("hf", str(p.parent))
        return None if p.suffix == ".safetensors" else Source("torch", str(p))
    if p.is_dir():
        if (p / "model.json").is_file() or (p / which).is_file():
            return None
        return Source("hf", str(p)) if (p / "config.json").is_file() else None
    text = str(path)
    if resolve_model(text) is not None:  # a hub id whose files a pip package ships (packaged.py)
        return Source("packaged", text)
    # owner/name that is not a local path: not inside an existing folder, nor mdlm's run root runs/
    owner = text.split("/")[0]
    if _HUB_ID.match(text) and owner != RUN_ROOT and not Path(owner).is_dir():
        return Source("hub", text)
    return None


def load_pretrained(
    source: Source, *, ema: bool = True, device: torch.device | str = "cpu"
) -> LoadedModel:
    if source.kind == "hub":
        folder = download(source.location)
        return _from_hf_folder(folder, label=source.location, device=device)
    if source.kind == "hf":
        return _from_hf_folder(Path(source.location), label=source.location, device=device)
    if source.kind == "packaged":
        return _from_hf_folder(resolve_model(source.location), label=source.location, device=device)
    return _from_torch_file(Path(source.location), ema=ema, device=device)


# ---------------------------------------------------------------------- Hugging Face-style folders

def _from_hf_folder(folder: Path, *, label: str, device) -> LoadedModel:
    config_file = folder / "config.json"
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MdlmError(
            f"{config_file} is not readable JSON ({_first_line(e)}); the checkpoint is corrupted"
        ) from None
    if not isinstance(raw, dict):
        raise MdlmError(f"{config_file} must hold a JSON object")
    if raw.get("model_type") == "caduceus":  # a released Caduceus: mdlm's own backbone
        from .formats.caduceus import caduceus_from_hf

        weights = _read_hf_weights(folder)[1]
        return caduceus_from_hf(folder, raw, weights, label=label, device=device)
    mdlm_meta = raw.get("mdlm") if isinstance(raw.get("mdlm"), dict) else {}
    sedd = sedd_format.sedd_config(raw)
    if sedd is not None:  # SEDD's own hub format (louaaron/sedd-small)
        partial = sedd_format.partial_from_sedd_config(sedd, config_file)
    elif raw.get("model_type") not in (None, "mdlm"):  # a Hugging Face masked LM (or its export)
        return _from_hf_mlm_folder(folder, raw, mdlm_meta, label=label, device=device)
    elif isinstance(raw.get("config"), dict) and isinstance(raw["config"].get("model"), dict):
        # a DiT pushed with PyTorchModelHubMixin
        partial = ref.partial_from_hydra(raw["config"], config_file)
    else:
        partial = ref.partial_from_hf_config(raw, config_file)
    weights_file, weights = _read_hf_weights(folder)
    exported_tokenizer = (mdlm_meta.get("tokenizer") or {}).get("name")
    tokenizer_name = exported_tokenizer or partial["data"].get("tokenizer")
    state_json = _hf_state(mdlm_meta, label)
    return _assemble(
        ref.backbone_state(weights, weights_file),
        partial,
        source=f"{weights_file}",
        path=folder,
        tokenizer_folder=folder,
        tokenizer_name=tokenizer_name,
        shadow=None,
        state=state_json,
        mdlm_meta=mdlm_meta,
        label=label,
        device=device,
    )


def _from_hf_mlm_folder(
    folder: Path, raw: dict, mdlm_meta: dict, *, label: str, device
) -> LoadedModel:
    """A masked LM that transformers implements, as an MDLM denoiser (the hf-mlm backbone): an
    `mdlm export` of an hf-mlm run (its "mdlm" section gives the config it was trained with), or
    any MLM, which gets the defaults of an encoder to fine-tune: C4, L = 128 (at most its
    positions), wrap packing, the first PLAIN_MLM_ROWS rows of each split (C4 is streamed)."""
    from ..models.hf_mlm import HFMaskedLM, check_native

    check_native(raw, str(folder))
    tokenizer = _hf_mlm_tokenizer(folder, label)
    model_section = {"backbone": "hf-mlm", "hf_model": label}
    saved = mdlm_meta.get("config") if isinstance(mdlm_meta.get("config"), dict) else None
    if saved is not None:
        config = config_from_dict({**saved, "model": model_section})
    else:
        length = min(128, raw.get("max_position_embeddings") or 128)
        config = config_from_dict({
            "name": label.rstrip("/").split("/")[-1], "description": f"imported from {label}",
            "data": {"dataset": "c4", "tokenizer": label, "length": length, "packing": "wrap",
                     "max_rows": PLAIN_MLM_ROWS, "max_eval_rows": PLAIN_MLM_ROWS},
            "model": model_section})
    model = HFMaskedLM(config.model, tokenizer.vocab_size, folder=folder)
    data_meta = _data_meta(mdlm_meta, config, tokenizer)
    state = _hf_state(mdlm_meta, label)
    if model.notes:
        state["notes"] = model.notes
    return LoadedModel(folder, model.to(device).eval(), config, tokenizer, data_meta, state)


def _hf_state(mdlm_meta: dict, label: str) -> dict:
    """state.json of a Hugging Face-style folder: an export's own, with where it came from."""
    state = dict(mdlm_meta.get("state") or {})
    weights = mdlm_meta.get("weights", "as stored")
    state.update({"format": "hugging-face", "source": label, "weights": weights})
    return state


def _hf_mlm_tokenizer(folder: Path, label: str) -> Tokenizer:
    """The folder's own tokeniser, named as the model is (so data prepared for it is shared)."""
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise MdlmError(
            f"{folder} carries no tokenizer files; a masked LM needs its own tokenizer next to "
            "its config.json"
        )
    with quiet_transformers():
        tokenizer = load_tokenizer(str(folder))
    if not (folder / "mdlm_tokenizer.json").is_file() and not Path(label).is_dir():
        tokenizer.name = label  # a hub id or packaged name, as load_tokenizer(label) names it
    return tokenizer


def _read_hf_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    single, index, pickled = (folder / "model.safetensors", folder / "model.safetensors.index.json",
                              folder / "pytorch_model.bin")
    if single.is_file():
        return single, load_weights(single)
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise MdlmError(
                f"{index} is not a valid safetensors index ({_first_line(e)})"
            ) from None
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(load_weights(folder / shard))
        return index, weights
    if pickled.is_file():
        obj = read_torch_file(pickled)
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise MdlmError(f"{pickled} does not hold a state dict of tensors")
        return pickled, obj
    raise MdlmError(f"{folder} has a config.json but no weights (model.safetensors, "
                    "model.safetensors.index.json or pytorch_model.bin)")


# ---------------------------------------------------------------------- Lightning checkpoints

def _from_torch_file(path: Path, *, ema: bool, device) -> LoadedModel:
    obj = read_torch_file(path)
    if not isinstance(obj, dict):
        raise MdlmError(
            f"{path} holds a {type(obj).__name__}, not a checkpoint dictionary or state dict"
        )
    state = obj["state_dict"] if isinstance(obj.get("state_dict"), dict) else obj
    hparams = plain(obj.get("hyper_parameters") or {})
    config = hparams.get("config", hparams) if isinstance(hparams, dict) else {}
    partial = (
        ref.partial_from_hydra(config, path)
        if isinstance(config, dict) and config
        else ref.new_partial()
    )
    ema_state = obj.get("ema")
    shadow = ema_state.get("shadow_params") if ema and isinstance(ema_state, dict) else None
    weights = (
        "ema" if shadow is not None else ("raw" if not ema else "raw (the checkpoint holds no EMA)")
    )
    state_json = {"format": "lightning", "source": str(path), "weights": weights}
    for key in ("global_step", "epoch"):
        if isinstance(obj.get(key), int):
            state_json["step" if key == "global_step" else key] = obj[key]
    return _assemble(
        ref.backbone_state(state, path),
        partial,
        source=str(path),
        path=path,
        tokenizer_folder=None,
        tokenizer_name=partial["data"].get("tokenizer"),
        shadow=shadow,
        state=state_json,
        mdlm_meta={},
        label=path.stem,
        device=device,
    )


def _assemble(weights: dict[str, torch.Tensor], partial: dict, *, source: str, path: Path,
              tokenizer_folder: Path | None, tokenizer_name: str | None, shadow, state: dict,
              mdlm_meta: dict, label: str, device) -> LoadedModel:
    inv_freq = weights.pop(ref.INV_FREQ, None)
    model_cfg, vocab = ref.model_config(weights, partial, inv_freq, source)
    embedding = tuple(weights["vocab_embed.embedding"].shape)
    # checked before a tokeniser is fetched for the wrong vocabulary
    if embedding != (vocab, model_cfg.hidden_size):
        raise MdlmError(f"{source}: vocab_embed.embedding has shape {embedding}, the model expects "
                        f"{(vocab, model_cfg.hidden_size)} (its config says vocab {vocab}, "
                        f"hidden {model_cfg.hidden_size})")
    tokenizer = _tokenizer(tokenizer_folder, tokenizer_name, vocab, source)
    if tokenizer.vocab_size != vocab:
        raise MdlmError(
            f"{source}: the tokenizer {tokenizer.name!r} has {tokenizer.vocab_size} tokens (mask "
            f"included) but the model's vocabulary is {vocab}; they do not belong together"
        )
    if partial["mask_id"] is not None and tokenizer.mask_id != partial["mask_id"]:
        raise MdlmError(
            f"{source}: the model's mask (absorbing state) is id {partial['mask_id']}, but the "
            f"tokenizer {tokenizer.name!r} masks with id {tokenizer.mask_id}; they do not belong "
            "together"
        )
    config = mdlm_config(model_cfg, partial, tokenizer, mdlm_meta, label)
    model = build_model(model_cfg, vocab, causal=get_objective(config, tokenizer).causal)
    if shadow is not None:
        weights = ref.apply_ema(model, weights, shadow, source)
    load_state_into(model, weights, source)
    ref.check_rotary(inv_freq, model_cfg, source)
    data_meta = _data_meta(mdlm_meta, config, tokenizer)
    if partial["inferred"]:
        state["inferred"] = partial["inferred"]
    model.to(device).eval()
    return LoadedModel(path, model, config, tokenizer, data_meta, state)


def _data_meta(mdlm_meta: dict, config: Config, tokenizer: Tokenizer) -> dict:
    """data.json of an imported model: an export's own (its "mdlm" section), with what the
    resolved config says of the rows and the tokeniser."""
    data_meta = dict(mdlm_meta.get("data") or {})
    data_meta.update({"length": config.data.length, "packing": config.data.packing,
                      "tokenizer": tokenizer.describe()})
    data_meta.setdefault("source", {"name": config.data.dataset})
    return data_meta


def mdlm_config(
    model_cfg, partial: dict, tokenizer: Tokenizer, mdlm_meta: dict, label: str
) -> Config:
    """mdlm's typed config for an imported model: the exporter's own when present, else the
    reference's."""
    known = known_tokenizer(tokenizer.name)
    run = known.reference if known is not None and known.reference else _GPT2_RUN
    dataset, packing, length = run.dataset, run.packing, run.length
    saved = mdlm_meta.get("config") if isinstance(mdlm_meta.get("config"), dict) else {}
    saved_data = saved.get("data") or {}
    recorded = partial["data"]
    if "length" not in recorded and "length" not in saved_data:
        partial["inferred"].append(f"length {length} (the reference default for {tokenizer.name})")
    model = {k: v for k, v in model_dict(model_cfg).items() if k != "time_conditioning"}
    if "time_conditioning" in partial["model"]:
        model["time_conditioning"] = partial["model"]["time_conditioning"]
    data = {
        "dataset": recorded.get("dataset") or saved_data.get("dataset", dataset),
        "packing": recorded.get("packing") or saved_data.get("packing", packing),
        "length": recorded.get("length") or saved_data.get("length", length),
        "tokenizer": tokenizer.name,
    }
    if saved:
        merged = {
            **saved,
            "data": {**saved_data, **data},
            "model": {**(saved.get("model") or {}), **model},
            "diffusion": {**(saved.get("diffusion") or {}), **partial["diffusion"]},
        }
        try:
            return config_from_dict(merged)
        except MdlmError:
            pass  # written by another mdlm version: keep what this one understands
    return config_from_dict(
        {
            "name": label.rstrip("/").split("/")[-1],
            "description": f"imported from {label}",
            "data": data,
            "model": model,
            "diffusion": partial["diffusion"],
        }
    )


def _tokenizer(folder: Path | None, name: str | None, vocab_size: int, source) -> Tokenizer:
    """The checkpoint's own tokeniser files, else the reference tokeniser its config or
    vocabulary names."""
    if folder is not None and any((folder / f).is_file() for f in TOKENIZER_FILES):
        with quiet_transformers():
            return load_tokenizer(str(folder))
    known = reference_tokenizer(vocab_size)
    name = name or (known.name if known is not None else None)
    if name is None:
        raise MdlmError(
            f"{source} carries no tokenizer files and its vocabulary ({vocab_size}) is not "
            f"{_reference_vocabularies()}; put the tokenizer files next to its config.json"
        )
    return load_tokenizer(name)


def _reference_vocabularies() -> str:
    """"GPT-2's (50258), BERT's (30522) or text8's (35)": the vocabularies an import recognises."""
    known = [f"{t.label} ({t.vocab_size})" for t in TOKENIZERS.values() if t.reference]
    return ", ".join(known[:-1]) + " or " + known[-1]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
