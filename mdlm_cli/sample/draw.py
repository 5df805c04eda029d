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
from ..engine.settings import SamplingSettings as Settings
from ..errors import MdlmError
from .blocks import draw_blocks, samples_by_blocks
from .generate import (
    Drawn,
    answer_start,
    generate,
    prompt_parts,
    semi_ar_plan,
    semi_ar_records,
    template,
    window_for,
    with_responses,
    write_jsonl,
)


def draw(loaded: LoadedModel, rt, how: Settings, *, num_samples: int, batch_size: int,
         seed: int, length: int | None = None, prompt: torch.Tensor | None = None,
         stop_at_eos: bool | None = False, on_batch: Callable[[int], None] | None = None,
         extra: dict[str, Any] | None = None, stop_ids: list[int] | None = None) -> Drawn:
    """`num_samples` samples in batches (`generate`; a bd3lm model's block by block,
    sample/blocks.py); `extra` joins each JSONL record."""
    if samples_by_blocks(loaded):  # the template's fixed prefix, else the row's start
        start = (torch.tensor(loaded.row_start(), dtype=torch.long) if prompt is None
                 else prompt[: answer_start(prompt, loaded.mask_id)])
        return draw_blocks(loaded, rt, how, num_samples=num_samples, batch_size=batch_size,
                           seed=seed, length=length, prompt=start if len(start) else None,
                           stop_at_eos=stop_at_eos, on_batch=on_batch, extra=extra)
    records, stats, seconds = generate(
        loaded, how, num_samples=num_samples, batch_size=batch_size, seed=seed,
        device=rt.device, dtype=rt.dtype, length=length, prompt=prompt, stop_at_eos=stop_at_eos,
        on_batch=on_batch, stop_ids=stop_ids)
    fields = {**how.record(), "nfe": stats.nfe, "ncs": stats.ncs, "seed": seed,
              "checkpoint": str(loaded.path), "seconds": seconds / num_samples, **(extra or {})}
    return Drawn(records, stats, seconds, fields)


def sample_window(loaded: LoadedModel, rt, how: Settings, *, num_samples: int, batch_size: int,
                  seed: int, prompt: str | None = None, infill: str | None = None,
                  length: int | None = None, max_new_tokens: int | None = None,
                  stop_at_eos: bool | None = None, allow_longer: bool = False,
                  on_batch: Callable[[int], None] | None = None,
                  prompt_ids: list[int] | None = None, chat: str | None = None) -> Drawn:
    """`mdlm sample`: the length (`length`, or the prompt plus `max_new_tokens`, else the
    model's L; refused past L without `allow_longer` or where a batch cannot fit), the
    prompt, raw prompt ids, chat question or infill template, then `draw`. A `chat` answer
    ends at the template's end-of-turn token or EOS (unless `stop_at_eos` is False)."""
    if samples_by_blocks(loaded):
        refuse_in_blocks(infill, chat)
    parts = None if infill is not None else prompt_parts(loaded, prompt, prompt_ids, chat)
    length = window_for(loaded, length, max_new_tokens, parts)
    if samples_by_blocks(loaded):
        return sample_blocks_window(loaded, rt, how, num_samples=num_samples,
                                    batch_size=batch_size, seed=seed, prompt=prompt,
                                    infill=infill, length=length, stop_at_eos=stop_at_eos,
                                    on_batch=on_batch, prompt_ids=prompt_ids, chat=chat)
    length = checked_length(loaded, length, batch_size, num_samples, rt.device, allow_longer)
    fixed = template(loaded, length, prompt=prompt, infill=infill, prompt_ids=prompt_ids,
                     chat=chat)
    ids = {} if prompt_ids is None else {"prompt_ids": prompt_ids}
    stops = None
    if chat is not None:
        ids, stops = {"chat": chat}, end_of_turn_ids(loaded.tokenizer)
        stop_at_eos = stop_at_eos is not False
    drawn = draw(loaded, rt, how, num_samples=num_samples, batch_size=batch_size, seed=seed,
                 length=length, prompt=fixed, stop_at_eos=stop_at_eos, on_batch=on_batch,
                 extra={"prompt": prompt, "infill": infill, **ids}, stop_ids=stops)
    if prompt is not None or prompt_ids is not None or chat is not None:
        with_responses(loaded, drawn.records, answer_start(fixed, loaded.mask_id))
    return drawn


def sample_blocks_window(loaded: LoadedModel, rt, how: Settings, *, num_samples: int,
                         batch_size: int, seed: int, prompt: str | None, infill: str | None,
                         length: int, stop_at_eos: bool | None,
                         on_batch: Callable[[int], None] | None,
                         prompt_ids: list[int] | None, chat: str | None) -> Drawn:
    """`mdlm sample` of a bd3lm model: left to right over blocks, so a prefix only (the
    prompt or prompt ids; else the row's start, BOS, as the reference's first token)."""
    refuse_in_blocks(infill, chat)
    fixed = template(loaded, length, prompt=prompt, prompt_ids=prompt_ids)
    start = (torch.tensor(loaded.row_start(), dtype=torch.long) if fixed is None
             else fixed[: answer_start(fixed, loaded.mask_id)])
    ids = {} if prompt_ids is None else {"prompt_ids": prompt_ids}
    drawn = draw_blocks(loaded, rt, how, num_samples=num_samples, batch_size=batch_size,
                        seed=seed, length=length, prompt=start if len(start) else None,
                        stop_at_eos=stop_at_eos, on_batch=on_batch,
                        extra={"prompt": prompt, **ids})
    if fixed is not None:
        with_responses(loaded, drawn.records, len(start))
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
    from ..memory import check_memory

    length, batch = length if length is not None else loaded.length, min(batch, num_samples)
    check_length(loaded, length, allow_longer)
    check_memory(loaded.model, loaded.config.model, loaded.tokenizer.vocab_size, batch=batch,
                 length=length, device=device,
                 what=f"sampling {num_samples} x {length} tokens ({batch} per batch)",
                 fix="lower --length, --num-samples or --batch-size", rows=num_samples)
    return length


@dataclass
class SemiArDrawn(Drawn):
    window: int = 0
    stride: int = 0
    length: int = 0  # tokens per sample
    streamed: bool = False  # the text went to `on_text` as it came


def semi_ar_blocks(loaded: LoadedModel, rt, how: Settings, *, num_samples: int, seed: int,
                   length: int | None = None, stride: int | None = None,
                   prompt: str | None = None, max_new_tokens: int | None = None,
                   stop_at_eos: bool | None = None, source: str | None = None,
                   on_text: Callable[[str], None] | None = None) -> SemiArDrawn:
    """`mdlm semi-ar` (MDLM §4.2): each round keeps the last L - L' tokens as a clean prefix
    and samples L' = `stride` new ones, up to `length` tokens. With one sample, no EOS stop
    and `on_text`, the text is handed to `on_text` block by block. `source`: what an error
    calls the model (default: its path)."""
    window, tok = loaded.length, loaded.tokenizer
    stop, limit, length = semi_ar_plan(loaded, length, prompt, max_new_tokens, stop_at_eos)
    stride, length = semi_ar_lengths(loaded, stride, length, num_samples, rt.device, source)
    start = prompt_prefix(loaded, prompt)
    streaming = on_text is not None and num_samples == 1 and not stop
    if streaming and start is not None:
        on_text(tok.decode(start.tolist()))

    def on_block(r, new) -> None:
        if streaming:
            on_text(tok.decode(new[0].tolist()))

    t0 = time.perf_counter()
    result = engine.semi_ar(
        loaded.denoiser(rt.dtype), how, num_samples=num_samples, window=window,
        stride=stride, target_length=length, mask_id=loaded.mask_id, prompt=start,
        on_block=on_block,
        schedule=loaded.objective.schedule,
        generator=torch.Generator(device=rt.device).manual_seed(seed), device=rt.device,
        stop_token=tok.eos_id if stop else None)
    seconds = time.perf_counter() - t0
    tokens = result.tokens[:, :limit]
    fields = {**how.record(), "window": window, "stride": stride, "seed": seed,
              "checkpoint": str(loaded.path), "nfe": result.stats.nfe,
              "ncs": result.stats.ncs, "seconds": seconds / num_samples}
    records = semi_ar_records(loaded, tokens, start, stop)
    if start is not None:
        with_responses(loaded, records, len(start))
    return SemiArDrawn(records, result.stats, seconds, fields, window=window, stride=stride,
                       length=tokens.shape[1], streamed=streaming)


def prompt_prefix(loaded: LoadedModel, prompt: str | None) -> torch.Tensor | None:
    """The prompt's tokens (the first window's clean prefix), or None."""
    if not prompt:
        return None
    start = template(loaded, loaded.length, prompt=prompt)
    return start[start != loaded.mask_id]


def semi_ar_lengths(loaded: LoadedModel, stride: int | None, length: int | None,
                    num_samples: int, device, source: str | None = None) -> tuple[int, int]:
    """(stride, total length) for a diffusion model's window; left-to-right models are
    refused, and windows that cannot fit in memory."""
    from ..memory import check_memory

    window = loaded.length
    check_memory(loaded.model, loaded.config.model, loaded.tokenizer.vocab_size,
                 batch=num_samples, length=window, device=device,
                 what=f"sampling {num_samples} windows of {window} tokens",
                 fix="lower --num-samples")
    if loaded.objective.causal:
        name, objective = source or loaded.path, loaded.objective.name
        raise MdlmError(f"{name} is a left-to-right ({objective}) model; it generates up to its "
                        "length with mdlm sample (semi-ar is for diffusion models)")
    stride = window // 2 if stride is None else stride
    length = 2 * window if length is None else length
    if length < window:
        raise MdlmError(f"--length must be at least the window ({window})")
    return stride, length


def write_samples(path: str, drawn: Drawn) -> None:
    """The samples as JSONL (`mdlm sample --out`), replaced only once complete."""
    write_jsonl(path, drawn.lines())
