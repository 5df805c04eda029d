"""What a loaded model can do for generation, read once from what its backbone, objective,
denoiser and tokeniser declare, so the surfaces above ask this record instead of probing
the model with `getattr` each on its own.

The declarations it reads, and who makes them:
- the objective: `causal` (left to right), `samples_by_blocks` and `block_size` (bd3lm);
- the backbone: `answer_tokens` (a released family's default answer length: LLaDA's
  `generate` takes gen_length 128, Dream's examples max_new_tokens 512), `family` and its
  `sampling_defaults` (its transfer schedule, Dream's top_k 50), through the checkpoint's
  state;
- the denoiser (engine/protocols.py): a block cache, shifted logits;
- the tokeniser: a chat template, and the end of a turn read off it (data/chat.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..checkpoints.folder import LoadedModel
from ..data.chat import end_of_turn_ids, has_chat_template
from ..engine.protocols import has_block_cache, has_shifted_logits

ATTENTIONS = ("bidirectional", "block-causal", "causal")


@dataclass(frozen=True)
class Capabilities:
    mask_id: int
    attention: str  # one of ATTENTIONS
    window: int  # the positions it was trained on (L); bd3lm rows may go past it
    row_start: tuple[int, ...]  # what every training row starts with (BOS of wrap-packed rows)
    answer_tokens: int | None  # the family's default answer length; None: the rest of the window
    block_size: int = 0  # bd3lm's L' (rows grow block by block), else 0
    caches: tuple[str, ...] = ()  # the block caches of the cached samplers ("prefix", "dual")
    shifted_logits: bool = False  # position i's logits come from i - 1 (Dream)
    chat: bool = False  # its tokeniser has a chat template
    end_of_turn: tuple[int, ...] = ()  # EOS and the template's end-of-turn token
    generation_defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def causal(self) -> bool:
        return self.attention == "causal"


def capabilities_of(loaded: LoadedModel, denoiser: Any = None) -> Capabilities:
    """The record of `loaded` (its denoiser built here unless given)."""
    objective, tok = loaded.objective, loaded.tokenizer
    blocks = objective.samples_by_blocks
    attention = "causal" if objective.causal else "block-causal" if blocks else "bidirectional"
    denoiser = denoiser if denoiser is not None or objective.causal else loaded.denoiser()
    cached = denoiser is not None and not objective.causal and has_block_cache(denoiser)
    chat = has_chat_template(tok)
    return Capabilities(
        mask_id=loaded.mask_id, attention=attention, window=loaded.length,
        row_start=tuple(loaded.row_start()),
        answer_tokens=loaded.model.answer_tokens,
        block_size=objective.block_size if blocks else 0,
        caches=("prefix", "dual") if cached else (),
        shifted_logits=bool(denoiser is not None and has_shifted_logits(denoiser)),
        chat=chat, end_of_turn=tuple(end_of_turn_ids(tok)) if chat else (tok.eos_id,),
        generation_defaults=loaded.sampling_defaults)
