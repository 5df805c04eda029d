"""One response per prompt (`mdlm gen-ppl --sample-first --prompts`): each prompt fixed at the
start of its row (generation/layout.py: the window of a model trained at L, the prompt and
the release's answer length for LLaDA / Dream), the rest drawn, the row cut at its first
EOS after the prompt (the model's own choice of length; nothing from the EOS on is kept).

Prompts of different lengths share a batch (their rows all the window's length), except for
a left-to-right model, which can only continue a prefix of one length, and a model whose
rows end at its answer (LLaDA, Dream): their batches hold prompts of equal length. Batch b
is drawn with seed `seed + the index of its first prompt`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..checkpoints.folder import LoadedModel
from ..engine.settings import SamplingSettings as Settings
from ..errors import MdlmError
from ..eval.responses import Prompt, ToScore
from ..generation.capabilities import capabilities_of
from ..generation.layout import LayoutError, lay_out
from ..generation.request import GenerationRequest
from .draw import checked_length
from .generate import cut_at_eos, generate, write_jsonl


@dataclass
class Response:
    prompt: Prompt
    tokens: list[int]  # the row up to its first EOS after the prompt, EOS excluded
    length: int  # the response's tokens
    ended: bool  # an EOS ended it (else it ran to the row's end)
    text: str  # the response's text


@dataclass
class DrawnResponses:
    responses: list[Response]
    seconds: float  # all responses together
    nfe: float  # network evaluations per response
    fields: dict[str, Any] = field(default_factory=dict)  # what each JSONL record carries

    def lines(self, decode: Callable[[list[int]], str]) -> list[str]:
        """JSONL records as `mdlm sample --prompt --out` writes them (text and tokens: the whole
        row), with the prompt's text, the response and, where known, the held-out response."""
        out = []
        for i, r in enumerate(self.responses):
            held_out = {} if r.prompt.reference is None else {"reference": r.prompt.reference}
            record = {"index": i, "text": decode(r.tokens), "tokens": r.tokens,
                      "length": r.length, "ended": r.ended, "prompt": r.prompt.text,
                      "response": r.text, **held_out}
            out.append(json.dumps({**record, **self.fields}))
        return out

    def to_score(self) -> ToScore:
        rs = self.responses
        return ToScore([r.text for r in rs], [r.tokens[len(r.tokens) - r.length:] for r in rs],
                       prompts=[r.prompt.text for r in rs], ended=[r.ended for r in rs],
                       references=[r.prompt.reference for r in rs])


def batches_of(prompts: list[Prompt], batch_size: int, same_length: bool) -> list[list[int]]:
    """Indices of the prompts per batch, in order; `same_length`: grouped by prompt length."""
    order = list(range(len(prompts)))
    if same_length:
        order.sort(key=lambda i: len(prompts[i].ids))
    batches: list[list[int]] = []
    for i in order:
        last = batches[-1] if batches else None
        fits = last is not None and len(last) < batch_size
        if fits and (not same_length or len(prompts[last[0]].ids) == len(prompts[i].ids)):
            last.append(i)
        else:
            batches.append([i])
    return batches


def draw_responses(loaded: LoadedModel, rt, how: Settings, prompts: list[Prompt], *, seed: int,
                   batch_size: int = 16,
                   on_batch: Callable[[int], None] | None = None) -> DrawnResponses:
    """A response to each prompt, in the row generation/layout.py lays out for it: the prompt
    (its row start included), then the model's default answer, the rest of the window for a
    model trained at L, its release's answer length for LLaDA (128) or Dream (512); checked
    to fit in memory. Rows of their own lengths are batched by prompt length."""
    mask_id, eos_id = loaded.mask_id, loaded.tokenizer.eos_id
    caps = capabilities_of(loaded)
    try:
        rows = [lay_out(caps, p.ids, start=[]) for p in prompts]
    except LayoutError as e:
        raise MdlmError(f"a prompt does not fit: {e}") from None
    checked_length(loaded, max(r.length for r in rows), batch_size, len(prompts), rt.device,
                   allow_longer=False)
    found: dict[int, Response] = {}
    seconds, evaluations = 0.0, 0
    by_length = loaded.objective.causal or caps.answer_tokens is not None
    for batch in batches_of(prompts, batch_size, same_length=by_length):
        L = rows[batch[0]].length
        template = torch.stack([rows[i].template(mask_id) for i in batch])
        request = GenerationRequest(how, num_samples=len(batch), seed=seed + batch[0],
                                    stop_at_eos=False)
        records, stats, spent = generate(loaded, rt, request, length=L, prompt=template,
                                         on_batch=on_batch)
        seconds, evaluations = seconds + spent, evaluations + stats.sequence_evals
        for i, record in zip(batch, records, strict=True):
            kept, length, ended = cut_at_eos(record.tokens, len(prompts[i].ids), eos_id)
            text = loaded.tokenizer.decode(kept[len(kept) - length:])
            found[i] = Response(prompts[i], kept, length, ended, text)
    fields = {**how.record(), "nfe": evaluations / len(prompts), "seed": seed,
              "checkpoint": str(loaded.path), "seconds": seconds / len(prompts)}
    return DrawnResponses([found[i] for i in range(len(prompts))], seconds,
                          evaluations / len(prompts), fields)


def write_responses(path: str, drawn: DrawnResponses, loaded: LoadedModel) -> None:
    """The responses as JSONL, replaced only once complete."""
    write_jsonl(path, drawn.lines(loaded.tokenizer.decode))
