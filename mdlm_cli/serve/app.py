"""The ASGI app of `mdlm serve` (Starlette): OpenAI's completion endpoint, mdlm's infill
endpoint, models, health, metrics and the page at `/`. The model loads in a thread when the
app starts (`/health` answers 503 until then); one `Worker` owns it."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..memory import available, size_text
from .admission import Memory, memory_need, row_length
from .chat import chat_choice, chat_delta, chat_end, parse_chat
from .completion import parse_completion
from .events import Done, Event, StateSnapshot, TextDelta
from .gather import BlockGatherer
from .generation import Outcome, run_plan
from .http_io import api_error, error_response, json_body
from .infill import parse_infill
from .metrics import Metrics
from .responses import mdlm_info, object_name, response_id, sse, usage
from .schema import ApiError, Limits, Plan
from .score import parse_score, run_score
from .served import Served
from .worker import Batching, Cancelled, Job, QueueFull, Worker

MEMORY_SHARE = 0.8  # of the memory free once the model is loaded: what requests may hold


@dataclass(frozen=True)
class Settings:
    api_key: str | None = None
    max_batch: int = 8
    max_wait_ms: float = 20.0
    batch_padding: str = "auto"  # serve/shapes.py: auto (probe) | always | never
    queue_size: int = 64
    timeout_s: float = 300.0  # a request's time limit, queueing included (then 504)
    max_body_bytes: int = 1 << 20  # larger bodies: 413
    limits: Limits = field(default_factory=Limits)


@dataclass
class State:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    served: Served | None = None
    worker: Worker | None = None
    gatherer: BlockGatherer | None = None  # a bd3lm model's requests into batches (gather.py)
    load_error: str | None = None
    batching: str | None = None  # the shapes network calls run at, in words (/health)


def _ready(request: Request) -> State:
    """The app's state once the caller is authorised and the model loaded."""
    state: State = request.app.state.mdlm
    key = state.settings.api_key
    if key is not None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise ApiError(401, "a valid API key is needed: Authorization: Bearer KEY",
                           code="invalid_api_key", kind="authentication_error")
    if state.served is None or state.worker is None:
        message = f"the model failed to load: {state.load_error}" if state.load_error else (
            "the model is loading; retry shortly")
        raise ApiError(503, message, code="model_loading", kind="server_error",
                       headers={"Retry-After": "2"})
    return state


def _submit(state: State, plan: Plan) -> tuple[Job, asyncio.Queue]:
    """The plan as a job on the worker; its events (text, states, done) arrive on the queue
    (the states from the decoder's events: generation.py). A bd3lm plan goes to the gatherer,
    which batches it with the requests it can share a batch with (gather.py)."""
    served = state.served
    need = memory_need(state.worker.memory, plan.num_rows, row_length(plan, served),
                       state.settings.max_batch)
    if plan.block_size:
        return _enqueue(state, plan.num_rows, None, need=need,
                        place=lambda job, emit: state.gatherer.submit(plan, job, emit))
    return _enqueue(state, plan.num_rows, lambda d, emit: run_plan(plan, served, d, emit),
                    alone=plan.alone, need=need)


def _enqueue(state: State, rows: int, run: Callable | None, *, alone: bool = False,
             need: int = 0, place: Callable | None = None) -> tuple[Job, asyncio.Queue]:
    """`run(denoiser, emit)` as a job of `rows` rows on the worker; its events on the queue.
    `alone`: the job runs by itself on the model (a block cache); `need`: the bytes its calls
    hold; `place(job, emit)`: where the job goes in place of the worker's queue."""
    loop, events = asyncio.get_running_loop(), asyncio.Queue()

    def emit(event: Event) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens any more
            loop.call_soon_threadsafe(events.put_nowait, event)

    job = Job(rows=rows, run=lambda d: run(d, emit),
              done=lambda result, error: emit(Done(result, error)),
              timeout_s=state.settings.timeout_s, alone=alone, bytes=need)
    try:
        if place is not None:
            place(job, emit)
        else:
            state.worker.submit(job)
    except QueueFull:
        raise ApiError(429, "the server's queue is full; retry shortly",
                       code="rate_limit_exceeded", kind="rate_limit_error",
                       headers={"Retry-After": "1"}) from None
    return job, events


async def _done(request: Request, state: State, job: Job, events: asyncio.Queue) -> Done:
    """The job's end (its other events dropped); a client that goes away cancels it."""
    while True:
        try:
            event = await asyncio.wait_for(events.get(), 0.25)
        except asyncio.TimeoutError:  # (not the builtin TimeoutError before Python 3.11)
            if await request.is_disconnected():
                job.cancel("disconnect")
                raise api_error(Cancelled("disconnect"), 0) from None
            continue
        if isinstance(event, Done):
            break
    if event.error is not None:
        raise api_error(event.error, state.settings.timeout_s)
    return event


async def _answer(request: Request, state: State, plan: Plan, job: Job,
                  events: asyncio.Queue) -> dict:
    """The whole answer of a non-streamed request."""
    outcome = (await _done(request, state, job, events)).outcome
    state.metrics.samples.inc(plan.num_rows)
    choices = outcome.choices
    if plan.endpoint == "chat":
        choices = [chat_choice(c) for c in choices]
    return {"id": response_id(plan), "object": object_name(plan), "created": int(time.time()),
            "model": state.served.name, "choices": choices, "usage": usage(outcome),
            "mdlm": mdlm_info(plan, outcome, job)}


async def score(request: Request) -> Response:
    """`POST /v1/mdlm/score`: the bound (or exact NLL) of texts, continuations ranked."""
    t0 = time.monotonic()
    state: State = request.app.state.mdlm
    try:
        state = _ready(request)
        body = await json_body(request, state.settings.max_body_bytes)
        scoring = parse_score(body, state.served, state.settings.limits)
        served = state.served
        need = memory_need(state.worker.memory, scoring.num_rows, scoring.length,
                           state.settings.max_batch)
        job, events = _enqueue(state, scoring.num_rows,
                               lambda d, _emit: run_score(scoring, served, d), need=need)
        answer = (await _done(request, state, job, events)).outcome
    except ApiError as e:
        state.metrics.answered("score", e.status, time.monotonic() - t0)
        return error_response(e)
    state.metrics.answered("score", 200, time.monotonic() - t0)
    return JSONResponse({"id": f"score-{uuid.uuid4().hex}", "created": int(time.time()),
                         "model": state.served.name, **answer})


async def _stream(state: State, plan: Plan, job: Job, events: asyncio.Queue, endpoint: str,
                  t0: float):
    """Server-sent events in OpenAI's chunk format, then [DONE]; the text of each choice as it
    is decided, denoising states (if asked for) in the `mdlm` extension field only."""
    head = {"id": response_id(plan), "object": object_name(plan, chunk=True),
            "created": int(time.time()), "model": state.served.name}
    finished, started = False, set()  # chat: the choices whose first delta (with the role) went
    try:
        while not finished:
            event = await events.get()
            if isinstance(event, TextDelta) and plan.endpoint == "chat":
                choice = chat_delta(event.index, event.text, event.index not in started)
                started.add(event.index)
                yield sse({**head, "choices": [choice]})
            elif isinstance(event, TextDelta):
                choice = {"index": event.index, "text": event.text, "logprobs": None,
                          "finish_reason": None}
                yield sse({**head, "choices": [choice]})
            elif isinstance(event, StateSnapshot):
                choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": None}
                yield sse({**head, "choices": [choice], "mdlm": {"state": event.pieces}})
            else:
                finished = True
                for text in _final_chunks(state, plan, job, head, event.outcome, event.error):
                    yield text
    finally:
        if not finished:
            job.cancel("disconnect")
        state.metrics.answered(endpoint, 200 if finished else 499, time.monotonic() - t0)


def _final_chunks(state: State, plan: Plan, job: Job, head: dict, outcome: Outcome | None,
                  error: BaseException | None) -> list[str]:
    if error is not None:
        return [sse(api_error(error, state.settings.timeout_s).body()), sse("[DONE]")]
    state.metrics.samples.inc(plan.num_rows)
    ends = [{"index": c["index"], "text": "", "logprobs": c.get("logprobs"),
             "finish_reason": c["finish_reason"],
             **{k: c[k] for k in ("length", "ended") if k in c}} for c in outcome.choices]
    if plan.endpoint == "chat":
        ends = [chat_end(c) for c in outcome.choices]
    out = [sse({**head, "choices": ends, "mdlm": mdlm_info(plan, outcome, job)})]
    if plan.include_usage:
        out.append(sse({**head, "choices": [], "usage": usage(outcome)}))
    return out + [sse("[DONE]")]


def _generate_route(endpoint: str, parse: Callable) -> Callable:
    async def handle(request: Request) -> Response:
        t0 = time.monotonic()
        state: State = request.app.state.mdlm
        try:
            state = _ready(request)
            body = await json_body(request, state.settings.max_body_bytes)
            plan = parse(body, state.served, state.settings.limits)
            job, events = _submit(state, plan)
            if plan.stream:
                return StreamingResponse(_stream(state, plan, job, events, endpoint, t0),
                                         media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            answer = await _answer(request, state, plan, job, events)
        except ApiError as e:
            state.metrics.answered(endpoint, e.status, time.monotonic() - t0)
            return error_response(e)
        state.metrics.answered(endpoint, 200, time.monotonic() - t0)
        return JSONResponse(answer)

    return handle


async def models(request: Request) -> Response:
    try:
        state = _ready(request)
    except ApiError as e:
        return error_response(e)
    card = state.served.card()
    model_id = request.path_params.get("model")
    if model_id is None:
        return JSONResponse({"object": "list", "data": [card]})
    if model_id != card["id"]:
        return error_response(ApiError(404, f"model {model_id!r} is not served here",
                                       param="model", code="model_not_found"))
    return JSONResponse(card)


async def health(request: Request) -> Response:
    state: State = request.app.state.mdlm
    if state.load_error:
        return JSONResponse({"status": "error", "message": state.load_error}, status_code=503)
    if state.served is None or state.worker is None:
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "2"})
    queued, running = state.worker.depth()
    batching = state.worker.batching() if state.batching == "auto" else state.batching
    if state.gatherer is not None:
        batching = state.gatherer.batching()
    return JSONResponse({"status": "ok", "model": state.served.name, "queued": queued,
                         "running": running, "auth": state.settings.api_key is not None,
                         "batching": batching})


async def metrics(request: Request) -> Response:
    state: State = request.app.state.mdlm
    try:
        _ready(request)
    except ApiError as e:
        if e.status != 503:  # while loading the counters are there, all zero
            return error_response(e)
    if state.worker is not None:
        queued, running = state.worker.depth()
        state.metrics.queue.set(queued)
        state.metrics.running.set(running)
    return Response(state.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def page(request: Request) -> Response:
    return HTMLResponse(resources.files(__package__).joinpath("page.html").read_text("utf-8"))


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own errors (no such route, wrong method) in OpenAI's shape."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: "
                                   f"{exc.detail}", code=code))


def _load(state: State, load: Callable[[], Served], on_error: Callable[[str], None] | None,
          note: Callable[[str], None] | None = None) -> None:
    try:
        served = load()
        settings = state.settings
        free, _ = available(served.device)  # what the weights left: a share of it for requests
        memory = Memory(served.cost, None if free is None else int(free * MEMORY_SHARE))
        batching = Batching(settings.max_batch, settings.max_wait_ms / 1000, settings.queue_size,
                            settings.batch_padding)
        worker = Worker(served.denoiser, mask_id=served.loaded.mask_id, batching=batching,
                        exclusive=served.causal or bool(served.block_size),
                        metrics=state.metrics, device=served.device, memory=memory)
        state.worker = worker
        if served.block_size:  # a job per batch of requests, run alone with its cache
            state.gatherer = BlockGatherer(worker, served)
        elif not served.causal and settings.max_batch > 1:
            # probed at the first request of each row length (shapes.py), not here: a probe at
            # the whole window would cost a LLaDA-8B layout gigabytes before any request
            state.batching = "auto"
            if note is not None:
                note("batching: probed at each row length when its first request comes "
                     f"(--batch-padding {settings.batch_padding}); "
                     f"{size_text(memory.budget) if memory.budget else 'unknown memory'} "
                     "for requests")
        state.served = served
    except Exception as e:  # the server says why on /health, and the command exits with it
        state.load_error = str(e) or type(e).__name__
        if on_error is not None:
            on_error(state.load_error)


def create_app(load: Callable[[], Served], settings: Settings | None = None,
               on_load_error: Callable[[str], None] | None = None,
               note: Callable[[str], None] | None = None) -> Starlette:
    """The app; `load()` builds the served model in a thread once the app starts (`note`
    hears how its network calls are batched)."""
    state = State(settings or Settings())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        thread = threading.Thread(target=_load, args=(state, load, on_load_error, note),
                                  name="mdlm-load", daemon=True)
        thread.start()
        yield
        if state.worker is not None:
            state.worker.stop()

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", models, methods=["GET"]),
        Route("/v1/completions", _generate_route("completions", parse_completion),
              methods=["POST"]),
        Route("/v1/chat/completions", _generate_route("chat", parse_chat), methods=["POST"]),
        Route("/v1/mdlm/infill", _generate_route("infill", parse_infill), methods=["POST"]),
        Route("/v1/mdlm/score", score, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error})
    app.state.mdlm = state
    return app
