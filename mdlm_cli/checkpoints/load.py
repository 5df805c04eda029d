"""`--checkpoint` resolution, the same in every command: an mdlm run or step folder
(folder.py), or published weights (pretrained.py: a Hugging Face hub id, a Hugging
Face-style folder, a reference Lightning `.ckpt`)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ..errors import MdlmError, MdlmWarning
from ..models.speed import model_width
from ..runtime import Runtime
from .adapter import adapter_folder, is_adapter_step, load_adapter_run
from .folder import LoadedModel, load_run_folder, read_step, resolve_checkpoint
from .pretrained import load_pretrained, pretrained_source


def load_checkpoint(path: str | Path, *, ema: bool = True, device: torch.device | str = "cpu",
                    which: str = "latest", adapter: str | Path | None = None) -> LoadedModel:
    """Load a model (EMA weights by default) with its config and tokeniser, in eval mode; a
    LoRA run's is its base (train.init_from) with its adapter merged in; `adapter` (a peft
    adapter folder) is merged into whatever the checkpoint holds."""
    loaded = _load(path, ema=ema, device=device, which=which)
    if adapter is not None:
        from ..models.lora import load_adapter

        loaded.model = load_adapter(loaded.model, adapter).eval()
        loaded.state = {**loaded.state, "adapter": str(adapter)}
    return loaded


def adapter_of(path: str | Path, *, ema: bool = True, adapter: str | Path | None = None
               ) -> tuple[str, Path] | None:
    """(the base, the adapter folder) that `load_checkpoint(path, ema=, adapter=)` merges:
    `adapter` on `path`, or a LoRA run's own; None for a model without one."""
    if adapter is not None:
        return str(path), Path(adapter)
    if pretrained_source(path, "latest") is not None:
        return None
    step_dir = resolve_checkpoint(path)
    if not is_adapter_step(step_dir):
        return None
    _, run = read_step(step_dir)
    return run.config.train.init_from, adapter_folder(step_dir, ema)


def _load(path: str | Path, *, ema: bool, device: torch.device | str, which: str
          ) -> LoadedModel:
    source = pretrained_source(path, which)
    if source is not None:
        return load_pretrained(source, ema=ema, device=device)
    step_dir = resolve_checkpoint(path, which)
    if is_adapter_step(step_dir):
        _, run = read_step(step_dir)
        base = load_checkpoint(run.config.train.init_from, device=device)
        return load_adapter_run(base, step_dir, ema=ema, run=run)
    return load_run_folder(step_dir, ema=ema, device=device)


def load_on_device(path: str | Path, *,
                   device: str | None = None,
                   raw_weights: bool = False,
                   threads: int | None = None,
                   precision: str = "auto",
                   adapter: str | None = None) -> tuple[LoadedModel, Runtime]:
    """What a command loads: the runtime it asks for (device `auto` when None, CPU threads, the
    network's precision) and the checkpoint's EMA weights on it (raw ones with `raw_weights`),
    a LoRA `adapter` folder merged in."""
    rt = Runtime.create(device or "auto", precision, threads=threads or 0)
    loaded = load_checkpoint(path, ema=not raw_weights, device=rt.device, adapter=adapter)
    if precision == "fp32":  # weights kept in a checkpoint's bf16 (LLaDA, Dream) become float32
        loaded.model.float()
    return loaded, rt.for_model(precision, model_width(loaded.model))


def check_length(loaded: LoadedModel, length: int, allow_longer: bool) -> None:
    """A length beyond the model's trained L only with `allow_longer` (--allow-longer), and
    then with a warning."""
    if length <= loaded.length:
        return
    if not allow_longer:
        raise MdlmError(f"--length {length} is beyond the {loaded.length} tokens the model was "
                        "trained at; add --allow-longer to run it anyway (its quality past that "
                        "length is unknown)")
    warnings.warn(f"--length {length} is beyond the trained length {loaded.length}: quality "
                  "past it is unknown", MdlmWarning, stacklevel=2)
