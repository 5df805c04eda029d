"""What a backbone declares it can do: every optional trait that training, the objectives, LoRA
and the tasks read off a backbone, with its default.

Every class in `models.BACKBONES` inherits `BackboneTraits` and overrides only the traits it
has (a class attribute, or a property where the answer depends on how it was built: the DiT's
`shifted_logits` follows `model.shift`), so callers read `model.trait` (or `type(model).trait`
for what the class alone decides) instead of probing for them with getattr and a default.
Only plain values, never module names: a class attribute `blocks` or `vocab_embed` would hide
the submodule of that name (nn.Module keeps submodules outside the instance's `__dict__`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ..config import Config
    from ..data.tokenizers import Tokenizer


class BackboneTraits:
    """The defaults: a bidirectional-or-causal backbone of mdlm's own, with none of the
    optional abilities. No `__init__`: it goes before `nn.Module` in a backbone's bases."""

    # a released model family it loads (llada, dream, gpt2), its config.json's model_type, and
    # that family's default answer length (generation/layout.py); None: mdlm's own backbones
    family: ClassVar[str | None] = None
    model_type: ClassVar[str | None] = None
    answer_tokens: ClassVar[int | None] = None  # None: the rest of the window

    # attention (checked in build.py against the objective and the data); `requires_causal`:
    # the attention it is built with whatever the objective asks (True: causal only, Mamba;
    # False: bidirectional only; None: either, the DiT)
    requires_causal: ClassVar[bool | None] = None
    packs_segments: ClassVar[bool] = False  # keeps attention within segments (sft-pack rows)
    takes_query_masks: ClassVar[bool] = False  # a (B | 1, 1, L, L) mask and positions (BD3-LM)
    anneals_attention: ClassVar[bool] = False  # attends through `attention_anneal` (anneal.py)

    # outputs
    scores_in_chunks: ClassVar[bool] = False  # forward(nll_of=) gives -log p, chunk by chunk
    shifted_logits: bool = False  # position i's logits read from the output at i - 1 (Dream)
    kv_cache_blocks: bool = False  # BD3-LM sampling may keep finished blocks' keys and values
    # its own decoding cache, new_cache(batch, max_len, device, dtype) (Mamba's recurrent
    # state); None: the DiT's key/value cache (objectives/ar.py)
    new_cache: ClassVar[Callable[..., Any] | None] = None

    # LoRA's defaults (models/lora.py), read off the class
    lora_targets: ClassVar[tuple[str, ...]] = ()  # the linear layers LoRA adapts by default
    lora_whole: ClassVar[tuple[str, ...]] = ()  # trained whole with lora.train_embeddings
    lora_fan_in_fan_out: ClassVar[bool] = False  # (in, out) weights: GPT-2's Conv1D

    # checks of the data a run trains on, check_data(cfg, tokenizer) (a classmethod: its
    # tokeniser, the row length), called before the data is prepared; None: no checks
    check_data: ClassVar[Callable[[Config, Tokenizer], None] | None] = None
    notes: Sequence[str] = ()  # what a user should know of how it was built (a fresh MLM head)
    rcps: bool = False  # reverse-complement equivariant channels (Caduceus-PS: `strands`)
