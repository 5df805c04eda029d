"""The released folders of the open diffusion LLMs (LLaDA, Dream): their config.json, read
without their Python files, and a backbone built on the meta device whose parameters then
become the folder's memory-mapped tensors (models/folder_weights.py). `ReleasedBackbone` is
what both families' backbones share; each adds its network (models/llada.py, dream.py,
and gpt2.py: mdlm's own layout of a converted GPT-2).

A folder written by `mdlm convert` (checkpoints/convert/) carries its conversion record in
config.json (`mdlm_conversion`: source, shift, attention); the backbone reads its shift and
attention there, so they travel with the weights (and with the family config an mdlm checkpoint
keeps beside them). A released folder has none: its family's own behaviour, bit for bit.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..engine.diffusion import masked_nll
from ..errors import MdlmError
from ..io.files import read_json_object
from .anneal import AttentionAnneal
from .block_cache import BlockCache, BlockCall
from .decoder_layers import (
    causal_keys,
    key_padding_mask,
    predecessor_states,
    restricted_keys,
    shift_states,
)
from .folder_weights import fill_released, materialise
from .hf_mlm import model_folder
from .section import keys_of, read_section
from .tied import count_parameters
from .traits import BackboneTraits

CONVERSION_KEY = "mdlm_conversion"  # config.json's record of a folder `mdlm convert` wrote
ATTENTIONS = ("full", "causal")  # full: diffusion; causal: the conversion's equivalence check
# masked positions whose logits a loss makes at once (`chunked_nll`): LLaDA-8B's 126,464 rows
# make 256 of them 0.13 GB in float32, against 1 GB for a 2,048-token answer at once
NLL_CHUNK = 256


@dataclass(frozen=True)
class FolderModelConfig:
    """The `model:` keys of a backbone read from a released folder: which folder or hub id,
    and time conditioning (refused: neither family takes a time input)."""

    hf_model: str = ""
    time_conditioning: bool = False


def read_folder_config(name: str) -> tuple[Path, dict]:
    """The local folder of `name` (a folder or a hub id, code never fetched) and its config."""
    folder = model_folder(name)
    return folder, read_json_object(folder / "config.json")


def refuse(name: str, key: str, value: Any, why: str) -> MdlmError:
    """The one-line refusal of a config key whose value mdlm does not implement."""
    return MdlmError(f"{name}: config.json has {key}={value!r}, which mdlm's native backbone "
                     f"does not implement ({why})")


def read_conversion(raw: dict, name: str) -> dict:
    """config.json's conversion record ({} for a released folder), its values checked."""
    record = raw.get(CONVERSION_KEY) or {}
    if not isinstance(record, dict) or not isinstance(record.get("shift", False), bool):
        raise MdlmError(f"{name}: config.json's {CONVERSION_KEY} is not a conversion record "
                        "(convert the source again with mdlm convert)")
    if record.get("attention", "full") not in ATTENTIONS:
        raise MdlmError(f"{name}: config.json's {CONVERSION_KEY} has attention "
                        f"{record['attention']!r}; one of {', '.join(ATTENTIONS)}")
    return record


def conversion_diffusion(raw: dict) -> dict:
    """The `diffusion:` keys a converted folder's record fixes beyond LLaDA's objective: its
    target objective and that objective's keys (bd3lm's block size); {} for a released folder."""
    record = raw.get(CONVERSION_KEY) or {}
    keys = {"objective": record["target"]} if "target" in record else {}
    if record.get("block_size"):
        keys["block_size"] = int(record["block_size"])
    return keys


def read_family_config(folder: Path, file: str) -> dict:
    """The family's config saved beside an mdlm checkpoint's weights, or one line."""
    path = folder / file
    if not path.is_file():
        raise MdlmError(f"{folder} lacks {file}, which rebuilds its model; the checkpoint is "
                        "incomplete")
    return read_json_object(path)


def write_family_config(path: Path, raw: dict) -> None:
    path.write_text(json.dumps(raw, indent=2))


def validate_folder_config(cfg, family: str) -> None:
    """A folder backbone's model section: a folder or hub id, and no time input."""
    if not cfg.model.hf_model:
        raise MdlmError(f"model.hf_model must name the {family} folder or hub id")
    if cfg.model.time_conditioning:
        raise MdlmError(f"the {family} backbone takes no time input; set "
                        "model.time_conditioning=false")


def check_folder_data(cfg, tokenizer, raw: dict, max_length: int) -> None:
    """Before training: the data's tokeniser is the model's own (its mask id), and rows fit the
    model's positions."""
    name = cfg.model.hf_model
    if cfg.data.length > max_length:
        raise MdlmError(f"data.length {cfg.data.length} exceeds the {max_length} positions of "
                        f"{name}")
    if tokenizer.mask_id != raw.get("mask_token_id"):
        raise MdlmError(f"data.tokenizer {cfg.data.tokenizer!r} masks with id "
                        f"{tokenizer.mask_id}, {name} with {raw.get('mask_token_id')}; "
                        f"set data.tokenizer={name}")


class ReleasedBackbone(BackboneTraits, nn.Module, ABC):
    """What the LLaDA and Dream backbones share: built from a released folder named by
    `model.hf_model` (float32 weights, for training), from the folder in its own dtype
    (`from_folder`, for inference) or from an mdlm checkpoint (`from_checkpoint`, the release's
    config.json saved beside the weights as `config_file`). A family gives its `family` name,
    its config.json's `model_type`, `title`, `config_file`, `sampling_defaults` (its own
    transfer schedule), `read_shape(raw, name)` (the config's shape, refusing what it does not
    implement), `build_network()` (the release's modules under its own names, called on the
    meta device) and `blocks`."""

    config_keys = keys_of(FolderModelConfig)
    requires_causal = False  # bidirectional: neither release masks attention causally
    causal = False
    # the answer a request gets when it asks for no length (generation/layout.py): the
    # release's own default, not the rest of its 4096-position window
    answer_tokens: ClassVar[int]
    family: ClassVar[str]
    model_type: ClassVar[str]
    title: ClassVar[str]
    config_file: ClassVar[str]
    sampling_defaults: ClassVar[dict[str, Any]]
    read_shape: ClassVar[Callable[[dict, str], Any]]
    # the shift where no conversion record says (position i's logits from the output at i - 1:
    # shift_states): LLaDA predicts in place, Dream and GPT-2 keep their AR head's shift;
    # `shift_fixed`: the family's weights were trained one way only (Dream)
    default_shift: ClassVar[bool] = False
    shift_fixed: ClassVar[bool] = False

    # attention annealing while training (train.attention_anneal_steps, models/anneal.py): the
    # training loop sets each pass's; None is the model's own attention
    anneals_attention = True
    attention_anneal: AttentionAnneal | None = None
    # BD3-LM's pass (objectives/bd3lm.py): a (B | 1, 1, L, L) attention mask and positions
    takes_query_masks = True
    # the loss's -log p from `forward(..., nll_of=)`, its logits NLL_CHUNK positions at a time
    scores_in_chunks = True

    # gradient checkpointing (train.checkpointing): each block's activations are recomputed in
    # the backward pass instead of kept, so training memory holds one block's, not all of them
    checkpointing = False

    def __init__(self, cfg, vocab_size: int, causal: bool = False, *, raw: dict | None = None,
                 load: bool = True):
        super().__init__()
        cfg = read_section(FolderModelConfig, cfg)
        if causal:
            raise MdlmError(f"the {self.family} backbone is bidirectional; it cannot serve a "
                            "causal objective")
        folder = None
        if raw is None:  # for training: the folder's weights, in float32
            folder, raw = read_folder_config(cfg.hf_model)
        self.source, self.raw = cfg.hf_model, raw
        self.config = self.read_shape(raw, cfg.hf_model or self.family)
        self.conversion = read_conversion(raw, cfg.hf_model or self.family)
        self.shift = self.conversion.get("shift", self.default_shift)
        self.attention = self.conversion.get("attention", "full")
        if self.shift_fixed and self.shift != self.default_shift:
            raise MdlmError(f"{cfg.hf_model or self.family}: the {self.family} backbone always "
                            f"reads {'shifted' if self.default_shift else 'in-place'} logits; "
                            "its conversion record asks for the other")
        self.vocab_size = vocab_size
        if vocab_size > self.config.vocab_rows:
            raise MdlmError(f"the tokenizer has {vocab_size} tokens but {self.source}'s "
                            f"embedding only {self.config.vocab_rows} rows: use its own "
                            "tokenizer")
        with torch.device("meta"):  # a skeleton: the weights come from the folder or the caller
            self.build_network()
        if folder is not None and load:
            fill_released(self, folder, dtype=torch.float32)

    @abstractmethod
    def build_network(self) -> None:
        """The family's modules under the release's names (called on the meta device)."""

    @abstractmethod
    def hidden_states(self, tokens: Tensor, attention_mask: Tensor | None,
                      call: BlockCall | None = None, positions: Tensor | None = None) -> Tensor:
        """The last layer's normed states (B, n, d) of `tokens` (B, n); with a block `call`,
        at positions [call.start, call.start + n), the other keys read from its cache; with
        `positions` (n,), each token at its own (BD3-LM's x_t ⊕ x_0: 0..L-1 twice)."""

    @abstractmethod
    def _head(self, h: Tensor) -> Tensor:
        """The family's output layer over states `h`: float32 logits over the tokeniser's
        rows."""

    def _logits(self, h: Tensor, output_mask: Tensor | None, read: Tensor | None = None
                ) -> Tensor:
        """The logits of states `h` read where `read_positions` says (or from the states `read`
        gives, already shifted: a pass with its own positions), at `output_mask`'s positions."""
        h = self.read_positions(h) if read is None else read
        return self._head(h if output_mask is None else h[output_mask])

    def forward(self, tokens: Tensor, sigma: Tensor | None = None,
                attention_mask: Tensor | None = None, output_mask: Tensor | None = None,
                positions: Tensor | None = None,
                nll_of: tuple[Tensor, int] | None = None) -> Tensor:
        """Logits (B, L, V) in float32, or (N, V) at the N True positions of `output_mask`.
        `attention_mask` (B | 1, 1, L, L) bool says which keys each query attends and
        `positions` (L,) each token's position (BD3-LM's pass: `takes_query_masks`); with the
        shift, a position's logits are then read from the key it attends at the position
        before its own (decoder_layers.predecessor_states). With `nll_of` (targets (N,),
        mask_id): -log p (N,) of the targets at `output_mask` instead (`chunked_nll`)."""
        h = self.hidden_states(tokens, attention_mask, positions=positions)
        if positions is None or not self.shift:
            read = None if positions is None else h
        else:
            read = predecessor_states(h, attention_mask, positions)
        if nll_of is not None:
            states = self.read_positions(h) if read is None else read
            return self.chunked_nll(states[output_mask], *nll_of)
        return self._logits(h, output_mask, read)

    def chunked_nll(self, h: Tensor, targets: Tensor, mask_id: int) -> Tensor:
        """-log p_theta (N,) of `targets` (N,) from the states `h` (N, H) under SUBS (the mask
        never an output), the output layer and its softmax run `NLL_CHUNK` positions at a time
        and, under autograd, run again in the backward pass (checkpointed): the (N, V) logits of
        a long answer never exist at once (LLaDA-8B: 2,048 positions x 126,464 rows x 4 bytes
        is 1 GB, and its softmax and gradient as much again)."""
        pieces = []
        for hp, yp in zip(h.split(NLL_CHUNK), targets.split(NLL_CHUNK), strict=True):
            if torch.is_grad_enabled() and hp.requires_grad:
                pieces.append(checkpoint(self._nll_piece, hp, yp, mask_id, use_reentrant=False))
            else:
                pieces.append(self._nll_piece(hp, yp, mask_id))
        return torch.cat(pieces) if pieces else h.new_zeros(0, dtype=torch.float32)

    def _nll_piece(self, h: Tensor, targets: Tensor, mask_id: int) -> Tensor:
        return masked_nll(self._head(h), targets, mask_id)

    @property
    def shifted_logits(self) -> bool:
        """The engine's declaration (engine/protocols.py): logits at i read from i - 1."""
        return self.shift

    def read_positions(self, h: Tensor) -> Tensor:
        """The states each position's logits are read from (B, L, H): its own, or with the
        shift those one to its left. A cached call's slice is shifted within itself, as
        Fast-dLLM's modeling_dream.py (its loop decides the slice's first position from the full
        pass: engine/dream_blocks.py)."""
        return shift_states(h) if self.shift else h

    def attention_keys(self, attention_mask: Tensor | None, length: int,
                       device) -> Tensor | None:
        """The keys each query attends (SDPA's boolean mask): every real one, or with causal
        attention (a conversion's equivalence check) those up to its own; while training under
        an anneal (models/anneal.py), the causal ones and the anneal's random share of the
        others; a (B | 1, 1, L, L) mask as given (BD3-LM's block masks: the objective's)."""
        if attention_mask is not None and attention_mask.dim() == 4:
            return attention_mask.bool()
        anneal = self.attention_anneal if self.training else None
        allowed = None if anneal is None else anneal.allowed(length, device)
        if allowed is not None:
            return restricted_keys(allowed, attention_mask)
        if self.attention == "causal":
            return causal_keys(attention_mask, length, device)
        return key_padding_mask(attention_mask)

    # Fast-dLLM's block cache (models/block_cache.py); which position's output a slice's
    # logits read is `read_positions` (LLaDA: its own; Dream: the one to its left)
    def new_block_cache(self, batch: int, length: int) -> BlockCache:
        if self.attention == "causal":  # the cache's slices attend both ways
            raise MdlmError(f"{self.describe()} attends causally; a block cache needs full "
                            "attention: use --cache none")
        return BlockCache.empty(batch, length, self.config.n_layers)

    def block_cache(self, tokens: Tensor, cache: BlockCache, rows: Tensor | None = None
                    ) -> tuple[Tensor, BlockCache]:
        """A full pass: logits (R, L, V), every position's keys and values kept at `rows`."""
        call = BlockCall(cache, 0, rows, refresh=True)
        return self._logits(self.hidden_states(tokens, None, call), None), cache

    def from_cache(self, tokens: Tensor, cache: BlockCache, start: int,
                   rows: Tensor | None = None) -> Tensor:
        """Logits (R, n, V) of `tokens` (R, n) at positions [start, start + n) of `rows`."""
        return self._logits(self.hidden_states(tokens, None, BlockCall(cache, start, rows)),
                            None)

    @classmethod
    def from_folder(cls, cfg, vocab_size: int, folder: Path, raw: dict, device):
        """For inference: the folder's weights in their own dtype, memory-mapped, on `device`."""
        return fill_released(cls(cfg, vocab_size, raw=raw, load=False), folder, device)

    @classmethod
    def validate_config(cls, cfg) -> None:
        validate_folder_config(cfg, cls.family)

    @classmethod
    def check_data(cls, cfg, tokenizer) -> None:
        name = cfg.model.hf_model
        _, raw = read_folder_config(name)
        check_folder_data(cfg, tokenizer, raw, cls.read_shape(raw, name).max_length)
        if cfg.train.attention_anneal_steps and read_conversion(raw, name).get(
                "attention") == "causal":
            raise MdlmError("train.attention_anneal_steps anneals towards full attention; "
                            f"{name} attends causally (convert it with --attention full)")

    @classmethod
    def from_checkpoint(cls, cfg, vocab_size: int, folder: Path, *, causal: bool = False):
        raw = read_family_config(folder, cls.config_file)
        return materialise(cls(cfg, vocab_size, causal=causal, raw=raw, load=False))

    def save_checkpoint_files(self, folder: Path) -> None:
        write_family_config(folder / self.config_file, self.raw)

    def released_layout(self) -> tuple[dict, dict[str, Tensor]]:
        """This model in its family's released layout (`mdlm export`): config.json and the
        tensors by name. The state-dict adapter is the identity: `build_network` builds the
        release's own module tree, so the state dict is the folder's weights, key for key (as
        `assign_weights` checks when it loads one); config.json is the folder's own (its
        conversion record included), its dtype the weights'."""
        weights = {k: v.detach() for k, v in self.state_dict().items()}
        dtype = str(next(iter(weights.values())).dtype).removeprefix("torch.")
        return {**self.raw, "torch_dtype": dtype}, weights

    def describe(self) -> str:
        text = f"{self.title} {self.config.n_layers}x{self.config.hidden_size} ({self.source})"
        if self.conversion:
            text += (f", converted from {self.conversion.get('source')} (shift "
                     f"{'on' if self.shift else 'off'}, {self.attention} attention)")
        return text

    def num_parameters(self) -> int:
        return count_parameters(self)

    def run_block(self, block: nn.Module, x: Tensor, *args: Any) -> Tensor:
        """One block's forward, checkpointed while training with `checkpointing` on (a cached
        call never trains)."""
        if self.checkpointing and self.training and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(block, x, *args, use_reentrant=False)
        return block(x, *args)
