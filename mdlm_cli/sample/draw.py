"""Samples from a loaded model with their JSONL records, as `mdlm sample`, `mdlm semi-ar` and
`mdlm gen-ppl --sample-first` draw them, each with a `SamplingSettings` whose sampler is
named (the objective's choice made): `draw` (one window, batched), `sample_window` (the
length, prompt and infill template of `mdlm sample` first), `semi_ar_blocks` (past the window,
block by block) and `write_samples`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import engine
from ..checkpoints.folder import LoadedModel
from ..data.chat import end_of_turn_ids
from ..errors import MdlmError
from ..generation.capabilities import capabilities_of
from ..generation.layout import LayoutError, RowLayout, lay_out_semi_ar
from ..generation.request import GenerationRequest
from .blocks import block_layout, draw_blocks, samples_by_blocks
from .generate import (
    Drawn,
    answer_start,
    check_prompt_ids,
    generate,
    prompt_parts,
    semi_ar_records,
    stops_at_eos,
    template,
    window_for,
    with_responses,
    write_jsonl,
)


def draw(loaded: LoadedModel, rt, request: GenerationRequest, *, length: int | None = None,
         prompt: torch.Tensor | None = None, on_batch: Callable[[int], None] | None = None,
         extra: dict[str, Any] | None = None, stop_ids: list[int] | None = None) -> Drawn:
    """The request's samples in batches (`generate`; a bd3lm model's go through
    `sample_blocks_window`), rows of `length` with the template `prompt`; `extra` joins each
    JSONL record; its `stop_at_eos` None: as the model was trained (`stops_at_eos`)."""
    records, stats, seconds = generate(loaded, rt, request, length=length, prompt=prompt,
                                       on_batch=on_batch, stop_ids=stop_ids)
    fields = {**request.settings.record(), "nfe": stats.nfe, "ncs": stats.ncs,
              "seed": request.seed, "checkpoint": str(loaded.path),
              "seconds": seconds / request.num_samples, **(extra or {})}
    return Drawn(records, stats, seconds, fields)


def sample_window(loaded: LoadedModel, rt, request: GenerationRequest,
                  on_batch: Callable[[int], None] | None = None) -> Drawn:
    """`mdlm sample`: the row (its length as asked, else generation/layout.py's for the prompt
    and `max_new_tokens`; refused past L without `allow_longer` or where a batch cannot fit),
    the prompt, raw prompt ids, chat question or infill template, then `draw`. A chat answer
    ends at the template's end-of-turn token or EOS (unless `stop_at_eos` is False)."""
    r = request.validate()
    if samples_by_blocks(loaded):
        return sample_blocks_window(loaded, rt, r, on_batch)
    ids = None if r.prompt_ids is None else list(r.prompt_ids)
    parts = None if r.infill is not None else prompt_parts(loaded, r.prompt, ids, r.chat)
    length = window_for(loaded, r.length, r.max_new_tokens, parts)
    length = checked_length(loaded, length, r.rows_per_call, r.num_samples, rt.device,
                            r.allow_longer)
    fixed = template(loaded, length, prompt=r.prompt, infill=r.infill, prompt_ids=ids,
                     chat=r.chat)
    stops = end_of_turn_ids(loaded.tokenizer) if r.chat is not None else None
    stop = stops_at_eos(loaded, r.stop_at_eos) if r.chat is None else r.stop_at_eos is not False
    drawn = draw(loaded, rt, r.with_(stop_at_eos=stop), length=length, prompt=fixed,
                 on_batch=on_batch, extra=r.record(), stop_ids=stops)
    if r.conditioned:
        with_responses(loaded, drawn.records, answer_start(fixed, loaded.mask_id))
    return drawn


def sample_blocks_window(loaded: LoadedModel, rt, request: GenerationRequest,
                         on_batch: Callable[[int], None] | None) -> Drawn:
    """`mdlm sample` of a bd3lm model: left to right over blocks, so a prefix only (the
    row's start, BOS, as the reference's first token, then the prompt; raw prompt ids
    alone), the row laid out by the one rule with block rounding (`block_layout`)."""
    r = request
    refuse_in_blocks(r.infill, r.chat)
    ids = None if r.prompt_ids is None else check_prompt_ids(loaded, list(r.prompt_ids))
    start, prompt = prompt_parts(loaded, r.prompt, ids)
    layout = block_layout(loaded, prompt, start, answer=r.max_new_tokens, length=r.length)
    extra = {k: v for k, v in r.record().items() if k != "infill"}
    drawn = draw_blocks(loaded, rt, r, layout, on_batch=on_batch, extra=extra)
    if r.prompt is not None or ids is not None:
        with_responses(loaded, drawn.records, layout.answer_start)
    return drawn


def refuse_in_blocks(infill: str | None, chat: str | None) -> None:
    """What a bd3lm model cannot take: it generates block after block, left to right."""
    for flag, value in (("--infill", infill), ("--chat", chat)):
        if value is not None:
            raise MdlmError(f"{flag} does not apply to a bd3lm model (it generates block after "
                            "block, left to right); give --prompt or --prompt-ids")


def checked_length(loaded: LoadedModel, length: int | None, batch: int, num_samples: int,
                   device, allow_longer: bool) -> int:
    """The length to sample (default: the model's L), refused past L without --allow-longer,
    or where a batch of it cannot fit in memory."""
    from ..checkpoints.load import check_length
    from ..memory import Workload, check_memory

    length, batch = length if length is not None else loaded.length, min(batch, num_samples)
    check_length(loaded, length, allow_longer)
    work = Workload(batch, length,
                    what=f"sampling {num_samples} x {length} tokens ({batch} per batch)",
                    fix="lower --length, --num-samples or --batch-size", rows=num_samples)
    check_memory(loaded.model, loaded.config.model, loaded.tokenizer.vocab_size, work,
                 device=device)
    return length


@dataclass
class SemiArDrawn(Drawn):
    window: int = 0
    stride: int = 0
    length: int = 0  # tokens per sample
    streamed: bool = False  # the text went to `on_text` as it came


def semi_ar_blocks(loaded: LoadedModel, rt, request: GenerationRequest, *,
                   stride: int | None = None, source: str | None = None,
                   on_text: Callable[[str], None] | None = None) -> SemiArDrawn:
    """`mdlm semi-ar` (MDLM §4.2): each round keeps the last L - L' tokens as a clean prefix
    and samples L' = `stride` new ones, over the row `semi_ar_layout` lays out (its prompt:
    the first window's prefix). With one sample, no EOS stop and `on_text`, the text is
    handed to `on_text` block by block. `source`: what an error calls the model (default: its
    path)."""
    r = request.validate()
    window, tok, how = loaded.length, loaded.tokenizer, r.settings
    stop = stops_at_eos(loaded, r.stop_at_eos)
    layout = semi_ar_layout(loaded, r, stride, rt.device, source)
    start = torch.tensor(layout.prefix, dtype=torch.long) if r.prompt else None
    streaming = on_text is not None and r.num_samples == 1 and not stop
    if streaming and start is not None:
        on_text(tok.decode(start.tolist()))

    def on_block(_round, new) -> None:
        if streaming:
            on_text(tok.decode(new[0].tolist()))

    t0 = time.perf_counter()
    plan = engine.SemiArPlan(r.num_samples, window, layout.stride, loaded.mask_id,
                             target_length=layout.length, prompt=start,
                             stop_token=tok.eos_id if stop else None, device=rt.device)
    result = engine.semi_ar(
        loaded.denoiser(rt.dtype), how, plan, schedule=loaded.objective.schedule,
        generator=torch.Generator(device=rt.device).manual_seed(r.seed),
        hooks=engine.SampleHooks(on_block=on_block))
    seconds = time.perf_counter() - t0
    tokens = result.tokens
    fields = {**how.record(), "window": window, "stride": layout.stride, "seed": r.seed,
              "checkpoint": str(loaded.path), "nfe": result.stats.nfe,
              "ncs": result.stats.ncs, "seconds": seconds / r.num_samples}
    records = semi_ar_records(loaded, tokens, start, stop)
    if start is not None:
        with_responses(loaded, records, len(start))
    return SemiArDrawn(records, result.stats, seconds, fields, window=window,
                       stride=layout.stride, length=tokens.shape[1], streamed=streaming)


def semi_ar_layout(loaded: LoadedModel, request: GenerationRequest, stride: int | None,
                   device, source: str | None = None) -> RowLayout:
    """The semi-AR row of `mdlm semi-ar` by the one rule (generation/layout.py's
    `lay_out_semi_ar`): the row start and the prompt (nothing without a prompt), then
    `max_new_tokens`, or the row's `length` in all (default two windows, at least one);
    left-to-right models are refused, and windows that cannot fit in memory."""
    from ..memory import Workload, check_memory

    r, window = request, loaded.length
    work = Workload(r.num_samples, window, fix="lower --num-samples",
                    what=f"sampling {r.num_samples} windows of {window} tokens")
    check_memory(loaded.model, loaded.config.model, loaded.tokenizer.vocab_size, work,
                 device=device)
    if loaded.objective.causal:
        name, objective = source or loaded.path, loaded.objective.name
        raise MdlmError(f"{name} is a left-to-right ({objective}) model; it generates up to its "
                        "length with mdlm sample (semi-ar is for diffusion models)")
    length = r.length
    if r.max_new_tokens is None:
        length = 2 * window if length is None else length
        if length < window:
            raise MdlmError(f"--length must be at least the window ({window})")
    text = r.prompt
    start, prompt = (loaded.row_start(), loaded.tokenizer.encode(text)) if text else ([], [])
    try:
        return lay_out_semi_ar(capabilities_of(loaded), prompt, stride=stride, start=start,
                               answer=r.max_new_tokens, length=length)
    except LayoutError as e:
        raise MdlmError(str(e)) from None


def write_samples(path: str, drawn: Drawn) -> None:
    """The samples as JSONL (`mdlm sample --out`), replaced only once complete."""
    write_jsonl(path, drawn.lines())
