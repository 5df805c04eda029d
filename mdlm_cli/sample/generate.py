"""Sampling from a checkpoint: prompt/infill templates, batching, JSONL records."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import engine
from ..checkpoints.folder import LoadedModel
from ..errors import MdlmError
from ..io.files import write_text_atomic

MASK_SPAN = re.compile(r"<mask(?::(\d+))?>")


def template(loaded: LoadedModel, length: int, *, prompt: str | None = None,
             infill: str | None = None) -> torch.Tensor | None:
    """The engine's `prompt` tensor (length,): fixed tokens, mask_id at free positions.

    `prompt`: a prefix; `infill`: text with `<mask>` (one token) or `<mask:N>` (N tokens)
    spans. Positions after the text are free. Rows of wrap/pad-packed data start
    with BOS, so the template does too.
    """
    if prompt is None and infill is None:
        return None
    if prompt is not None and infill is not None:
        raise MdlmError("give --prompt or --infill, not both")
    tok, mask_id = loaded.tokenizer, loaded.mask_id
    ids: list[int] = loaded.row_start()
    if prompt is not None:
        ids += tok.encode(prompt)
    else:
        pos = 0
        for m in MASK_SPAN.finditer(infill):
            ids += tok.encode(infill[pos:m.start()]) if m.start() > pos else []
            span = int(m.group(1) or 1)
            if len(ids) + span > length:  # before building it: <mask:99999999999> is not a list to allocate
                raise MdlmError(f"--infill needs more than the sequence length of {length} tokens "
                                f"({m.group(0)} at token {len(ids)}); shorten the spans or raise --length")
            ids += [mask_id] * span
            pos = m.end()
        ids += tok.encode(infill[pos:]) if pos < len(infill) else []
        if mask_id not in ids:
            raise MdlmError("--infill needs at least one <mask> or <mask:N> span")
    if len(ids) > length:
        raise MdlmError(f"the prompt is {len(ids)} tokens; the sequence length is {length}")
    out = torch.full((length,), mask_id, dtype=torch.long)
    out[: len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


@dataclass
class SampleRecord:
    index: int
    text: str
    tokens: list[int]

    def to_json(self, **extra) -> str:
        return json.dumps({"index": self.index, "text": self.text, "tokens": self.tokens, **extra})


def generate(loaded: LoadedModel,
             *,
             sampler: str,
             num_samples: int,
             batch_size: int,
             steps: int | None,
             seed: int,
             device: torch.device,
             dtype: torch.dtype | None,
             length: int | None = None,
             prompt: torch.Tensor | None = None,
             precision: str = "fp64",
             temperature: float = 1.0,
             top_p: float = 1.0,
             on_batch: Callable[[int], None] | None = None,
             **options,
             ) -> tuple[list[SampleRecord], engine.SampleStats, float]:
    """Sample in batches with one of the objective's samplers; returns the decoded records,
    the work counters and the seconds. `options`: sampler options by name (engine.sample's
    keywords: final_denoise, tokens_per_step, k_schedule, threshold, eta, remdm_schedule)."""
    length = length or loaded.length
    if loaded.objective.causal and length > loaded.length:
        raise MdlmError(f"a left-to-right model generates at most its training length "
                        f"({loaded.length} tokens); got --length {length}")
    gen = torch.Generator(device=device).manual_seed(seed)
    t0 = time.perf_counter()
    tokens, stats = engine.sample(
        loaded.denoiser(dtype), sampler=sampler, num_samples=num_samples, length=length, mask_id=loaded.mask_id,
        steps=steps, schedule=loaded.objective.schedule, generator=gen, prompt=prompt, batch_size=batch_size,
        precision=precision, temperature=temperature, top_p=top_p, device=device, return_stats=True,
        on_batch=on_batch, **options)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    records = [SampleRecord(i, loaded.tokenizer.decode(row.tolist()), row.tolist())
               for i, row in enumerate(tokens.cpu())]
    return records, stats, seconds


def write_jsonl(path: str | Path, lines: list[str]) -> None:
    """Write atomically: an existing file is replaced only once the new one is complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(line + "\n" for line in lines))
