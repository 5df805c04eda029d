"""Constrained draws: spans of positions whose concatenated token texts must lie in a regular
language, enforced at every network call by a denoiser wrapper (the server's `json_schema`).

A masked diffusion model reveals positions in any order, so a left-to-right rule ("the tokens
that continue the text so far") is not enough. For each span, `SpanConstraint.allowed` runs a
forward and a backward reachability over (position, DFA state), given the tokens already
revealed, and allows at a masked position exactly the tokens after which some completion of
the span is accepted.

The guarantee: if every span is satisfiable at the start (`satisfiable`), every draw is made
from logits that are -inf at the disallowed tokens (`ConstrainedDenoiser`), and the sampler
reveals one position per row between two network calls and never changes a revealed token
(first-hitting with `tokens_per_step` 1, fp64 or greedy draws, which never pick a token of
weight 0), then after every draw each span can still be completed, so once every position is
revealed each span's text is accepted. (On CUDA the float64 CDF is a parallel scan, which may
round a weight-0 token's step an ulp above 0; the server checks every finished row with
`satisfiable` and never returns one that fails.) Samplers that reveal several positions from
one call could combine two individually allowed tokens into a pair no completion has; they
are not guarded here.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from .diffusion import call_denoiser
from .protocols import Denoiser, is_time_agnostic


class Language(Protocol):
    """A character DFA: `start`, `step(state, ch)` (None: no text of the language continues
    so) and `accepts(state)`; states are hashable and finitely many are reachable."""

    start: Hashable

    def step(self, state: Hashable, ch: str) -> Hashable | None: ...

    def accepts(self, state: Hashable) -> bool: ...


def walk(language: Language, state: Hashable | None, text: str) -> Hashable | None:
    """The state after `text`, None where it leaves the language."""
    for ch in text:
        if state is None:
            return None
        state = language.step(state, ch)
    return state


@dataclass
class Span:
    """Positions [start, start + length) of every row whose tokens' texts must be accepted by
    a DFA, held as tables over the vocabulary."""

    start: int
    length: int
    table: Tensor  # (S, V) long: the state after each token's text, -1 where none
    reach: Tensor  # (S, S) float: 1 where some token leads from s to s'
    accept: Tensor  # (S,) bool


def compile_span(language: Language, strings: list[str | None], start: int,
                 length: int) -> Span:
    """A span at [start, start + length) over the language's tables (`language_tables`)."""
    return Span(start, length, *language_tables(language, strings))


def language_tables(language: Language,
                    strings: list[str | None]) -> tuple[Tensor, Tensor, Tensor]:
    """The language's states reachable through the tokens' texts `strings` (None: a token
    never allowed), breadth first, and their tables: next state, reach, accept."""
    index, states, rows = {language.start: 0}, [language.start], []
    while len(rows) < len(states):
        row = []
        for text in strings:
            nxt = None if text is None else walk(language, states[len(rows)], text)
            if nxt is not None and nxt not in index:
                index[nxt] = len(states)
                states.append(nxt)
            row.append(-1 if nxt is None else index[nxt])
        rows.append(row)
    table = torch.tensor(rows, dtype=torch.long)
    reach = torch.zeros(len(states), len(states) + 1).scatter_(1, table + 1, 1.0)
    accept = torch.tensor([language.accepts(s) for s in states])
    return table, reach[:, 1:].contiguous(), accept


class SpanConstraint:
    """Spans of a row layout (the same for every row) and the tokens each masked position
    allows given the state z."""

    def __init__(self, spans: list[Span], mask_id: int, vocab_size: int):
        self.spans, self.mask_id, self.vocab_size = spans, mask_id, vocab_size

    def _forward(self, span: Span, zs: Tensor) -> list[Tensor]:
        """States (B, S) reachable before each position of the span and after its last (zs:
        the span's columns): a revealed token moves along the table, a masked one along any."""
        B, S = len(zs), len(span.accept)
        states = torch.zeros(B, S, dtype=torch.bool)
        states[:, 0] = True
        out = [states]
        for p in range(span.length):
            tok = zs[:, p]
            moved = torch.zeros(B, S + 1).scatter_add_(1, span.table[:, tok].T + 1,
                                                       states.float())[:, 1:] > 0
            free = (states.float() @ span.reach) > 0
            states = torch.where((tok == self.mask_id)[:, None], free, moved)
            out.append(states)
        return out

    def satisfiable(self, z: Tensor) -> Tensor:
        """(B,) bool: every span of each row can still be completed to an accepted text."""
        z = z.cpu()
        ok = torch.ones(len(z), dtype=torch.bool)
        for span in self.spans:
            last = self._forward(span, z[:, span.start : span.start + span.length])[-1]
            ok &= (last & span.accept).any(1)
        return ok

    def allowed(self, z: Tensor, positions: Tensor | None = None) -> Tensor:
        """(N, V) bool at the N True entries of `positions` (B, L) (all positions if None), in
        row-major order: at a masked position of a span, the tokens after which the span can
        still be completed; True elsewhere. Only the positions asked are worked out over the
        vocabulary (a sampler asks for those it draws)."""
        z = z.cpu()
        B, L = z.shape
        positions = torch.ones(B, L, dtype=torch.bool) if positions is None else positions.cpu()
        index = positions.flatten().cumsum(0).view(B, L) - 1  # each asked position's row in out
        out = torch.ones(int(positions.sum()), self.vocab_size, dtype=torch.bool)
        for span in self.spans:
            zs = z[:, span.start : span.start + span.length]
            forward = self._forward(span, zs)
            back = span.accept.expand(B, -1)  # states from which the rest can be accepted
            for p in reversed(range(span.length)):
                tok = zs[:, p]
                masked = (tok == self.mask_id)[:, None]
                padded = torch.cat([torch.zeros(B, 1, dtype=torch.bool), back], 1)  # (B, S + 1)
                rows = torch.nonzero(masked[:, 0] & positions[:, span.start + p])[:, 0]
                if len(rows):
                    # (R, S, V)
                    ok = padded[rows][:, span.table + 1] & forward[p][rows][:, :, None]
                    out[index[rows, span.start + p]] = ok.any(1)
                free = (back.float() @ span.reach.T) > 0
                back = torch.where(masked, free, padded.gather(1, span.table[:, tok].T + 1))
        return out


class ConstrainedDenoiser:
    """A denoiser whose logits are -inf at the tokens `constraint` disallows, given the state
    z_t it is called on (every row has the same layout, so a subset of rows, as samplers pass
    once some rows are done, is masked the same way)."""

    supports_output_mask = True

    def __init__(self, base: Denoiser, constraint: SpanConstraint):
        self.base, self.constraint = base, constraint
        self.time_agnostic = is_time_agnostic(base)

    def __call__(self, z_t: Tensor, t: Tensor, *, output_mask: Tensor | None = None,
                 attention_mask: Tensor | None = None) -> Tensor:
        logits = call_denoiser(self.base, z_t, t, output_mask=output_mask,
                               attention_mask=attention_mask)
        ok = self.constraint.allowed(z_t, output_mask).to(logits.device)  # (N, V)
        if ok.shape[-1] < logits.shape[-1]:  # a vocabulary padded past the tokeniser's
            ok = torch.cat([ok, ok.new_zeros(len(ok), logits.shape[-1] - ok.shape[-1])], -1)
        return logits.masked_fill(~ok.view(logits.shape), -math.inf)
