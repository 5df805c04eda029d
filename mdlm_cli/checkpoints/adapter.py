"""A LoRA run's step folder (lora.rank > 0): the adapters in peft's folder format in place of
the weights, the frozen base named by the config's `train.init_from` and read from there.

    checkpoints/step-N/
      adapter/            adapter_config.json, adapter_model.safetensors, mdlm_adapter.json
      adapter-ema/        the same, of the EMA (where train.ema > 0; used by default)
      optimizer.pt, state.json, config.yaml, model.json ("adapter": true), data.json, tokenizer/

Either adapter folder loads with `peft.PeftModel.from_pretrained` onto the base's mdlm module,
or with `--adapter FOLDER` onto `--checkpoint BASE` in every command; `--checkpoint RUN` of a
LoRA run does both (base, then its adapter, merged).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..errors import MdlmError
from ..models.lora import WEIGHTS, load_adapter, put_adapter_tensors, write_adapter
from .folder import LoadedModel

ADAPTER = "adapter"
ADAPTER_EMA = "adapter-ema"


def write_adapters(folder: Path, model: nn.Module, ema: dict[str, torch.Tensor] | None) -> None:
    """The step's adapter (and its EMA's, `ema` by parameter name) into `folder`."""
    (folder / ADAPTER).mkdir()
    write_adapter(model, folder / ADAPTER)
    if ema is not None:
        (folder / ADAPTER_EMA).mkdir()
        write_adapter(model, folder / ADAPTER_EMA, ema)


def adapter_folder(step_dir: Path, ema: bool) -> Path:
    """The step's EMA adapter where asked and saved, else its raw one."""
    return step_dir / (ADAPTER_EMA if ema and (step_dir / ADAPTER_EMA).is_dir() else ADAPTER)


def is_adapter_step(step_dir: Path) -> bool:
    return (step_dir / ADAPTER / WEIGHTS).is_file()


def restore_adapters(step_dir: Path, model: nn.Module) -> dict[str, torch.Tensor] | None:
    """--resume of a LoRA run: its raw adapter into `model` in place; returns the EMA's
    tensors by parameter name (None where the step has no EMA)."""
    ema = None
    if (step_dir / ADAPTER_EMA / WEIGHTS).is_file():
        put_adapter_tensors(model, step_dir / ADAPTER_EMA)
        ema = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    put_adapter_tensors(model, step_dir / ADAPTER)
    return ema


def load_adapter_run(loaded_base: LoadedModel, step_dir: Path, *, ema: bool,
                     run: LoadedModel) -> LoadedModel:
    """A LoRA run's model: its base (`loaded_base`, what train.init_from names) with the
    step's adapter (the EMA's unless `ema=False`) merged in; the run's config, tokeniser,
    data and state (`run`, whose model is None)."""
    if loaded_base.tokenizer.vocab_size != run.tokenizer.vocab_size:
        raise MdlmError(f"{step_dir} adapts {run.config.train.init_from}, whose vocabulary "
                        f"({loaded_base.tokenizer.vocab_size}) is no longer the run's "
                        f"({run.tokenizer.vocab_size}): the base changed since training")
    model = load_adapter(loaded_base.model, adapter_folder(step_dir, ema))
    state = {**loaded_base.state, **run.state}
    return LoadedModel(step_dir, model.eval(), run.config, run.tokenizer, run.data_meta, state)
