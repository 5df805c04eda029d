"""A block diffusion (bd3lm) model behind `mdlm serve`: each prompt's choices are generated block
by block with the key/value cache of the finished blocks (`BD3LM.sample`, as `mdlm sample`
draws them), past the training length if `max_tokens` asks, and each block's text is handed
out as soon as the block is committed: a finished block never changes, so a stream sends it
once, with no revision.

A bd3lm request runs alone on the model (`Plan.alone`): its cache holds its own rows' keys and
values, which no other request's calls can share. Its choices end at EOS (`finish_reason`
"stop"), at a stop string or at `max_tokens` ("length"); the sampling stops after the block in
which the last of a prompt's choices ended.
"""

from __future__ import annotations

import time

import torch

from .. import engine
from ..engine.block_sampling import BlockHooks, BlockRows
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


def _texts(plan: Plan, served: Served) -> list[ChoiceText]:
    """Each choice's text, ended at EOS whatever the packing (`mdlm sample` on bd3lm stops
    there too) and at the chat turn's end."""
    tok = served.loaded.tokenizer
    return [ChoiceText(tok.decode, plan.max_tokens, plan.stop, tok.eos_id,
                       prefix=row.echo if plan.echo else "", end_ids=plan.end_ids)
            for row in plan.rows for _ in range(plan.n)]


def run_blocks(plan: Plan, served: Served, denoiser, emit: Emit) -> Outcome:
    """The plan's rows (prompt-major: choice index = prompt * n + j), each prompt's n choices
    in one batch of `BD3LM.sample` under the request's one generator, prompt after prompt.
    `denoiser`: the worker's wrapper of a job that runs alone, whose `check` stops the sampling
    at its next network call once the client has gone or the time limit has passed."""
    loaded, how = served.loaded, plan.settings
    generator = torch.Generator(device=served.device).manual_seed(plan.seed)
    texts = _texts(plan, served)
    stats, t0 = engine.SampleStats(), time.perf_counter()
    for p, row in enumerate(plan.rows):
        first, prefix = p * plan.n, len(row.prefix)
        mine = texts[first:first + plan.n]

        def on_block(start: int, block: torch.Tensor, mine=mine, first=first,
                     prefix=prefix) -> bool:
            for j, new in enumerate(block[:, max(prefix - start, 0):].cpu().tolist()):
                _send(emit, first + j, mine[j].feed(new))
            return all(t.finish_reason is not None for t in mine)

        rows = BlockRows(plan.n, row.length,
                         torch.tensor(row.prefix, dtype=torch.long) if prefix else None)
        out = loaded.objective.sample(
            loaded.model, how.with_(steps=how.steps or 1), rows, generator=generator,
            autocast_dtype=served.dtype,
            hooks=BlockHooks(on_block=on_block, before_call=denoiser.check))
        stats.num_sequences += out.stats.num_sequences
        stats.merge(out.stats)
    for i, text in enumerate(texts):
        _send(emit, i, text.finish())
    choices = [{"index": i, "text": t.text, "finish_reason": t.finish_reason, "logprobs": None,
                "length": len(t.tokens), "ended": t.ended} for i, t in enumerate(texts)]
    return Outcome(choices, stats, time.perf_counter() - t0,
                   plan.n * sum(r.n_prompt for r in plan.rows), sum(len(t.tokens) for t in texts))


def _send(emit: Emit, index: int, delta: str) -> None:
    if delta:
        emit(TextDelta(index, delta))
