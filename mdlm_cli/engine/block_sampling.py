"""Block-by-block sampling of a block diffusion model (BD3-LM, Arriola et al.): each block of
L' tokens starts masked (but for the prompt's tokens in it) and is denoised given the finished
blocks by one within-block step, then joins them; generation stops once every row has drawn
EOS after the prompt.

The model side is a `BlockModel`: `start` a batch, `logits` of a noisy block given the
finished blocks (nothing kept), `commit` a finished block. Attention is block-causal, so a
finished block's keys and values never change: a key/value cache of them is exact, and the
cached and the recomputing models give the same tokens under one generator.

The within-block step is pluggable (`BLOCK_STEPS`, keyed by the engine sampler it mirrors):
`ancestral`, `first-hitting` and `confidence`; nucleus and vocabulary top-k filtering
(`top_p`, `top_k`) and temperature apply to every draw, as the reference applies
`sampling.nucleus_p` to p_theta before either of its updates. The model takes no time (bd3lm
refuses time conditioning), so a step's logits serve until the block changes.

Several requests share a batch as `BlockDraw.groups`: each group of rows draws from its own
generator exactly what it would draw alone, so a server batches seeded requests without
changing their tokens (where the network gives a row the same bits in any batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from .categorical import sample_tokens, sample_tokens_with_probs
from .context import SampleStats
from .schedules import Schedule


class BlockModel(Protocol):
    def start(self, batch: int, max_len: int, device: torch.device) -> None: ...

    def logits(self, block: Tensor) -> Tensor:
        """(B, L', V) of the noisy block (B, L') after the finished blocks."""
        ...

    def commit(self, block: Tensor) -> None:
        """The finished block (B, L') becomes context of the next ones."""
        ...


@dataclass
class BlockSamples:
    tokens: Tensor  # (B, n): the prompt and the blocks drawn (n a multiple of L')
    lengths: Tensor  # (B,) tokens up to and including the first EOS after the prompt; else n
    ended: Tensor  # (B,) bool: the row drew EOS after the prompt
    stats: SampleStats = field(default_factory=SampleStats)


@dataclass
class GroupCounts:
    """Each group's work so far (`BlockDraw.groups`), what it takes alone: its draws, and its
    network calls (the calls at which it draws, and the commit of each block). A batch's own
    calls may be more: a step runs the network when any group reveals something."""

    draws: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)

    def size(self, groups: int) -> None:
        if len(self.draws) != groups:  # in place: a caller may hold the lists
            self.draws[:], self.calls[:] = [0] * groups, [0] * groups

    def committed(self, groups: int) -> None:
        self.size(groups)
        self.calls[:] = [c + 1 for c in self.calls]


@dataclass
class BlockDraw:
    """What a within-block step reads: its steps, the draw's settings and the work counters.

    `groups` batches several requests: (rows, generator) for consecutive rows, each group's
    random draws from its own generator in the order the group alone would make them (a group
    with nothing left to draw draws nothing, as it would have stopped), so with a network that
    gives a row the same logits in any batch each group gets the tokens it gets alone. None:
    one group of every row, drawing from `generator`."""

    mask_id: int
    schedule: Schedule
    generator: torch.Generator | None
    steps: int = 1000  # per block, for the steps that take steps
    precision: str = "fp64"
    temperature: float = 1.0
    top_p: float = 1.0  # nucleus mass
    top_k: int = 0  # vocabulary top-k, after top_p (0: every token)
    tokens_per_step: int = 1  # first-hitting's k
    stats: SampleStats = field(default_factory=SampleStats)
    # runs before each network call: a server stops a request whose client left there
    before_call: Callable[[], None] | None = None
    groups: list[tuple[int, torch.Generator | None]] | None = None
    counts: GroupCounts = field(default_factory=GroupCounts)  # per group, so far

    def logits(self, model: BlockModel, z: Tensor) -> Tensor:
        self.check()
        self.stats.calls += 1
        self.stats.sequence_evals += z.shape[0]
        return model.logits(z)

    def check(self) -> None:
        if self.before_call is not None:
            self.before_call()

    def spans(self, batch: int) -> list[tuple[slice, torch.Generator | None]]:
        """Each group's rows of a batch of `batch` rows and its generator."""
        if self.groups is None:
            return [(slice(0, batch), self.generator)]
        spans, start = [], 0
        for rows, gen in self.groups:
            spans.append((slice(start, start + rows), gen))
            start += rows
        if start != batch:
            raise ValueError(f"the groups hold {start} rows; the batch has {batch}")
        return spans

    def rand(self, shape, device, live: Tensor | None = None) -> Tensor:
        """Uniforms of `shape` (B, ...), each group's rows from its generator; a group with no
        `live` (B, ...) position draws none (ones: it is done)."""
        parts = []
        for rows, gen in self.spans(shape[0]):
            n = rows.stop - rows.start
            if live is not None and not bool(live[rows].any()):
                parts.append(torch.ones((n, *shape[1:]), device=device))
            else:
                parts.append(torch.rand((n, *shape[1:]), generator=gen, device=device))
        return torch.cat(parts)

    def draw(self, logits: Tensor, where: Tensor, probs: bool = False):
        """Tokens (N,) at the N True positions of `where` (B, L') from logits (B, L', V), in
        row-major order (`logits[where]`'s): tempered, nucleus-filtered, the mask never drawn,
        each group's from its generator (a group with no position draws nothing). With
        `probs`: (tokens, the drawn tokens' probabilities), the confidence step's draw."""
        fn = sample_tokens_with_probs if probs else sample_tokens
        spans = self.spans(len(where))
        self.counts.size(len(spans))
        parts = []
        for i, (rows, gen) in enumerate(spans):
            n = int(where[rows].sum())
            if n:  # the call was one this group alone makes: it draws at it
                self.counts.draws[i] += n
                self.counts.calls[i] += 1
                parts.append(fn(logits[rows][where[rows]], self.mask_id, generator=gen,
                                precision=self.precision, temperature=self.temperature,
                                top_p=self.top_p, top_k=self.top_k))
        self.stats.draws += int(where.sum())
        if not probs:
            return torch.cat(parts)
        return torch.cat([t for t, _ in parts]), torch.cat([p for _, p in parts])

    def most(self, masked: Tensor) -> Tensor:
        """(B,) each row's group's most masked positions in a row (what the group alone would
        read as `masked.sum(1).max()`)."""
        counts = masked.sum(1)
        out = torch.empty_like(counts)
        for rows, _ in self.spans(len(masked)):
            out[rows] = counts[rows].max()
        return out


BlockStep = Callable[[BlockModel, Tensor, BlockDraw], Tensor]  # fills z's masked positions


def ancestral_block(model: BlockModel, z: Tensor, d: BlockDraw) -> Tensor:
    """`steps` ancestral steps t = k / steps -> (k - 1) / steps (MDLM §4.1 within the block):
    a masked position is revealed with probability (alpha_s - alpha_t) / (1 - alpha_t) (all at
    the last step), its token drawn from p_theta. The logits are those of the block as it
    stands, computed only at a step that reveals something (the model takes no time)."""
    for k in range(d.steps, 0, -1):
        masked = z == d.mask_id
        if not bool(masked.any()):
            break
        t, s = torch.tensor(k / d.steps), torch.tensor((k - 1) / d.steps)
        u = d.rand(z.shape, z.device, live=masked)
        reveal = masked if k == 1 else masked & (u < float(d.schedule.unmask_prob(t, s)))
        if bool(reveal.any()):
            logits = d.logits(model, z)  # (B, L', V)
            z = z.masked_scatter(reveal, d.draw(logits, reveal))
    return z


def _first(order: Tensor, counts: Tensor) -> Tensor:
    """(B, L') bool: the first `counts` (B,) positions of each row's `order` (a permutation):
    `order[:, :k]` with a k per row."""
    take = torch.arange(order.shape[1], device=order.device)[None] < counts[:, None]
    return torch.zeros_like(order, dtype=torch.bool).scatter_(1, order, take)


def first_hitting_block(model: BlockModel, z: Tensor, d: BlockDraw) -> Tensor:
    """Zheng et al.'s first-hitting sampler in the block: each call reveals `tokens_per_step`
    uniformly chosen masked positions per row (one: exact, the model ignores time), their
    tokens from p_theta. The reference's default within-block update (`first_hitting: True`)."""
    while True:
        masked = z == d.mask_id
        if not bool(masked.any()):
            return z
        order = d.rand(z.shape, z.device, live=masked).masked_fill(~masked, 2.0).argsort(dim=1)
        chosen = _first(order, d.most(masked).clamp(max=d.tokens_per_step)) & masked
        logits = d.logits(model, z)
        z = z.masked_scatter(chosen, d.draw(logits, chosen))


def confidence_block(model: BlockModel, z: Tensor, d: BlockDraw) -> Tensor:
    """MaskGIT-style confidence decoding in the block: each of `steps` steps draws a token at
    every masked position and keeps the ceil(n / steps left) most likely draws (the top
    probabilities); inexact, biased to likely tokens."""
    for left in range(d.steps, 0, -1):
        masked = z == d.mask_id
        n = d.most(masked)  # (B,)
        if int(n.max()) == 0:
            break
        logits = d.logits(model, z)
        tokens, probs = d.draw(logits, masked, probs=True)
        confidence = torch.full(z.shape, -1.0, dtype=torch.float64, device=z.device)
        confidence[masked] = probs
        drawn = z.masked_scatter(masked, tokens)
        keep = -(-n // left)  # ceil(n / left) per row
        chosen = _first(confidence.argsort(dim=1, descending=True), keep) & masked
        z = torch.where(chosen, drawn, z)
    return z


BLOCK_STEPS: dict[str, BlockStep] = {
    "ancestral": ancestral_block,
    "first-hitting": first_hitting_block,
    "confidence": confidence_block,
}
# the engine sampler options each within-block step reads (the rest do not apply)
BLOCK_OPTIONS: dict[str, frozenset[str]] = {"first-hitting": frozenset({"tokens_per_step"})}
# sees each finished block (start, (B, L')) as it is committed; True: no more blocks are needed
OnBlock = Callable[[int, Tensor], bool]


@dataclass(frozen=True)
class BlockRows:
    """What block sampling fills: `num_samples` rows of up to `length` tokens (a multiple of
    L': the positions go on past the training length), their first P tokens fixed to
    `prompt`, (P,) for every row or (B, P) one per row (its whole blocks committed as they
    are); with `eos_id`, done once every row has drawn it after the prompt."""

    num_samples: int
    length: int
    prompt: Tensor | None = None
    eos_id: int | None = None


@dataclass(frozen=True)
class BlockHooks:
    """What a caller sees of block sampling: `on_block(start, block)` after each committed
    block (True ends the sampling), `before_call()` before each network call (a server stops
    a request whose client left there), `counts`: filled with each group's draws and calls
    so far (`BlockDraw.groups`)."""

    on_block: OnBlock | None = None
    before_call: Callable[[], None] | None = None
    counts: GroupCounts | None = None


def sample_blocks(model: BlockModel, d: BlockDraw, rows: BlockRows, *, block_size: int,
                  device: torch.device, step: BlockStep = ancestral_block,
                  on_block: OnBlock | None = None) -> BlockSamples:
    """The `rows`, block after block of `block_size`, each filled by `step`. With the rows'
    `eos_id`, stops after the block in which the last row drew EOS after the prompt (the rows
    that ended earlier are cut at their EOS by `lengths`). `on_block` sees each block once
    committed (a block is final then, so a server streams it) and may end the sampling
    there."""
    num_samples, length, prompt, eos_id = rows.num_samples, rows.length, rows.prompt, rows.eos_id
    model.start(num_samples, length, device)
    P = 0 if prompt is None else prompt.shape[-1]
    fixed = torch.full((num_samples, length), d.mask_id, dtype=torch.long, device=device)
    if prompt is not None:
        fixed[:, :P] = prompt.to(device)  # (P,) broadcast to every row, or (B, P)
    blocks, ended = [], torch.zeros(num_samples, dtype=torch.bool, device=device)
    d.stats.num_sequences += num_samples
    for b in range(length // block_size):
        start = b * block_size
        z = fixed[:, start:start + block_size].clone()
        if bool((z == d.mask_id).any()):
            z = step(model, z, d)
        d.check()
        model.commit(z)
        d.stats.calls += 1
        d.counts.committed(len(d.spans(num_samples)))
        d.stats.sequence_evals += num_samples
        blocks.append(z)
        if on_block is not None and on_block(start, z):
            break
        if eos_id is not None and start + block_size > P:
            ended |= (z[:, max(P - start, 0):] == eos_id).any(dim=1)
            if bool(ended.all()):
                break
    tokens = torch.cat(blocks, dim=1)
    n = tokens.shape[1]
    positions = torch.arange(n, device=device)
    is_eos = (tokens == eos_id) & (positions >= P) if eos_id is not None \
        else torch.zeros_like(tokens, dtype=torch.bool)
    first = torch.where(is_eos, positions, n).min(dim=1).values
    return BlockSamples(tokens, torch.where(ended, first + 1, n), ended, d.stats)
