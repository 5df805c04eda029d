"""Issue 33: whatever logits a model gives (nan, inf, rows with nothing left to draw), every
sampler either refuses with a ProbabilityError naming itself, or returns ids in [0, V), never
the mask. A seeded property test over random logits."""

import random

import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.engine.errors import EngineError, ProbabilityError
from mdlm_cli.objectives import objectives_served_by

V, MASK, L = 7, 6, 5  # the mask is the last id: an inverse CDF that runs past it reads V


def random_logits(rng: random.Random, shape: tuple[int, ...], bad: float) -> torch.Tensor:
    """Random logits (..., V); each row is, with probability `bad`, one of: all nan, one nan,
    one +inf, all -inf, every class but the mask at -inf. Other rows may hold -inf entries
    (a nucleus-filtered row), which are valid."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    logits = torch.randn((*shape, V), generator=g) * rng.choice([0.1, 1.0, 30.0])
    rows = logits.reshape(-1, V)
    for row in rows:
        if rng.random() < 0.2:
            row[rng.randrange(V - 1)] = float("-inf")
        if rng.random() < bad:
            kind = rng.randrange(5)
            if kind == 0:
                row[:] = float("nan")
            elif kind == 1:
                row[rng.randrange(V)] = float("nan")
            elif kind == 2:
                row[rng.randrange(V)] = float("inf")
            elif kind == 3:
                row[:] = float("-inf")
            else:
                row[:MASK] = float("-inf")
    return logits


class RandomDenoiser:
    """A denoiser (SUBS, SEDD via conversion, D3PM) giving fresh random logits at every call."""

    time_agnostic = True

    def __init__(self, rng: random.Random, bad: float):
        self.rng, self.bad = rng, bad

    def __call__(self, z, t, **kwargs):
        return random_logits(self.rng, tuple(z.shape), self.bad)


class RandomCausalLM(RandomDenoiser):
    """The left-to-right protocol (engine.autoregressive.CausalLM) with random logits."""

    bos_id = 0

    def new_cache(self, batch_size, length, device):
        return None

    def __call__(self, tokens, cache):
        return random_logits(self.rng, tuple(tokens.shape), self.bad)


def run(name: str, model, precision: str, seed: int) -> torch.Tensor:
    spec = engine.SAMPLERS[name]
    return engine.sample(
        model,
        sampler=name,
        num_samples=3,
        length=L,
        mask_id=MASK,
        steps=4 if spec.uses_steps else None,
        precision=precision,
        generator=torch.Generator().manual_seed(seed),
        final_denoise=seed % 2 == 0,
    )


def model(name: str, rng: random.Random, bad: float):
    return (RandomCausalLM if "ar" in objectives_served_by(name) else RandomDenoiser)(
        rng, bad
    )


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
@pytest.mark.parametrize("name", list(engine.SAMPLERS))
def test_every_draw_is_a_real_token_or_a_named_refusal(name, precision):
    rng = random.Random(f"{name}-{precision}")
    refused = 0
    for trial in range(12):
        try:
            tokens = run(name, model(name, rng, bad=rng.choice([0.05, 0.3, 1.0])), precision, trial)
        except ProbabilityError as e:
            assert str(e).startswith(f"{name} sampler, at network call "), e
            refused += 1
            continue
        assert tokens.dtype == torch.long and tokens.shape == (3, L)
        assert ((tokens >= 0) & (tokens < V) & (tokens != MASK)).all(), tokens
    assert refused, "no trial met a bad row"


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
@pytest.mark.parametrize("name", list(engine.SAMPLERS))
def test_finite_logits_are_never_refused_and_all_bad_ones_always_are(name, precision):
    rng = random.Random(name)
    for trial in range(4):
        tokens = run(name, model(name, rng, bad=0.0), precision, trial)
        assert ((tokens >= 0) & (tokens < MASK)).all()
    with pytest.raises(ProbabilityError, match=f"^{name} sampler, at network call 1: "):
        run(name, model(name, rng, bad=1.0 + 1e-9), precision, 0)


def test_the_messages_say_what_is_wrong():
    nan = torch.full((2, V), float("nan"))
    with pytest.raises(ProbabilityError, match="non-finite probabilities in 2 of 2 rows"):
        engine.sample_tokens(nan, MASK, generator=None)
    only_mask = torch.full((3, V), float("-inf"))
    only_mask[:, MASK] = 0.0
    with pytest.raises(ProbabilityError, match="all-zero probabilities in 3 of 3 rows"):
        engine.sample_tokens(only_mask, MASK, generator=None)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0, -1e-9])
def test_a_temperature_below_0_or_not_finite_is_refused(temperature):
    with pytest.raises(EngineError, match="temperature must be a finite number at least 0"):
        engine.sample(
            RandomDenoiser(random.Random(0), 0.0),
            sampler="first-hitting",
            num_samples=1,
            length=L,
            mask_id=MASK,
            temperature=temperature,
        )
