"""`mdlm serve`: an OpenAI-compatible HTTP server for a checkpoint (docs/serving.md); the
server is `serve.launch.serve_checkpoint`."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import MdlmError
from .app import app
from .console import note, say, user_errors, warn
from .flag_checks import check_positive
from .loading import loading_command, loading_from
from .options import float_in

HostOpt = Annotated[str, typer.Option(
    help="Address to bind (a non-loopback one wants --api-key).")]
PortOpt = Annotated[int, typer.Option(help="TCP port.", min=0, max=65535)]
MaxBatchOpt = Annotated[int, typer.Option(
    help="Rows per network call at most: concurrent requests are sampled together up to this "
         "many rows (1 = no batching).")]
PaddingOpt = Annotated[str, typer.Option(
    help="Shapes of the batched calls: auto = the sizes that a probe at the first request of "
         "each row length finds give every row the same bits as a full call (seeded answers "
         "stay batch-invariant, a lone request pays for its own rows); always = every call "
         "padded to --max-batch rows (invariant by construction); never = the rows a call has "
         "(fastest; rare draws may then depend on the batch).")]
MaxWaitOpt = Annotated[float, typer.Option(
    help="How long a network call waits for the calls of the other running requests (ms).",
    callback=float_in(0))]
QueueOpt = Annotated[int, typer.Option(
    help="Requests that may wait; beyond them 429 Retry-After.")]
ApiKeyOpt = Annotated[str | None, typer.Option(
    envvar="MDLM_API_KEY", help="Require Authorization: Bearer KEY on /v1 and /metrics "
                                "(env MDLM_API_KEY).")]
TimeoutOpt = Annotated[float, typer.Option(help="A request's time limit in seconds (then 504).",
                                            callback=float_in(0, low_in=False))]
NameOpt = Annotated[str | None, typer.Option(
    help="The model id requests name (default: the checkpoint's folder name or hub id).")]


@app.command("serve", cls=loading_command())
def serve_cmd(
    ctx: typer.Context,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    max_batch: MaxBatchOpt = 8,
    batch_padding: PaddingOpt = "auto",
    max_wait_ms: MaxWaitOpt = 20.0,
    queue_size: QueueOpt = 64,
    api_key: ApiKeyOpt = None,
    timeout: TimeoutOpt = 300.0,
    model_name: NameOpt = None,
) -> None:
    """Serve a checkpoint over HTTP: OpenAI's /v1/completions (suffix = real infilling,
    semi-AR streaming), /v1/mdlm/infill, /v1/models, /health, /metrics and a page at /.

    [dim]Examples:[/]
      mdlm serve                                     # runs/demo on http://127.0.0.1:8000
      mdlm serve --max-batch 1                       # one request's rows per network call
      mdlm serve -c runs/owt --device cuda --max-batch 16
      mdlm serve --host 0.0.0.0 --api-key $KEY       # reachable from other machines
    """
    from ..serve.launch import ServeOptions, serve_checkpoint
    from ..serve.shapes import PADDINGS

    loading = loading_from(ctx)
    with user_errors():
        check_positive(max_batch=max_batch, queue_size=queue_size)
        if batch_padding not in PADDINGS:
            raise MdlmError(f"--batch-padding must be one of: {', '.join(PADDINGS)}")
        options = ServeOptions(
            host=host, port=port, max_batch=max_batch, batch_padding=batch_padding,
            max_wait_ms=max_wait_ms,
            queue_size=queue_size, api_key=api_key, timeout_s=timeout, model_name=model_name,
            device=loading.device, raw_weights=loading.raw_weights, threads=loading.threads,
            precision=loading.net_precision, adapter=loading.adapter)
        serve_checkpoint(loading.checkpoint, options, warn=warn, note=note, on_ready=say)
