"""The backbone contract: what every class in `models.BACKBONES` provides (a structural type:
each implements its own methods), so that training, checkpoints and the objectives can build,
save, describe and call any of them alike.

The traits a backbone may have (`requires_causal`, `packs_segments`, `takes_query_masks`,
`anneals_attention`, `scores_in_chunks`, `shifted_logits`, `kv_cache_blocks`, `new_cache`, the
LoRA defaults, `check_data`, `notes`, `rcps`, its `family`) have their defaults on
`BackboneTraits` (models/traits.py), which every backbone inherits, overriding the ones it
has; callers read them as attributes.

Optional members beside them, each present only where a backbone has it:
- `block_cache(tokens, cache=None, rows=None) -> (logits, cache)` and `from_cache(tokens,
  cache, start, rows=None) -> logits`: Fast-dLLM's block cache (models/block_cache.py: one
  full pass stores every position's keys and values; a call on positions [start, start + n)
  attends to them, its own replacing theirs), on bidirectional time-agnostic models (the DiT);
- `attention_anneal`: the `AttentionAnneal` the training loop sets on a backbone that
  `anneals_attention` (models/anneal.py: DiffuLLaMA's causal-to-full schedule,
  train.attention_anneal_steps), its own attention when None or in eval mode;
- `blocks`: the modules FSDP2 shards one by one;
- `features(tokens)` -> hidden states (B, L, H) (DNA encoders): what `mdlm classify`
  fine-tunes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from torch import Tensor

if TYPE_CHECKING:
    from ..config import Config, ModelConfig


class Backbone(Protocol):
    """A module built as `cls(model_cfg, vocab_size, causal=...)` for training (vocabulary with
    the mask token) and called as `model(tokens (B, L), sigma (B,) or None, attention_mask=,
    output_mask=) -> logits (B, L, V)`, or (N, V) at the N True positions of `output_mask`."""

    config_keys: ClassVar[tuple[str, ...]]  # the ModelConfig keys it reads
    # a released model family it loads (LLaDA, Dream; None for mdlm's own), and that family's
    # default answer length (generation/layout.py; None: the rest of the window)
    family: ClassVar[str | None]
    answer_tokens: ClassVar[int | None]
    config: ModelConfig
    vocab_size: int
    causal: bool

    def __init__(self, cfg: ModelConfig, vocab_size: int, causal: bool = False) -> None: ...

    @classmethod
    def validate_config(cls, cfg: Config) -> None:
        """Refuse (MdlmError) model settings it cannot be built with."""

    @classmethod
    def from_checkpoint(cls, cfg: ModelConfig, vocab_size: int, folder: Path, *,
                        causal: bool = False) -> Backbone:
        """Rebuilt offline from a checkpoint folder, ready for its weights."""

    def save_checkpoint_files(self, folder: Path) -> None:
        """What it needs beside the weights to be rebuilt offline (hf-mlm: its HF config)."""

    def describe(self) -> str: ...

    def num_parameters(self) -> int: ...

    def __call__(self, tokens: Tensor, sigma: Tensor | None = None, *,
                 attention_mask: Tensor | None = None,
                 output_mask: Tensor | None = None) -> Tensor: ...
