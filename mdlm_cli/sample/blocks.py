"""Samples of a block diffusion (bd3lm) model as `mdlm sample`, `gen-ppl --sample-first` and
`bench`-free callers draw them: block by block with the exact key/value cache of the finished
blocks (`BD3LM.sample`), rows laid out by the one rule (generation/layout.py: rounded up to
whole blocks of L', past the training length), each sample cut at its first EOS after
the prompt, its `length` and `ended` in the record."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..checkpoints.folder import LoadedModel
from ..engine.block_sampling import BlockRows
from ..errors import MdlmError, MdlmWarning
from ..generation.capabilities import capabilities_of
from ..generation.layout import LayoutError, RowLayout, lay_out
from ..generation.request import GenerationRequest
from .generate import Drawn, SampleRecord, cut_at_eos


def samples_by_blocks(loaded: LoadedModel) -> bool:
    return loaded.objective.samples_by_blocks


def block_layout(loaded: LoadedModel, prompt: list[int], start: list[int], *,
                 answer: int | None = None, length: int | None = None) -> RowLayout:
    """The row of a bd3lm sample by the one rule (generation/layout.py): `start` + `prompt`
    + the answer (`answer`, or what the row's `length` leaves, else the rest of the
    training length, one block at least), rounded up to whole blocks of L', with a note
    when rounded. No --allow-longer: the blocks go on past the training length (the
    paper's variable-length generation)."""
    try:
        layout = lay_out(capabilities_of(loaded), prompt, answer=answer, start=start,
                         length=length)
    except LayoutError as e:
        raise MdlmError(str(e).replace("max_tokens / ", "")) from None
    if layout.rounded:
        asked = f"--length {length}" if length is not None else f"a row of {layout.asked}"
        warnings.warn(f"{asked} rounded up to {layout.length}, a multiple of the block size "
                      f"{layout.block_size}", MdlmWarning, stacklevel=2)
    return layout


def draw_blocks(loaded: LoadedModel, rt, request: GenerationRequest, layout: RowLayout, *,
                on_batch: Callable[[int], None] | None = None,
                extra: dict[str, Any] | None = None):
    """The request's samples in batches, one generator seeded with its seed for all, rows of
    up to `layout.length` positions (whole blocks) after its fixed prefix (the row start and
    the prompt). Stops at EOS unless the request's `stop_at_eos` is False (the paper's
    variable-length sampling). Returns a `Drawn`."""
    from ..memory import Workload, check_memory

    how, num_samples, seed = request.settings, request.num_samples, request.seed
    length = layout.length
    prompt = torch.tensor(layout.prefix, dtype=torch.long) if layout.prefix else None
    batch = request.rows_per_call
    work = Workload(batch, length,
                    what=f"sampling {num_samples} x {length} tokens ({batch} per batch)",
                    fix="lower --length, --num-samples or --batch-size", rows=num_samples)
    check_memory(loaded.model, loaded.config.model, loaded.tokenizer.vocab_size, work,
                 device=rt.device)
    stop = request.stop_at_eos is not False
    eos = loaded.tokenizer.eos_id if stop else None
    if stop and eos is None:
        raise MdlmError(f"the tokenizer {loaded.tokenizer.name!r} has no EOS to stop at; add "
                        "--no-stop-at-eos")
    gen = torch.Generator(device=rt.device).manual_seed(seed)
    start = layout.answer_start
    records, stats, t0 = [], None, time.perf_counter()
    for first in range(0, num_samples, batch):
        n = min(batch, num_samples - first)
        out = loaded.objective.sample(
            loaded.model, how.with_(steps=how.steps or 1), BlockRows(n, length, prompt, eos),
            generator=gen, autocast_dtype=rt.dtype)
        for i, row in enumerate(out.tokens.cpu().tolist()):
            records.append(_record(loaded, first + i, row, start, eos))
        if stats is None:
            stats = out.stats
        else:
            stats.num_sequences += out.stats.num_sequences
            stats.merge(out.stats)
        if on_batch is not None:
            on_batch(n)
    if rt.device.type == "cuda":
        torch.cuda.synchronize(rt.device)
    seconds = time.perf_counter() - t0
    fields = {**how.record(), "block_size": loaded.objective.block_size, "max_length": length,
              "nfe": stats.nfe, "ncs": stats.ncs, "seed": seed, "checkpoint": str(loaded.path),
              "seconds": seconds / num_samples, **(extra or {})}
    return Drawn(records, stats, seconds, fields)


def _record(loaded: LoadedModel, index: int, row: list[int], start: int,
            eos: int | None) -> SampleRecord:
    """A row cut at its first EOS after the prompt (EOS left out, as every cut record), its
    length the tokens after the prompt; without EOS stopping, the whole row."""
    if eos is None:
        return SampleRecord(index, loaded.tokenizer.decode(row), row)
    kept, length, ended = cut_at_eos(row, start, eos)
    return SampleRecord(index, loaded.tokenizer.decode(kept), kept, length, ended)
