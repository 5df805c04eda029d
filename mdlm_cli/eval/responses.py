"""Responses to prompts, as `mdlm gen-ppl` scores them conditionally: the prompts to answer
(held-out ones of a fine-tuned model's own prompt/response data, or a JSONL file), the texts
to score read from `--samples` records, and a summary of the responses' lengths.

A response is scored given its prompt (eval/genppl.py's `score_samples(prompts=...)`): the
judge reads prompt + response, only the response's tokens count. A `--samples` record is a
response when it carries `prompt` and `response` strings (`mdlm sample --prompt --out` and
`gen-ppl --prompts --samples` write them).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config import SFT_PACKINGS
from ..data.sources import SPLITS, read_text_file
from ..errors import MdlmError
from .genppl import read_records, read_samples

if TYPE_CHECKING:
    from ..checkpoints.folder import LoadedModel
    from ..data.store import TokenSplit
    from ..data.tokenizers import Tokenizer


@dataclass
class Prompt:
    """A prompt to answer: the model's tokens (the row's start, BOS, included: the fixed part
    of the sampling template), its text as the model reads it, and the held-out response."""

    ids: list[int]
    text: str
    reference: str | None = None


@dataclass
class ToScore:
    """What gen-ppl scores: the texts (responses, when `prompts` is set), the generating
    model's ids of each (for the entropy; None: the judge's), and what is known of the
    responses: whether each ended at EOS, and the held-out response to the same prompt."""

    texts: list[str]
    tokens: list[list[int]] | None = None
    prompts: list[str] | None = None
    ended: list[bool | None] | None = None
    references: list[str | None] | None = None


# ----------------------------------------------------------------------------- the prompts

def read_prompts(spec: str, loaded: LoadedModel, count: int) -> tuple[list[Prompt], str]:
    """The first `count` prompts of `spec` (a JSONL file, or a split of the model's own
    prompt/response data) and what they are, for the report."""
    if count < 1:
        raise MdlmError(f"-n must be at least 1 (the prompts to answer; got {count})")
    if Path(spec).is_file():
        return file_prompts(Path(spec), loaded, count), spec
    if spec not in SPLITS:
        raise MdlmError(f"--prompts {spec}: no such file, and not a split "
                        f"({', '.join(SPLITS)}); give a JSONL file of prompt records or a "
                        "split of the model's sft data")
    packing = loaded.config.data.packing
    if packing not in SFT_PACKINGS:
        raise MdlmError(f"--prompts {spec}: {loaded.path} was trained on data.packing={packing} "
                        "data, which holds no prompts; give a JSONL file of prompt (or "
                        "messages) records, or a model fine-tuned with data.packing=sft")
    return split_prompts(loaded, spec, count)


def split_prompts(loaded: LoadedModel, split: str, count: int) -> tuple[list[Prompt], str]:
    """The first `count` examples of a split of the model's own sft (or sft-pack) data: each
    prompt as stored (the prepared data records where it ends) and its response."""
    from ..data.store import prepare
    from .ppl import pick_split

    prepared = prepare(loaded.config.data)
    name, _ = pick_split(prepared, split)
    rows, tok, start = prepared.split(name), loaded.tokenizer, len(loaded.row_start())
    prompts: list[Prompt] = []
    for r in range(len(rows)):
        for ids, response in row_examples(rows, r, tok.eos_id):
            prompts.append(Prompt(ids, tok.decode(ids[start:]), tok.decode(response)))
            if len(prompts) == count:
                return prompts, f"{name} split"
    if not prompts:
        raise MdlmError(f"the {name} split of {prepared.folder.name} holds no examples; "
                        "give another split or a JSONL file of prompts")
    return prompts, f"{name} split"


def row_examples(rows: TokenSplit, r: int, eos_id: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids up to its EOS) of each example of row `r`: one under sft (the
    prompt's length stored per row), one per segment under sft-pack (its target map)."""
    tokens = np.asarray(rows.tokens[r]).astype(np.int64)
    if rows.segments is None:
        p, end = int(rows.prompt[r]), int(rows.lengths[r])
        pieces = [(tokens[:p], tokens[p:end])]
    else:
        segments, targets = np.asarray(rows.segments[r]), np.asarray(rows.target_map[r]) > 0
        pieces = [(tokens[(segments == s) & ~targets], tokens[(segments == s) & targets])
                  for s in range(1, int(segments.max(initial=0)) + 1)]
    out = []
    for prompt, response in pieces:
        response = response.tolist()
        end = response.index(eos_id) if eos_id in response else len(response)
        out.append((prompt.tolist(), response[:end]))
    return out


def file_prompts(path: Path, loaded: LoadedModel, count: int) -> list[Prompt]:
    """The first `count` records of a JSONL file: `prompt` (with an optional `response`, the
    held-out answer) or `messages` through the tokeniser's chat template."""
    from ..data.chat import has_chat_template

    tok, start = loaded.tokenizer, loaded.row_start()
    # a model fine-tuned on pairs through its chat template reads a prompt as a user turn
    chat_pairs = loaded.data_meta.get("packing") in SFT_PACKINGS and has_chat_template(tok)
    prompts: list[Prompt] = []
    for n, line in enumerate(read_text_file(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise MdlmError(f"{path}:{n} is not JSON") from None
        text, reference, templated = prompt_of(record, tok, f"{path}:{n}", chat_pairs=chat_pairs)
        # a template's rendering holds its own BOS (LLaDA's): the row's start is not added again
        ids = tok.encode(text) if templated else start + tok.encode(text)
        if len(ids) >= loaded.length:
            raise MdlmError(f"{path}:{n}: the prompt is {len(ids)} tokens; {loaded.path} "
                            f"answers in rows of {loaded.length} tokens, prompt and response "
                            "together")
        prompts.append(Prompt(ids, tok.decode(ids if templated else ids[len(start):]),
                              reference))
        if len(prompts) == count:
            break
    if not prompts:
        raise MdlmError(f"{path} holds no prompts; give one JSON object per line")
    return prompts


def prompt_of(record, tokenizer: Tokenizer, where: str,
              chat_pairs: bool = False) -> tuple[str, str | None, bool]:
    """(prompt text, held-out response or None, whether the text is a chat template's
    rendering) of one record; with `chat_pairs` a prompt/response record is one user turn."""
    from ..data.sft import check_example, render_chat

    if isinstance(record, dict) and isinstance(record.get("messages"), list):
        messages = record["messages"]
        if (messages and isinstance(messages[-1], dict)
                and messages[-1].get("role") == "assistant"):
            return *render_chat(tokenizer, check_example(record, where)["messages"]), True
        # a conversation awaiting its answer: rendered as if with an empty one, whose prompt
        # (the conversation and the template's generation prompt) is what the model reads
        answer = {"role": "assistant", "content": ""}
        checked = check_example({"messages": [*messages, answer]}, where)
        return render_chat(tokenizer, checked["messages"])[0], None, True
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        response = record.get("response")
        response = response if isinstance(response, str) else None
        if chat_pairs:
            turns = [{"role": "user", "content": record["prompt"]},
                     {"role": "assistant", "content": response or ""}]
            return render_chat(tokenizer, turns)[0], response, True
        return record["prompt"], response, False
    raise MdlmError(f"{where}: no 'prompt' string (nor 'messages' list); --prompts reads "
                    "prompt (optionally with response) or messages records")


def reference_responses(checkpoint: str, split: str, count: int) -> list[str]:
    """MAUVE's real text for responses: the held-out responses of a split of the model's data."""
    from ..checkpoints.load import load_checkpoint

    prompts, _ = read_prompts(split, load_checkpoint(checkpoint), count)
    return [p.reference or "" for p in prompts]


# ----------------------------------------------------------------------------- --samples

def samples_to_score(path: str, conditional: bool | None) -> ToScore:
    """The records of `path`: responses scored given their prompts where every record carries
    `prompt` and `response` strings (or `conditional` asks), else whole texts as before."""
    records = read_records(path)
    paired = [isinstance(r.get("prompt"), str) and isinstance(r.get("response"), str)
              for _, r in records]
    if conditional is False or (conditional is None and not any(paired)):
        return ToScore(*read_samples(path))
    if not all(paired):
        n = records[paired.index(False)][0]
        fix = "" if conditional else "; give --unconditional to score every text whole"
        raise MdlmError(f"{path}:{n} has no 'prompt' and 'response' strings, so it is no "
                        f"response to score given its prompt{fix}")
    texts = [r["response"] for _, r in records]
    return ToScore(texts, response_tokens([r for _, r in records]),
                   prompts=[r["prompt"] for _, r in records],
                   ended=[r.get("ended") for _, r in records],
                   references=[r.get("reference") for _, r in records])


def response_tokens(records: list[dict]) -> list[list[int]] | None:
    """The generating model's ids of each response: the last `length` of its `tokens` (records
    cut at EOS carry both); None unless every record has them."""
    out = []
    for r in records:
        tokens, length = r.get("tokens"), r.get("length")
        if not isinstance(tokens, list) or not isinstance(length, int) or length > len(tokens):
            return None
        out.append(tokens[len(tokens) - length:])
    return out


# ----------------------------------------------------------------------------- the summary

def response_summary(items: ToScore) -> tuple[dict, str]:
    """The responses' lengths in characters (and the held-out responses', where known) and how
    many ended at EOS: JSON fields and a line."""
    lengths = [len(t) for t in items.texts]
    out: dict = {"responses": len(lengths), "characters_mean": statistics.fmean(lengths),
                 "characters_min": min(lengths), "characters_max": max(lengths)}
    line = (f"{len(lengths)} responses, {out['characters_mean']:.1f} characters "
            f"({min(lengths)} to {max(lengths)})")
    ended = items.ended or []
    if ended and all(isinstance(e, bool) for e in ended):
        out["ended_at_eos"] = sum(ended)
        line += f", {sum(ended)} ended at EOS"
    references = items.references or []
    if references and all(isinstance(r, str) for r in references):
        known = [len(r) for r in references]
        out["reference_characters_mean"] = statistics.fmean(known)
        line += (f"; the held-out responses {statistics.fmean(known):.1f} "
                 f"({min(known)} to {max(known)})")
    return out, line
