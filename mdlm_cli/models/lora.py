"""LoRA adapters (Hu et al., 2021) on any backbone, through peft.

W x becomes W x + (alpha / r) B A x with A (r, in) and B (out, r) trained and W frozen. peft
injects its layers into mdlm's own module in place (`inject_adapter_in_model`), so the model
keeps its class, its forward and every capability the engine reads; only the targeted
`nn.Linear`s become peft's `lora.Linear`. The adapter is written in peft's folder format
(`adapter_config.json`, `adapter_model.safetensors`, keys `base_model.model.<module>...`), so
`peft.PeftModel.from_pretrained(module, folder)` loads it onto the same mdlm module.

Each backbone names its defaults: `lora_targets` (the attention and MLP projections inside its
blocks) and `lora_whole` (its embedding and output layer, trained whole with
`lora.train_embeddings`, peft's `modules_to_save`). Beside peft's files, `mdlm_adapter.json`
records the base the adapter was trained on, so loading it onto another base is refused.
"""

from __future__ import annotations

import dataclasses
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import MdlmError

if TYPE_CHECKING:
    from ..config import LoraConfig

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
RECORD = "mdlm_adapter.json"  # mdlm's own: the base it was trained on (peft ignores it)
PREFIX = "base_model.model."  # what PeftModel puts before the module's own names
# how close the fingerprint of a base must be to the adapter's record, relatively: bf16 storage
# of the same weights moves each entry by at most 2^-8; another base (another seed, or a few
# more steps of training) by far more
FINGERPRINT_TOLERANCE = 1e-2
FINGERPRINT_ENTRIES = 16


def _need_peft():
    try:
        import peft
    except ImportError:
        raise MdlmError("LoRA needs peft: pip install 'mdlm[adapt]' (or pip install peft)"
                        ) from None
    return peft


def block_pattern(names: tuple[str, ...]) -> str:
    """peft's target_modules as a regular expression (re.fullmatch on module names): the
    `names` (suffixes such as `q_proj` or `mlp.0`) inside a numbered block, never a
    same-named layer outside them (LLaDA's output layer is `transformer.ff_out`, its blocks'
    MLP output `blocks.N.ff_out`)."""
    alternatives = "|".join(re.escape(n) for n in names)
    return rf"(.*\.)?(blocks|layers|h)\.\d+\.(.*\.)?({alternatives})"  # h: GPT-2's blocks


def peft_config(model: nn.Module, lora: LoraConfig, base: str):
    """The peft LoraConfig of a run: the backbone's default targets unless `lora.targets`
    names them, its embedding and output layer trained whole with `lora.train_embeddings`."""
    peft = _need_peft()
    own = tuple(type(model).lora_targets)
    if not lora.targets and not own:
        raise MdlmError(f"{model.describe()} declares no default LoRA targets; name its linear "
                        "layers with lora.targets (e.g. --set lora.targets=[query,value])")
    targets = list(lora.targets) if lora.targets else block_pattern(own)
    whole = None
    if lora.train_embeddings:
        names = {n for n, _ in model.named_modules()}
        whole = [w for w in type(model).lora_whole
                 if any(n == w or n.endswith("." + w) for n in names)]
    return peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                           target_modules=targets, modules_to_save=whole or None,
                           base_model_name_or_path=base,
                           fan_in_fan_out=bool(type(model).lora_fan_in_fan_out))


def prepare_base(model: nn.Module, lora, rt) -> nn.Module:
    """The frozen base an adapter trains on, for runtime `rt` (its device and dtype): in bf16
    where the run computes in bf16 (a frozen weight needs no float32 master copy: LLaDA-8B's
    weights are 16 GB, not 32), in nf4 with lora.quantize=4bit (QLoRA), else as it is."""
    if lora.quantize == "4bit":
        return quantize_base(model, rt.device)
    return model.to(torch.bfloat16) if rt.dtype == torch.bfloat16 else model


def quantize_base(model: nn.Module, device: torch.device) -> nn.Module:
    """The base's linear layers inside its blocks as bitsandbytes' 4-bit nf4 (its output layer
    and embeddings stay as they are), computing in bf16: QLoRA's base. CUDA only."""
    if device.type != "cuda":
        raise MdlmError(f"lora.quantize=4bit needs a CUDA GPU (bitsandbytes' 4-bit kernels); "
                        f"this run is on {device.type}: use lora.quantize=none")
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise MdlmError("lora.quantize=4bit needs bitsandbytes: pip install bitsandbytes"
                        ) from None
    pattern = block_pattern(tuple(type(model).lora_targets) or ("",))
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or not re.fullmatch(pattern, name):
            continue
        q = bnb.nn.Linear4bit(module.in_features, module.out_features, module.bias is not None,
                              compute_dtype=torch.bfloat16, quant_type="nf4")
        q.weight = bnb.nn.Params4bit(module.weight.data.cpu(), requires_grad=False,
                                     quant_type="nf4")
        if module.bias is not None:
            q.bias = nn.Parameter(module.bias.data, requires_grad=False)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, q.to(device))
    return model


def add_lora(model: nn.Module, lora: LoraConfig, base: str) -> nn.Module:
    """Inject fresh adapters into `model` in place (B = 0: the function is unchanged) and
    freeze everything else; returns the model."""
    peft = _need_peft()
    config = peft_config(model, lora, base)
    try:
        model = peft.inject_adapter_in_model(config, model)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                         if type(m).__name__ in ("Linear", "Conv1D")})
        raise MdlmError(f"lora.targets: {str(e).splitlines()[0]} (its linear layers are named "
                        f"{', '.join(linear)})") from None
    model.lora_config = config  # what save_adapter writes
    with torch.no_grad():  # peft gives the adapters the base's dtype: trained in float32
        for _, p in trainable(model):
            p.data = p.data.float()
    return model


def is_adapted(model: nn.Module) -> bool:
    return hasattr(model, "lora_config")


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def fingerprint(model: nn.Module) -> list[float]:
    """Numbers that tell bases apart: 16 entries spread over the first linear layer peft adapts
    (its frozen `base_layer`), or over the first parameter."""
    weight = next((m.weight for n, m in model.named_modules()
                   if n.endswith("base_layer") and isinstance(m, nn.Linear)),
                  next(model.parameters()))
    flat = weight.detach().float().flatten()
    picked = flat[:: max(1, flat.numel() // FINGERPRINT_ENTRIES)][:FINGERPRINT_ENTRIES]
    return [float(v) for v in picked.cpu()]


@dataclass(frozen=True)
class AdapterRecord:
    """mdlm_adapter.json: the base an adapter was trained on, and its vocabulary."""

    base: str
    vocab_size: int
    fingerprint: list[float]

    def check(self, model: nn.Module, folder: Path) -> None:
        mine, theirs = torch.tensor(fingerprint(model)), torch.tensor(self.fingerprint)
        if self.vocab_size != model.vocab_size or mine.shape != theirs.shape or not (
                torch.allclose(mine, theirs, rtol=FINGERPRINT_TOLERANCE, atol=1e-6)):
            raise MdlmError(f"{folder} is an adapter for another base ({self.base}, vocabulary "
                            f"{self.vocab_size}); this model ({model.describe()}, vocabulary "
                            f"{model.vocab_size}) is not it: load the adapter onto its base")


def adapter_tensors(model: nn.Module, weights: dict[str, torch.Tensor] | None = None
                    ) -> dict[str, torch.Tensor]:
    """The adapter's tensors under peft's file keys (its own, or `weights`: the same
    trainable tensors by parameter name, e.g. their EMA)."""
    peft = _need_peft()
    state = None
    if weights is not None:
        state = {**model.state_dict(), **weights}
    # embeddings travel as modules_to_save (train_embeddings), never looked up on the Hub
    tensors = peft.get_peft_model_state_dict(model, state_dict=state,
                                             save_embedding_layers=False)
    return {PREFIX + k: v.detach().contiguous().cpu() for k, v in tensors.items()}


def write_adapter(model: nn.Module, folder: Path, weights: dict | None = None) -> None:
    """peft's folder format (into an existing, empty `folder`), and mdlm's record of the base."""
    from safetensors.torch import save_file

    model.lora_config.save_pretrained(str(folder))
    save_file(adapter_tensors(model, weights), folder / WEIGHTS)
    record = {"base": model.lora_config.base_model_name_or_path,
              "vocab_size": model.vocab_size, "fingerprint": fingerprint(model)}
    (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def read_record(folder: Path) -> AdapterRecord | None:
    path = folder / RECORD
    if not path.is_file():
        return None  # an adapter trained elsewhere: peft's own checks only
    try:
        return AdapterRecord(**json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, TypeError) as e:
        raise MdlmError(f"{path} is corrupted ({type(e).__name__}); restore the adapter folder"
                        ) from None


def check_adapter_folder(folder: Path) -> None:
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise MdlmError(f"{folder} is not a LoRA adapter folder (it needs {CONFIG} and "
                        f"{WEIGHTS}, as peft's save_pretrained writes)")


def load_adapter(model: nn.Module, folder: str | Path, *, merge: bool = True) -> nn.Module:
    """`folder`'s adapter on `model` (checked against the base it was trained on), merged
    into the weights (same logits, no extra cost per call) unless `merge=False`."""
    peft = _need_peft()
    folder = Path(folder)
    check_adapter_folder(folder)
    record = read_record(folder)
    config = read_config(folder)
    try:  # what PeftModel.from_pretrained does, on the local folder only (never the Hub)
        model = peft.inject_adapter_in_model(config, model)
        model.lora_config = config
        put_adapter_tensors(model, folder)
    except (ValueError, RuntimeError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MdlmError(f"{folder} does not fit this model ({model.describe()}): {first}"
                        ) from None
    if record is not None:
        record.check(model, folder)
    return merged(model) if merge else model


def read_config(folder: Path):
    """adapter_config.json as peft's LoraConfig (keys this peft does not know are dropped, as
    its own loader does); another kind of adapter is refused."""
    peft = _need_peft()
    try:
        attrs = peft.LoraConfig.from_json_file(str(folder / CONFIG))
    except (OSError, ValueError) as e:
        raise MdlmError(f"{folder / CONFIG} is not readable JSON ({type(e).__name__}); restore "
                        "the adapter folder") from None
    if attrs.get("peft_type", "LORA") != "LORA":
        raise MdlmError(f"{folder} holds a {attrs['peft_type']} adapter; mdlm loads LoRA ones")
    known = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    return peft.LoraConfig(**{k: v for k, v in attrs.items() if k in known})


def put_adapter_tensors(model: nn.Module, folder: Path) -> None:
    """The adapter tensors of `folder` into the adapted `model` (peft maps its file keys to
    the parameters); one line where they do not fit."""
    from peft import set_peft_model_state_dict
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(folder / WEIGHTS)
    except (SafetensorError, OSError) as e:
        raise MdlmError(f"{folder / WEIGHTS} is not a readable safetensors file ({e})") from None
    result = set_peft_model_state_dict(model, {k.removeprefix(PREFIX): v
                                               for k, v in tensors.items()})
    missing = [k for k in result.missing_keys if "lora_" in k or "modules_to_save" in k]
    if result.unexpected_keys or missing:
        first = (result.unexpected_keys or missing)[0]
        raise MdlmError(f"{folder} does not fit this model's adapters ({first}): another "
                        "base or another lora section")


def merged(model: nn.Module) -> nn.Module:
    """An adapted model with its adapters folded into the weights and peft's layers replaced
    by what they wrap, in place: the plain backbone again, same logits (what
    `mdlm export --merge-adapter` writes)."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            plain = module.get_base_layer()
        elif isinstance(module, ModulesToSaveWrapper):
            plain = module.modules_to_save["default"]
        else:
            continue
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, plain)
    del model.lora_config
    return model


@contextmanager
def adapters_off(model: nn.Module):
    """`model` as its base for the duration (every adapter bypassed, nothing copied): the
    reference policy of RL (mdlm rl)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)
