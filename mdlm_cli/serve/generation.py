"""Running a `Plan`: the request's rows through the decoder protocol (generation/decode.py; a
semi-AR request through engine.semi_ar) with its own generator, and the text of each choice,
decoded as it is decided.

Streamed and non-streamed answers come from the same code: each choice's `ChoiceText`
(generation/text.py) is fed
the new tokens (every semi-AR block as it is committed, a single window's tokens once), cuts
them at `max_tokens`, at the end of text and at a stop string, and hands out the new text;
the final text is what it handed out, so the joined stream is the non-streamed text.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import engine
from ..engine.constraints import ConstrainedDenoiser
from ..engine.reveals import RevealRecorder
from ..generation.decode import Finished, decode
from ..generation.text import ChoiceText
from .events import Emit, StateSnapshot, TextDelta
from .schema import Plan
from .served import Served


class _AllFinished(Exception):
    """Every choice has its text: the remaining semi-AR blocks are not needed."""


@dataclass
class Outcome:
    choices: list[dict]
    stats: engine.SampleStats
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    batch: dict | None = None  # a bd3lm request's shared batch (serve/gather.py)


def _texts(plan: Plan, served: Served) -> list[ChoiceText]:
    tok = served.loaded.tokenizer
    eos = tok.eos_id if plan.endpoint == "completion" and served.loaded.row_start() else None
    texts = []
    decode = tok.decode if plan.constraint is None else plan.constraint.text
    for row in plan.rows:
        for _ in range(plan.n):
            texts.append(
                ChoiceText(
                    decode,
                    plan.max_tokens,
                    plan.stop,
                    eos,
                    prefix=row.echo if plan.echo else "",
                    end_ids=plan.end_ids,
                )
            )
    return texts


def _sample_kwargs(plan: Plan, served: Served, generator: torch.Generator) -> dict:
    """How every network call of the plan draws: its settings, schedule and generator."""
    return dict(settings=plan.settings, schedule=served.loaded.objective.schedule,
                generator=generator)


def run_plan(plan: Plan, served: Served, denoiser, emit: Emit) -> Outcome:
    """Sample the plan's rows (prompt-major: choice index = prompt * n + j) and decode them."""
    loaded = served.loaded
    generator = torch.Generator(device=served.device).manual_seed(plan.seed)
    kwargs = _sample_kwargs(plan, served, generator)
    texts = _texts(plan, served)
    t0 = time.perf_counter()
    if plan.constraint is not None:  # each draw kept to what the schema allows
        denoiser = ConstrainedDenoiser(denoiser, plan.constraint)
    recorders: list[tuple[RevealRecorder, int]] = []  # each choice's recorder and row in it
    if plan.stride is not None:
        stats = _semi_ar(plan, served, denoiser, kwargs, texts, emit)
    else:
        tokens, stats, recorders = _sample_rows(plan, served, denoiser, kwargs, emit)
        constraint = plan.constraint
        if constraint is not None and not constraint.satisfiable(torch.stack(tokens)).all():
            # only a parallel scan's rounding (a weight-0 token's CDF step of an ulp) could
            # draw a disallowed token; an answer that might not parse is never sent
            raise RuntimeError("a json_schema answer left its schema; retry the request")
        if plan.endpoint == "infill":
            return _infill_outcome(
                plan, served, torch.stack(tokens), stats, time.perf_counter() - t0, emit
            )
        for i, row in enumerate(tokens):
            start = len(plan.rows[i // plan.n].prefix)
            _send(emit, i, texts[i].feed(row[start : start + plan.max_tokens].tolist()))
    for i, text in enumerate(texts):
        _send(emit, i, text.finish())
        if plan.constraint is not None:  # the JSON is complete
            text.finish_reason = "stop"
    choices = [  # length and ended: as `mdlm sample` reports an answer cut at its EOS
        {"index": i, "text": t.text, "finish_reason": t.finish_reason,
         "logprobs": None if not recorders else logprobs_object(
             loaded.tokenizer.decode, t.tokens, *recorders[i],
             len(plan.rows[i // plan.n].prefix)),
         "length": len(t.tokens), "ended": t.ended}
        for i, t in enumerate(texts)
    ]
    prompt_tokens = plan.n * sum(r.n_prompt + r.n_suffix for r in plan.rows)
    return Outcome(
        choices, stats, time.perf_counter() - t0, prompt_tokens,
        sum(len(t.tokens) for t in texts),
    )


def _sample_rows(plan: Plan, served: Served, denoiser, kwargs: dict, emit: Emit
                 ) -> tuple[list[torch.Tensor], engine.SampleStats, list]:
    """Every choice's row (prompt-major: choice = prompt * n + j), sampled in groups of one
    row length (the engine samples a rectangle), in order, from the request's one generator,
    by the decoder protocol (generation/decode.py): with `stream_states` each call's state is
    handed out as it is decided, the last one with every position decided. With
    log-probabilities, (recorder, row in it) per choice."""
    lengths = [len(plan.rows[i // plan.n].template) for i in range(plan.num_rows)]
    tokens: list = [None] * plan.num_rows
    recorders: list = [None] * plan.num_rows
    stats = engine.SampleStats(num_sequences=0)
    for length in dict.fromkeys(lengths):  # first appearance first
        group = [i for i, n in enumerate(lengths) if n == length]
        recorder = None if plan.logprobs is None else RevealRecorder(
            (len(group), length), plan.logprobs, served.device)
        prompt = torch.stack([plan.rows[i // plan.n].template for i in group])
        canvas = engine.Canvas(len(group), length, served.loaded.mask_id, prompt,
                               device=served.device)
        out, done = _decoded(decode(denoiser, kwargs["settings"], canvas, recorder=recorder,
                                    schedule=kwargs["schedule"], generator=kwargs["generator"]),
                             emit if plan.states else None, served)
        stats.num_sequences += done.num_sequences
        stats.merge(done)
        for j, i in enumerate(group):
            tokens[i], recorders[i] = out[j].cpu(), (recorder, j)
    return tokens, stats, recorders if plan.logprobs is not None else []


def _decoded(events, emit: Emit | None, served: Served) -> tuple[torch.Tensor, object]:
    """The rows and counters a decoder's events end with; each `Revealed` state handed to
    `emit` as a snapshot of the first row, where given (stream_states)."""
    for event in events:
        if isinstance(event, Finished):
            return event.tokens, event.stats
        if emit is not None:
            emit(StateSnapshot(state_pieces(served, event.tokens[:1])))
    raise RuntimeError("the decoder ended without its rows")


def logprobs_object(decode: Callable[[list[int]], str], tokens: list[int],
                    recorder: RevealRecorder, row: int, start: int) -> dict:
    """OpenAI's legacy `logprobs` of a choice's tokens (those from position `start` of its row):
    each token's text, its log-probability at the network call that revealed it, that call's
    top alternatives (those of probability 0, outside top-p, left out) and its offset in the
    choice's text."""
    end = start + len(tokens)
    ids = recorder.top_ids[row, start:end].tolist()
    values = recorder.top_logprobs[row, start:end].tolist()
    return {
        "tokens": [decode([i]) for i in tokens],
        "token_logprobs": recorder.logprob[row, start:end].tolist(),
        "top_logprobs": [{decode([i]): v for i, v in zip(a, b, strict=True) if v > -math.inf}
                         for a, b in zip(ids, values, strict=True)],
        "text_offset": [len(decode(tokens[:k])) for k in range(len(tokens))],
    }


def _send(emit: Emit, index: int, delta: str) -> None:
    if delta:
        emit(TextDelta(index, delta))


def _semi_ar(
    plan: Plan, served: Served, denoiser, kwargs: dict, texts: list[ChoiceText], emit: Emit
) -> engine.SampleStats:
    """Semi-AR blocks, each one's text handed out as it is committed; stops once every choice
    is done."""
    loaded = served.loaded
    prefix = plan.rows[0].prefix

    def on_block(_round: int, new: torch.Tensor) -> None:
        for i, row in enumerate(new.cpu().tolist()):
            _send(emit, i, texts[i].feed(row))
        if all(t.finish_reason is not None for t in texts):
            raise _AllFinished

    hooks = engine.SampleHooks(on_block=on_block)
    if plan.states:  # each window's state before each of its calls
        hooks = engine.SampleHooks(on_block=on_block, on_step=lambda z: emit(
            StateSnapshot(state_pieces(served, z[:1]))))
    try:
        semi = engine.SemiArPlan(
            plan.num_rows, loaded.length, plan.stride, loaded.mask_id,
            target_length=plan.rows[0].length,
            prompt=torch.tensor(prefix, dtype=torch.long) if prefix else None,
            device=served.device)
        return engine.semi_ar(denoiser, plan=semi, hooks=hooks, **kwargs).stats
    except _AllFinished:  # the work done so far, as the request's denoiser counted it
        return engine.SampleStats(
            num_sequences=plan.num_rows,
            calls=getattr(denoiser, "calls", 0),
            sequence_evals=getattr(denoiser, "sequence_evals", 0),
        )


def _infill_outcome(
    plan: Plan, served: Served, tokens: torch.Tensor, stats, seconds: float, emit: Emit
) -> Outcome:
    """The filled templates: each row's whole text and the text of each filled span."""
    loaded = served.loaded
    tok, row = loaded.tokenizer, plan.rows[0]
    free = (row.template == loaded.mask_id).tolist()
    start = len(row.prefix)
    spans, i = [], start
    while i < len(free):  # the runs of free positions
        if free[i]:
            j = i
            while j < len(free) and free[j]:
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    choices = []
    for index, ids in enumerate(tokens.tolist()):
        text = tok.decode(ids[start:])
        _send(emit, index, text)
        choices.append(
            {
                "index": index,
                "text": text,
                "spans": [tok.decode(ids[a:b]) for a, b in spans],
                "logprobs": None,
                "finish_reason": "length",
            }
        )
    return Outcome(choices, stats, seconds, plan.n * row.n_prompt,
                   plan.num_rows * plan.max_tokens)


def state_pieces(served: Served, z: torch.Tensor) -> list[str | None]:
    """A denoising state for the page: each position's text, None where it is still masked."""
    tok, mask_id = served.loaded.tokenizer, served.loaded.mask_id
    return [None if i == mask_id else tok.decode([i]) for i in z[0].tolist()]
