"""A task whose data the code generates, for RL shown on the CPU: digit addition, character
level, with a seeded train / held-out split and an exact-match scorer.

A problem is two numbers of at most `max_digits` digits each; its prompt "12+345=", its
response "357". mdlm's character tokeniser is text8's (a-z and space: digits would become
spaces), so with `alphabet="text8"` (the default) the digits are written as the letters
a-j (0 -> a, ..., 9 -> j), "+" as "p" and "=" as "q": "bcpdefq" -> "dfh", one token a
character; `alphabet="digits"` keeps "12+345=" for tokenisers that have digits.

The files are prompt/response JSONL, what `data/sft.py` reads (`data.packing: sft`):
train.jsonl for SFT and the RL prompts, held_out.jsonl for evaluation. The two splits are
drawn together without replacement from every (a, b) pair, so no problem is in both. Sized
for a tiny DiT on 2 CPU cores: the default 2 digits give 10,000 problems, prompts of at most
6 characters and answers of at most 3, rows of 16 tokens (`data.length: 16`) with BOS and EOS.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import MdlmError
from ..io.files import write_text_atomic

ALPHABETS = ("text8", "digits")
DIGIT_LETTERS = "abcdefghij"  # text8 has no digits: 0 -> a ... 9 -> j
TEXT8_SIGNS = {"+": "p", "=": "q"}


@dataclass(frozen=True)
class AdditionTask:
    max_digits: int = 2  # each operand in [0, 10**max_digits)
    train: int = 2000  # problems in train.jsonl
    held_out: int = 200  # problems in held_out.jsonl, none of them in train
    seed: int = 0
    alphabet: str = "text8"  # text8 (letters for digits) or digits

    def validate(self) -> None:
        if self.alphabet not in ALPHABETS:
            raise MdlmError(f"alphabet must be one of: {', '.join(ALPHABETS)} "
                            f"(got {self.alphabet!r})")
        if not 1 <= self.max_digits <= 6:
            raise MdlmError(f"max_digits must be in 1..6 (got {self.max_digits})")
        if self.train < 1 or self.held_out < 0:
            raise MdlmError(f"train must be positive and held_out non-negative "
                            f"(got {self.train}, {self.held_out})")
        if self.train + self.held_out > self.problems:
            raise MdlmError(f"{self.train} + {self.held_out} problems asked; {self.max_digits}-"
                            f"digit addition has only {self.problems}: raise max_digits")

    @property
    def problems(self) -> int:
        """Distinct (a, b) pairs."""
        return 10 ** (2 * self.max_digits)


def write_text(text: str, alphabet: str) -> str:
    """Plain arithmetic text ("12+345=") in the task's alphabet."""
    if alphabet == "digits":
        return text
    out = []
    for ch in text:
        out.append(DIGIT_LETTERS[int(ch)] if ch.isdigit() else TEXT8_SIGNS[ch])
    return "".join(out)


def read_text(text: str, alphabet: str) -> str:
    """The task's text back as plain arithmetic (for display); unknown characters kept."""
    if alphabet == "digits":
        return text
    signs = {v: k for k, v in TEXT8_SIGNS.items()}
    return "".join(str(DIGIT_LETTERS.index(c)) if c in DIGIT_LETTERS else signs.get(c, c)
                   for c in text)


def example(a: int, b: int, alphabet: str) -> dict:
    """One prompt/response record: "a+b=" -> "a + b"."""
    return {"prompt": write_text(f"{a}+{b}=", alphabet),
            "response": write_text(str(a + b), alphabet)}


def addition_splits(task: AdditionTask) -> tuple[list[dict], list[dict]]:
    """(train, held_out) records: `train + held_out` distinct pairs drawn together from all
    pairs with `random.Random(seed)`, the first `train` of them the train split, so the splits
    never share a problem and the same seed gives the same files."""
    task.validate()
    base = 10 ** task.max_digits
    drawn = random.Random(task.seed).sample(range(task.problems), task.train + task.held_out)
    records = [example(*divmod(i, base), task.alphabet) for i in drawn]
    return records[:task.train], records[task.train:]


def write_addition_task(task: AdditionTask, folder: str | Path) -> dict[str, Path]:
    """train.jsonl and held_out.jsonl (prompt/response lines) in `folder`, created if need
    be; returns their paths by split name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, records in zip(("train", "held_out"), addition_splits(task), strict=True):
        paths[name] = folder / f"{name}.jsonl"
        write_text_atomic(paths[name], "".join(json.dumps(r) + "\n" for r in records))
    return paths


def exact_match(completions: Sequence[str], references: Sequence[str]) -> float:
    """The fraction of completions equal to their reference, whitespace at the ends aside (the
    held-out accuracy; the `exact` reward scores one completion the same way, by its answer)."""
    if len(completions) != len(references):
        raise MdlmError(f"{len(completions)} completions for {len(references)} references")
    if not completions:
        return 0.0
    hits = sum(c.strip() == r.strip() for c, r in zip(completions, references, strict=True))
    return hits / len(completions)
