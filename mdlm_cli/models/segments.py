"""Several examples in one row (`data.packing: sft-pack`): attention kept within each.

A row's attention mask may be given as segment ids instead of a bool mask: (B, L) integers, the
example each position belongs to (1, 2, ... within the row), 0 for padding. A position then
attends only to the positions of its own segment (block-diagonal attention, combined with the
causal mask for the AR objective), and its rotary position counts from its segment's start.
A bool mask, or integers that are all 0 or 1 (one example, then padding), keep their meaning.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def is_segmented(attention_mask: Tensor | None) -> bool:
    """Whether an attention mask holds segment ids of more than one example (a host sync)."""
    return (attention_mask is not None and attention_mask.dtype != torch.bool
            and bool((attention_mask > 1).any()))


def segment_starts(segments: Tensor) -> Tensor:
    """(B, L) bool: the first position of each segment (position 0 included)."""
    before = F.pad(segments, (1, 0), value=-1)[:, :-1]
    return segments != before


def segment_attention(segments: Tensor) -> tuple[Tensor, Tensor]:
    """The key mask (B, L, L) bool (query i may attend key j: same segment; the diagonal is
    always on, so no row of the softmax is empty) and the positions (B, L) long, counted from
    each segment's start. Rotary scores depend only on position differences, so the restart
    changes nothing in exact arithmetic; it makes a packed example compute, rounding included,
    what the same example alone at the start of a row computes."""
    same = segments[:, :, None] == segments[:, None, :]
    index = torch.arange(segments.shape[1], device=segments.device).expand_as(segments)
    start = torch.where(segment_starts(segments), index, 0).cummax(dim=1).values
    return same, index - start
