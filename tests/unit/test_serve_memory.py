"""`mdlm serve` on a folder in LLaDA-8B's released shape (4096 positions, 126,464 rows, tiny
layers): nothing is run at start, the first request's row length is probed with a few masked
positions per row, requests are admitted by the memory their calls need (a 400 naming it for
one that cannot fit alone, a wait for one that fits only after another), and the server stays up.
"""

import threading
import time

import pytest
import torch

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from mdlm_cli.checkpoints.load import load_checkpoint  # noqa: E402
from mdlm_cli.memory import ForwardCost  # noqa: E402
from mdlm_cli.serve.admission import Memory  # noqa: E402
from mdlm_cli.serve.app import Settings, create_app  # noqa: E402
from mdlm_cli.serve.served import Served  # noqa: E402
from mdlm_cli.serve.shapes import PROBE_POSITIONS, _bits, probe  # noqa: E402
from mdlm_cli.serve.worker import Batching, Job, Worker  # noqa: E402
from tests.open_model_folders import write_llada  # noqa: E402

ROWS, WINDOW = 126_464, 4096  # LLaDA-8B's embedding rows and max_sequence_length


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return load_checkpoint(str(write_llada(tmp_path_factory.mktemp("llada-8b-shape") / "m",
                                           rows=ROWS, window=WINDOW)))


class Spy:
    """The served denoiser, each call's rows, length and logits asked for recorded."""

    def __init__(self, base):
        self.base, self.calls = base, []
        self.supports_output_mask = True
        self.time_agnostic = getattr(base, "time_agnostic", False)

    def __call__(self, z, t, output_mask=None):
        self.calls.append((*z.shape, None if output_mask is None else int(output_mask.sum())))
        return self.base(z, t, output_mask=output_mask)


def client(served: Served, **settings) -> TestClient:
    http = TestClient(create_app(lambda: served, Settings(**settings)))
    http.__enter__()
    for _ in range(400):  # the model loads in a thread
        if http.get("/health").status_code == 200:
            break
        time.sleep(0.01)
    return http


def test_the_server_starts_without_a_call_and_probes_the_rows_a_request_brings(big):
    assert big.length == WINDOW and big.tokenizer.vocab_size == ROWS
    served = Served(big, torch.device("cpu"), None, "big")
    spy = Spy(served.denoiser)
    served.__dict__["denoiser"] = spy  # the cached property, replaced
    http = client(served)
    try:
        assert spy.calls == []  # no probe at the whole window at start
        assert http.get("/health").json()["batching"].startswith("probed at each row length")
        body = {"messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 8,
                "top_k": 5, "steps": 4, "seed": 0}
        answer = http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        health = http.get("/health").json()
    finally:
        http.__exit__(None, None, None)
    lengths = {length for _, length, _ in spy.calls}
    assert len(lengths) == 1 and lengths.pop() < 64  # the prompt and 8 tokens, not 4096
    probes = [c for c in spy.calls if c[0] == Settings().max_batch]
    assert probes and all(wanted == c[0] * PROBE_POSITIONS for *c, wanted in probes)
    assert all(wanted is not None for *_, wanted in spy.calls)  # never B x L x V logits
    assert "positions:" in health["batching"]


def test_a_request_that_cannot_fit_alone_gets_a_400_and_the_server_stays_up(big):
    served = Served(big, torch.device("cpu"), None, "big")
    http = client(served)
    try:
        state = http.app.state.mdlm
        need_one = served.cost.bytes(1, WINDOW)
        state.worker.memory = Memory(served.cost, need_one // 2)  # under one row at 4096
        body = {"prompt": "w1", "max_tokens": WINDOW - 2, "steps": 2}
        refused = http.post("/v1/completions", json=body)
        short = http.post("/v1/completions", json={"prompt": "w1", "max_tokens": 4,
                                                   "steps": 2, "seed": 1})
    finally:
        http.__exit__(None, None, None)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "insufficient_memory" and "GB of memory" in error["message"]
    assert short.status_code == 200, short.text


def test_jobs_beyond_the_memory_budget_wait_for_the_running_one():
    cost = ForwardCost(per_position=1000)
    release, order = threading.Event(), []

    def job(name, wait=False):
        def run(_denoiser):
            order.append(f"{name} starts")
            if wait:
                release.wait(10)
            order.append(f"{name} ends")
        done = threading.Event()
        return Job(rows=1, run=run, done=lambda r, e: done.set(), timeout_s=30,
                   bytes=cost.bytes(1, 10)), done

    worker = Worker(lambda z, t: z, mask_id=0, memory=Memory(cost, 15_000),
                    batching=Batching(max_batch=8))
    try:
        (first, first_done), (second, second_done) = job("a", wait=True), job("b")
        worker.submit(first)
        worker.submit(second)  # 10 kB + 10 kB > 15 kB: queued behind the first
        time.sleep(0.2)
        assert order == ["a starts"] and worker.depth() == (1, 1)
        release.set()
        assert first_done.wait(10) and second_done.wait(10)
    finally:
        worker.stop()
    assert order == ["a starts", "a ends", "b starts", "b ends"]


def test_a_probe_within_memory_runs_at_fewer_rows_and_calls_are_cut_to_them():
    cost = ForwardCost(per_position=100)
    def net(z, t, output_mask=None):
        return torch.zeros(len(z), z.shape[1], 3)

    worker = Worker(net, mask_id=2, memory=Memory(cost, 100 * 10 * 3),
                    batching=Batching(max_batch=8, padding="always"))
    try:
        assert worker.shapes("logits", 10).sizes == (3,)  # three rows of 10 fit, not eight
    finally:
        worker.stop()


def test_the_checksum_is_computed_in_chunks_with_the_same_sums():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g)
    whole = _bits(logits, chunk=1 << 30)
    assert whole.shape == (3, 5) and torch.equal(_bits(logits, chunk=7), whole)
    nudged = logits.clone()
    nudged[1, 2, 3] = torch.nextafter(nudged[1, 2, 3], torch.tensor(9.0))
    assert not torch.equal(_bits(nudged, chunk=7)[1, 2], whole[1, 2])
    # a masked probe compares the same number of positions in every row
    calls = []

    def net(z, t, wanted):
        calls.append(None if wanted is None else wanted.sum(1).tolist())
        return torch.sin(z.float())[..., None].expand(*z.shape, 4)[wanted]

    shapes = probe(net, max_batch=4, length=50, mask_id=9, masks=True,
                   device=torch.device("cpu"))
    assert shapes.masked and shapes.sizes == (1, 2, 3, 4)
    assert all(set(c) == {PROBE_POSITIONS} for c in calls)


def test_where_the_memory_cannot_be_read_nothing_is_refused():
    from mdlm_cli.serve.admission import memory_need

    unknown = Memory(ForwardCost(per_position=10**12), None)
    assert memory_need(unknown, 4, 4096, 8) == 4 * 4096 * 10**12
    assert memory_need(None, 4, 4096, 8) == 0
