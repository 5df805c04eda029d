"""The one rule that lays a request out in a row, for `mdlm sample`, the server and the
Python API alike (docs/sampling.md, "How long a row is"):

    row = start + prompt + answer + suffix     (nothing after the suffix)

- `start`: the tokens every training row of the model starts with (BOS of wrap-packed
  rows), none before a chat prompt (its template writes its own BOS) or raw prompt ids;
- `answer`: as many positions as asked (`--max-new-tokens`, `max_tokens`); when none is
  asked, the model family's default (`Capabilities.answer_tokens`: LLaDA 128, Dream 512,
  as their releases' generate functions), else the rest of the model's window (a DiT or an
  AR model trained on rows of L tokens), never a silent canvas of the whole window for a
  model whose release denoises prompt + answer only;
- a model that generates block by block (bd3lm, `Capabilities.block_size` L') rounds its
  row up to whole blocks, the positions after the answer drawn too (the row is
  `-(-(start + prompt + answer) // L') * L'` long); its default answer is the rest of the
  window, one block at least; it takes no suffix;
- the row must fit the window (the trained L), unless the caller allows longer rows or the
  model generates block by block (bd3lm: rows grow past L).

An infill template (`lay_out_infill`: `mdlm sample --infill`, `/v1/mdlm/infill`) is the same
row: its text before the first span is the prompt, the answer the rest of the row (the
window, or the row's `length`), over which the template's spans and the text between and
after them lie; every position after the template is free too.

Instead of an answer a caller may ask for the row's whole `length` (`mdlm sample --length`):
the answer is then what the row leaves after the start and the prompt.

A semi-AR row (MDLM §4.2, `lay_out_semi_ar`: `mdlm semi-ar`, the server's `stride`, lm-eval
past the window) is the same start + prompt + answer, drawn as the window L, then
extensions of `stride` L' new tokens (default L // 2), each keeping the last L - L' tokens
as its clean prefix, as many as the row needs, the last cut to the row; the prompt must be
shorter than the window, and an answer not asked for is the rest of the window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ..errors import MdlmError
from .capabilities import Capabilities


class LayoutError(MdlmError):
    """A request that does not fit in a row; `param` names the field to change."""

    def __init__(self, message: str, param: str = "max_tokens"):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class RowLayout:
    start: tuple[int, ...]
    prompt: tuple[int, ...]
    answer: int  # the answer's positions as asked (what a surface hands out at most)
    suffix: tuple[int, ...] = ()
    block_size: int = 0  # L' of a block model: the row rounded up to whole blocks
    stride: int = 0  # semi-AR: new tokens per extension after the first window, else 0
    window: int = 0  # semi-AR: the window each extension is drawn in (the model's L)
    inside: tuple[int, ...] = ()  # fixed tokens over the answer from its start (an infill
    # template after its first span: mask_id at each span, the text between and after them)

    @property
    def asked(self) -> int:
        """The row's positions before any block rounding."""
        return self.answer_start + self.answer + len(self.suffix)

    @property
    def prefix(self) -> list[int]:
        """The fixed tokens before the answer: the row start and the prompt."""
        return [*self.start, *self.prompt]

    @property
    def answer_start(self) -> int:
        return len(self.start) + len(self.prompt)

    @property
    def length(self) -> int:
        """The row's positions: `asked`, rounded up to whole blocks for a block model."""
        if not self.block_size:
            return self.asked
        return -(-self.asked // self.block_size) * self.block_size

    @property
    def extensions(self) -> int:
        """Semi-AR: the windows drawn after the first, `stride` new tokens each."""
        if not self.stride:
            return 0
        return max(math.ceil((self.length - self.window) / self.stride), 0)

    @property
    def rounded(self) -> bool:
        """Whether block rounding added positions after the answer."""
        return self.length != self.asked

    def template(self, mask_id: int) -> torch.Tensor:
        """(length,) the fixed tokens, `mask_id` at the answer's positions."""
        row = torch.full((self.length,), mask_id, dtype=torch.long)
        row[: self.answer_start] = torch.tensor(self.prefix, dtype=torch.long)
        if self.suffix:
            at = self.answer_start + self.answer
            row[at : at + len(self.suffix)] = torch.tensor(self.suffix, dtype=torch.long)
        if self.inside:
            at = self.answer_start
            row[at : at + len(self.inside)] = torch.tensor(self.inside, dtype=torch.long)
        return row


def lay_out(caps: Capabilities, prompt: Sequence[int], *, answer: int | None = None,
            suffix: Sequence[int] = (), start: Sequence[int] | None = None,
            longer: bool = False, length: int | None = None) -> RowLayout:
    """The row of one prompt (the module's rule). `start`: the tokens before the prompt
    (default the model's row start); `longer`: a row may pass the window (`--allow-longer`);
    `length`: the row's whole length instead of an `answer` (`--length`)."""
    start = caps.row_start if start is None else tuple(start)
    block = caps.block_size
    if block and suffix:
        raise LayoutError("a model that generates block by block takes no suffix", "suffix")
    fixed = len(start) + len(prompt) + len(suffix)
    if length is not None:
        if answer is not None:
            raise LayoutError("give the answer's length or the row's, not both")
        answer = length - fixed
        if answer < 1:
            raise LayoutError(f"the prompt is {fixed} tokens (the row start included); the "
                              f"row's length is {length}", "length")
    room = None if block or longer else caps.window - fixed
    if answer is None:
        answer = _default_answer(caps, fixed, room)
    if answer is None:  # no window and no default: nothing says how long
        raise LayoutError("say how many tokens to generate (max_tokens / --max-new-tokens)")
    if answer < 1 or room is not None and answer > room:
        raise LayoutError(_too_long(len(prompt), len(suffix), len(start), answer, caps.window))
    return RowLayout(start, tuple(prompt), answer, tuple(suffix), block)


def _default_answer(caps: Capabilities, fixed: int, room: int | None) -> int | None:
    """An answer not asked for: the family's default (cut to the room), else the rest of the
    window (a block model's: one block at least, its rows growing past the window)."""
    if caps.answer_tokens is not None:
        return caps.answer_tokens if room is None else min(caps.answer_tokens, room)
    if caps.block_size:
        return max(caps.window - fixed, caps.block_size)
    return room


def semi_ar_stride(caps: Capabilities, stride: int | None) -> int:
    """Semi-AR's new tokens per extension: as asked, else half the window (MDLM §4.2)."""
    return caps.window // 2 if stride is None else stride


def lay_out_semi_ar(caps: Capabilities, prompt: Sequence[int], *, stride: int | None = None,
                    answer: int | None = None, start: Sequence[int] | None = None,
                    length: int | None = None) -> RowLayout:
    """The semi-AR row of one prompt (the module's rule): start + prompt + answer (as asked,
    or what `length` leaves, else the rest of the window), the prompt shorter than the
    window, drawn as the window then `extensions` of `stride` (default L // 2)."""
    start = caps.row_start if start is None else tuple(start)
    fixed = len(start) + len(prompt)
    if fixed >= caps.window:
        raise LayoutError(f"a semi-AR prompt must be shorter than the window: {fixed} tokens, "
                          f"window {caps.window}", "prompt")
    if answer is None and length is None:
        answer = caps.window - fixed
    row = lay_out(replace(caps, block_size=0), prompt, answer=answer, start=start,
                  longer=True, length=length)
    return replace(row, stride=semi_ar_stride(caps, stride), window=caps.window)


def lay_out_infill(caps: Capabilities, template: Sequence[int], *,
                   start: Sequence[int] | None = None, length: int | None = None,
                   longer: bool = False) -> RowLayout:
    """The row of an infill `template` (its tokens, `caps.mask_id` at each position to fill):
    the text before its first span the prompt, the rest of the row (`length`, default the
    window) its answer, the template after the first span laid over it (`inside`)."""
    first = list(template).index(caps.mask_id)
    row = lay_out(caps, template[:first], start=start, longer=longer,
                  length=caps.window if length is None else length)
    if len(template) - first > row.answer:
        raise LayoutError(_too_long(first, 0, len(row.start), len(template) - first,
                                    caps.window), "template")
    return replace(row, inside=tuple(template[first:]))


def _too_long(prompt: int, suffix: int, start: int, answer: int, window: int) -> str:
    parts = f"prompt ({prompt} tokens" + (f", {start} of row start)" if start else ")")
    parts += f" + suffix ({suffix})" if suffix else ""
    if answer >= 1:
        parts += f" + answer ({answer})"
    return f"{parts} exceeds the window of {window} tokens"
