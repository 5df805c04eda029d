"""A block diffusion (bd3lm) model behind `mdlm serve`: each prompt's choices are generated block
by block with the key/value cache of the finished blocks (`BD3LM.sample`, as `mdlm sample`
draws them), past the training length if `max_tokens` asks, and each block's text is handed
out as soon as the block is committed: a finished block never changes, so a stream sends it
once, with no revision.

Requests of one row length, prompt length and sampling settings share a batch (serve/gather.py
gathers them): each is a `Part` of the batch, its rows drawing from its own generator
(`BlockDraw.groups`), so it gets the tokens it gets alone. Its choices end at EOS
(`finish_reason` "stop"), at a stop string or at `max_tokens` ("length"); the sampling stops
after the block in which the last choice of every part has ended, the rows of the parts that
ended before it drawn on with their tokens dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import engine
from ..engine.block_sampling import BlockHooks, BlockRows, GroupCounts
from ..generation.layout import LayoutError, lay_out
from ..generation.text import ChoiceText
from .events import Emit, TextDelta
from .generation import Outcome
from .schema import Limits, Plan, Row, invalid
from .served import Served


def block_rows(prompts: list[list[int]], max_tokens: int | None, served: Served,
               limits: Limits, start: list[int] | None = None) -> tuple[list[Row], int]:
    """One prefix-only `Row` per prompt and the new tokens, each row laid out by the one rule
    (generation/layout.py: start + prompt + answer, rounded up to whole blocks of L';
    `max_tokens`, by default what the longest prompt's rule gives: the rest of the training
    length, one block at least, the same for all). The blocks go on past that length, up to
    `max_semi_ar_windows` training lengths (the positions semi-AR may reach); `start` as
    `prompt_rows`'s."""
    loaded, caps = served.loaded, served.capabilities
    longest = max(prompts, key=len)
    try:
        max_tokens = lay_out(caps, longest, answer=max_tokens, start=start).answer
        layouts = [lay_out(caps, ids, answer=max_tokens, start=start) for ids in prompts]
    except LayoutError as e:
        raise invalid(str(e), e.param, "context_length_exceeded") from None
    most, size = limits.max_semi_ar_windows * loaded.length, max(r.length for r in layouts)
    if size > most:
        raise invalid(f"prompt and row start ({max(r.answer_start for r in layouts)} tokens) + "
                      f"max_tokens ({max_tokens}) are {size} positions in blocks of "
                      f"{caps.block_size}; the server's limit is {most} "
                      f"({limits.max_semi_ar_windows} training lengths)", "max_tokens",
                      "context_length_exceeded")
    decode = loaded.tokenizer.decode
    rows = [Row(None, r.prefix, len(ids), 0, decode(ids), length=r.length)
            for r, ids in zip(layouts, prompts, strict=True)]
    return rows, max_tokens


def choice_texts(plan: Plan, served: Served) -> list[ChoiceText]:
    """Each choice's text, ended at EOS whatever the packing (`mdlm sample` on bd3lm stops
    there too) and at the chat turn's end."""
    tok = served.loaded.tokenizer
    return [ChoiceText(tok.decode, plan.max_tokens, plan.stop, tok.eos_id,
                       prefix=row.echo if plan.echo else "", end_ids=plan.end_ids)
            for row in plan.rows for _ in range(plan.n)]


SizeFor = Callable[[int, int], int]  # (rows, row length) -> the rows their batch runs at


@dataclass(eq=False)
class Part:
    """One prompt's n choices in a batch of block sampling: its plan and row, its generator,
    its choices' texts (`first`: the index of its first) and where their text goes; what it
    took (`calls`, `draws`: up to the block in which its last choice ended, what it takes
    alone); `dropped`: why it stopped before (its client left, its time ran out)."""

    plan: Plan
    row: Row
    generator: torch.Generator
    texts: list[ChoiceText]
    emit: Emit
    first: int = 0
    calls: int = 0
    draws: int = 0
    ended: bool = False  # every choice has its text
    dropped: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.ended or self.dropped is not None

    def feed(self, start: int, block: torch.Tensor) -> None:
        """Its rows (n, L') of the block committed at `start`: the new text of each choice."""
        for j, new in enumerate(block[:, max(len(self.row.prefix) - start, 0):].cpu().tolist()):
            _send(self.emit, self.first + j, self.texts[j].feed(new))
        self.ended = all(t.finish_reason is not None for t in self.texts)

    def stats(self) -> engine.SampleStats:
        n = self.plan.n
        return engine.SampleStats(n, self.calls, self.calls * n, self.draws)


def sample_parts(parts: list[Part], served: Served, check: Callable[[], None],
                 size: int) -> int:
    """The parts' rows (one row length, one prompt length, one sampling settings) in one
    `BD3LM.sample`, each part's rows drawing from its own generator, padded to `size` rows
    that draw from a generator of their own (their tokens dropped). A part is fed its blocks
    until its choices have ended; the sampling stops once every part has ended. `check` runs
    before each network call. Returns the network calls made."""
    loaded, lead = served.loaded, parts[0]
    how = lead.plan.settings
    groups = [(p.plan.n, p.generator) for p in parts]
    prefixes = [p.row.prefix for p in parts for _ in range(p.plan.n)]
    if size > len(prefixes):
        groups.append((size - len(prefixes),
                       torch.Generator(device=served.device).manual_seed(0)))
        prefixes += [lead.row.prefix] * (size - len(prefixes))
    counts = GroupCounts()

    def on_block(start: int, block: torch.Tensor) -> bool:
        first = 0
        for i, part in enumerate(parts):
            if not part.done:
                part.feed(start, block[first:first + part.plan.n])
                if part.ended:
                    part.calls, part.draws = counts.calls[i], counts.draws[i]
            first += part.plan.n
        return all(p.done for p in parts)

    prompt = torch.tensor(prefixes, dtype=torch.long) if lead.row.prefix else None
    samples = loaded.objective.sample(
        loaded.model, how.with_(steps=how.steps or 1),
        BlockRows(len(prefixes), lead.row.length, prompt), generator=None, groups=groups,
        autocast_dtype=served.dtype, hooks=BlockHooks(on_block, check, counts))
    for i, part in enumerate(parts):
        if not part.done:  # it ran to its row's length
            part.calls, part.draws = counts.calls[i], counts.draws[i]
    return samples.stats.calls  # the batch's: its rows' logits and its blocks' commits


def run_blocks(plan: Plan, served: Served, denoiser, emit: Emit,
               size_for: SizeFor | None = None) -> Outcome:
    """The plan's rows alone (prompt-major: choice index = prompt * n + j), each prompt's n
    choices in one batch of `BD3LM.sample` under the request's one generator, prompt after
    prompt, each batch at `size_for`'s rows (padded; its own rows without). `denoiser`: the
    worker's wrapper of a job that runs alone, whose `check` stops the sampling at its next
    network call once the client has gone or the time limit has passed."""
    generator = torch.Generator(device=served.device).manual_seed(plan.seed)
    texts = choice_texts(plan, served)
    stats, t0, calls, padded = engine.SampleStats(), time.perf_counter(), 0, 0
    for p, row in enumerate(plan.rows):
        first = p * plan.n
        part = Part(plan, row, generator, texts[first:first + plan.n], emit, first)
        size = plan.n if size_for is None else size_for(plan.n, row.length)
        calls += sample_parts([part], served, denoiser.check, size)
        padded = max(padded, size)
        stats.num_sequences += plan.n
        stats.merge(part.stats())
    # its batches, one per prompt, shared with no other request
    batch = {"requests": 1, "rows": plan.n, "padded_to": padded, "network_calls": calls,
             "batches": len(plan.rows)}
    return finished(plan, texts, emit, stats, time.perf_counter() - t0, batch)


def finished(plan: Plan, texts: list[ChoiceText], emit: Emit, stats: engine.SampleStats,
             seconds: float, batch: dict | None = None) -> Outcome:
    """The plan's answer once its texts are final (`batch`: the batch it shared, if any)."""
    for i, text in enumerate(texts):
        _send(emit, i, text.finish())
    choices = [{"index": i, "text": t.text, "finish_reason": t.finish_reason, "logprobs": None,
                "length": len(t.tokens), "ended": t.ended} for i, t in enumerate(texts)]
    return Outcome(choices, stats, seconds, plan.n * sum(r.n_prompt for r in plan.rows),
                   sum(len(t.tokens) for t in texts), batch)


def _send(emit: Emit, index: int, delta: str) -> None:
    if delta:
        emit(TextDelta(index, delta))
