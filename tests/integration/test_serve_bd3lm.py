"""`mdlm serve` of a bd3lm run, in process (the app behind Starlette's test client): completions
block by block with the cache, past the training length, the same text as `mdlm sample` at the
same seed, streamed block by block into the unstreamed text, stopped at EOS; chat; and the
400s for what a block diffusion model cannot serve."""

import copy
import json
import time

import pytest
import torch

pytest.importorskip("starlette")

from starlette.testclient import TestClient  # noqa: E402

from mdlm_cli.checkpoints.load import load_checkpoint  # noqa: E402
from mdlm_cli.serve.app import Settings, create_app  # noqa: E402
from mdlm_cli.serve.blocks import run_blocks  # noqa: E402
from mdlm_cli.serve.completion import parse_completion  # noqa: E402
from mdlm_cli.serve.schema import Limits  # noqa: E402
from mdlm_cli.serve.served import Served  # noqa: E402
from mdlm_cli.serve.worker import Cancelled  # noqa: E402

from .conftest import invoke  # noqa: E402

BLOCK = 8  # L' of the run; its training length is 32


@pytest.fixture(scope="module")
def bd3_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bd3serve") / "run"
    invoke("train", "--preset", "test", "--no-print-config", "--max-steps", "3", "--set",
           "diffusion.objective=bd3lm", "--set", f"diffusion.block_size={BLOCK}", "--set",
           "train.eval_rows=16", "--out", out)
    return out


def served_from(run, tokenizer=None) -> Served:
    loaded = load_checkpoint(run)
    if tokenizer is not None:
        loaded.tokenizer = tokenizer
    return Served(loaded, torch.device("cpu"), None, "bd3")


def client(served: Served) -> TestClient:
    http = TestClient(create_app(lambda: served, Settings(max_batch=4)))
    http.__enter__()
    for _ in range(200):  # the model loads in a thread
        if http.get("/health").status_code == 200:
            return http
        time.sleep(0.05)
    raise AssertionError(http.get("/health").json())


@pytest.fixture(scope="module")
def http(bd3_run):
    opened = client(served_from(bd3_run))
    yield opened
    opened.__exit__(None, None, None)


def complete(http, **body) -> dict:
    response = http.post("/v1/completions", json={"prompt": "the ", **body})
    assert response.status_code == 200, response.json()
    return response.json()


def streamed(http, **body) -> tuple[dict[int, list[str]], list[dict]]:
    """Each choice's text chunks, and the chunks that end the choices."""
    response = http.post("/v1/completions", json={"prompt": "the ", "stream": True, **body})
    assert response.status_code == 200
    events = [line[len("data: "):] for line in response.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    pieces, ends = {}, []
    for chunk in map(json.loads, events[:-1]):
        for choice in chunk["choices"]:
            if choice["finish_reason"] is None:
                pieces.setdefault(choice["index"], []).append(choice["text"])
            else:
                ends.append(choice)
    return pieces, ends


def test_a_completion_is_what_mdlm_sample_draws_past_the_training_length(http, bd3_run, tmp_path):
    """4 prompt tokens + 99 new ones: 103 positions, rounded up to 104 (13 blocks of 8) as
    `mdlm sample --length 103` rounds them; at one seed the server's choices are the CLI's
    samples, each cut at its first EOS, else at max_tokens."""
    answer = complete(http, max_tokens=99, n=3, seed=1)
    out = tmp_path / "s.jsonl"
    note = invoke("sample", "-c", bd3_run, "--prompt", "the ", "--length", "103", "-n", "3",
                  "--seed", "1", "--out", out, "--quiet")
    assert "rounded up to 104" in note
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    for choice, sample in zip(answer["choices"], samples, strict=True):
        assert choice["text"] == sample["response"][:99]
        assert choice["ended"] == sample["ended"] and choice["length"] == min(sample["length"], 99)
        assert choice["finish_reason"] == ("stop" if sample["ended"] else "length")
    assert {c["finish_reason"] for c in answer["choices"]} == {"stop", "length"}  # both ends
    assert answer["usage"]["completion_tokens"] == sum(c["length"] for c in answer["choices"])
    assert answer["mdlm"]["sampler"] == "first-hitting"


def test_streamed_blocks_join_to_the_unstreamed_text(http):
    body = {"max_tokens": 99, "n": 3, "seed": 1}
    whole = complete(http, **body)["choices"]
    pieces, ends = streamed(http, **body)
    assert [e["finish_reason"] for e in ends] == [c["finish_reason"] for c in whole]
    for choice in whole:
        chunks = pieces.get(choice["index"], [])
        assert "".join(chunks) == choice["text"]
        assert all(len(c) <= BLOCK for c in chunks)  # one block's text at most per chunk
    longest = max(whole, key=lambda c: c["length"])  # 99 tokens: 4 + 8 * 11 + 7, block by block
    assert len(pieces[longest["index"]]) >= 12


def test_several_prompts_are_sampled_prompt_after_prompt_under_one_generator(http):
    """Choice index = prompt * n + j; the first prompt's choices are those it gets alone (its
    rows draw first from the request's generator), the second's come after them."""
    answer = complete(http, prompt=["the ", "a"], n=2, max_tokens=40, seed=3)
    both = answer["choices"]
    alone = complete(http, prompt="the ", n=2, max_tokens=40, seed=3)["choices"]
    second = complete(http, prompt="a", n=2, max_tokens=40, seed=3)["choices"]
    batch = answer["mdlm"]["batch"]  # one batch per prompt, shared with no other request
    assert {k: batch[k] for k in ("requests", "rows", "batches")} == {
        "requests": 1, "rows": 2, "batches": 2}
    assert batch["padded_to"] >= 2 and batch["network_calls"] >= answer["mdlm"]["network_calls"]
    assert [c["index"] for c in both] == [0, 1, 2, 3]
    assert [c["text"] for c in both[:2]] == [c["text"] for c in alone]
    assert [c["text"] for c in both[2:]] != [c["text"] for c in second]


@pytest.mark.parametrize("sampler", [{"sampler": "ancestral", "steps": 3},
                                     {"sampler": "confidence", "steps": 2, "top_p": 0.9},
                                     {"tokens_per_step": 2, "temperature": 0.7}])
def test_every_within_block_sampler_serves_and_a_seed_repeats(http, sampler):
    first = complete(http, max_tokens=40, n=2, seed=5, **sampler)
    again = complete(http, max_tokens=40, n=2, seed=5, **sampler)
    assert [c["text"] for c in first["choices"]] == [c["text"] for c in again["choices"]]
    assert first["mdlm"]["sampler"] == sampler.get("sampler", "first-hitting")


def test_a_choice_ends_at_eos_and_the_sampling_stops_there(bd3_run):
    """A model whose every draw is EOS: each choice is empty and 'stop', and the sampling ends
    after the first block (4 first-hitting calls for its 4 free positions, and its commit), not
    after the 26 blocks max_tokens would take."""
    served = served_from(bd3_run)
    served.loaded.model = copy.deepcopy(served.loaded.model)
    with torch.no_grad():
        served.loaded.model.output_layer.linear.bias[served.loaded.tokenizer.eos_id] += 50.0
    http = client(served)
    try:
        answer = complete(http, max_tokens=200, n=2, seed=0)
    finally:
        http.__exit__(None, None, None)
    for choice in answer["choices"]:
        assert choice["text"] == "" and choice["finish_reason"] == "stop" and choice["ended"]
    assert answer["mdlm"]["network_calls"] == 5


class Leaves:
    """The worker's wrapper of a job whose client leaves at its third network call."""

    def __init__(self):
        self.calls = 0

    def check(self):
        self.calls += 1
        if self.calls == 3:
            raise Cancelled("disconnect")


def test_a_request_whose_client_leaves_stops_at_its_next_network_call(bd3_run):
    served = served_from(bd3_run)
    plan = parse_completion({"prompt": "the ", "max_tokens": 200, "seed": 0}, served, Limits())
    denoiser, sent = Leaves(), []
    with pytest.raises(Cancelled):
        run_blocks(plan, served, denoiser, sent.append)
    assert denoiser.calls == 3 and sent == []


def test_the_model_card_says_block_size_and_the_options_that_apply(http):
    card = http.get("/v1/models").json()["data"][0]["mdlm"]
    assert card["objective"] == "bd3lm" and card["block_size"] == BLOCK
    assert not card["infill"] and not card["semi_ar"]
    assert card["samplers"]["first-hitting"]["options"] == ["tokens_per_step"]
    assert card["samplers"]["confidence"]["options"] == []
    assert "bd3lm requests of one row length" in http.get("/health").json()["batching"]


@pytest.mark.parametrize("body, param, says", [
    ({"sampler": "remdm"}, "sampler", "must be one of: ancestral, first-hitting, confidence"),
    ({"sampler": "ancestral", "final_denoise": False}, "final_denoise", "does not apply"),
    ({"sampler": "confidence", "k_schedule": "llada"}, "k_schedule", "does not apply"),
    ({"suffix": " end"}, "suffix", "cannot infill a suffix"),
    ({"stride": 8}, "stride", "takes no stride or semi_ar"),
    ({"logprobs": 2}, "logprobs", "block sampler does not record"),
    ({"stream": True, "stream_states": True}, "stream_states", "its finished blocks"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "boolean"}}}}, "response_format", "json_schema"),
    ({"max_tokens": 600}, "max_tokens", "the server's limit is 512"),
])
def test_what_a_bd3lm_model_cannot_serve_is_a_400_in_one_line(http, body, param, says):
    response = http.post("/v1/completions", json={"prompt": "the ", **body})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param
    assert says in error["message"] and "\n" not in error["message"]
    infill = http.post("/v1/mdlm/infill", json={"template": "a <mask:3> b"})
    assert infill.status_code == 400 and "cannot infill a template" in infill.json()["error"][
        "message"]


def test_a_chat_answer_is_the_completion_of_the_rendered_prompt(bd3_run):
    """With a chat template, /v1/chat/completions answers block by block too: at one seed, the
    completion of the prompt the template renders."""
    pytest.importorskip("transformers")
    from ..unit.test_serve_chat import MESSAGES, PROMPT, templated

    served = served_from(bd3_run)
    served.loaded.tokenizer = templated(served.loaded.tokenizer)
    http = client(served)
    try:
        chat = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 50,
                                                        "n": 2, "seed": 4}).json()
        plain = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 50, "n": 2,
                                                    "seed": 4}).json()
    finally:
        http.__exit__(None, None, None)
    assert [c["message"]["content"] for c in chat["choices"]] == [
        c["text"] for c in plain["choices"]]
    assert [c["finish_reason"] for c in chat["choices"]] == [
        c["finish_reason"] for c in plain["choices"]]


@pytest.mark.slow
def test_mdlm_serve_of_a_bd3lm_run_streams_to_the_openai_client_and_the_page(bd3_run, tmp_path):
    """The command itself (a real process): the official client's stream joins to its
    unstreamed completion past the training length, and the page at / streams a prompt's
    blocks in (it asks for no denoising states of a bd3lm model)."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from .test_serve import (
        chromium_page,
        free_port,
        start_server,
        stop_server,
        wait_healthy,
    )

    port, log = free_port(), tmp_path / "server.log"
    proc = start_server(bd3_run, port, log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                               timeout=120)
        body = dict(model=bd3_run.name, prompt="the ", max_tokens=90, n=3, seed=1)
        whole = client.completions.create(**body).choices
        chunks = {c.index: [] for c in whole}
        for chunk in client.completions.create(**body, stream=True):
            for c in chunk.choices:
                chunks[c.index].append(c.text)
        assert ["".join(chunks[c.index]) for c in whole] == [c.text for c in whole]
        assert max(len(chunks[c.index]) for c in whole) > 90 // BLOCK  # block by block
        assert "length" in [c.finish_reason for c in whole]  # 90 tokens, past L = 32
        with chromium_page(url) as page:
            page.wait_for_function("document.querySelectorAll('#sampler option').length > 0")
            page.fill("#seed", "2")
            page.fill("#prompt", "the ")
            page.click("#go")
            page.wait_for_function("document.getElementById('status').dataset.done === '1'")
            status, text = page.inner_text("#status"), page.inner_text("#text")
        assert "first-hitting" in status and "seed 2" in status and text.strip()
    finally:
        stop_server(proc)


@pytest.mark.parametrize("prompt, max_tokens", [("the ", 99), ("the ", None), ("x" * 30, None),
                                                (["a", "the  cat"], 13)])
def test_each_rows_positions_are_the_one_rules(bd3_run, prompt, max_tokens):
    """A completion's rows are generation/layout.py's (rounded up to whole blocks); without
    max_tokens, the rest of the training length after the longest prompt, one block at
    least (30 tokens of 32: one block, 38 positions rounded up to 40)."""
    from mdlm_cli.generation.layout import lay_out

    served = served_from(bd3_run)
    body = {"prompt": prompt, "seed": 0, **({} if max_tokens is None else
                                            {"max_tokens": max_tokens})}
    plan = parse_completion(body, served, Limits())
    prompts = [prompt] if isinstance(prompt, str) else prompt
    ids = [served.loaded.tokenizer.encode(p) for p in prompts]
    caps = served.capabilities
    asked = lay_out(caps, max(ids, key=len), answer=max_tokens).answer
    assert plan.max_tokens == asked
    assert [r.length for r in plan.rows] == [lay_out(caps, i, answer=asked).length for i in ids]
    assert all(r.length % BLOCK == 0 for r in plan.rows)
    if prompt == "x" * 30:
        assert plan.max_tokens == BLOCK and plan.rows[0].length == 40


def test_concurrent_seeded_requests_share_batches_and_keep_their_alone_texts(bd3_run):
    """Requests of one row length, prompt length and settings, sent together from threads,
    share one batch of block sampling (the answers' `mdlm.batch`; fewer network calls than
    the sum of theirs), and each gets the text it gets sent alone: every within-block step, a
    seed and an n each, some requests ending before the others (they answer the network
    calls they take alone). A request of other settings runs in a batch of its own."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    http = TestClient(create_app(lambda: served_from(bd3_run),
                                 Settings(max_batch=8, max_wait_ms=300)))
    http.__enter__()
    try:
        for _ in range(200):
            if http.get("/health").status_code == 200:
                break
            time.sleep(0.05)
        ends = set()  # (the batch's calls, a request's) where the request ended first
        # ancestral at 20 steps: the batch calls at steps where only some requests reveal
        for how in ({}, {"sampler": "ancestral", "steps": 20},
                    {"sampler": "confidence", "steps": 2, "top_p": 0.9}):
            bodies = [{"prompt": p, "max_tokens": 40, "seed": seed, "n": n, **how}
                      for p, seed, n in (("the ", 1, 3), ("a ca", 2, 1), ("she ", 3, 2))]
            bodies.append({**bodies[0], "temperature": 0.5})  # other settings: not shared
            alone = [complete(http, **b) for b in bodies]
            barrier = Barrier(len(bodies))

            def send(body, barrier=barrier):
                barrier.wait()
                return complete(http, **body)

            with ThreadPoolExecutor(len(bodies)) as pool:
                together = list(pool.map(send, bodies))
            for a, t in zip(alone, together, strict=True):
                assert [c["text"] for c in t["choices"]] == [c["text"] for c in a["choices"]]
                assert [c["finish_reason"] for c in t["choices"]] == [
                    c["finish_reason"] for c in a["choices"]]
                assert t["mdlm"]["network_calls"] == a["mdlm"]["network_calls"]
                assert a["mdlm"]["batch"]["requests"] == 1
            shared = [t["mdlm"]["batch"] for t in together[:3]]
            assert all(b == {**shared[0]} for b in shared)
            assert shared[0]["requests"] == 3 and shared[0]["rows"] == 6
            assert shared[0]["network_calls"] < sum(a["mdlm"]["network_calls"]
                                                    for a in alone[:3])
            assert together[3]["mdlm"]["batch"]["requests"] == 1
            ends |= {(b["network_calls"], t["mdlm"]["network_calls"])
                     for b, t in zip(shared, together, strict=False)}
        assert any(mine < batch for batch, mine in ends)
        assert "positions:" in http.get("/health").json()["batching"]
    finally:
        http.__exit__(None, None, None)


class Gathered:
    """A bd3lm gatherer on its own worker, outside the app: `run` submits plans (the jobs'
    answers in the order they come), `submit` one plan whose answer `wait` awaits."""

    def __init__(self, served: Served, max_wait_s: float = 0.3):
        from mdlm_cli.serve.gather import BlockGatherer
        from mdlm_cli.serve.worker import Batching, Worker

        self.worker = Worker(served.denoiser, mask_id=served.loaded.mask_id, exclusive=True,
                             batching=Batching(max_batch=8, max_wait_s=max_wait_s))
        self.gatherer = BlockGatherer(self.worker, served)
        self.answers: dict = {}

    def submit(self, key, plan, emit=None, timeout_s: float = 60):
        import threading

        from mdlm_cli.serve.worker import Job

        arrived = threading.Event()

        def done(result, error):
            self.answers[key] = (result, error)
            arrived.set()

        job = Job(rows=plan.n, run=None, done=done, timeout_s=timeout_s)
        if isinstance(emit, LeavesAtFirstText):  # it cancels the job it is the emit of
            emit.job = job
        emit = emit or (lambda event: None)
        self.gatherer.submit(plan, job, emit)
        return arrived

    def run(self, plans: dict, emits: dict | None = None) -> dict:
        self.answers = {}
        arrived = [self.submit(k, p, (emits or {}).get(k)) for k, p in plans.items()]
        assert all(a.wait(60) for a in arrived)
        return dict(self.answers)


class LeavesAtFirstText:
    """An emit whose client leaves at its first event (`leave`)."""

    def __init__(self, leave: bool):
        self.leave, self.job = leave, None

    def __call__(self, event):
        if self.leave:
            self.job.cancel("disconnect")


def test_a_request_that_stops_mid_batch_leaves_the_others_their_texts(bd3_run):
    """On the worker and gatherer themselves: of two requests sharing a batch, the one whose
    client leaves at its first text is answered Cancelled at the next network call, at once;
    the other goes on and gets its alone text, answered after it."""
    served = served_from(bd3_run)
    g = Gathered(served)
    body = {"prompt": "the ", "max_tokens": 40, "n": 2}
    plans = {i: parse_completion({**body, "seed": i}, served, Limits()) for i in (1, 2)}
    try:
        both = g.run(plans, {1: LeavesAtFirstText(True), 2: LeavesAtFirstText(False)})
        alone = g.run({2: plans[2]}, {2: LeavesAtFirstText(False)})
    finally:
        g.worker.stop()
    assert list(both) == [1, 2]  # the one that left is answered first, not with the batch
    assert both[1][0] is None and isinstance(both[1][1], Cancelled)
    outcome, error = both[2]
    assert error is None and outcome.batch["requests"] == 2
    assert [c["text"] for c in outcome.choices] == [c["text"] for c in alone[2][0].choices]


def test_a_request_after_a_batch_that_never_ran_opens_its_own(bd3_run):
    """A batch whose time runs out in the queue (behind a job holding the model) is answered
    so; a request of the same settings that comes after it is not left in it: it gets its
    text. After the worker stops, one is refused (QueueFull), not left waiting."""
    import threading

    from mdlm_cli.serve.worker import Job, QueueFull

    served = served_from(bd3_run)
    g = Gathered(served, max_wait_s=0.01)
    plan = parse_completion({"prompt": "the ", "max_tokens": 8, "seed": 1}, served, Limits())
    release, holding = threading.Event(), threading.Event()
    blocker = Job(rows=1, run=lambda d: (holding.set(), release.wait(30)), done=lambda *a: None,
                  timeout_s=60, alone=True)
    try:
        g.worker.submit(blocker)
        assert holding.wait(30)
        first = g.submit("late", plan, timeout_s=0.05)
        time.sleep(0.2)  # its deadline passes while it waits
        release.set()
        assert first.wait(30)
        assert isinstance(g.answers["late"][1], Cancelled) and g.answers["late"][1].reason == "timeout"
        assert g.submit("next", plan).wait(30), "the request joined the batch that never ran"
        outcome, error = g.answers["next"]
        assert error is None and outcome.batch["requests"] == 1
    finally:
        g.worker.stop()
    with pytest.raises(QueueFull):
        g.submit("stopped", plan)


def test_a_failure_late_in_a_batch_leaves_the_ended_requests_their_texts(bd3_run, monkeypatch):
    """Two requests share a batch; the first ends in the first block (at a stop string taken
    from its alone text), then the network fails at the second block's commit: the first gets
    its alone text, the other the error."""
    served = served_from(bd3_run)
    body = {"prompt": "the ", "max_tokens": 20}  # 3 blocks of 8, the answer from position 4
    g = Gathered(served)
    try:
        text = g.run({0: parse_completion({**body, "seed": 1}, served, Limits())})[0][0]
        stop = text.choices[0]["text"][1:3]  # within the first block's 4 answer tokens
        # a seed whose text goes past the first block (EOS ends some in it)
        seed = next(seed for seed in range(2, 40) if g.run({0: parse_completion(
            {**body, "seed": seed}, served, Limits())})[0][0].choices[0]["length"] > 4)
        plans = {1: parse_completion({**body, "seed": 1, "stop": [stop]}, served, Limits()),
                 2: parse_completion({**body, "seed": seed}, served, Limits())}
        alone = g.run({1: plans[1]})[1][0]
        objective = served.loaded.objective
        real = objective.block_model

        class FailsSecond:  # the block model, failing at its second commit
            def __init__(self, blocks):
                self.blocks, self.committed = blocks, 0

            def start(self, *args):
                self.blocks.start(*args)

            def logits(self, block):
                return self.blocks.logits(block)

            def commit(self, block):
                self.committed += 1
                if self.committed == 2:
                    raise RuntimeError("the device fell over")
                self.blocks.commit(block)

        monkeypatch.setattr(objective, "block_model",
                            lambda *a, **k: FailsSecond(real(*a, **k)))
        both = g.run(plans)
    finally:
        g.worker.stop()
    outcome, error = both[1]
    assert error is None and outcome.choices == alone.choices
    assert outcome.choices[0]["finish_reason"] == "stop"
    assert outcome.batch["requests"] == 2 and outcome.batch["network_calls"] is None
    assert both[2][0] is None and "fell over" in str(both[2][1])


def test_health_answers_while_a_probe_runs(bd3_run):
    """`batching()` (what /health says) does not wait for the lock a running probe holds."""
    import threading

    served = served_from(bd3_run)
    g = Gathered(served)
    said = []
    try:
        for holder in (g.gatherer, g.worker):
            with holder._probe_lock:  # as a probe at a new row length holds it
                asking = threading.Thread(target=lambda h=holder: said.append(h.batching()))
                asking.start()
                asking.join(5)
                assert not asking.is_alive(), f"{type(holder).__name__}.batching() waited"
    finally:
        g.worker.stop()
    assert len(said) == 2


def test_a_batch_found_out_of_time_closes_to_newcomers_in_the_same_step():
    """The worker's expiry check of a group's job closes the group at once: a request that
    comes after cannot join it (and be answered with a timeout its own deadline has not
    reached); a job still in time stays open."""
    from types import SimpleNamespace

    from mdlm_cli.serve.gather import _Group, _GroupJob, _Member
    from mdlm_cli.serve.worker import Job

    newcomer = _Member(SimpleNamespace(n=1), Job(rows=1, run=None, done=None, timeout_s=60), None)
    for timeout_s, expired in ((0.0, True), (60.0, False)):
        group = _Group(("key",), 8, [])
        group.job = _GroupJob(rows=1, run=None, done=None, timeout_s=timeout_s, group=group)
        time.sleep(0.01)
        assert group.job.expired() is expired and group.open is not expired
        assert group.join(newcomer, 8, None) is not expired
