"""The reference's Lightning checkpoints (`.ckpt`; parameterization subs, sedd or d3pm) and bare
state-dict files: `state_dict` with `backbone.*` keys, the EMA in `ema.shadow_params` (a list in
parameter order, as the reference's models/ema.py stores it) and the hyper-parameters of the
pickled Hydra config, read as inert data (io/safe_load.py)."""

from __future__ import annotations

from ...errors import MdlmError
from ...io.safe_load import plain, read_torch_file
from ..folder import LoadedModel
from . import reference as ref
from .assemble import DitCheckpoint, assemble
from .base import Format, Found, Partial


def detect(found: Found) -> bool:
    return found.config is None  # a file, not a folder with a config.json


def load(found: Found, *, ema: bool, device) -> LoadedModel:
    path = found.path
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
        else Partial()
    )
    ema_state = obj.get("ema")
    shadow = ema_state.get("shadow_params") if ema and isinstance(ema_state, dict) else None
    weights = (
        "ema" if shadow is not None
        else ("raw" if not ema else "raw (the checkpoint holds no EMA)")
    )
    state_json = {"format": "lightning", "source": str(path), "weights": weights}
    for key in ("global_step", "epoch"):
        if isinstance(obj.get(key), int):
            state_json["step" if key == "global_step" else key] = obj[key]
    return assemble(DitCheckpoint(
        ref.backbone_state(state, path), partial, source=str(path), path=path,
        tokenizer_folder=None, tokenizer_name=partial.data.get("tokenizer"), shadow=shadow,
        state=state_json, label=path.stem), device)


FORMAT = Format(detect, load, "a Lightning .ckpt or a state-dict file of the reference's DiT")
