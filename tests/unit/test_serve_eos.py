"""`mdlm serve`'s answers end at the model's EOS (as `mdlm sample --stop-at-eos` does): nothing
from the EOS on is returned, each choice reports its length and whether it ended, and
`max_new_tokens` is accepted for `max_tokens`."""

from pathlib import Path

import pytest
import torch

from mdlm_cli.checkpoints.folder import LoadedModel
from mdlm_cli.serve.completion import parse_completion
from mdlm_cli.serve.schema import ApiError, Limits
from mdlm_cli.serve.served import Served
from mdlm_cli.serve.worker import Worker

from .test_serve_batching import TOK, run, served_model

X, Y = TOK.encode("x")[0], TOK.encode("y")[0]


class EndsAt:
    """A certain denoiser: 'x' before position `end`, EOS from it on, except 'y' at `end` + 1
    (which an answer cut at its first EOS never shows)."""

    time_agnostic, supports_output_mask = True, True

    def __init__(self, end: int):
        self.end = end

    def __call__(self, z_t, t, output_mask=None, attention_mask=None):
        B, L = z_t.shape
        ids = torch.full((L,), TOK.eos_id)
        ids[: self.end] = X
        if self.end + 1 < L:  # a row that ends at its answer may stop before it
            ids[self.end + 1] = Y
        logits = torch.full((B, L, TOK.vocab_size), -1e4)
        logits.scatter_(-1, ids.expand(B, L)[..., None], 0.0)
        return logits if output_mask is None else logits[output_mask]


def sft_served() -> Served:
    """The test-size model as if fine-tuned on prompt/response rows padded with EOS."""
    base = served_model("mdlm").loaded
    meta = {"length": 32, "packing": "sft", "pad_as_eos": True}
    return Served(LoadedModel(Path("in-memory"), base.model, base.config, TOK, meta, {}),
                  torch.device("cpu"), None, "test")


def answer(served: Served, body: dict, denoiser) -> list[dict]:
    """The choices of one request through the batching worker over `denoiser`."""
    worker = Worker(denoiser, mask_id=served.loaded.mask_id)
    try:
        outcome, = run(worker, served, [body])
    finally:
        worker.stop()
    return outcome.choices


@pytest.mark.parametrize("semi_ar", [False, True])
def test_an_answer_ends_at_the_first_eos_and_reports_its_length(semi_ar):
    served = sft_served()
    body = {"prompt": "ab", "n": 2, "seed": 0, **({"stride": 8} if semi_ar else {})}
    for choice in answer(served, body, EndsAt(end=9)):  # [BOS] a b, then 6 x, then EOS
        assert choice["text"] == "x" * 6 and "y" not in choice["text"]
        assert choice["length"] == 6 and choice["ended"] and choice["finish_reason"] == "stop"


def test_max_new_tokens_caps_an_answer_that_has_not_ended():
    served = sft_served()
    choice, = answer(served, {"prompt": "ab", "max_new_tokens": 4}, EndsAt(end=20))
    assert choice["text"] == "xxxx" and choice["length"] == 4 and not choice["ended"]
    assert choice["finish_reason"] == "length"
    same, = answer(served, {"prompt": "ab", "max_tokens": 4}, EndsAt(end=20))
    assert same["text"] == choice["text"]
    with pytest.raises(ApiError, match="max_tokens or max_new_tokens, not both"):
        parse_completion({"prompt": "ab", "max_tokens": 4, "max_new_tokens": 4}, served, Limits())
