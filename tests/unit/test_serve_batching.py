"""`mdlm serve`'s worker without HTTP: a seeded request gets the same tokens alone and batched
with others, for every sampler of the registry (each on a test-size model of an objective it
serves); the requests' checks; the text cut at stop strings and max_tokens."""

import threading
from pathlib import Path

import pytest
import torch

from mdlm_cli.build import resolve_config
from mdlm_cli.checkpoints.folder import LoadedModel
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.engine.sampling import SAMPLERS
from mdlm_cli.generation.text import ChoiceText
from mdlm_cli.models import build_model
from mdlm_cli.objectives import get_objective, objectives_served_by
from mdlm_cli.serve.completion import parse_completion
from mdlm_cli.serve.events import TextDelta
from mdlm_cli.serve.generation import run_plan
from mdlm_cli.serve.infill import parse_infill
from mdlm_cli.serve.schema import ApiError, Limits
from mdlm_cli.serve.served import Served
from mdlm_cli.serve.worker import Batching, Job, Worker

from ..objective_configs import overrides

TOK = load_tokenizer("char")
CPU = torch.device("cpu")
FEW_STEPS = {"steps": 12}


def served_model(objective: str) -> Served:
    """A random test-size model (L = 32) whose positions interact (its zero-initialised gates
    perturbed)."""
    cfg = resolve_config("test", overrides(objective))
    torch.manual_seed(0)
    model = build_model(cfg.model, TOK.vocab_size, causal=get_objective(cfg, TOK).causal)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    loaded = LoadedModel(
        Path("in-memory"), model.eval(), cfg, TOK, {"length": 32, "packing": "chunk"}, {}
    )
    return Served(loaded, CPU, None, "test")


def run(worker: Worker, served: Served, bodies: list[dict], parse=parse_completion) -> list:
    """Submit the requests together; their outcomes (or errors) once all are done."""
    plans = [parse(body, served, Limits()) for body in bodies]
    results, done = [None] * len(plans), [threading.Event() for _ in plans]

    def finish(i):
        def done_fn(result, error):
            results[i] = error if error is not None else result
            done[i].set()

        return done_fn

    for i, plan in enumerate(plans):
        worker.submit(
            Job(
                rows=plan.num_rows,
                run=lambda d, plan=plan: run_plan(plan, served, d, lambda ev: None),
                done=finish(i),
                timeout_s=60,
                alone=plan.alone,
            )
        )
    for event in done:
        assert event.wait(60)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def objective_of(sampler: str) -> str:
    return objectives_served_by(sampler)[0]


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_a_seeded_request_gets_the_same_tokens_alone_and_batched(sampler):
    served = served_model(objective_of(sampler))
    spec = SAMPLERS[sampler]
    extra = FEW_STEPS if spec.uses_steps else {}
    if sampler == "d3pm-ancestral":
        extra = {"steps": 100}  # the model's T
    mine = {"prompt": "the ", "n": 2, "seed": 11, "sampler": sampler, **extra}
    others = [
        {"prompt": "a", "n": 3, "seed": 5, "sampler": sampler, **extra},
        {"prompt": "", "seed": 7, "sampler": sampler, "temperature": 0.8, **extra},
    ]
    if not served.causal:
        others.append(
            {
                "prompt": "it ",
                "suffix": " was",
                "max_tokens": 6,
                "seed": 9,
                **extra,
                "sampler": sampler,
            }
        )
    worker = Worker(served.denoiser, mask_id=served.loaded.mask_id, exclusive=served.causal,
                    batching=Batching(max_batch=8, max_wait_s=0.05))
    try:
        alone = run(worker, served, [mine])[0]
        together = run(worker, served, [others[0], mine, *others[1:]])[1]
    finally:
        worker.stop()
    assert [c["text"] for c in alone.choices] == [c["text"] for c in together.choices]
    assert alone.choices[0]["text"] != alone.choices[1]["text"]  # two draws, not one repeated
    assert alone.completion_tokens == 2 * (
        32 - len("the ")
    )  # (a random model's text may hold specials)


def test_batched_calls_hold_the_rows_of_several_requests():
    served = served_model("mdlm")

    class Count:
        rows: list[int] = []

        def network_call(self, n, seconds):
            self.rows.append(n)

        def queue_depth(self, n):
            pass

    metrics = Count()
    worker = Worker(served.denoiser, mask_id=served.loaded.mask_id, metrics=metrics,
                    batching=Batching(max_batch=8, max_wait_s=0.5))
    try:
        run(
            worker,
            served,
            [{"prompt": "a", "seed": s, "sampler": "ancestral", "steps": 5} for s in range(4)],
        )
    finally:
        worker.stop()
    assert max(metrics.rows) > 1 and sum(metrics.rows) == 4 * 5


def test_a_semi_ar_request_streams_its_blocks_and_stops_at_max_tokens():
    served = served_model("mdlm")
    plan = parse_completion(
        {
            "prompt": "the ",
            "stride": 8,
            "max_tokens": 30,
            "seed": 1,
            "stream": True,
            "sampler": "ancestral",
            "steps": 4,
        },
        served,
        Limits(),
    )
    events = []
    worker = Worker(served.denoiser, mask_id=served.loaded.mask_id, batching=Batching(max_batch=1))
    done = threading.Event()
    box = []
    worker.submit(
        Job(
            rows=1,
            run=lambda d: run_plan(plan, served, d, events.append),
            done=lambda r, e: (box.append(e or r), done.set()),
            timeout_s=60,
        )
    )
    assert done.wait(60)
    worker.stop()
    outcome = box[0]
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 1 and "".join(deltas) == outcome.choices[0]["text"]
    assert len(outcome.choices[0]["text"]) == 30 and outcome.choices[0]["finish_reason"] == "length"


def test_choice_text_cuts_at_a_stop_string_across_blocks():
    text = ChoiceText(TOK.decode, max_tokens=100, stop=["end"], eos_id=None)
    first = text.feed(TOK.encode("the e"))
    second = text.feed(TOK.encode("nd of it"))
    assert first + second == "the " and text.finish_reason == "stop" and len(text.tokens) == 4
    assert text.finish() == ""


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "logprobs": 2, "sampler": "remdm", "steps": 4}, "logprobs"),
        ({"prompt": "x", "tools": [{"type": "function"}]}, "tools"),
        ({"prompt": "x", "colour": 1}, "colour"),
        ({"prompt": "x", "max_tokens": 40}, "max_tokens"),
        ({"prompt": "x", "suffix": "y" * 20, "max_tokens": 20}, "max_tokens"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "n": 10_000}, "n"),
        ({"prompt": "x", "steps": 0}, "steps"),
        ({"prompt": "x", "sampler": "euler"}, "sampler"),
        ({"prompt": "x", "sampler": "first-hitting", "steps": 5}, "steps"),
        ({"prompt": "x", "sampler": "ancestral", "eta": 0.1}, "eta"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": [1, 2, 99]}, "prompt"),
        ({"prompt": {"a": 1}}, "prompt"),
        ({"prompt": "x", "stride": 8, "suffix": "y"}, "suffix"),
        ({"prompt": "x", "stream_states": True}, "stream_states"),
        ({"prompt": "x", "model": "gpt-4"}, "model"),
    ],
)
def test_bad_requests_are_refused_with_the_field_named(body, param):
    served = served_model("mdlm")
    with pytest.raises(ApiError) as e:
        parse_completion(body, served, Limits())
    assert e.value.param == param and 400 <= e.value.status < 500
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


def test_openai_fields_at_their_neutral_values_are_accepted():
    served = served_model("mdlm")
    body = {"prompt": "x", "logprobs": None, "presence_penalty": 0.0, "frequency_penalty": 0,
            "best_of": 1, "user": "someone", "model": "test"}
    assert parse_completion(body, served, Limits()).n == 1
    with pytest.raises(ApiError):
        parse_completion({**body, "presence_penalty": 0.5}, served, Limits())


def test_semi_ar_allows_more_than_the_window_and_infill_takes_templates():
    served = served_model("mdlm")
    plan = parse_completion({"prompt": "x", "stride": 8, "max_tokens": 100}, served, Limits())
    assert plan.max_tokens == 100 and plan.rows[0].template is None
    infill = parse_infill({"template": "the <mask:5> of <mask:3>", "seed": 1}, served, Limits())
    outcome = run(
        Worker(served.denoiser, mask_id=served.loaded.mask_id),
        served,
        [{"template": "the <mask:5> of <mask:3>", "seed": 1}],
        parse_infill,
    )[0]
    text, spans = outcome.choices[0]["text"], outcome.choices[0]["spans"]
    assert (
        text.startswith("the ")
        and text[4:9] == spans[0]
        and text[9:13] == " of "
        and len(spans[0]) == 5
    )
    assert infill.max_tokens == 32 - len("the  of ")


@pytest.mark.parametrize("padding", ["auto", "always"])
def test_a_rows_logits_are_the_same_bits_in_every_batch(padding):
    """Whatever shape the worker runs a call at (the probe's sizes, or always max_batch), a
    row's logits do not depend on how many rows share the call or where the row sits."""
    served = served_model("mdlm")
    worker = Worker(served.denoiser, mask_id=served.loaded.mask_id,
                    batching=Batching(max_batch=8, padding=padding))
    try:
        g = torch.Generator().manual_seed(0)
        z = torch.randint(8, 35, (8, 32), generator=g)
        z[torch.rand(8, 32, generator=g) < 0.5] = served.loaded.mask_id
        t = torch.rand(8, generator=g)
        shapes = worker.shapes("logits", 32)
        if padding == "always":
            assert shapes.sizes == (8,) and not shapes.masked
        alone = worker._network("logits", z[:1], t[:1], None, shapes)
        for n in (2, 5, 8):
            assert torch.equal(worker._network("logits", z[:n], t[:n], None, shapes)[:1], alone)
        assert torch.equal(worker._network("logits", z.flip(0), t.flip(0), None, shapes)[-1:],
                           alone)
        if shapes.masked:  # logits at some positions only: the same bits as the full call's
            wanted = torch.rand(8, 32, generator=g) < 0.3
            full = worker._network("logits", z, t, None, shapes)
            assert torch.equal(worker._network("logits", z, t, wanted, shapes), full[wanted])
    finally:
        worker.stop()


class _Net:
    """A fake network whose rows change in the last bits at some batch sizes, which counts
    the rows of its calls."""

    def __init__(self, noisy_sizes=(), vocab=5):
        self.noisy_sizes, self.vocab, self.rows = set(noisy_sizes), vocab, []

    def __call__(self, z, t, wanted=None):
        self.rows.append(len(z))
        out = torch.sin(z[..., None].float() + torch.arange(self.vocab) + t[:, None, None])
        if len(z) in self.noisy_sizes:  # another rounding at this size
            out = torch.nextafter(out, torch.full_like(out, 2.0))
        return out if wanted is None else out[wanted]


def test_the_probe_keeps_only_the_sizes_whose_rows_are_bit_identical():
    from mdlm_cli.serve.shapes import fixed_shapes, probe

    kwargs = dict(max_batch=8, length=6, mask_id=4, device=CPU)
    clean = probe(_Net(), masks=True, **kwargs)
    assert clean.sizes == tuple(range(1, 9)) and clean.masked and clean.size_for(3) == 3
    some = probe(_Net(noisy_sizes={1, 2, 3, 5}), masks=False, **kwargs)
    assert some.sizes == (4, 6, 7, 8) and some.size_for(1) == 4 and some.size_for(5) == 6
    assert not some.masked
    none = probe(_Net(noisy_sizes=set(range(1, 8))), masks=True, **kwargs)
    assert none.sizes == (8,) and "padded to 8 rows" in none.why
    assert fixed_shapes("always", 8, True).sizes == (8,)
    assert fixed_shapes("never", 8, True).sizes == tuple(range(1, 9))
    assert fixed_shapes("auto", 8, True) is None


def test_a_lone_request_runs_at_its_own_rows_and_asks_for_the_masked_logits_only():
    """No padding of a lone request where the probe found the sizes bit-identical, and the
    network returns only the logits rows the sampler needs (the masked positions)."""
    served = served_model("mdlm")
    calls = []
    base = served.denoiser

    class Spy:
        supports_output_mask = True
        time_agnostic = getattr(base, "time_agnostic", False)

        def __call__(self, z, t, output_mask=None):
            calls.append((len(z), None if output_mask is None else int(output_mask.sum())))
            return base(z, t, output_mask=output_mask)

    worker = Worker(Spy(), mask_id=served.loaded.mask_id,
                    batching=Batching(max_batch=8, padding="never"))
    try:
        run(worker, served, [{"prompt": "the ", "seed": 3, "sampler": "ancestral", "steps": 4}])
    finally:
        worker.stop()
    assert calls and all(rows == 1 for rows, _ in calls)
    assert all(wanted is not None and wanted <= 32 - len("the ") for _, wanted in calls)


def test_a_full_queue_refuses_and_a_late_request_times_out():
    from mdlm_cli.serve.app import api_error
    from mdlm_cli.serve.worker import Cancelled, QueueFull

    served = served_model("mdlm")
    worker = Worker(served.denoiser, mask_id=served.loaded.mask_id,
                    batching=Batching(max_batch=1, queue_size=1))
    release, outcomes = threading.Event(), []
    try:
        blocking = Job(rows=1, run=lambda d: release.wait(30), done=lambda r, e: outcomes.append(e),
                       timeout_s=60)
        worker.submit(blocking)
        for _ in range(200):  # bounded: until the first job runs
            if worker.depth() == (0, 1):
                break
            threading.Event().wait(0.01)
        z = torch.full((1, 32), served.loaded.mask_id)
        late = Job(rows=1, run=lambda d: d(z, torch.ones(1)),
                   done=lambda r, e: outcomes.append(e), timeout_s=0.0)
        worker.submit(late)  # waits in the queue, past its time limit when its turn comes
        with pytest.raises(QueueFull):
            worker.submit(Job(rows=1, run=lambda d: None, done=lambda r, e: None, timeout_s=60))
        release.set()
        for _ in range(500):
            if len(outcomes) == 2:
                break
            threading.Event().wait(0.01)
    finally:
        worker.stop()
    assert outcomes[0] is None and isinstance(outcomes[1], Cancelled)
    assert api_error(outcomes[1], 1).status == 504


def asgi_get(app, path: str) -> tuple[int, dict]:
    """(status, JSON body) of a GET through the ASGI interface, without a server."""
    import asyncio
    import json

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [], "scheme": "http", "http_version": "1.1",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1), "root_path": ""}
    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body)


def test_health_is_503_until_the_model_is_loaded_and_then_200():
    from mdlm_cli.serve.app import _load, create_app

    app = create_app(lambda: served_model("mdlm"))
    state = app.state.mdlm
    assert asgi_get(app, "/health") == (503, {"status": "loading"})
    status, body = asgi_get(app, "/v1/models")
    assert status == 503 and body["error"]["code"] == "model_loading"
    notes = []
    _load(state, lambda: served_model("mdlm"), None, notes.append)  # the start-up thread's work
    try:
        health = asgi_get(app, "/health")[1]
        assert health["status"] == "ok" and len(notes) == 1
        # nothing probed at start: the shapes of each row length are found at its first call
        assert notes[0].startswith("batching: probed at each row length")
        assert health["batching"].startswith("probed at each row length")
        assert asgi_get(app, "/v1/models")[1]["data"][0]["mdlm"]["length"] == 32
    finally:
        state.worker.stop()
    failed = create_app(lambda: None)

    def missing():
        raise OSError("no such checkpoint")

    _load(failed.state.mdlm, missing, None)
    error = {"status": "error", "message": "no such checkpoint"}
    assert asgi_get(failed, "/health") == (503, error)


def test_only_loopback_addresses_count_as_loopback():
    from mdlm_cli.serve.launch import is_loopback

    assert all(map(is_loopback, ("127.0.0.1", "localhost", "::1", "127.0.0.2")))
    assert not any(map(is_loopback, ("0.0.0.0", "192.168.1.4", "example.org", "::")))


@pytest.mark.parametrize("body", [{"stride": 8, "max_tokens": 100}, {"semi_ar": True},
                                  {"stride": 4, "max_tokens": 5}])
def test_a_semi_ar_requests_row_is_the_one_rules(body):
    """The server's semi-AR row (prompt_rows) is generation/layout.py's: the window, then
    stride-sized extensions; without max_tokens the rest of the window; stride by default
    half of it."""
    from mdlm_cli.generation.layout import lay_out_semi_ar

    served = served_model("mdlm")
    plan = parse_completion({"prompt": "xy", **body}, served, Limits())
    rule = lay_out_semi_ar(served.capabilities, TOK.encode("xy"), stride=body.get("stride"),
                           answer=body.get("max_tokens"))
    assert (plan.rows[0].length, plan.max_tokens, plan.stride) == (rule.length, rule.answer,
                                                                   rule.stride)
    assert plan.rows[0].prefix == rule.prefix


def test_the_http_body_becomes_one_generation_request_validated_once():
    """The plan holds the request the body makes (generation/request.py's type, as `mdlm
    sample`'s): n, seed, the answer as the row rule resolved it, stops, echo, stride and
    suffix; a broken rule of the request is a 400 naming its field."""
    from mdlm_cli.generation.request import GenerationRequest

    served = served_model("mdlm")
    plan = parse_completion({"prompt": "ab", "n": 3, "seed": 7, "stop": ["x", "yz"],
                             "echo": True, "suffix": "cd", "max_tokens": 5}, served, Limits())
    request = plan.request
    assert isinstance(request, GenerationRequest) and request.settings is plan.settings
    assert (request.num_samples, request.seed, request.max_new_tokens) == (3, 7, 5)
    assert request.stop == ("x", "yz") and request.echo and request.suffix_ids == tuple(
        TOK.encode("cd"))
    semi = parse_completion({"prompt": "ab", "semi_ar": True}, served, Limits()).request
    assert semi.stride == 16 and semi.max_new_tokens == 32 - len(served.capabilities.row_start) - 2
    with pytest.raises(ApiError) as e:
        parse_completion({"prompt": "ab", "stop": ["a", "b", "c", "d", "e"]}, served, Limits())
    assert e.value.param == "stop" and "1 to 4" in e.value.message
