"""Writing a step folder (folder.py's layout): a training run's checkpoint, atomically (into a
temporary folder renamed when complete), the `latest` / `best` pointers, and the pruning of
old steps."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn

from .. import distributed
from ..build import config_yaml
from ..config import Config
from ..data.tokenizers import Tokenizer
from ..io.files import swap_folder, temporary, write_failure, write_text_atomic
from ..models import unwrap
from ..models.lora import is_adapted, trainable
from .adapter import write_adapters
from .folder import SCHEMA_VERSION, recover_run_folder


@dataclass(frozen=True)
class CheckpointContents:
    """What a step folder holds: the model (and its EMA copy and optimizer, where the run has
    them), the resolved config, the training state, the tokeniser and the prepared data's
    metadata."""

    model: nn.Module
    cfg: Config
    state: dict
    tokenizer: Tokenizer
    data_meta: dict
    ema_model: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    # a LoRA run's EMA: its trainable tensors by parameter name (train/optim.AdapterEMA)
    ema_adapter: dict[str, torch.Tensor] | None = None


def save_checkpoint(run_dir: Path, step: int, contents: CheckpointContents, *,
                    keep_last: int = 2, best: bool = False) -> Path:
    """Write checkpoints/step-N atomically (temp folder + rename), update the
    `latest`/`best` pointers and prune all but the last `keep_last` and the best.
    Collective under torch.distributed: every rank calls it, rank 0 writes."""
    c = contents
    model, ema_model, optimizer, cfg = c.model, c.ema_model, c.optimizer, c.cfg
    state, tokenizer, data_meta = c.state, c.tokenizer, c.data_meta
    ckpt_root = run_dir / "checkpoints"
    final = ckpt_root / f"step-{step:08d}"
    adapted = is_adapted(unwrap(model))  # the adapters only: the base is train.init_from's
    weights = {} if adapted else distributed.full_model_state(model)
    ema_weights = distributed.full_model_state(ema_model) if ema_model is not None else None
    optimizer_state = (
        distributed.full_optimizer_state(model, optimizer) if optimizer is not None else None
    )
    if distributed.current_rank() != 0:
        distributed.barrier()  # until rank 0 has written it
        return final
    ckpt_root.mkdir(parents=True, exist_ok=True)
    recover_run_folder(run_dir)
    tmp = temporary(final)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        if adapted:
            write_adapters(tmp, unwrap(model), c.ema_adapter)
        else:
            save_file(weights, tmp / "model.safetensors")
        if ema_weights is not None:
            save_file(ema_weights, tmp / "ema.safetensors")
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / "optimizer.pt")
        base = unwrap(model)
        base.save_checkpoint_files(
            tmp
        )  # what the backbone needs beside the weights (hf-mlm: its HF config)
        (tmp / "model.json").write_text(json.dumps(model_metadata(base, cfg), indent=2))
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        (tmp / "config.yaml").write_text(config_yaml(cfg))
        (tmp / "data.json").write_text(json.dumps(data_meta, indent=2))
        tokenizer.save(tmp / "tokenizer")
        swap_folder(tmp, final)
        write_text_atomic(run_dir / "latest", final.name + "\n")
        if best:
            write_text_atomic(run_dir / "best", final.name + "\n")
    except (
        OSError,
        RuntimeError,
        SafetensorError,
    ) as e:  # disk full, read-only: one line, nothing lost
        raise write_failure(e, run_dir, f"the checkpoint of step {step}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(run_dir, keep_last)
    distributed.barrier()
    return final


def model_metadata(model: nn.Module, cfg: Config) -> dict:
    """model.json: what config.yaml's model section does not say about the weights."""
    return {
        "schema_version": SCHEMA_VERSION,
        "backbone": cfg.model.backbone,
        "vocab_size": model.vocab_size,
        "causal": model.causal,
        "objective": cfg.diffusion.objective,
        "parameters": sum(p.numel() for p in model.parameters()),
        **({"adapter": True, "trainable_parameters": sum(p.numel() for _, p in trainable(model))}
           if is_adapted(model) else {}),
    }


def _prune(run_dir: Path, keep_last: int) -> None:
    steps = sorted((run_dir / "checkpoints").glob("step-*"))
    keep = set(steps[-keep_last:])
    for pointer in ("best", "latest"):
        if (run_dir / pointer).is_file():
            keep.add(run_dir / "checkpoints" / (run_dir / pointer).read_text().strip())
    for path in steps:
        if path not in keep:
            shutil.rmtree(path, ignore_errors=True)


