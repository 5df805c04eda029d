"""`POST /v1/mdlm/score` without HTTP: a text's bound agrees with `mdlm eval-ppl`'s on the same
tokens within the standard error, an AR model's score is its exact NLL, continuations are
ranked with the prompt never scored, a seeded score is the same alone and next to other texts
(through the batching worker), and the refusals name their field."""

import math
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from mdlm_cli.data.store import TokenSplit
from mdlm_cli.eval.ppl import PplOptions, evaluate
from mdlm_cli.serve.schema import ApiError, Limits
from mdlm_cli.serve.score import parse_score, run_score
from mdlm_cli.serve.worker import Batching, Job, Worker

from .test_serve_batching import CPU, TOK, served_model

TEXTS = ["the cat sat", "a dog ran off", "xyz"]


class Prompts:
    """What `eval.ppl.evaluate` reads of a prepared folder: one split of rows."""

    folder, meta, splits = Path("in-memory"), {"source": {"name": "texts"}}, ["test"]

    def __init__(self, split: TokenSplit):
        self._split = split

    def split(self, name: str) -> TokenSplit:
        return self._split


def as_split(rows: list[list[int]]) -> TokenSplit:
    width = max(map(len, rows))
    tokens = np.full((len(rows), width), TOK.pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    return TokenSplit(tokens=tokens, lengths=np.array([len(r) for r in rows]))


def score(served, body: dict, denoiser=None) -> dict:
    request = parse_score(body, served, Limits())
    with torch.no_grad():
        return run_score(request, served, denoiser or served.denoiser)


def test_the_bound_agrees_with_eval_ppl_on_the_same_tokens_within_the_standard_error():
    served = served_model("mdlm")
    out = score(served, {"input": TEXTS, "mc_samples": 32, "seed": 1})
    assert [e["kind"] for e in out["data"]] == ["bound"] * 3 and out["kind"] == "bound"
    tokens = sum(e["tokens"] for e in out["data"])
    assert tokens == sum(len(TOK.encode(t)) for t in TEXTS)
    mine = sum(e["nats"] for e in out["data"]) / tokens
    mine_se = math.sqrt(sum(e["nats_se"] ** 2 for e in out["data"])) / tokens
    split = as_split([TOK.encode(t) for t in TEXTS])
    ppl = evaluate(served.loaded, Prompts(split), PplOptions(mc_samples=32, batch_size=4, seed=5),
                   name="texts", device=CPU)
    assert ppl.tokens == tokens and not ppl.exact
    assert abs(mine - ppl.nats_per_token) < 4 * math.hypot(mine_se, ppl.standard_error)
    for e in out["data"]:
        assert e["bits_per_token"] == pytest.approx(e["nats_per_token"] / math.log(2))
        assert e["nats_per_token_se"] == pytest.approx(e["nats_se"] / e["tokens"])


def test_an_ar_score_is_the_exact_nll_and_ignores_mc_samples():
    served = served_model("ar")
    out = score(served, {"input": TEXTS, "mc_samples": 16})
    assert out["kind"] == "exact" and out["mc_samples"] == 1
    ppl = evaluate(served.loaded, Prompts(as_split([TOK.encode(t) for t in TEXTS])),
                   PplOptions(mc_samples=1, batch_size=4), name="texts", device=CPU)
    total = sum(e["nats"] for e in out["data"])
    assert total / ppl.tokens == pytest.approx(ppl.nats_per_token, rel=1e-5)
    for e, text in zip(out["data"], TEXTS, strict=True):
        x0 = torch.tensor([TOK.encode(text)])
        assert e["nats"] == pytest.approx(float(served.denoiser.nll(x0)[0].detach()), rel=1e-5)
        assert e["nats_se"] == 0.0 and e["kind"] == "exact"


class Says:
    """A certain denoiser: 'x' at every position, whatever it sees."""

    time_agnostic, supports_output_mask = True, True

    def __call__(self, z_t, t, output_mask=None, attention_mask=None):
        logits = torch.full((*z_t.shape, TOK.vocab_size), -10.0)
        logits[..., TOK.encode("x")[0]] = 10.0
        return logits if output_mask is None else logits[output_mask]


def test_continuations_are_ranked_and_only_their_tokens_scored():
    served = served_model("mdlm")
    body = {"prompt": "yyyy", "continuations": [" abc", "xxx", "xxa"], "mc_samples": 8}
    out = score(served, body, Says())
    ranks = [e["rank"] for e in out["data"]]
    assert ranks == [3, 1, 2]
    assert [e["tokens"] for e in out["data"]] == [4, 3, 3]  # the prompt's tokens are not scored
    assert out["data"][1]["nats"] < 1e-3  # certain of every continuation token


def scored_by_worker(served, bodies: list[dict]) -> list[dict]:
    """The requests submitted together to one batching worker (4 rows a call)."""
    worker = Worker(served.denoiser, mask_id=served.loaded.mask_id, batching=Batching(max_batch=4))
    results, done = [None] * len(bodies), [threading.Event() for _ in bodies]
    try:
        for i, body in enumerate(bodies):
            request = parse_score(body, served, Limits())

            def finish(result, error, i=i):
                results[i] = error or result
                done[i].set()

            worker.submit(Job(rows=request.num_rows, timeout_s=60, done=finish,
                              run=lambda d, r=request: run_score(r, served, d)))
        assert all(event.wait(60) for event in done)
    finally:
        worker.stop()
    return results


@pytest.mark.parametrize("objective", ["mdlm", "sedd", "d3pm"])
def test_a_seeded_score_is_the_same_alone_and_next_to_other_texts(objective):
    served = served_model(objective)
    alone, = scored_by_worker(served, [{"input": "a dog ran off", "mc_samples": 6, "seed": 3}])
    batch, other = scored_by_worker(served, [
        {"input": ["the cat sat", "a dog ran off", "xyz"], "mc_samples": 6, "seed": 3},
        {"input": "zzz", "mc_samples": 5, "seed": 9},
    ])
    assert batch["data"][1]["nats"] == alone["data"][0]["nats"]
    assert batch["data"][1]["nats_se"] == alone["data"][0]["nats_se"]
    again = score(served, {"input": "a dog ran off", "mc_samples": 6, "seed": 4})
    assert again["data"][0]["nats"] != alone["data"][0]["nats"]  # the seed draws the passes


@pytest.mark.parametrize("body, field, words", [
    ({}, "input", "give input"),
    ({"input": ""}, "input", r"input\[0\] is empty"),
    ({"input": []}, "input", "non-empty"),
    ({"input": ["ok", 3]}, "input", "strings"),
    ({"input": "x" * 40}, "input", "length is 32"),
    ({"prompt": "x" * 30, "continuations": ["abc"]}, "continuations", "length is 32"),
    ({"input": "ab", "continuations": ["a"]}, "input", "not both"),
    ({"input": "ab", "mc_samples": 0}, "mc_samples", "between 1"),
    ({"input": "ab", "temperature": 1}, "temperature", "unknown field"),
])
def test_bad_requests_are_400s_naming_the_field(body, field, words):
    with pytest.raises(ApiError, match=words) as e:
        parse_score(body, served_model("mdlm"), Limits())
    assert e.value.status == 400 and e.value.param == field


def test_a_model_without_a_bound_is_refused():
    with pytest.raises(ApiError, match="no likelihood bound") as e:
        parse_score({"input": "ab"}, served_model("mlm"), Limits())
    assert e.value.status == 400
