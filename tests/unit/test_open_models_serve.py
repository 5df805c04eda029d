"""`mdlm serve`'s app on the tiny random LLaDA and Dream folders (tests/open_model_folders.py),
in process: /v1/completions runs the real network, /v1/chat/completions renders the folder's
chat template (nothing added before it: LLaDA's template writes its BOS, Dream's none) and
cuts the answer at the family's end-of-turn token."""

import pytest
import torch

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from mdlm_cli import engine  # noqa: E402
from mdlm_cli.checkpoints.load import load_checkpoint  # noqa: E402
from mdlm_cli.serve.app import Settings, create_app  # noqa: E402
from mdlm_cli.serve.served import Served  # noqa: E402
from tests.open_model_folders import write_dream, write_llada  # noqa: E402

WRITERS = {"llada": write_llada, "dream": write_dream}
END_OF_TURN = {"llada": "<|eot_id|>", "dream": "<|im_end|>"}
MESSAGES = [{"role": "user", "content": "w1 w2 w3"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("open-serve")
    return {name: write(base / name) for name, write in WRITERS.items()}


class Scripted:
    """A certain denoiser: 'w5' before position `end`, the end-of-turn token at `end`, 'w6'
    after it (which an answer cut at the end of the turn never shows); it keeps the rows it
    was called with."""

    time_agnostic, supports_output_mask = True, True

    def __init__(self, tokenizer, end: int, turn_end: int):
        self.vocab, self.end, self.seen = tokenizer.vocab_size, end, []
        self.ids = {"w5": tokenizer.encode("w5")[0], "w6": tokenizer.encode("w6")[0],
                    "eot": turn_end}

    def __call__(self, z_t, t, output_mask=None, attention_mask=None):
        self.seen.append(z_t.clone())
        B, L = z_t.shape
        ids = torch.full((L,), self.ids["w6"])
        ids[: self.end], ids[self.end] = self.ids["w5"], self.ids["eot"]
        logits = torch.full((B, L, self.vocab), -1e4)
        logits.scatter_(-1, ids.expand(B, L)[..., None], 0.0)
        return logits if output_mask is None else logits[output_mask]


def client_of(served: Served) -> TestClient:
    http = TestClient(create_app(lambda: served, Settings(max_batch=2)))
    http.__enter__()
    for _ in range(200):  # the model loads in a thread
        if http.get("/health").status_code == 200:
            break
    return http


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_completions_run_the_folders_network(folders, family):
    loaded = load_checkpoint(str(folders[family]))
    http = client_of(Served(loaded, torch.device("cpu"), None, family))
    try:
        body = {"model": family, "prompt": "w1 w2 w3", "max_tokens": 6, "temperature": 0,
                "sampler": "confidence", "steps": 6}
        first = http.post("/v1/completions", json=body)
        again = http.post("/v1/completions", json=body).json()
    finally:
        http.__exit__(None, None, None)
    assert first.status_code == 200, first.text
    out = first.json()
    assert out["usage"]["prompt_tokens"] == 3
    assert out["choices"][0]["text"] == again["choices"][0]["text"]  # greedy: no draw
    # the greedy text is the engine's own on serve's row: the row start, the prompt and six
    # masks, nothing after them (the family's generate denoises prompt + gen_length, as
    # `mdlm sample --max-new-tokens 6` does; not the model's whole window)
    prefix = loaded.row_start() + loaded.tokenizer.encode("w1 w2 w3")
    tokens = greedy(loaded, prefix, 6, engine.SamplingSettings("confidence", 6, temperature=0.0))
    stop = next((i for i, t in enumerate(tokens.tolist()) if t == loaded.tokenizer.eos_id), 6)
    assert out["choices"][0]["text"] == loaded.tokenizer.decode(tokens[:stop])


def greedy(loaded, prefix: list[int], n: int, how) -> torch.Tensor:
    """The n tokens the engine gives after `prefix` on a row of the prefix and n masks."""
    row = torch.tensor(prefix + [loaded.mask_id] * n)
    how = how.with_defaults(loaded.sampling_defaults).validate()
    return engine.sample(loaded.denoiser(), how, num_samples=1, length=len(row), prompt=row,
                         mask_id=loaded.mask_id, schedule=loaded.objective.schedule,
                         generator=torch.Generator().manual_seed(0))[0, len(prefix):]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_cached_chat_request_runs_fast_dllms_blocks_over_its_answer_only(folders, family):
    """`"cache": "dual"` with blocks of 4 and 8 steps for 8 new tokens: two blocks of the
    answer (not of the whole window: a request the CLI takes is not refused for the window's
    block count), the tokens of the engine's run on the rendered prompt and 8 masks, NFE 8."""
    loaded = load_checkpoint(str(folders[family]))
    tok = loaded.tokenizer
    prompt = tok.encode(tok.hf.apply_chat_template(MESSAGES, tokenize=False,
                                                   add_generation_prompt=True))
    http = client_of(Served(loaded, torch.device("cpu"), None, family))
    body = {"model": family, "messages": MESSAGES, "max_tokens": 8, "temperature": 0,
            "sampler": "confidence", "steps": 8, "block_length": 4, "cache": "dual"}
    try:
        out = http.post("/v1/chat/completions", json=body)
    finally:
        http.__exit__(None, None, None)
    assert out.status_code == 200, out.text
    how = engine.SamplingSettings("confidence", 8, temperature=0.0,
                                  options={"block_length": 4, "cache": "dual"})
    tokens = greedy(loaded, prompt, 8, how).tolist()
    ends = {tok.eos_id, tok.hf.convert_tokens_to_ids(END_OF_TURN[family])}
    stop = next((i for i, t in enumerate(tokens) if t in ends), 8)
    assert out.json()["choices"][0]["message"]["content"] == tok.decode(tokens[:stop])
    assert out.json()["mdlm"]["nfe"] == 8.0


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_chat_renders_the_template_and_stops_at_the_end_of_turn(folders, family):
    loaded = load_checkpoint(str(folders[family]))
    tok = loaded.tokenizer
    rendered = tok.hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt = tok.encode(rendered)
    assert prompt.count(tok.bos_id) == (1 if family == "llada" else 0)
    turn_end = tok.hf.convert_tokens_to_ids(END_OF_TURN[family])
    served = Served(loaded, torch.device("cpu"), None, family)
    served.denoiser = Scripted(tok, end=len(prompt) + 3, turn_end=turn_end)
    http = client_of(served)
    try:
        out = http.post("/v1/chat/completions", json={"model": family, "messages": MESSAGES,
                                                      "max_tokens": 8, "seed": 0})
    finally:
        http.__exit__(None, None, None)
    assert out.status_code == 200, out.text
    choice = out.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "w5 w5 w5"}
    assert choice["finish_reason"] == "stop"
    assert out.json()["usage"]["prompt_tokens"] == len(prompt)
    # the model saw the rendered prompt from position 0: nothing before it (the other calls
    # are serve's probes of batch shapes)
    assert prompt in [z[0, : len(prompt)].tolist() for z in served.denoiser.seen]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_chat_on_the_real_network_answers(folders, family):
    loaded = load_checkpoint(str(folders[family]))
    http = client_of(Served(loaded, torch.device("cpu"), None, family))
    try:
        out = http.post("/v1/chat/completions", json={"model": family, "messages": MESSAGES,
                                                      "max_tokens": 6, "steps": 6, "seed": 1})
    finally:
        http.__exit__(None, None, None)
    assert out.status_code == 200, out.text
    choice = out.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert END_OF_TURN[family] not in choice["message"]["content"]
    assert out.json()["usage"]["completion_tokens"] <= 6


def test_a_conversation_past_the_window_is_refused_naming_the_prompt_alone(folders):
    """No max_tokens and a prompt longer than the window: the error names the prompt's length
    and the window (no negative max_tokens of the room left)."""
    loaded = load_checkpoint(str(folders["llada"]))
    http = client_of(Served(loaded, torch.device("cpu"), None, "llada"))
    long = [{"role": "user", "content": " ".join(f"w{i % 70 + 1}" for i in range(80))}]
    try:
        out = http.post("/v1/chat/completions", json={"model": "llada", "messages": long})
    finally:
        http.__exit__(None, None, None)
    assert out.status_code == 400
    message = out.json()["error"]["message"]
    assert "exceeds the window of 64 tokens" in message and "max_tokens" not in message, message


def test_prompts_of_different_lengths_each_get_their_own_row(folders):
    """Two prompts of 3 and 1 tokens in one request: each row is its own start + prompt +
    max_tokens (generation/layout.py), so the shorter one is not given the longer one's extra
    masks; each answer is the engine's greedy one on its own row."""
    loaded = load_checkpoint(str(folders["llada"]))
    http = client_of(Served(loaded, torch.device("cpu"), None, "llada"))
    body = {"model": "llada", "prompt": ["w1 w2 w3", "w4"], "max_tokens": 6, "temperature": 0,
            "sampler": "confidence", "steps": 6}
    try:
        out = http.post("/v1/completions", json=body)
    finally:
        http.__exit__(None, None, None)
    assert out.status_code == 200, out.text
    how = engine.SamplingSettings("confidence", 6, temperature=0.0)
    for choice, text in zip(out.json()["choices"], body["prompt"], strict=True):
        prefix = loaded.row_start() + loaded.tokenizer.encode(text)
        tokens = greedy(loaded, prefix, 6, how).tolist()
        stop = next((i for i, t in enumerate(tokens) if t == loaded.tokenizer.eos_id), 6)
        assert choice["text"] == loaded.tokenizer.decode(tokens[:stop])
