"""`mdlm serve`: an OpenAI-compatible HTTP server for a checkpoint (docs/serving.md)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated

import typer

from ..errors import MdlmError
from .common import (
    CheckpointOpt,
    DeviceOpt,
    RawWeightsOpt,
    ThreadsOpt,
    app,
    check_positive,
    err_console,
    float_in,
    load_for_command,
    user_errors,
    warn,
)

HostOpt = Annotated[str, typer.Option(help="Address to bind (a non-loopback one wants --api-key).")]
PortOpt = Annotated[int, typer.Option(help="TCP port.", min=0, max=65535)]
MaxBatchOpt = Annotated[int | None, typer.Option(
    help="Rows per network call: concurrent requests are sampled together up to this many rows; "
         "every call has this shape, padded (1 = no batching). Default: 8 on a GPU, 1 on a CPU, "
         "where a padded call costs all its rows.")]
MaxWaitOpt = Annotated[float, typer.Option(
    help="How long a network call waits for the calls of the other running requests (ms).",
    callback=float_in(0))]
QueueOpt = Annotated[int, typer.Option(help="Requests that may wait; beyond them 429 Retry-After.")]
ApiKeyOpt = Annotated[str | None, typer.Option(
    envvar="MDLM_API_KEY", help="Require Authorization: Bearer KEY on /v1 and /metrics "
                                "(env MDLM_API_KEY).")]
TimeoutOpt = Annotated[float, typer.Option(help="A request's time limit in seconds (then 504).",
                                            callback=float_in(0, low_in=False))]
NameOpt = Annotated[str | None, typer.Option(
    help="The model id requests name (default: the checkpoint's folder name or hub id).")]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _model_name(checkpoint: str) -> str:
    path = Path(checkpoint)
    return path.resolve().name if path.exists() else checkpoint.strip("/")


def _imports():
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise MdlmError(f"mdlm serve needs the serve extra ({e.name} is missing): "
                        "pip install 'mdlm[serve]'") from None
    return uvicorn


@app.command("serve")
def serve_cmd(
    checkpoint: CheckpointOpt = "runs/demo",
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    max_batch: MaxBatchOpt = None,
    max_wait_ms: MaxWaitOpt = 20.0,
    queue_size: QueueOpt = 64,
    api_key: ApiKeyOpt = None,
    timeout: TimeoutOpt = 300.0,
    model_name: NameOpt = None,
    threads: ThreadsOpt = None,
    device: DeviceOpt = None,
    raw_weights: RawWeightsOpt = False,
) -> None:
    """Serve a checkpoint over HTTP: OpenAI's /v1/completions (suffix = real infilling,
    semi-AR streaming), /v1/mdlm/infill, /v1/models, /health, /metrics and a page at /.

    [dim]Examples:[/]
      mdlm serve                                     # runs/demo on http://127.0.0.1:8000
      mdlm serve --max-batch 8                       # batch concurrent requests on a CPU too
      mdlm serve -c runs/owt --device cuda --max-batch 16
      mdlm serve --host 0.0.0.0 --api-key $KEY       # reachable from other machines
    """
    with user_errors():
        check_positive(max_batch=max_batch, queue_size=queue_size)
        uvicorn = _imports()
        from ..runtime import pick_device
        from ..serve.app import Settings, create_app
        from ..serve.served import Served

        if max_batch is None:  # (an unknown device fails here, before the server starts)
            max_batch = 1 if pick_device(device or "auto").type == "cpu" else 8

        if not is_loopback(host) and not api_key:
            warn(f"binding {host} without --api-key: anyone who reaches it can use the model")
        name = model_name or _model_name(checkpoint)

        def load() -> Served:
            loaded, rt = load_for_command(checkpoint, device, raw_weights, threads)
            err_console.print(f"serving {name} ({loaded.objective.name}, L={loaded.length}) on "
                              f"http://{host}:{port}", highlight=False, markup=False)
            return Served(loaded, rt.device, rt.dtype, name)

        def failed(message: str) -> None:
            server.should_exit = True

        settings = Settings(api_key=api_key, max_batch=max_batch, max_wait_ms=max_wait_ms,
                            queue_size=queue_size, timeout_s=timeout)
        application = create_app(load, settings, on_load_error=failed)
        server = uvicorn.Server(uvicorn.Config(application, host=host, port=port, log_level="info",
                                               timeout_graceful_shutdown=5))
        server.run()
        error = application.state.mdlm.load_error
        if error:
            raise MdlmError(f"{checkpoint}: {error}")
