"""Fast offline detection for the Hugging Face Hub.

Without a network, huggingface_hub retries with back-off for close to a minute
before failing. One quick TCP probe tells us first; when the Hub is unreachable
the libraries are switched to offline mode, so files already in the local
Hugging Face cache still load and anything else fails at once.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from urllib.parse import urlparse


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
