"""Decoders as generators: one protocol over every registered sampler and BD3-LM's blocks.
A batch of rows goes in; typed events come out as the sampler runs:

    for event in decode(denoiser, settings, canvas, schedule=..., generator=g):
        if isinstance(event, Revealed): ...   # the tokens one network call revealed
        elif isinstance(event, Finished): ... # the rows, NFE and each row's stop reason

The sampler runs in a thread of its own and reports the batch's state before each network
call (`SampleHooks.on_step`, which every sampler's calls pass through: engine/context.py's
`count_call`); the generator yields what changed between two states, so the events are the
sampler's own steps, in order, whatever the sampler. Closing the generator early (a consumer
that has what it needs, a client gone) stops the sampling at its next network call.
BD3-LM's blocks come out of `decode_blocks` as the same events, one per committed block.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import engine
from ..engine.block_sampling import BlockHooks, BlockRows


@dataclass(frozen=True)
class Revealed:
    """Positions of rows [first_row, first_row + B) that one network call revealed (B, L)
    bool, and those rows' tokens after it (B, L), the mask where still masked."""

    call: int
    first_row: int
    revealed: Tensor
    tokens: Tensor


@dataclass(frozen=True)
class Finished:
    """The rows filled (num_samples, L), the work counters, and each row's stop reason:
    "stop" where a stop token follows its answer's start, else "length"."""

    tokens: Tensor
    stats: engine.SampleStats
    reasons: tuple[str, ...]


Event = Revealed | Finished


class _Closed(Exception):
    """The consumer closed the generator: the sampler thread ends at its next call."""


def stop_reasons(tokens: Tensor, starts: list[int],
                 stop_ids: Collection[int]) -> tuple[str, ...]:
    """Per row: "stop" where one of `stop_ids` sits at or after the row's answer start."""
    stops = set(stop_ids)
    return tuple("stop" if stops & set(row[start:]) else "length"
                 for row, start in zip(tokens.tolist(), starts, strict=True))


def _answer_starts(prompt: Tensor | None, mask_id: int, rows: int) -> list[int]:
    """Where each row's answer starts: after its last fixed token (0 without a prompt)."""
    if prompt is None:
        return [0] * rows
    prompt = prompt[None].expand(rows, -1) if prompt.dim() == 1 else prompt
    fixed = prompt != mask_id
    last = torch.where(
        fixed, torch.arange(prompt.shape[1], device=prompt.device), -1
    ).max(1).values
    return (last + 1).tolist()


def _run(work: Callable[[Callable[[str, object], None]], object]) -> Iterator[tuple]:
    """`work(put)` in a thread, `put(kind, value)` its reports; yields them, then ("done",
    result), or raises its error. Closing the iterator makes the next report raise in the
    thread, which ends the work there."""
    box: queue.Queue = queue.Queue()
    closed = threading.Event()

    def put(kind: str, value: object) -> None:
        if closed.is_set():
            raise _Closed
        box.put((kind, value))

    def target() -> None:
        try:
            box.put(("done", work(put)))
        except _Closed:
            box.put(("closed", None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer's thread
            box.put(("error", e))

    thread = threading.Thread(target=target, name="mdlm-decode", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = box.get()
            if kind == "error":
                raise value
            if kind == "closed":
                return
            yield kind, value
            if kind == "done":
                return
    finally:
        closed.set()


def decode(denoiser, settings: engine.SamplingSettings, canvas: engine.Canvas, *,
           schedule="loglinear", generator: torch.Generator | None = None,
           stop_ids: Collection[int] = (), recorder=None) -> Iterator[Event]:
    """`engine.sample(denoiser, settings, canvas, ...)` as events (the module's protocol):
    a `Revealed` for each network call that revealed tokens, then `Finished`. `recorder`: the
    engine's `RevealRecorder`, for the samplers that record their draws."""
    mask = canvas.mask_id

    def work(put):
        hooks = engine.SampleHooks(on_step=lambda z: put("call", z.detach().clone()),
                                   on_batch=lambda n: put("batch", n), recorder=recorder)
        return engine.sample(denoiser, settings, canvas, schedule=schedule,
                             generator=generator, hooks=hooks, return_stats=True)

    first, calls, before = 0, 0, None  # the batch's first row, calls so far, its last state
    for kind, value in _run(work):
        if kind == "done":
            tokens, stats = value
            starts = _answer_starts(canvas.prompt, mask, canvas.num_samples)
            yield Finished(tokens, stats, stop_reasons(tokens, starts, stop_ids))
            return
        if kind == "batch":  # the state before was the batch's final one, after its last call
            first, calls, before = first + value, calls - 1, None
            continue
        if before is not None:  # what the call between the two states revealed
            new = (before == mask) & (value != mask)
            if bool(new.any()):
                yield Revealed(calls, first, new, value)
        before, calls = value, calls + 1


def decode_blocks(objective, model, settings: engine.SamplingSettings, rows: BlockRows, *,
                  generator: torch.Generator | None = None,
                  autocast_dtype: torch.dtype | None = None) -> Iterator[Event]:
    """A bd3lm model's `BD3LM.sample` as the same events: one `Revealed` per committed block
    (its tokens final then; `revealed` marks the block's positions), then `Finished` ("stop"
    for the rows that drew EOS after the prompt)."""

    def work(put):
        def on_block(start: int, block: Tensor) -> bool:
            put("block", (start, block.detach().clone()))
            return False

        return objective.sample(model, settings, rows, generator=generator,
                                autocast_dtype=autocast_dtype, hooks=BlockHooks(on_block))

    calls = 0
    for kind, value in _run(work):
        if kind == "block":
            start, block = value
            calls += 1
            tokens = torch.nn.functional.pad(block, (start, 0), value=-1)
            yield Revealed(calls, 0, tokens >= 0, tokens)
        else:
            yield Finished(value.tokens, value.stats,
                           tuple("stop" if e else "length" for e in value.ended.tolist()))
