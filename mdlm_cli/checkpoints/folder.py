"""Checkpoints: a folder of plain files, written atomically, never a pickle.

    runs/NAME/
      config.yaml              resolved config of the run
      metrics.jsonl            training log
      latest, best             text files naming a step folder
      checkpoints/step-00001000/
        model.safetensors      raw weights (a LoRA run: adapter/ and adapter-ema/ instead,
                               checkpoints/adapter.py)
        ema.safetensors        EMA weights (used by default for evaluation and sampling)
        optimizer.pt           optimizer state (tensors and numbers; loaded with weights_only=True)
        state.json             step, data position, metrics, versions
        config.yaml            resolved config (the model section builds the backbone)
        model.json             schema_version, backbone, vocabulary, causal attention
        hf_config.json         hf-mlm only: the Hugging Face config that rebuilds the model offline
        data.json              prepared-data metadata (tokeniser, length, packing, source)
        tokenizer/             tokeniser files

A re-save of an existing step moves the old folder aside before the new one takes its name
(files.swap_folder), so a kill at any instant leaves one whole copy; the loader falls back
to the newest whole checkpoint (with a warning) when `latest` names a missing one, and the
next save or resume puts an orphaned copy back and removes dead processes' temporaries.

`schema_version` (model.json) is 2; folders written before it existed (version 1, whose
model.json held the DiT's hyper-parameters) are upgraded when read (`upgrade_metadata`).

Under torch.distributed, `save_checkpoint` and `load_training_state` are called by
every rank: FSDP2 shards are gathered into full tensors and rank 0 writes the same
files as a single process, so any number of ranks (or `mdlm sample`) can load them.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from .. import distributed
from ..build import config_from_dict
from ..config import Config
from ..data.tokenizers import Tokenizer, load_tokenizer
from ..errors import MdlmError, MdlmWarning
from ..io.files import (
    remove_stale_temporaries,
    stale_old_folders,
)
from ..models import build_model, unwrap
from ..objectives import Objective, get_objective

SCHEMA_VERSION = 2
V1_MODEL_KEYS = ("hidden_size", "n_blocks", "n_heads", "cond_dim", "mlp_ratio", "dropout")
# what every whole step folder holds (written into a temporary folder first, renamed when
# complete)
STEP_FILES = (
    "model.json",
    "state.json",
    "config.yaml",
    "data.json",
    "tokenizer",
)


def upgrade_metadata(model_meta: dict, cfg_dict: dict) -> tuple[dict, dict]:
    """Bring a checkpoint's model.json and config.yaml to the current schema.

    Version 1 (no schema_version): model.json was the DiT's config (vocab_size, causal and
    the hyper-parameters, mlp_ratio among them, which config.yaml's model section lacked).
    """
    version = model_meta.get("schema_version", 1)
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"schema_version {version} is newer than this mdlm reads ({SCHEMA_VERSION}); "
            "upgrade mdlm"
        )
    if version == 1:
        cfg_dict = {
            **cfg_dict,
            "model": {
                **(cfg_dict.get("model") or {}),
                **{k: model_meta[k] for k in V1_MODEL_KEYS if k in model_meta},
            },
        }
        model_meta = {
            "schema_version": 2,
            "backbone": "dit",
            "vocab_size": model_meta["vocab_size"],
            "causal": bool(model_meta.get("causal", False)),
        }
    return model_meta, cfg_dict


def recover_run_folder(run_dir: Path) -> list[str]:
    """Undo what a killed save left in a run folder: a step folder set aside during its
    re-save goes back in place, dead processes' temporaries go; returns what was done."""
    return remove_stale_temporaries(run_dir / "checkpoints") + remove_stale_temporaries(run_dir)


# the weights: the model's, or a LoRA run's adapter (checkpoints/adapter.py: its base is
# train.init_from's)
WEIGHT_FILES = ("model.safetensors", "adapter/adapter_model.safetensors")


def holds_weights(step_dir: Path) -> bool:
    return any((step_dir / name).is_file() for name in WEIGHT_FILES)


def is_whole(step_dir: Path) -> bool:
    return (step_dir.is_dir() and holds_weights(step_dir)
            and all((step_dir / name).exists() for name in STEP_FILES))


def _whole_steps(run_dir: Path) -> list[tuple[str, Path]]:
    """(step name, folder) of the whole checkpoints, oldest first, including a step folder
    that an interrupted re-save left aside under a temporary name."""
    root = run_dir / "checkpoints"
    found = {p.name: p for p in root.glob("step-*") if is_whole(p)} if root.is_dir() else {}
    for name, path in stale_old_folders(root):
        if name.startswith("step-") and is_whole(path):
            found.setdefault(name, path)
    return [(name, found[name]) for name in sorted(found)]


def resolve_checkpoint(path: str | Path, which: str = "latest") -> Path:
    """A step folder from a step folder, or from a run folder via its `latest`/`best` pointer.
    A pointer to a missing or partial folder (a save killed half-way) falls back to the
    newest whole checkpoint, with a warning."""
    path = Path(path)
    if holds_weights(path):
        return path
    if not path.exists():
        raise MdlmError(f"checkpoint {str(path)!r} does not exist")
    if (path / "adapter_config.json").is_file():
        raise MdlmError(f"{path} is a LoRA adapter, not a model: pass it as --adapter {path}, "
                        "with the model it was trained on as --checkpoint")
    pointer = path / which
    named = pointer.read_text().strip() if pointer.is_file() else None
    if named is not None and is_whole(path / "checkpoints" / named):
        return path / "checkpoints" / named
    whole = _whole_steps(path)
    if named is None and not whole:
        raise MdlmError(
            f"{path} holds no mdlm checkpoint (no model.safetensors nor adapter/, no '{which}' "
            "pointer)"
        )
    problem = (f"{pointer} names {named}, which is missing or incomplete in "
               f"{path / 'checkpoints'}"
               if named is not None else f"{path} has no '{which}' pointer")
    if not whole:
        raise MdlmError(
            f"{problem}, and no other whole checkpoint is there (a save was interrupted "
            "before any completed)"
        )
    name, folder = whole[-1]
    where = (
        ""
        if folder.name == name
        else f" (its whole copy {folder.name}, left by the interrupted save)"
    )
    warnings.warn(
        f"{problem} (a save was interrupted); using {name}{where}, the newest whole checkpoint",
        MdlmWarning,
        stacklevel=2,
    )
    return folder


def saved_config(step_dir: Path) -> Config:
    """The typed config a step folder was trained with (older schemas upgraded)."""
    try:
        _, cfg_dict = upgrade_metadata(json.loads((step_dir / "model.json").read_text()),
                                       yaml.safe_load((step_dir / "config.yaml").read_text()))
    except (OSError, json.JSONDecodeError, yaml.YAMLError, TypeError, KeyError, ValueError) as e:
        raise MdlmError(
            f"{step_dir} is incomplete or corrupted ({type(e).__name__}: {e})"
        ) from None
    return config_from_dict(cfg_dict)


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except (SafetensorError, OSError) as e:
        raise MdlmError(
            f"{path} is not a readable safetensors file ({e}); the checkpoint is corrupted"
        ) from None


def weight_mismatch(target: dict[str, torch.Tensor],
                    weights: dict[str, torch.Tensor], *,
                    may_lack: Callable[[str], bool] = lambda key: False,
                    ) -> tuple[list[str], list[str], str | None]:
    """How `weights` fail a model whose state dict is `target`: (missing keys, unexpected keys,
    the first shared key whose shape differs), all empty / None when they fit; keys that
    `may_lack` accepts are not missing."""
    missing = sorted(k for k in set(target) - set(weights) if not may_lack(k))
    unexpected = sorted(set(weights) - set(target))
    reshaped = [k for k, v in weights.items() if k in target and target[k].shape != v.shape]
    return missing, unexpected, reshaped[0] if reshaped else None


def load_state_into(model: nn.Module, weights: dict[str, torch.Tensor], source: Path) -> None:
    """Strict load with a one-line error naming the first mismatch."""
    target = model.state_dict()
    missing, unexpected, reshaped = weight_mismatch(target, weights)
    if missing or unexpected:
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise MdlmError(f"{source} does not fit this model ({what}, "
                        f"{len(missing)} missing / {len(unexpected)} unexpected keys)")
    if reshaped is not None:
        got, want = tuple(weights[reshaped].shape), tuple(target[reshaped].shape)
        raise MdlmError(f"{source}: {reshaped} has shape {got}, the model expects {want}")
    distributed.load_full_model_state(model, weights)


@dataclass
class LoadedModel:
    """A trained model ready for the engine."""

    path: Path
    model: nn.Module
    config: Config
    tokenizer: Tokenizer
    data_meta: dict
    state: dict

    @cached_property
    def objective(self) -> Objective:
        """What the model was trained to do: its loss, evaluation and samplers."""
        return get_objective(self.config, self.tokenizer)

    def denoiser(self, dtype: torch.dtype | None = None):
        """The engine-facing callable of the objective (a denoiser, or a causal LM)."""
        return self.objective.denoiser(self.model, dtype)

    @property
    def mask_id(self) -> int:
        return self.tokenizer.mask_id

    def row_start(self) -> list[int]:
        """The tokens every training row starts with: [BOS] for wrap/pad-packed data (each row
        is [BOS] piece [EOS]), none for chunked data (text8: rows start anywhere in the
        stream)."""
        starts_with_bos = self.data_meta.get("packing") in ("wrap", "pad", "sft", "sft-pack")
        return [self.tokenizer.bos_id] if starts_with_bos else []

    @property
    def length(self) -> int:
        return self.data_meta["length"]

    @property
    def sampling_defaults(self) -> dict:
        """The model family's own sampler option defaults (its loader's
        `state["sampling_defaults"]`, e.g. {"k_schedule": "llada"}); {} for none. Every
        surface that samples applies them (`SamplingSettings.with_defaults`) to the options
        the user did not give."""
        return dict(self.state.get("sampling_defaults") or {})


def read_step(step_dir: Path) -> tuple[dict, LoadedModel]:
    """(model.json, the step's LoadedModel without its model: config, tokeniser, data, state),
    each file checked: one line for a missing or corrupted one."""
    try:
        model_meta, cfg_dict = upgrade_metadata(
            json.loads((step_dir / "model.json").read_text()),
            yaml.safe_load((step_dir / "config.yaml").read_text()),
        )
        data_meta = json.loads((step_dir / "data.json").read_text())
        state = json.loads((step_dir / "state.json").read_text())
    except (OSError, json.JSONDecodeError, yaml.YAMLError, TypeError, KeyError, ValueError) as e:
        raise MdlmError(
            f"{step_dir} is incomplete or corrupted ({type(e).__name__}: {e})"
        ) from None
    cfg = config_from_dict(cfg_dict)
    tokenizer = load_tokenizer(str(step_dir / "tokenizer"))
    if tokenizer.vocab_size != model_meta["vocab_size"]:
        raise MdlmError(f"{step_dir}: tokenizer vocabulary {tokenizer.vocab_size} does not "
                        f"match the model's {model_meta['vocab_size']}")
    causal = get_objective(cfg, tokenizer).causal
    if model_meta["causal"] != causal:
        raise MdlmError(
            f"{step_dir}: model.json says causal={model_meta['causal']}, but the "
            f"{cfg.diffusion.objective} objective of its config.yaml needs the other; the "
            "checkpoint is inconsistent"
        )
    return model_meta, LoadedModel(step_dir, None, cfg, tokenizer, data_meta, state)


def load_run_folder(path: str | Path, *, ema: bool = True, device: torch.device | str = "cpu",
                    which: str = "latest") -> LoadedModel:
    """An mdlm run or step folder (EMA weights by default), in eval mode."""
    step_dir = resolve_checkpoint(path, which)
    model_meta, run = read_step(step_dir)
    cfg, state = run.config, run.state
    weights_file = step_dir / ("ema.safetensors"
                               if ema and (step_dir / "ema.safetensors").is_file()
                               else "model.safetensors")
    model = build_model(cfg.model, model_meta["vocab_size"], causal=model_meta["causal"],
                        folder=step_dir)
    load_state_into(model, load_weights(weights_file), weights_file)
    if model.family:  # a fine-tuned LLaDA or Dream keeps its family's defaults
        state.setdefault("family", model.family)
        # the family's defaults under what the run saved (a run saved before top_k had none)
        state["sampling_defaults"] = {**model.sampling_defaults,
                                      **(state.get("sampling_defaults") or {})}
    run.model = model.to(device).eval()
    return run


def load_training_state(step_dir: Path, model: nn.Module, ema_model: nn.Module | None,
                        optimizer: torch.optim.Optimizer) -> dict:
    """Restore model, EMA and optimizer in place for --resume (on every rank, whatever
    the number of ranks that wrote the checkpoint); returns state.json."""
    load_state_into(unwrap(model), load_weights(step_dir / "model.safetensors"),
                    step_dir / "model.safetensors")
    if ema_model is not None:
        ema_file = step_dir / "ema.safetensors"
        if ema_file.is_file():
            load_state_into(ema_model, load_weights(ema_file), ema_file)
    distributed.load_full_optimizer_state(model, optimizer, read_optimizer_state(step_dir))
    return json.loads((step_dir / "state.json").read_text())


def read_optimizer_state(step_dir: Path) -> dict:
    """optimizer.pt, read as tensors and numbers only (weights_only: never code)."""
    try:
        return torch.load(step_dir / "optimizer.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - corrupted or tampered file
        raise MdlmError(f"{step_dir}/optimizer.pt cannot be read safely ({type(e).__name__}); "
                        "the checkpoint is corrupted") from None
