"""Prompt/response data (`data.packing: sft`): conditional fine-tuning examples.

An example is {"prompt": str, "response": str}, or {"messages": [{"role", "content"}, ...]}
rendered through the tokeniser's chat template (the last message, the assistant's, is the
response; everything before it, with the generation prompt, is the prompt). Each example
becomes one row:

    [BOS] prompt response [EOS] fill ...      (L tokens)

With a tokeniser that has a chat template (LLaDA's, Dream's) every example goes through it,
a prompt/response pair as one user turn and the answer (`encode_example`):

    template(user: prompt, generation prompt) response end-of-turn fill ...

`fill` is EOS with `data.pad_as_eos: true` (LLaDA's SFT convention: the padding is part of
the answer, attended and scored, so the model learns where the answer ends), else the pad
token outside the row's length (never attended, masked or scored). The prompt's length
is stored per row (`{split}.prompt.bin`, int32): the prompt is clean context, the rest of
the row up to its length is the target of the loss. Examples longer than L are dropped
and counted (`dropped` in meta.json), never cut: a cut answer would teach a wrong end.

Sources: a local .jsonl of such records, `hub:ORG/NAME` (a Hugging Face data set of them), or
`bigtxt-next` (the embedded corpus: a sentence as the prompt, the next sentence as the response).
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import MdlmError
from ..io.packaged import sha256_file
from .chat import chat_example_ids, has_chat_template
from .source import SplitWrite
from .sources import BigTxt, HubDataset, Source, _split_documents, get_source, read_text_file
from .tokenizers import Tokenizer

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")


def check_example(record, where: str) -> dict:
    """A validated example: prompt/response strings, or messages ending with the assistant's."""
    if not isinstance(record, dict):
        raise MdlmError(
            f"{where}: an example must be a JSON object with prompt/response or messages"
        )
    if "messages" in record:
        msgs = record["messages"]
        ok = (
            isinstance(msgs, list)
            and len(msgs) >= 2
            and all(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
                for m in msgs
            )
        )
        if not ok or msgs[-1]["role"] != "assistant":
            raise MdlmError(
                f"{where}: 'messages' must be a list of {{role, content}} strings, at least "
                "two, the last one the assistant's (the response)"
            )
        return {**_fields(record), "messages": msgs}
    if not all(isinstance(record.get(k), str) for k in ("prompt", "response")):
        raise MdlmError(
            f"{where}: an example needs string 'prompt' and 'response' fields (or 'messages')"
        )
    return {**_fields(record), "prompt": record["prompt"], "response": record["response"]}


def _fields(record: dict) -> dict:
    """The example's other fields (a reference answer, a task id, ...), kept for what reads
    them (`mdlm rl`'s rewards take the data set's fields); the packing reads only the prompt
    and the response."""
    return {k: v for k, v in record.items() if k not in ("prompt", "response", "messages")}


def read_examples(path: Path) -> list[dict]:
    examples = []
    for n, line in enumerate(read_text_file(path).splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise MdlmError(f"{path}:{n} is not JSON") from None
            examples.append(check_example(record, f"{path}:{n}"))
    if not examples:
        raise MdlmError(f"{path} holds no examples; give one JSON object per line")
    return examples


class ExampleSource(Source):
    """A source of prompt/response examples (what `data.packing: sft` reads)."""

    @abstractmethod
    def all_examples(self, load_dataset=None) -> list[dict]:
        """Every example of the source, in a fixed order (the splits are drawn from it)."""

    def examples(self, split: str, load_dataset=None) -> tuple[Iterator[list[dict]], int]:
        return _split_documents(self.all_examples(load_dataset), split)

    def documents(self, split, load_dataset=None):
        """As plain text (prompt, a newline, response) for the other packings."""
        batches, n = self.examples(split, load_dataset)
        return ([f"{e.get('prompt', '')}\n{e.get('response', '')}" for e in b]
                for b in batches), n


@dataclass
class LocalExamples(ExampleSource):
    path: Path = field(default_factory=Path)

    @property
    def fingerprint(self) -> str:
        return f"local-sft:{self.path.name}:{sha256_file(self.path)}:v1"

    def all_examples(self, load_dataset=None) -> list[dict]:
        return read_examples(self.path)


@dataclass
class HubExamples(ExampleSource):
    """`hub:ORG/NAME`: a Hugging Face data set of prompt/response or messages records (its
    train split, divided into train/valid/test as local files are). A named one
    (`EXAMPLE_SOURCES`) may read its own fields as the prompt and response (`prompt_field`,
    `response_field`), its `config` and `split`, and derive further fields (`derive`: GSM8K's
    answer after `####`)."""

    hub_id: str = ""
    config: str | None = None
    split: str = "train"
    prompt_field: str = "prompt"
    response_field: str = "response"
    derive: Callable[[dict], dict] | None = None

    @property
    def fingerprint(self) -> str:
        named = (self.config, self.split, self.prompt_field) != (None, "train", "prompt")
        return (f"hub-sft:{self.hub_id}"
                + (f":{self.config}:{self.split}" if named else "") + ":v1")

    def all_examples(self, load_dataset=None) -> list[dict]:
        hub = HubDataset(self.name, self.description, hub_id=self.hub_id, config=self.config,
                         split_specs={"train": self.split})
        rows = hub.load("train", load_dataset)
        return [check_example(self._record(dict(row)), f"{self.hub_id} row {i}")
                for i, row in enumerate(rows)]

    def _record(self, row: dict) -> dict:
        if (self.prompt_field, self.response_field) != ("prompt", "response"):
            row["prompt"] = row.pop(self.prompt_field, None)
            row["response"] = row.pop(self.response_field, None)
        return {**row, **self.derive(row)} if self.derive else row


def gsm8k_answer(row: dict) -> dict:
    """GSM8K's reference answer: the text after `####` in its solution (d1's
    `extract_hash_answer`), the `answer` field the `exact` reward reads first."""
    solution = row.get("response") or ""
    return {"answer": solution.split("####")[-1].strip()} if "####" in solution else {}


@dataclass
class SentencePairs(ExampleSource):
    """The embedded corpus as a task: each sentence (8 to `max_chars` characters) the prompt,
    the sentence after it in the same paragraph the response."""

    name: str = "bigtxt-next"
    description: str = (
        "big.txt as prompt/response pairs: a sentence, then the next one (offline; sft)"
    )
    max_chars: int = 60

    @property
    def fingerprint(self) -> str:
        return f"{BigTxt().fingerprint}:next-sentence-{self.max_chars}-v1"

    def all_examples(self, load_dataset=None) -> list[dict]:
        pairs = []
        for doc in BigTxt().all_documents():
            for paragraph in doc.split("\n\n"):
                sentences = SENTENCE_END.split(paragraph)
                pairs += [
                    {"prompt": a, "response": b}
                    for a, b in zip(sentences, sentences[1:], strict=False)
                    if 8 <= len(a) <= self.max_chars and 8 <= len(b) <= self.max_chars
                ]
        return pairs


def _gsm8k(split: str) -> HubExamples:
    return HubExamples(name=f"gsm8k-{split}", hub_id="openai/gsm8k", config="main", split=split,
                       prompt_field="question", response_field="answer", derive=gsm8k_answer,
                       description=f"GSM8K's {split} split (openai/gsm8k, main): the question, "
                                   "the worked solution, its answer after #### (hub)")


EXAMPLE_SOURCES = {"bigtxt-next": SentencePairs(), "gsm8k": _gsm8k("train"),
                   "gsm8k-test": _gsm8k("test")}


def holds_examples(name_or_path: str) -> bool:
    """Whether `name_or_path` is prompt/response data: a named example source, or a local .jsonl
    whose first record has prompt/response or messages fields (its first line is read)."""
    if name_or_path in EXAMPLE_SOURCES:
        return True
    path = Path(name_or_path)
    if not (path.is_file() and path.suffix == ".jsonl"):
        return False
    with path.open(encoding="utf-8", errors="replace") as f:
        line = next((line for line in f if line.strip()), "")
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and ("messages" in record
                                         or {"prompt", "response"} <= set(record))


def example_source(name_or_path: str) -> ExampleSource:
    """The source of `data.dataset` under `data.packing: sft` or `sft-pack`."""
    if name_or_path in EXAMPLE_SOURCES:
        return EXAMPLE_SOURCES[name_or_path]
    if name_or_path.startswith("hub:") and "/" in name_or_path:
        hub_id = name_or_path[4:]
        return HubExamples(name=hub_id.replace("/", "_"), description=f"examples {hub_id}",
                           hub_id=hub_id)
    path = Path(name_or_path)
    if path.is_file() and path.suffix == ".jsonl":
        return LocalExamples(name=path.stem or "local", description=f"examples {path}",
                             path=path)
    get_source(name_or_path)  # an unknown name or path: its own error
    raise MdlmError(
        f"data.packing=sft (or sft-pack) needs prompt/response examples: a .jsonl file of "
        f"prompt/response or messages records, hub:ORG/NAME, or {', '.join(EXAMPLE_SOURCES)}; "
        f"{name_or_path!r} is neither"
    )


def render_chat(tokenizer: Tokenizer, messages: list[dict]) -> tuple[str, str]:
    """(prompt text, response text) of a conversation through the tokeniser's chat template."""
    _need_template(tokenizer)
    hf = tokenizer.hf
    prompt = hf.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    full = hf.apply_chat_template(messages, tokenize=False)
    if not full.startswith(prompt):
        raise MdlmError(
            f"the chat template of {tokenizer.name} does not render the conversation as its "
            "prompt followed by the answer; give prompt/response fields instead"
        )
    return prompt, full[len(prompt) :]


def _need_template(tokenizer: Tokenizer) -> None:
    if not has_chat_template(tokenizer):
        raise MdlmError(
            f"'messages' examples need a tokenizer with a chat template; {tokenizer.name} has "
            "none: give prompt/response fields instead"
        )


def encode_example(tokenizer: Tokenizer, example: dict) -> tuple[list[int], list[int]]:
    """(prompt tokens, response tokens). With a chat template (a LLaDA or Dream tokeniser's) a
    prompt/response pair is the conversation [user: prompt, assistant: response], and every
    conversation is the template's rendering (data/chat.py: the prompt as `sample --chat` feeds
    it, its BOS the template's own; the answer up to its end-of-turn token). Without one:
    ([BOS] + prompt, response + [EOS])."""
    if "messages" in example:
        _need_template(tokenizer)
        return chat_example_ids(tokenizer, example["messages"])
    if has_chat_template(tokenizer):
        turns = [{"role": "user", "content": example["prompt"]},
                 {"role": "assistant", "content": example["response"]}]
        return chat_example_ids(tokenizer, turns)
    prompt_ids = [tokenizer.bos_id] + tokenizer.encode(example["prompt"])
    return prompt_ids, tokenizer.encode(example["response"]) + [tokenizer.eos_id]


def row_format(tokenizer: Tokenizer) -> str:
    """What of the tokeniser besides its vocabulary shapes the rows (for the cache key): its
    chat template, where it has one."""
    if not has_chat_template(tokenizer):
        return ""
    return ":chat-" + hashlib.sha256(tokenizer.hf.chat_template.encode()).hexdigest()[:16]


def sft_rows(
    example_batches: Iterable[list[dict]], length: int, tokenizer: Tokenizer, *, pad_as_eos: bool
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """(rows (n, L), lengths (n,), prompt lengths (n,), examples dropped as too long) per
    batch."""
    fill = tokenizer.eos_id if pad_as_eos else tokenizer.pad_id
    for examples in example_batches:
        encoded = [encode_example(tokenizer, e) for e in examples]
        kept = [(p, r) for p, r in encoded if len(p) + len(r) <= length]
        rows = np.full((len(kept), length), fill, dtype=np.int64)
        lengths = np.full(len(kept), length, dtype=np.int32)
        prompts = np.zeros(len(kept), dtype=np.int32)
        for i, (p, r) in enumerate(kept):
            rows[i, : len(p) + len(r)] = p + r
            prompts[i] = len(p)
            if not pad_as_eos:
                lengths[i] = len(p) + len(r)
        yield rows, lengths, prompts, len(encoded) - len(kept)


def write_sft_split(out: SplitWrite, source: ExampleSource, tokenizer: Tokenizer, *,
                    length: int, pad_as_eos: bool) -> dict:
    """Tokens, lengths and prompt lengths of one split; the split's entry of meta.json."""
    batches, total = source.examples(out.split, out.load_dataset)
    info = {"rows": 0, "tokens": 0, "docs": 0, "dropped": 0, "target_tokens": 0}
    limit = out.limit
    with (
        open(out.path("tokens"), "wb") as ft,
        open(out.path("lengths"), "wb") as fl,
        open(out.path("prompt"), "wb") as fp,
    ):
        for batch in batches:
            out.read(len(batch), total)
            for rows, lengths, prompts, dropped in sft_rows(
                [batch], length, tokenizer, pad_as_eos=pad_as_eos
            ):
                if limit is not None:
                    rows, lengths, prompts = (
                        a[: limit - info["rows"]] for a in (rows, lengths, prompts)
                    )
                ft.write(rows.astype(out.dtype).tobytes())
                fl.write(lengths.tobytes())
                fp.write(prompts.tobytes())
                info["rows"] += len(rows)
                info["docs"] += len(batch)
                info["dropped"] += dropped
                info["tokens"] += int(lengths.sum())
                info["target_tokens"] += int((lengths - prompts).sum())
            if limit is not None and info["rows"] >= limit:
                break
    return info
