"""Local lm-eval tasks from a data set of the registry (offline for the embedded corpus):
a LAMBADA-style last-word task (lm-eval's `lambada_openai` recipe: accuracy and perplexity
of the passage's last word given the rest) and a rolling-perplexity task over whole
documents (lm-eval's `wikitext` recipe). `mdlm lm-eval --include-path DIR` runs them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ...data.sources import get_source
from ...data.tokenizers import normalize_text8
from ...errors import MdlmError

# An lm-eval task over a local JSONL file; `lines` (metrics and how a row becomes a request)
# and `about` (metadata.source) are the task's own.
TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: {output_type}
test_split: test
{lines}metadata: {{version: 1.0, source: "{about}"}}
"""
LASTWORD_LINES = """doc_to_text: "{{text.split(' ')[:-1]|join(' ')}}"
doc_to_target: "{{' '+text.split(' ')[-1]}}"
metric_list:
  - {metric: perplexity, aggregation: perplexity, higher_is_better: false}
  - {metric: acc, aggregation: mean, higher_is_better: true}
"""
LASTWORD_ABOUT = (
    "{source}, split {split}, {words}-word passages, last word >= {min_letters} letters"
)
ROLLING_LINES = """doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - {metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
  - {metric: byte_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
  - {metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}
"""
ROLLING_ABOUT = "{source}, split {split}, one document per row"


def last_word_passages(words: list[str], size: int, min_letters: int = 4) -> Iterator[str]:
    """Consecutive passages of about `size` words, each extended until its last word is
    alphabetic with at least `min_letters` letters (the word to predict)."""
    start = 0
    while start + size <= len(words):
        end = start + size
        while end <= len(words) and not (
            words[end - 1].isalpha() and len(words[end - 1]) >= min_letters
        ):
            end += 1
        if end > len(words):
            return
        yield " ".join(words[start:end])
        start = end


def write_tasks(folder: str | Path, *,
                dataset: str,
                split: str = "test",
                char_level: bool = False,
                words: int = 40,
                passages: int = 0,
                min_letters: int = 4) -> dict[str, int]:
    """Write `{name}_lastword` and `{name}_rolling` (YAML + JSONL) into `folder`; text as a
    character-level model reads it (text8 normalisation) when `char_level`. Returns the rows
    of each task."""
    if words < 2:
        raise MdlmError(f"--words must be at least 2 (got {words})")
    source = get_source(dataset)
    batches, _ = source.documents(split)
    docs = [normalize_text8(d).strip() if char_level else d for batch in batches for d in batch]
    docs = [d for d in docs if d]
    if not docs:
        raise MdlmError(f"{dataset} has no documents in its {split} split")
    items = [p for d in docs for p in last_word_passages(d.split(), words, min_letters)]
    items = items[:passages] if passages > 0 else items
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = "".join(c if c.isalnum() else "_" for c in source.name).strip("_") or "local"
    for kind, rows, output_type, lines, about in (
        ("lastword", items, "loglikelihood", LASTWORD_LINES, LASTWORD_ABOUT),
        ("rolling", docs, "loglikelihood_rolling", ROLLING_LINES, ROLLING_ABOUT),
    ):
        data = folder / f"{name}_{kind}.jsonl"
        data.write_text("".join(json.dumps({"text": row}) + "\n" for row in rows))
        description = about.format(
            source=source.name, split=split, words=words, min_letters=min_letters
        )
        yaml = TASK_YAML.format(
            task=f"{name}_{kind}",
            data=data.resolve(),
            output_type=output_type,
            lines=lines,
            about=description,
        )
        (folder / f"{name}_{kind}.yaml").write_text(yaml)
    return {f"{name}_lastword": len(items), f"{name}_rolling": len(docs)}
