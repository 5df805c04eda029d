"""Any Hugging Face masked LM as the MDLM denoiser (`model.backbone: hf-mlm`, Table 4).

MDLM's loss is BERT's with a random masking rate and a weight in front (rebuttal, seed 000:
"one could take an off-the-shelf pre-trained BERT and with minimal modifications ... render
it a generative model"), so a masked LM that `transformers` implements natively
(`AutoModelForMaskedLM`: BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA, ModernBERT, ...) is
already a denoiser x_theta(z_t): no time input (MDLM needs none, so it is time-agnostic),
its tokeniser's own [MASK] as the mask token, logits over its own vocabulary, padding kept
out of attention. For the positions the loss needs, the encoder runs on the whole sequence
and the MLM head only on the selected rows, where the architecture's head is known (HEADS).

Never `trust_remote_code`: a config with `auto_map` (MosaicBERT, the paper's encoder) or an
architecture transformers does not implement is refused; bert-base-uncased is the stand-in.
An encoder saved without an MLM head (a sentence-embedding `BertModel`) gets the standard
head of its architecture (BERT: transform + LayerNorm + decoder tied to the word embeddings
+ bias), freshly initialised with seed 0, and says so in `notes`.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import MdlmError
from ..io.files import read_json_object
from .section import keys_of, read_section
from .tied import count_parameters
from .traits import BackboneTraits

if TYPE_CHECKING:
    from ..config import Config, ModelConfig
    from ..data.tokenizers import Tokenizer

CONFIG_FILE = "hf_config.json"  # the HF config, beside an mdlm checkpoint's weights
# model_type -> the MLM model's submodules that map the encoder's hidden states to logits,
# in order
HEADS = {
    "bert": ("cls",),
    "megatron-bert": ("cls",),
    "roberta": ("lm_head",),
    "xlm-roberta": ("lm_head",),
    "camembert": ("lm_head",),
    "albert": ("predictions",),
    "modernbert": ("head", "decoder"),
    "distilbert": ("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector"),
    "electra": ("generator_predictions", "generator_lm_head"),
}
REMOTE_CODE_HINT = (
    "mdlm never runs trust_remote_code (MosaicBERT, the paper's encoder, is such a model); "
    "use a natively implemented one such as bert-base-uncased"
)


def check_native(raw: dict, name: str) -> None:
    """Refuse a config that needs remote code or names a model transformers does not
    implement."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    model_type = raw.get("model_type")
    if raw.get("auto_map"):
        raise MdlmError(
            f"{name} holds a {model_type!r} model that needs remote code (its config.json has "
            f"auto_map); {REMOTE_CODE_HINT}"
        )
    if model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        raise MdlmError(
            f"{name} holds a {model_type!r} model, which transformers "
            f"{transformers.__version__} does not implement as a masked LM; "
            f"{REMOTE_CODE_HINT}"
        )
    unknown = [a for a in raw.get("architectures") or [] if not hasattr(transformers, a)]
    if unknown:
        raise MdlmError(
            f"{name} holds a {model_type!r} model of architecture {unknown[0]!r}, which "
            f"transformers does not implement; {REMOTE_CODE_HINT}"
        )


def model_folder(name: str) -> Path:
    """A local folder for `model.hf_model`: a pip-packaged model, a folder, or a hub download
    (config, safetensors weights and tokeniser files; never code)."""
    from ..io.packaged import resolve_model

    packaged = resolve_model(name)
    if packaged is not None:
        return packaged
    path = Path(name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise MdlmError(
                f"{path} has no config.json: model.hf_model must be a Hugging Face model "
                "folder, hub id or packaged model"
            )
        return path
    from ..io.hub import download

    return download(name)


def read_config(folder: Path) -> dict:
    return read_json_object(folder / "config.json")


@contextmanager
def quiet_transformers():
    """transformers' load report and warnings: mdlm states what matters in one note."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def load_pretrained(folder: Path, name: str) -> tuple[nn.Module, list[str]]:
    """`AutoModelForMaskedLM` with the folder's weights (float32), and the names of the head
    tensors the folder lacks (freshly initialised, seed 0); other missing weights are an
    error."""
    from transformers import AutoModelForMaskedLM

    raw = read_config(folder)
    check_native(raw, name)
    with quiet_transformers(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # a missing head is initialised the same way on every load
        try:
            model, info = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=False,
                                                               output_loading_info=True)
        except (OSError, ValueError, RuntimeError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise MdlmError(
                f"{name} holds a {raw.get('model_type')!r} model that does not load as a masked "
                f"LM: {first}"
            ) from None
    head = {child for child, _ in model.named_children()} - {model.base_model_prefix}
    missing = sorted(info.get("missing_keys") or [])
    encoder_missing = [k for k in missing if k.split(".")[0] not in head]
    if encoder_missing or info.get("mismatched_keys"):
        what = encoder_missing[0] if encoder_missing else sorted(info["mismatched_keys"])[0]
        raise MdlmError(f"{name} holds a {raw.get('model_type')!r} model whose weights do "
                        f"not fit {type(model).__name__} ({what} missing or of another "
                        f"shape, {len(encoder_missing)} encoder weights missing)")
    return model.float(), missing


@dataclass(frozen=True)
class HFMaskedLMConfig:
    """The hf-mlm backbone's `model:` keys (models/section.py): which Hugging Face masked LM, and
    time conditioning (refused: an encoder takes no time)."""

    hf_model: str = ""
    time_conditioning: bool = False


class HFMaskedLM(BackboneTraits, nn.Module):
    """`HFMaskedLM(cfg, vocab_size)(tokens (B, L), None, attention_mask, output_mask) -> logits`.

    Built from `cfg.hf_model`'s pretrained weights (or `folder`'s), or with `from_checkpoint`
    from the HF config an mdlm checkpoint carries. `vocab_size` is the tokeniser's: a model
    whose output layer is padded beyond it (ModernBERT) has the extra logits cut off.
    """

    config_keys = keys_of(HFMaskedLMConfig)
    requires_causal = False  # a bidirectional encoder
    causal = False

    def __init__(
        self,
        cfg: ModelConfig | HFMaskedLMConfig,
        vocab_size: int,
        causal: bool = False,
        *,
        hf: nn.Module | None = None,
        folder: Path | None = None,
    ):
        super().__init__()
        cfg = read_section(HFMaskedLMConfig, cfg)
        if causal:
            raise MdlmError(
                "the hf-mlm backbone is bidirectional; it cannot serve a causal objective"
            )
        self.notes: list[str] = []
        self.source = cfg.hf_model
        if hf is None:
            hf, fresh = load_pretrained(folder or model_folder(cfg.hf_model), cfg.hf_model)
            if fresh:
                self.notes.append(
                    f"{cfg.hf_model} has no MLM head: {type(hf).__name__}'s standard head "
                    f"({len(fresh)} tensors, decoder tied to the word embeddings) is freshly "
                    "initialised (seed 0)"
                )
        self.hf, self.vocab_size = hf, vocab_size
        outputs = hf.get_output_embeddings().weight.shape[0]
        if outputs < vocab_size:
            raise MdlmError(
                f"the tokenizer has {vocab_size} tokens but {cfg.hf_model}'s output layer only "
                f"{outputs}: use the model's own tokenizer (data.tokenizer={cfg.hf_model})"
            )
        names = HEADS.get(hf.config.model_type, ())
        self.head_names = names if all(hasattr(hf, n) for n in names) else ()
        self.max_length = getattr(hf.config, "max_position_embeddings", None)
        self.aliases = _aliases(self)  # tied weights: saved once, restored on load
        self._register_state_dict_hook(_drop_aliases)
        self._register_load_state_dict_pre_hook(_fill_aliases, with_module=True)

    # ------------------------------------------------------------------ the backbone hooks
    @classmethod
    def validate_config(cls, cfg: Config) -> None:
        if not cfg.model.hf_model:
            raise MdlmError(
                "model.hf_model must name the Hugging Face masked LM of the hf-mlm backbone "
                "(hub id, folder or packaged model)"
            )
        if cfg.model.time_conditioning:
            raise MdlmError("the hf-mlm backbone takes no time input (MDLM needs none); "
                            "set model.time_conditioning=false")

    @classmethod
    def check_data(cls, cfg: Config, tokenizer: Tokenizer) -> None:
        """Before training: the data's tokeniser is the model's own, and rows fit its
        positions."""
        from ..data.tokenizers import load_tokenizer

        raw = read_config(model_folder(cfg.model.hf_model))
        check_native(raw, cfg.model.hf_model)
        positions = raw.get("max_position_embeddings")
        if positions and cfg.data.length > positions:
            raise MdlmError(
                f"data.length {cfg.data.length} exceeds the {positions} positions of "
                f"{cfg.model.hf_model}"
            )
        try:
            own = load_tokenizer(cfg.model.hf_model)
        except MdlmError:
            # a model folder without tokeniser files: the vocabulary sizes are checked when built
            return
        same = tokenizer.hf is not None and tokenizer.hf.get_vocab() == own.hf.get_vocab()
        if not same or tokenizer.mask_id != own.mask_id:
            raise MdlmError(
                f"data.tokenizer {cfg.data.tokenizer!r} ({tokenizer.vocab_size} tokens) is "
                f"not the tokenizer of model.hf_model {cfg.model.hf_model!r} "
                f"({own.vocab_size} tokens); set data.tokenizer={cfg.model.hf_model}"
            )

    @classmethod
    def from_checkpoint(
        cls, cfg: ModelConfig, vocab_size: int, folder: Path, *, causal: bool = False
    ) -> HFMaskedLM:
        """The architecture from the checkpoint's hf_config.json (offline; weights loaded
        after)."""
        from transformers import AutoConfig, AutoModelForMaskedLM

        try:
            raw = json.loads((folder / CONFIG_FILE).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise MdlmError(f"{folder} holds an hf-mlm checkpoint without a readable "
                            f"{CONFIG_FILE} ({type(e).__name__}); the checkpoint is "
                            "incomplete") from None
        check_native(raw, str(folder / CONFIG_FILE))
        with quiet_transformers():
            hf = AutoModelForMaskedLM.from_config(
                AutoConfig.for_model(**raw), trust_remote_code=False
            )
        return cls(cfg, vocab_size, causal=causal, hf=hf.float())

    def save_checkpoint_files(self, folder: Path) -> None:
        (folder / CONFIG_FILE).write_text(self.hf.config.to_json_string(use_diff=False))

    def describe(self) -> str:
        c = self.hf.config
        layers = getattr(c, "num_hidden_layers", getattr(c, "n_layers", "?"))
        width = getattr(c, "hidden_size", getattr(c, "dim", "?"))
        return f"{type(self.hf).__name__} {layers}x{width} ({self.source})"

    def num_parameters(self) -> int:
        return count_parameters(self)

    @property
    def blocks(self) -> list[nn.Module]:
        """The encoder layers (what FSDP2 shards one by one)."""
        n = getattr(self.hf.config, "num_hidden_layers", None)
        for module in self.hf.base_model.modules():
            if isinstance(module, nn.ModuleList) and len(module) == n:
                return list(module)
        return []

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        tokens: torch.Tensor,
        sigma: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, L, V), or (N, V) at the N True positions of `output_mask` (row-major)."""
        if sigma is not None:
            raise ValueError("the hf-mlm backbone takes no time input")
        if self.max_length and tokens.shape[1] > self.max_length:
            raise MdlmError(
                f"{tokens.shape[1]} positions asked for; {self.source} has {self.max_length}"
            )
        mask = None if attention_mask is None else attention_mask.long()
        if not self.head_names:  # a head mdlm does not know: every position, then the rows
            logits = self.hf(input_ids=tokens, attention_mask=mask).logits
            logits = logits if output_mask is None else logits[output_mask]
        else:
            hidden = self.hf.base_model(input_ids=tokens, attention_mask=mask)[0]  # (B, L, H)
            logits = hidden if output_mask is None else hidden[output_mask]  # (N, H)
            for name in self.head_names:
                logits = getattr(self.hf, name)(logits)
        return logits[..., : self.vocab_size]

    def save_pretrained_folder(self, folder: Path) -> dict:
        """The HF model's own folder (config.json, model.safetensors); returns config.json's
        content."""
        with quiet_transformers():
            self.hf.save_pretrained(folder)
        return read_config(folder)


def _aliases(module: nn.Module) -> dict[str, str]:
    """state_dict key -> the key of the same tensor saved in its place (tied embeddings)."""
    first: dict[int, str] = {}
    aliases = {}
    for key, value in module.state_dict(keep_vars=True).items():
        if id(value) in first:
            aliases[key] = first[id(value)]
        else:
            first[id(value)] = key
    return aliases


def _drop_aliases(module, state_dict, prefix, local_metadata):
    for key in module.aliases:
        state_dict.pop(prefix + key, None)


def _fill_aliases(
    module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
):
    for key, source in module.aliases.items():
        if prefix + key not in state_dict and prefix + source in state_dict:
            state_dict[prefix + key] = state_dict[prefix + source]
