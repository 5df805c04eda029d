"""Sampling from a checkpoint: prompt/infill templates, batching, JSONL records."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import engine
from ..checkpoints.folder import LoadedModel
from ..config import SFT_PACKINGS
from ..data.chat import chat_prompt_ids
from ..errors import MdlmError
from ..generation.capabilities import capabilities_of
from ..generation.layout import lay_out, lay_out_infill
from ..generation.request import GenerationRequest
from ..io.files import write_text_atomic

MASK_SPAN = re.compile(r"<mask(?::(\d+))?>")


def check_prompt_ids(loaded: LoadedModel, ids: list[int]) -> list[int]:
    """Raw prompt ids (`--prompt-ids`), refused past the vocabulary or at the mask id."""
    bad = [i for i in ids if i >= loaded.tokenizer.vocab_size or i == loaded.mask_id]
    if bad:
        raise MdlmError(f"--prompt-ids holds {bad[0]}, not a token of the model's vocabulary "
                        f"(ids 0 to {loaded.tokenizer.vocab_size - 1} but the mask, "
                        f"{loaded.mask_id}; --infill marks positions to fill)")
    return ids


def template(loaded: LoadedModel, length: int, *, prompt: str | None = None,
             infill: str | None = None, prompt_ids: list[int] | None = None,
             chat: str | None = None) -> torch.Tensor | None:
    """The engine's `prompt` tensor (length,): fixed tokens, mask_id at free positions.

    `prompt`: a prefix; `infill`: text with `<mask>` (one token) or `<mask:N>` (N tokens)
    spans. Positions after the text are free. Rows of wrap/pad-packed data start
    with BOS, so the template does too. `prompt_ids`: a prefix of raw token ids, nothing
    added before or after it (no BOS). `chat`: a question in the tokeniser's chat template
    with its generation prompt (the template writes its own BOS).
    """
    given = [n for n, v in (("--prompt", prompt), ("--prompt-ids", prompt_ids),
                            ("--infill", infill), ("--chat", chat)) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise MdlmError(f"give {' or '.join(given)}, not both")
    tok, mask_id = loaded.tokenizer, loaded.mask_id
    raw = prompt_ids is not None or chat is not None
    ids: list[int] = [] if raw else loaded.row_start()
    if prompt_ids is not None:
        ids += check_prompt_ids(loaded, prompt_ids)
    elif chat is not None:
        ids += chat_prompt_ids(tok, chat)
    elif prompt is not None:
        ids += tok.encode(prompt)
    else:
        pos = 0
        for m in MASK_SPAN.finditer(infill):
            ids += tok.encode(infill[pos:m.start()]) if m.start() > pos else []
            span = int(m.group(1) or 1)
            if (
                len(ids) + span > length
            ):  # before building it: <mask:99999999999> is not a list to allocate
                raise MdlmError(
                    f"--infill needs more than the sequence length of {length} tokens "
                    f"({m.group(0)} at token {len(ids)}); shorten the spans or raise --length"
                )
            ids += [mask_id] * span
            pos = m.end()
        ids += tok.encode(infill[pos:]) if pos < len(infill) else []
        if mask_id not in ids:
            raise MdlmError("--infill needs at least one <mask> or <mask:N> span")
    if len(ids) > length:
        raise MdlmError(f"the prompt is {len(ids)} tokens; the sequence length is {length}")
    if infill is not None:  # the one rule's infill row (the caller checked `length`)
        start = len(loaded.row_start())
        return lay_out_infill(capabilities_of(loaded), ids[start:], start=ids[:start],
                              length=length, longer=True).template(mask_id)
    out = torch.full((length,), mask_id, dtype=torch.long)
    out[: len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


@dataclass
class SampleRecord:
    index: int
    text: str
    tokens: list[int]
    length: int | None = None  # cut at EOS: the answer's tokens (after the prompt, before EOS)
    # cut at EOS: whether the sample holds one (else it ran to the end)
    ended: bool | None = None
    response: str | None = None  # after a prompt: the text after it (what gen-ppl scores)

    def to_json(self, **extra) -> str:
        cut = {} if self.length is None else {"length": self.length, "ended": self.ended}
        answer = {} if self.response is None else {"response": self.response}
        record = {"index": self.index, "text": self.text, "tokens": self.tokens}
        return json.dumps({**record, **cut, **answer, **extra})


def with_responses(loaded: LoadedModel, records: list[SampleRecord], start: int) -> None:
    """Each record's response: the text of its tokens after the `start` of the prompt's (the
    row's start included), so that gen-ppl scores it given the prompt."""
    for r in records:
        r.response = loaded.tokenizer.decode(r.tokens[start:])


def stops_at_eos(loaded: LoadedModel, asked: bool | None = None) -> bool:
    """Whether samples end at their first EOS: as asked, else on for a model fine-tuned on
    prompt/response rows padded with EOS (data.pad_as_eos: it learnt to choose the length)."""
    if asked is not None:
        return asked
    sft = loaded.data_meta.get("packing") in SFT_PACKINGS
    return sft and bool(loaded.data_meta.get("pad_as_eos"))


def cut_at_eos(row: list[int], start: int, eos_id: int | Collection[int]
               ) -> tuple[list[int], int, bool]:
    """(the row up to its first EOS at or after `start`, EOS excluded; the answer's length
    from `start`; whether an EOS was found). Nothing after the EOS is kept. `eos_id`: an id,
    or the ids that each end an answer (a chat model's end-of-turn token and EOS)."""
    stops = {eos_id} if isinstance(eos_id, int) else set(eos_id)
    end = next((i for i in range(start, len(row)) if row[i] in stops), None)
    kept = row if end is None else row[:end]
    return kept, len(kept) - start, end is not None


def records_at_eos(loaded: LoadedModel, tokens: torch.Tensor, start: int,
                   stop_ids: Collection[int] | None = None) -> list[SampleRecord]:
    """A record per row (B, N) cut at its first EOS (or any of `stop_ids`) after the `start`
    fixed tokens."""
    out, stops = [], stop_ids or loaded.tokenizer.eos_id
    for i, row in enumerate(tokens.cpu().tolist()):
        kept, length, ended = cut_at_eos(row, start, stops)
        out.append(SampleRecord(i, loaded.tokenizer.decode(kept), kept, length, ended))
    return out


def answer_start(prompt: torch.Tensor | None, mask_id: int) -> int:
    """Where the answer starts in a template: after its last fixed token (0 without one)."""
    if prompt is None:
        return 0
    fixed = (prompt != mask_id).nonzero()
    return int(fixed[-1, 0]) + 1 if len(fixed) else 0


def prompt_parts(loaded: LoadedModel, prompt: str | None = None,
                 prompt_ids: list[int] | None = None,
                 chat: str | None = None) -> tuple[list[int], list[int]]:
    """(the tokens before the prompt, the prompt's ids) as `template` lays them: the row start
    before a text prompt (and before nothing), none before raw ids or a chat question (whose
    template writes its own BOS)."""
    if prompt_ids is not None:
        return [], list(prompt_ids)
    if chat is not None:
        return [], chat_prompt_ids(loaded.tokenizer, chat)
    return loaded.row_start(), loaded.tokenizer.encode(prompt) if prompt else []


def window_for(loaded: LoadedModel, length: int | None, max_new_tokens: int | None,
               parts: tuple[list[int], list[int]] | None) -> int:
    """Tokens per sample: `length` as given, else the row generation/layout.py lays out for
    the prompt `parts` (`prompt_parts`) and `max_new_tokens` (else the model family's default
    answer, else the rest of the window); `parts` None (an infill template): the window."""
    if max_new_tokens is not None and length is not None:
        raise MdlmError("give --length or --max-new-tokens, not both")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise MdlmError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    if length is not None or parts is None:
        return length or loaded.length
    caps = capabilities_of(loaded)
    if max_new_tokens is None and caps.answer_tokens is None:
        return loaded.length  # the rest of the window, its length checked by the caller
    start, ids = parts  # an asked length may pass the window: the caller checks (--allow-longer)
    return lay_out(caps, ids, answer=max_new_tokens, start=start,
                   longer=max_new_tokens is not None).length


def generate(loaded: LoadedModel, rt, request: GenerationRequest, *, length: int | None = None,
             prompt: torch.Tensor | None = None, on_batch: Callable[[int], None] | None = None,
             stop_ids: Collection[int] | None = None,
             ) -> tuple[list[SampleRecord], engine.SampleStats, float]:
    """The request's samples in batches, rows of `length` (default the model's L) with the
    template `prompt`, on `rt`'s device and precision; returns the decoded records, the work
    counters and the seconds. Each sample is cut at its first EOS (any of `stop_ids` when
    given) after the template's last fixed token where the request's `stop_at_eos` says so
    (None: as `stops_at_eos` decides for the model), its answer's length in the record."""
    length, device = length or loaded.length, rt.device
    if loaded.objective.causal and length > loaded.length:
        raise MdlmError(f"a left-to-right model generates at most its training length "
                        f"({loaded.length} tokens); got --length {length}")
    gen = torch.Generator(device=device).manual_seed(request.seed)
    t0 = time.perf_counter()
    canvas = engine.Canvas(request.num_samples, length, loaded.mask_id, prompt,
                           request.rows_per_call, device)
    tokens, stats = engine.sample(
        loaded.denoiser(rt.dtype), request.settings, canvas, schedule=loaded.objective.schedule,
        generator=gen, hooks=engine.SampleHooks(on_batch=on_batch), return_stats=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    if stops_at_eos(loaded, request.stop_at_eos):
        start = answer_start(prompt, loaded.mask_id)
        return records_at_eos(loaded, tokens, start, stop_ids), stats, seconds
    records = [SampleRecord(i, loaded.tokenizer.decode(row.tolist()), row.tolist())
               for i, row in enumerate(tokens.cpu())]
    return records, stats, seconds


def semi_ar_records(loaded: LoadedModel,
                    tokens: torch.Tensor,
                    prefix: torch.Tensor | None,
                    stop: bool) -> list[SampleRecord]:
    """Records of semi_ar's output (B, N): cut at each row's first EOS after the `prefix` tokens
    when `stop`."""
    if stop:
        return records_at_eos(loaded, tokens, 0 if prefix is None else len(prefix))
    rows = tokens.cpu().tolist()
    return [SampleRecord(i, loaded.tokenizer.decode(row), row) for i, row in enumerate(rows)]


def write_jsonl(path: str | Path, lines: list[str]) -> None:
    """Write atomically: an existing file is replaced only once the new one is complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(line + "\n" for line in lines))


@dataclass
class Drawn:
    """A draw of `mdlm sample`: its records, the engine's counts and the time it took."""

    records: list[SampleRecord]
    stats: engine.SampleStats
    seconds: float  # all samples together
    fields: dict[str, Any]  # what each JSONL record carries beside its sample

    @property
    def per_sample(self) -> float:
        return self.seconds / len(self.records)

    def lines(self) -> list[str]:
        return [r.to_json(**self.fields) for r in self.records]
