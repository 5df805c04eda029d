"""`logprobs` on `/v1/completions`: what the recording samplers report is, at every position
they fill, the log-probability of the drawn token under the distribution of the network call
that revealed it (temperature and top-p applied), with that call's top alternatives; recording
changes no draw; an AR model's values are its left-to-right conditionals (they sum to minus
its exact NLL); the answer's shape is OpenAI's; what cannot record is refused."""

import math

import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.engine.diffusion import without_mask
from mdlm_cli.engine.reveals import RevealRecorder
from mdlm_cli.engine.sampling import SAMPLERS
from mdlm_cli.serve.completion import parse_completion
from mdlm_cli.serve.schema import ApiError, Limits
from mdlm_cli.serve.worker import Batching, Worker

from .test_serve_batching import TOK, objective_of, run, served_model

RECORDING = [name for name, spec in SAMPLERS.items() if spec.records_reveals]
L = 32


def prompt_row(text: str) -> torch.Tensor:
    row = torch.full((L,), TOK.mask_id)
    row[: len(text)] = torch.tensor(TOK.encode(text))
    return row


def draw(denoiser, sampler: str, recorder=None, num_samples=2, **settings) -> torch.Tensor:
    steps = {"steps": 8} if SAMPLERS[sampler].uses_steps else {}
    return engine.sample(denoiser, sampler=sampler, num_samples=num_samples, length=L,
                         mask_id=TOK.mask_id, prompt=prompt_row("ab"), recorder=recorder,
                         generator=torch.Generator().manual_seed(4), **steps, **settings)


@pytest.mark.parametrize("sampler", RECORDING)
def test_recording_changes_no_draw_and_covers_every_filled_position(sampler):
    served = served_model(objective_of(sampler))
    recorder = RevealRecorder((2, L), top=3)
    with torch.no_grad():
        plain = draw(served.denoiser, sampler)
        recorded = draw(served.denoiser, sampler, recorder)
    assert torch.equal(plain, recorded)
    assert not recorder.recorded[:, :2].any() and recorder.recorded[:, 2:].all()
    lp, top = recorder.logprob[:, 2:], recorder.top_logprobs[:, 2:]
    assert (lp <= 0).all() and (top[..., :-1] >= top[..., 1:]).all()
    assert (top[..., 0] >= lp - 1e-12).all()  # the likeliest alternative is at least as likely
    in_top = recorder.top_ids[:, 2:] == recorded[:, 2:, None]
    assert torch.allclose(top[in_top], lp.unsqueeze(-1).expand_as(top)[in_top])


class Logged:
    """The model, keeping every call's input and logits (one sequence)."""

    def __init__(self, denoiser):
        self.denoiser, self.calls = denoiser, []
        self.time_agnostic = getattr(denoiser, "time_agnostic", False)

    def __call__(self, z_t, t, **kwargs):
        logits = self.denoiser(z_t, t, **kwargs)
        self.calls.append((z_t.clone(), logits.clone()))
        return logits


@pytest.mark.parametrize("sampler", ["first-hitting", "ancestral", "ancestral-cache"])
def test_a_value_is_the_drawn_token_under_the_call_that_revealed_it(sampler):
    served = served_model("mdlm")
    logged, recorder = Logged(served.denoiser), RevealRecorder((1, L), top=0)
    with torch.no_grad():
        tokens = draw(logged, sampler, recorder, num_samples=1, temperature=0.7)[0]
    checked = 0
    for c, (z_in, logits) in enumerate(logged.calls):
        after = logged.calls[c + 1][0][0] if c + 1 < len(logged.calls) else tokens
        for pos in ((z_in[0] == TOK.mask_id) & (after != TOK.mask_id)).nonzero()[:, 0].tolist():
            expected = torch.log_softmax(without_mask(logits[0, pos].double(), TOK.mask_id) / 0.7,
                                         -1)[tokens[pos]]
            assert float(recorder.logprob[0, pos]) == pytest.approx(float(expected), abs=1e-6)
            checked += 1
    assert checked == L - 2  # every filled position, each at the one call that revealed it


def test_ar_values_are_the_left_to_right_conditionals():
    served = served_model("ar")
    recorder = RevealRecorder((2, L), top=1)
    with torch.no_grad():
        tokens = draw(served.denoiser, "autoregressive-kv-cache", recorder)
        targets = torch.zeros_like(tokens, dtype=torch.bool)
        targets[:, 2:] = True
        nll = served.denoiser.nll(tokens, targets=targets)
    assert torch.allclose(-recorder.logprob[:, 2:].sum(1), nll.double(), rtol=1e-4)


def answer(served, body: dict) -> list[dict]:
    worker = Worker(served.denoiser, mask_id=served.loaded.mask_id, batching=Batching(max_batch=4))
    try:
        outcome, = run(worker, served, [body])
    finally:
        worker.stop()
    return outcome.choices


def test_the_answer_has_openais_legacy_logprobs_per_kept_token():
    served = served_model("mdlm")
    choices = answer(served, {"prompt": "the ", "max_tokens": 10, "n": 2, "seed": 1,
                              "logprobs": 3, "stop": ["e"]})
    for choice in choices:
        lp = choice["logprobs"]
        assert "".join(lp["tokens"]) == choice["text"] and len(lp["tokens"]) == choice["length"]
        assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == choice["length"]
        assert lp["text_offset"] == list(range(choice["length"]))  # one character per token
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                     strict=True):
            assert 1 <= len(top) <= 3 and value <= 0 and max(top.values()) >= value
            assert token not in top or math.isclose(top[token], value)
    plain = answer(served, {"prompt": "the ", "max_tokens": 10, "n": 2, "seed": 1, "stop": ["e"]})
    assert [c["text"] for c in plain] == [c["text"] for c in choices]
    assert all(c["logprobs"] is None for c in plain)


@pytest.mark.parametrize("extra, words", [
    ({"sampler": "confidence", "steps": 4}, "needs a sampler that records"),
    ({"precision": "fp32"}, "precision fp64"),
    ({"stride": 8}, "one window"),
    ({"echo": True}, "echo: false"),
    ({"logprobs": 21}, "between 0 and 20"),
    ({"logprobs": True}, "an integer"),
])
def test_what_cannot_be_recorded_is_refused_naming_logprobs(extra, words):
    body = {"prompt": "ab", "max_tokens": 4, "logprobs": 2, **extra}
    with pytest.raises(ApiError, match=words) as e:
        parse_completion(body, served_model("mdlm"), Limits())
    assert e.value.status == 400 and e.value.param == "logprobs"


def test_more_alternatives_than_the_vocabulary_holds_are_left_out():
    recorder = RevealRecorder((1, 3), top=5)  # a vocabulary of 3, the mask (2) among them
    where = torch.tensor([[True, False, True]])
    recorder.record(where, torch.tensor([[1.0, 0.0, 5.0], [0.0, 2.0, 5.0]]), torch.tensor([0, 1]),
                    mask_id=2, temperature=1.0, top_p=1.0)
    assert torch.allclose(recorder.logprob[0, [0, 2]].exp(),
                          torch.tensor([1 / (1 + math.exp(-1)), 1 / (1 + math.exp(-2))],
                                       dtype=torch.float64))
    assert torch.isinf(recorder.top_logprobs[0, 0, 2:]).all() and recorder.recorded.sum() == 2
