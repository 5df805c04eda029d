"""Serving a checkpoint (`mdlm serve`): the server's settings from the options, the model
loaded in the background once the server is up, and uvicorn run until it stops."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import MdlmError
from .served import Served


@dataclass
class ServeOptions:
    """Where and how a checkpoint is served; the fields are `mdlm serve`'s flags."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 8  # rows per network call at most (1: no batching)
    max_wait_ms: float = 20.0
    batch_padding: str = "auto"  # serve/shapes.py: auto | always | never
    queue_size: int = 64
    api_key: str | None = None
    timeout_s: float = 300.0
    model_name: str | None = None  # None: the checkpoint's folder name or hub id
    device: str | None = None
    raw_weights: bool = False
    threads: int | None = None
    precision: str = "auto"  # the network's: auto | bf16 | fp32 (runtime.autocast_dtype)
    adapter: str | None = None  # a LoRA adapter folder merged into the checkpoint's model


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_model_name(checkpoint: str) -> str:
    path = Path(checkpoint)
    return path.resolve().name if path.exists() else checkpoint.strip("/")


def require_serve_extra():
    """uvicorn, once the serve extra's packages are known to be installed."""
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise MdlmError(f"mdlm serve needs the serve extra ({e.name} is missing): "
                        "pip install 'mdlm[serve]'") from None
    return uvicorn


def serve_checkpoint(
    checkpoint: str,
    options: ServeOptions,
    *,
    warn: Callable[[str], None],
    note: Callable[[str], None],
    on_ready: Callable[[str], None],
) -> None:
    """Serve the checkpoint until the server stops: `warn` for an open address without an API
    key, `note` for the checkpoint's notes and how calls are batched, `on_ready` with the line
    that says where it is served. A model that fails to load stops the server and raises here."""
    uvicorn = require_serve_extra()  # before app.py, which imports starlette
    from ..checkpoints.load import load_on_device
    from ..runtime import pick_device
    from .app import Settings, create_app

    # an unknown device fails here, before the server starts
    pick_device(options.device or "auto")
    host, port = options.host, options.port
    if not is_loopback(host) and not options.api_key:
        warn(f"binding {host} without --api-key: anyone who reaches it can use the model")
    name = options.model_name or default_model_name(checkpoint)

    def load() -> Served:
        loaded, rt = load_on_device(checkpoint, device=options.device,
                                    raw_weights=options.raw_weights, threads=options.threads,
                                    precision=options.precision, adapter=options.adapter)
        for text in loaded.state.get("notes") or []:  # e.g. a freshly initialised MLM head
            note(text)
        on_ready(f"serving {name} ({loaded.objective.name}, L={loaded.length}) on "
                 f"http://{host}:{port}")
        return Served(loaded, rt.device, rt.dtype, name)

    def failed(message: str) -> None:
        server.should_exit = True

    settings = Settings(api_key=options.api_key, max_batch=options.max_batch,
                        max_wait_ms=options.max_wait_ms, queue_size=options.queue_size,
                        batch_padding=options.batch_padding,
                        timeout_s=options.timeout_s)
    application = create_app(load, settings, on_load_error=failed, note=note)
    server = uvicorn.Server(uvicorn.Config(application, host=host, port=port, log_level="info",
                                           timeout_graceful_shutdown=5))
    server.run()
    error = application.state.mdlm.load_error
    if error:
        raise MdlmError(f"{checkpoint}: {error}")
