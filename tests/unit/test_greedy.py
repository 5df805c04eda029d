"""Temperature 0 (greedy): every categorical draw is the argmax of the logits, the mask
excluded, and draws no noise; the confidence is the argmax's untempered probability. On every
sampler, and through the server's `temperature: 0`."""

import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.engine.categorical import sample_tokens_with_probs, token_weights
from mdlm_cli.objectives import objectives_served_by

V, MASK, L = 9, 8, 6
TABLE = torch.randn(L, V, generator=torch.Generator().manual_seed(3))  # logits per position
ARGMAX = TABLE[:, :MASK].argmax(-1)


class PositionDenoiser:
    """Logits that depend on the position only: the greedy sample is their argmax, whatever
    order a sampler reveals the positions in."""

    time_agnostic = True

    def __call__(self, z, t, **kwargs):
        return TABLE.expand(len(z), -1, -1).clone()


class ChainLM:
    """A causal LM whose next-token logits are TABLE's row of the last token (mod L)."""

    bos_id = 0

    def new_cache(self, batch_size, length, device):
        return None

    def __call__(self, tokens, cache):
        return TABLE[tokens % L]


def greedy_chain(n: int) -> list[int]:
    out, last = [], ChainLM.bos_id
    for _ in range(n):
        last = int(TABLE[last % L, :MASK].argmax())
        out.append(last)
    return out


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
@pytest.mark.parametrize("name", list(engine.SAMPLERS))
def test_every_sampler_at_temperature_0_takes_the_argmax(name, precision):
    spec = engine.SAMPLERS[name]
    causal = "ar" in objectives_served_by(name)
    drawn = {
        seed: engine.sample(
            ChainLM() if causal else PositionDenoiser(), sampler=name, num_samples=2,
            length=L, mask_id=MASK, steps=4 if spec.uses_steps else None, precision=precision,
            temperature=0.0, top_p=0.5, generator=torch.Generator().manual_seed(seed))
        for seed in (0, 1)
    }
    expected = torch.tensor(greedy_chain(L)) if causal else ARGMAX  # BOS is fed, not returned
    for tokens in drawn.values():
        assert (tokens == expected).all(), (name, tokens, expected)


def test_the_greedy_draw_uses_no_noise_and_reports_the_softmax_probability():
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(0))
    logits[0, MASK] = 50.0  # the mask is never the argmax
    g = torch.Generator().manual_seed(7)
    before = g.get_state()
    tokens, probs = sample_tokens_with_probs(logits, MASK, generator=g, temperature=0.0)
    assert torch.equal(g.get_state(), before)
    assert tokens.tolist() == logits[:, :MASK].argmax(-1).tolist()
    p = logits[:, :MASK].double().softmax(-1)
    assert torch.allclose(probs, p.gather(-1, tokens[:, None])[:, 0], rtol=1e-6)
    one_hot = token_weights(logits, MASK, temperature=0.0)
    assert (one_hot.sum(-1) == 1).all() and (one_hot.argmax(-1) == tokens).all()


def test_a_served_request_at_temperature_0_is_the_same_for_any_seed():
    from mdlm_cli.serve.worker import Batching, Worker

    from .test_serve_batching import run, served_model

    served = served_model("mdlm")
    worker = Worker(served.denoiser, mask_id=served.loaded.mask_id,
                    batching=Batching(max_batch=8, max_wait_s=0.05))
    body = {"prompt": "the ", "sampler": "confidence", "steps": 8, "temperature": 0}
    try:
        a, b = run(worker, served, [{**body, "seed": 1}, {**body, "seed": 2}])
    finally:
        worker.stop()
    assert a.choices[0]["text"] == b.choices[0]["text"]
