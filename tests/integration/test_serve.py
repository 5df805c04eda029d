"""`mdlm serve` as a real process on 127.0.0.1 (a free port) with a test-size checkpoint, driven
by the official `openai` client: completions, n > 1, suffix infilling, semi-AR streaming,
errors as the client raises them, a disconnecting client, and bad input that leaves the server up.
Every wait is bounded in count and time."""

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from ..char_tokenizers import stop_server

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key"
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: bytes | None = None, key: str | None = KEY, timeout: float = 30):
    """(status, parsed JSON or text) of one HTTP request."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=body, headers=headers, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def start_server(checkpoint: Path, port: int, *extra: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "mdlm_cli", "serve", "-c", str(checkpoint), "--host", "127.0.0.1",
           "--port", str(port), "--threads", "1", *extra]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, limit_s: float = 180) -> None:
    deadline = time.monotonic() + limit_s
    for _ in range(int(limit_s * 4)):
        if proc.poll() is not None or time.monotonic() > deadline:
            break
        try:
            status, _ = request(f"{url}/health", key=None, timeout=2)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"server not healthy:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def checkpoint(trained_runs):
    return trained_runs[1]  # the shared MDLM run (conftest)


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    """(base URL, model id) of a running `mdlm serve --api-key test-key`."""
    port, log = free_port(), tmp_path_factory.mktemp("serve-log") / "server.log"
    proc = start_server(checkpoint, port, "--api-key", KEY, "--max-batch", "4", log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url, checkpoint.name
    finally:
        stop_server(proc)




@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_models_lists_the_objective_length_and_samplers(client, server):
    model = client.models.list().data[0]
    assert model.id == server[1]
    info = model.model_extra["mdlm"]
    assert info["objective"] == "mdlm" and info["length"] == 32
    assert {"first-hitting", "ancestral", "ancestral-cache"} <= set(info["samplers"])


def test_a_completion_is_reproducible_from_its_seed(client, server):
    kwargs = dict(model=server[1], prompt="the ", max_tokens=12, seed=3)
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    assert first.choices[0].text == again.choices[0].text
    assert first.choices[0].finish_reason == "length"
    assert first.usage.completion_tokens == 12 and first.usage.prompt_tokens == 4
    info = first.model_extra["mdlm"]
    assert info["sampler"] == "first-hitting" and info["seed"] == 3 and info["nfe"] > 0


def test_n_choices_are_different_draws(client, server):
    out = client.completions.create(model=server[1], prompt="and ", max_tokens=20, n=3, seed=5,
                                    extra_body={"sampler": "ancestral", "steps": 20})
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.text for c in out.choices}) == 3
    assert out.model_extra["mdlm"]["steps"] == 20


def test_suffix_fills_the_middle_and_keeps_prompt_and_suffix(client, server):
    prompt, suffix = "it was the ", " of the day"
    out = client.completions.create(model=server[1], prompt=prompt, suffix=suffix, max_tokens=6,
                                    seed=8, echo=True)
    text = out.choices[0].text
    assert text.startswith(prompt) and out.usage.completion_tokens == 6
    # the completion's row ends at its suffix (generation/layout.py); an infill template runs
    # over the model's window, positions after its text free: another row, other draws
    body = json.dumps({"model": server[1], "template": f"{prompt}<mask:6>{suffix}", "seed": 8})
    status, filled = request(f"{server[0]}/v1/mdlm/infill", body.encode())
    assert status == 200, filled
    span = filled["choices"][0]["spans"][0]
    assert filled["choices"][0]["text"].startswith(prompt + span + suffix)


def test_semi_ar_streams_blocks_that_join_to_the_unstreamed_text(client, server):
    kwargs = dict(model=server[1], prompt="the ", max_tokens=60, seed=2,
                  extra_body={"stride": 16, "sampler": "ancestral", "steps": 8})
    whole = client.completions.create(**kwargs)
    chunks = [c.choices[0].text for c in client.completions.create(stream=True, **kwargs)
              if c.choices and c.choices[0].text]
    assert len(chunks) > 1
    assert "".join(chunks) == whole.choices[0].text
    assert whole.usage.completion_tokens == 60


def batch_rows(url: str) -> tuple[float, float]:
    """(network calls, calls holding one row) from the server's metrics."""
    _, text = request(f"{url}/metrics")
    values = dict(line.rsplit(" ", 1) for line in text.splitlines()
                  if line.startswith("mdlm_batch"))
    return float(values["mdlm_batch_rows_count"]), float(values['mdlm_batch_rows_bucket{le="1.0"}'])


def test_a_seeded_request_gets_the_same_text_alone_and_among_concurrent_ones(client, server):
    from concurrent.futures import ThreadPoolExecutor

    def complete(seed: int, prompt: str) -> str:
        out = client.completions.create(model=server[1], prompt=prompt, max_tokens=20, seed=seed,
                                        extra_body={"sampler": "ancestral", "steps": 30})
        return out.choices[0].text

    alone = complete(21, "she ")
    calls0, single0 = batch_rows(server[0])
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(complete, seed, prompt)
                   for seed, prompt in ((5, "a"), (21, "she "), (6, "the "), (7, ""))]
        together = [f.result(timeout=120) for f in futures]
    calls, single = batch_rows(server[0])
    assert together[1] == alone
    assert (calls - calls0) - (single - single0) > 0  # some calls held rows of several requests


def test_logprobs_come_in_openais_legacy_shape_streamed_or_not(client, server):
    kwargs = dict(model=server[1], prompt="the ", max_tokens=8, seed=2, logprobs=3)
    out = client.completions.create(**kwargs)
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text and len(lp.token_logprobs) == 8
    assert all(v <= 0 for v in lp.token_logprobs) and all(len(t) <= 3 for t in lp.top_logprobs)
    assert lp.text_offset == [len("".join(lp.tokens[:k])) for k in range(8)]
    chunks = list(client.completions.create(**kwargs, stream=True))
    last = [c for c in chunks if c.choices and c.choices[0].logprobs is not None]
    assert len(last) == 1 and last[0].choices[0].logprobs.token_logprobs == lp.token_logprobs


def test_errors_come_back_as_the_client_raises_them(client, server):
    name = server[1]
    with pytest.raises(openai.BadRequestError, match="records") as e:
        client.completions.create(model=name, prompt="x", max_tokens=5, logprobs=2,
                                  extra_body={"sampler": "confidence", "steps": 4})
    assert e.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError, match="exceeds the window"):
        client.completions.create(model=name, prompt="x", max_tokens=500)
    with pytest.raises(openai.BadRequestError, match="does not serve|must be one of"):
        client.completions.create(model=name, prompt="x", extra_body={"sampler": "euler"})
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError, match="no chat template") as e:  # char tokenizer
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["param"] == "messages"
    wrong = openai.OpenAI(base_url=f"{server[0]}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=name, prompt="x")
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=name, prompt="a" * 1_200_000, max_tokens=1)
    assert e.value.status_code == 413


def test_stream_states_sends_the_denoising_states(server):
    body = json.dumps({"model": server[1], "prompt": "the ", "max_tokens": 8, "stream": True,
                       "stream_states": True, "seed": 1, "sampler": "ancestral", "steps": 4})
    req = urllib.request.Request(f"{server[0]}/v1/completions", data=body.encode(), method="POST",
                                 headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        lines = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
    states = [json.loads(x)["mdlm"]["state"] for x in lines[:-1]
              if "state" in json.loads(x).get("mdlm", {})]
    assert len(states) >= 2 and None in states[0] and None not in states[-1]


def test_score_gives_the_bound_ranks_continuations_and_refuses_in_openai_shape(server):
    url = f"{server[0]}/v1/mdlm/score"
    body = {"model": server[1], "input": ["the night was dark", "qzxj vvkq"], "mc_samples": 8,
            "seed": 2}
    status, out = request(url, json.dumps(body).encode())
    assert status == 200, out
    assert out["object"] == "mdlm.score" and out["kind"] == "bound" and out["mc_samples"] == 8
    first, second = out["data"]
    assert first["tokens"] == 18 and first["nats_se"] > 0 and first["kind"] == "bound"
    assert second["bits_per_token"] * math.log(2) == pytest.approx(second["nats_per_token"])
    alone = request(url, json.dumps({**body, "input": "qzxj vvkq"}).encode())[1]
    assert alone["data"][0]["nats"] == second["nats"]  # one seed: the same alone or batched
    choices = {"prompt": "it was the ", "continuations": ["end of the day", "zq zq zq zq"],
               "mc_samples": 8}
    ranked = request(url, json.dumps(choices).encode())[1]
    by_nats = sorted(ranked["data"], key=lambda e: e["nats"])
    assert [e["rank"] for e in by_nats] == [1, 2]
    assert [e["tokens"] for e in ranked["data"]] == [15, 12]  # the prompt's space moves over
    status, error = request(url, json.dumps({"input": "x" * 40}).encode())
    assert status == 400 and error["error"]["param"] == "input"
    assert "length is 32" in error["error"]["message"]


def test_malformed_bodies_do_not_take_the_server_down(server):
    url = f"{server[0]}/v1/completions"
    for body in (b"{not json", b"[1, 2]", b'{"prompt": ' * 5000, b'{"prompt": "x", "n": "two"}'):
        status, answer = request(url, body)
        assert status == 400 and set(answer["error"]) == {"message", "type", "param", "code"}
    assert request(f"{server[0]}/health", key=None)[0] == 200


def test_a_client_that_disconnects_mid_stream_cancels_its_work(server):
    body = json.dumps({"model": server[1], "prompt": "the ", "max_tokens": 400, "stride": 8,
                       "stream": True, "sampler": "ancestral", "steps": 50, "seed": 1}).encode()
    req = urllib.request.Request(f"{server[0]}/v1/completions", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.readline().startswith(b"data: ")  # the first block, then hang up
    for _ in range(120):  # bounded: 30 s
        status, health = request(f"{server[0]}/health", key=None)
        if health["running"] == 0:
            break
        time.sleep(0.25)
    assert health["running"] == 0
    _, metrics = request(f"{server[0]}/metrics")
    assert 'mdlm_requests_total{endpoint="completions",status="499"}' in metrics


def test_a_checkpoint_that_does_not_load_ends_the_command_with_one_line(tmp_path):
    log = tmp_path / "log"
    proc = start_server(tmp_path / "missing", free_port(), log=log)
    assert proc.wait(timeout=120) == 1
    errors = [line for line in log.read_text().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "missing" in errors[0]


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium_api():
    """playwright's sync API; the test skips where it or /usr/bin/chromium is missing."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip("no chromium at /usr/bin/chromium (Debian: apt-get install chromium)")
    return sync_api


@contextmanager
def chromium_page(url: str, **page_options):
    """The page at `url`/ in a headless chromium (skipping without one), closed afterwards."""
    with chromium_api().sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(**page_options)
            page.set_default_timeout(60_000)
            page.goto(url + "/")
            yield page
        finally:
            browser.close()


def test_the_page_shows_the_masks_filling_in(server, tmp_path):
    """The page at / in a headless chromium: a template submitted, its masked positions filled in
    state by state; screenshots (mid-way and done) in the test's folder."""
    with chromium_page(server[0], viewport={"width": 1000, "height": 520}) as page:
        page.fill("#key", KEY)
        page.dispatch_event("#key", "change")
        page.wait_for_function("document.querySelectorAll('#sampler option').length > 0")
        page.select_option("#sampler", "first-hitting")
        page.fill("#seed", "4")
        page.fill("#prompt", "the <mask:12> of the <mask:8>")
        page.click("#go")
        page.wait_for_function("window.mdlmMasked.length > 3 && window.mdlmMasked.at(-1) > 0"
                               " && window.mdlmMasked.at(-1) < window.mdlmMasked[0]")
        page.screenshot(path=str(tmp_path / "serve-page-midway.png"))
        page.wait_for_function("document.getElementById('status').dataset.done === '1'")
        page.screenshot(path=str(tmp_path / "serve-page.png"))
        masked = page.evaluate("window.mdlmMasked")
        text = page.inner_text("#text")
        status = page.inner_text("#status")
    assert masked[0] == 32 - len("the  of the ") and masked[-1] == 0
    assert all(a >= b for a, b in zip(masked, masked[1:], strict=False)) and len(masked) > 3
    assert text.startswith("the ") and " of the " in text and "first-hitting" in status
    assert (tmp_path / "serve-page.png").stat().st_size > 0


def test_serve_without_its_extra_names_it(monkeypatch):
    from .conftest import one_line_error

    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert "pip install 'mdlm[serve]'" in one_line_error("serve", "--port", "0")
