"""Read checkpoints without running their code: PyTorch pickles (Lightning `.ckpt`,
`pytorch_model.bin`), and Hugging Face folders, which transformers would otherwise offer to
run the Python files of (`auto_map`; every `from_pretrained` here passes
`trust_remote_code=False`, and `refuse_remote_code` turns such a folder away in one line).

Everything goes through `torch.load(weights_only=True)`, whose unpickler only rebuilds
tensors and plain containers. A reference Lightning checkpoint also pickles objects
(`hyper_parameters` holds the Hydra/OmegaConf config and the transformers tokeniser),
which that unpickler refuses. For those, every class or function the file names is
registered with `torch.serialization.safe_globals` under its own name but bound to an
inert `Opaque` record: unpickling then builds records that hold the object's
arguments and state as plain data, and no class from the file is imported or called.
The config values are read back out of those records by `plain()`.
"""

from __future__ import annotations

import _compat_pickle
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..errors import MdlmError

# Names that only a file meant to run code would reference; such a file is refused outright.
_DANGEROUS_MODULES = {
    "os",
    "posix",
    "nt",
    "subprocess",
    "sys",
    "runpy",
    "importlib",
    "shutil",
    "socket",
    "pty",
    "marshal",
    "pickle",
    "code",
    "ctypes",
    "webbrowser",
    "commands",
    "_posixsubprocess",
}
_DANGEROUS_BUILTINS = {
    "eval",
    "exec",
    "compile",
    "open",
    "__import__",
    "getattr",
    "setattr",
    "delattr",
    "globals",
    "locals",
    "vars",
    "input",
    "breakpoint",
}


class Opaque:
    """Inert stand-in for a pickled object: keeps its constructor arguments and state."""

    qualname = "?"

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.args, obj.state = args, None
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<opaque {self.qualname}>"


def _plain_dict(*args, **kwargs) -> dict:
    """`collections.defaultdict(factory)` rebuilt as a plain dict (the factory is dropped)."""
    return {}


def python3_name(name: str) -> str:
    """The global a pickle name resolves to: protocol-2 pickles (torch.save's default) store
    Python 2 names, which unpickling maps back (`commands.call` is `subprocess.call`)."""
    module, _, attr = name.rpartition(".")
    if (module, attr) in _compat_pickle.NAME_MAPPING:
        return ".".join(_compat_pickle.NAME_MAPPING[(module, attr)])
    return f"{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{attr}"


def _dangerous(name: str) -> bool:
    module, _, attr = python3_name(name).rpartition(".")
    root = module.split(".")[0]
    return root in _DANGEROUS_MODULES or (module == "builtins" and attr in _DANGEROUS_BUILTINS)


def _stand_ins(names: list[str]) -> list[tuple[Any, str]]:
    out = []
    for name in names:
        if name == "collections.defaultdict":
            out.append((_plain_dict, name))
        else:
            out.append((type("Opaque", (Opaque,), {"qualname": name}), name))
    return out


def _check_pickle(path: Path) -> None:
    """A file that is neither torch.save's zip nor a pickle (protocol 2+ starts with 0x80) is
    refused for what it is, not as a pickle that cannot be inspected."""
    with open(path, "rb") as f:
        head = f.read(256)
    # a pickle, or a torch.save zip cut short
    if head[:1] == b"\x80" or head[:4] == b"PK\x03\x04":
        return  # torch.load says what is wrong with it
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None:
        kind = "an unknown binary file"
    elif text.lstrip()[:1] in ("{", "["):
        kind = "a JSON or JSON-lines text file"
        if '"tokens"' in text:
            kind += " (samples from mdlm sample --out?)"
    else:
        kind = "a text file"
    raise MdlmError(f"{path} is not a PyTorch checkpoint (a torch.save or Lightning file): "
                    f"it is {kind}; --checkpoint takes a run folder, a step folder, a hub id "
                    "or a .ckpt file")


def read_torch_file(path: Path) -> Any:
    """The object in a `torch.save` file, read with weights_only=True (see the module doc)."""
    mmap = zipfile.is_zipfile(path)  # large Lightning files: map tensors instead of reading them
    if not mmap:
        _check_pickle(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        pass  # pickled objects besides tensors: read them as inert records below
    except Exception as e:  # noqa: BLE001 - any failure here means an unreadable file
        raise MdlmError(f"{path} is not a readable PyTorch checkpoint ({_first_line(e)}); "
                        "the file is corrupted or truncated") from None
    if not hasattr(torch.serialization, "get_unsafe_globals_in_checkpoint"):
        raise MdlmError(
            f"{path} pickles Python objects besides tensors; reading them safely needs "
            f"torch >= 2.6 (this is {torch.__version__})"
        )
    try:
        names = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception as e:  # noqa: BLE001 - legacy (non-zip) format or damaged archive
        raise MdlmError(
            f"refusing to read {path}: it pickles Python objects and cannot be inspected "
            f"safely ({_first_line(e)}); re-save its state_dict (and 'ema') as plain tensors"
        ) from None
    bad = [python3_name(n) for n in names if _dangerous(n)]
    if bad:
        raise MdlmError(
            f"refusing to read {path}: it references {bad[0]}, which a model checkpoint never "
            "needs and which could run code when unpickled; refused"
        )
    try:
        with torch.serialization.safe_globals(_stand_ins(names)):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001
        raise MdlmError(
            f"refusing to read {path}: torch.load(weights_only=True) cannot rebuild it "
            f"({_first_line(e)}); mdlm never unpickles arbitrary objects. Re-save its "
            "state_dict (and 'ema') as plain tensors with torch.save where it was written"
        ) from None


def plain(obj: Any) -> Any:
    """Plain Python data from a read pickle: OmegaConf containers and value nodes (records
    with `_content` / `_val` state) become dicts, lists and values; other records stay opaque."""
    if isinstance(obj, Opaque):
        state = obj.state if isinstance(obj.state, dict) else {}
        if "_content" in state:
            return plain(state["_content"])
        if "_val" in state:
            return plain(state["_val"])
        return obj
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    return obj


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def refuse_remote_code(folder: str | Path, *, model: bool) -> None:
    """One line, before transformers reads `folder`, if loading its tokeniser (and, with
    `model`, its model) would need the folder's own Python code (`auto_map`)."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    tokenizer_config, config = (
        _json_object(folder / "tokenizer_config.json"),
        _json_object(folder / "config.json"),
    )
    asks = None
    if tokenizer_config.get("auto_map"):
        asks = "tokenizer_config.json"
    elif (
        config.get("auto_map")
        and config.get("model_type") not in CONFIG_MAPPING_NAMES
        and (model or "tokenizer_class" not in tokenizer_config)
    ):  # transformers would build the config from code
        asks = "config.json"
    if asks:
        raise MdlmError(
            f"refusing {folder}: its {asks} asks to run the folder's own Python code "
            "(auto_map), and mdlm never runs code from a model folder; use one without "
            "custom code"
        )


def remote_code_refusal(e: BaseException, name: str) -> MdlmError | None:
    """The one-line refusal for transformers' error on a hub repo that needs its own code."""
    text = str(e)
    if "trust_remote_code" in text or "custom code" in text:
        return MdlmError(
            f"refusing {name!r}: it needs its own Python code (trust_remote_code), and mdlm "
            "never runs code from a model repository"
        )
    return None
