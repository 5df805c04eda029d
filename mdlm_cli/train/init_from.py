"""`train.init_from`: start a run from trained weights (fine-tuning), e.g. a released Caduceus
fine-tuned with MDLM, SEDD or MLM on HG38 (Table 6).

The weights come from anything `--checkpoint` accepts (an mdlm run or step folder, its EMA
weights; a hub id or Hugging Face-style folder, a released Caduceus among them). They must
fit the run's backbone key for key and shape for shape; the only keys they may lack are the
run's zero-initialised time-conditioning layers (a pretrained model without time input then
starts with its function unchanged). The optimizer, EMA and step start fresh.

A LLaDA or Dream folder fixes the run's model (build.adopt_released_folder: model.hf_model is
the folder), whose backbone is built from that folder's weights already: they are not read a
second time. A diffusion run's shift (the DiT's model.shift, which build.adopt_run_shift adopts
from a run folder) must be the run's own: a fine-tune never silently reads the wrong position.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ..checkpoints.folder import weight_mismatch
from ..data.tokenizers import Tokenizer
from ..engine.protocols import has_shifted_logits
from ..errors import MdlmError
from ..models import unwrap
from ..models.open_weights import ReleasedBackbone

FRESH = (
    "time_modulation",
    "time_embed",
)  # may be absent from a pretrained model: zero-initialised here


def initialise_from(model: nn.Module, spec: str, tokenizer: Tokenizer) -> str:
    """Load `spec`'s weights into `model` in place; returns a line saying what was loaded."""
    from ..checkpoints.load import load_checkpoint

    if isinstance(model, ReleasedBackbone) and _same_source(model.source, spec):
        return (f"{spec} (the {model.title} folder's {len(model.state_dict())} tensors, read "
                "as model.hf_model built the model)")
    loaded = load_checkpoint(spec)
    if (loaded.tokenizer.vocab_size, loaded.tokenizer.mask_id) != (
        tokenizer.vocab_size,
        tokenizer.mask_id,
    ):
        raise MdlmError(
            f"train.init_from {spec}: its tokenizer {loaded.tokenizer.name} (vocab "
            f"{loaded.tokenizer.vocab_size}) is not this run's {tokenizer.name} "
            f"({tokenizer.vocab_size})"
        )
    _check_shift(spec, loaded, model)
    weights, target = loaded.model.state_dict(), model.state_dict()
    missing, unexpected, reshaped = weight_mismatch(
        target, weights, may_lack=lambda k: any(f in k for f in FRESH))
    if unexpected or missing:
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise MdlmError(
            f"train.init_from {spec} does not fit this run's "
            f"{loaded.config.model.backbone} model ({what}); the model section must match "
            "the checkpoint's"
        )
    if reshaped is not None:
        got, want = tuple(weights[reshaped].shape), tuple(target[reshaped].shape)
        raise MdlmError(f"train.init_from {spec}: {reshaped} has shape {got}, this run's model "
                        f"{want}; the model section must match the checkpoint's")
    model.load_state_dict({**target, **weights})
    fresh = len(set(target) - set(weights))
    return f"{spec} ({loaded.objective.name} model, {len(weights)} tensors" + (
        f"; {fresh} fresh time-conditioning tensors)" if fresh else ")")


def check_source(spec: str) -> None:
    """Before any data is prepared: a local path that does not exist is refused at once (a
    hub id, owner/name, is the loader's to find)."""
    parent = Path(spec).expanduser().parent
    is_path = (len(Path(spec).parts) > 2 or spec.startswith((".", "/", "~"))
               or (parent != Path(".") and parent.is_dir()))  # runs/sft, not owner/name
    if is_path and not Path(spec).expanduser().exists():
        raise MdlmError(f"train.init_from {spec} does not exist; write it first (a run folder, "
                        "or the --out of mdlm convert)")


def _check_shift(spec: str, loaded, model: nn.Module) -> None:
    """A diffusion model's shift is kept (an AR source's is the fine-tune's choice)."""
    theirs, ours = has_shifted_logits(unwrap(loaded.model)), has_shifted_logits(unwrap(model))
    if not loaded.objective.causal and theirs != ours:
        raise MdlmError(f"train.init_from {spec} was trained with its logits read "
                        f"{'one position to the left' if theirs else 'in place'}; set "
                        f"model.shift={str(theirs).lower()} to fine-tune it")


def _same_source(source: str, spec: str) -> bool:
    if source == spec:
        return True
    return Path(source).is_dir() and Path(source).resolve() == Path(spec).resolve()
