"""The likelihood estimators of mdlm_cli/rl pinned to their definitions: each one's output
equals passes rebuilt by hand with the same masks (d1: one pass, the completion masked, the
prompt masked with p; coupled: a mask and its complement, every completion token scored once;
elbo: the K-sample Monte-Carlo ELBO), and the ELBO's expectation is known in closed form
for a model that ignores its input."""

import pytest
import torch

from mdlm_cli.engine.schedules import get_schedule
from mdlm_cli.errors import MdlmError
from mdlm_cli.rl import ESTIMATORS, estimate, iteration_seeds

V, MASK = 11, 10  # the last id is the mask


class Toy(torch.nn.Module):
    """logits (B, L, V) that depend on each token and on the row's mean embedding (so masking
    the context changes every position's logits); records each call's input."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.own = torch.nn.Parameter(torch.randn(V, V, generator=g))
        self.context = torch.nn.Parameter(torch.randn(V, V, generator=g))
        self.calls: list[torch.Tensor] = []

    def forward(self, z):
        self.calls.append(z.clone())
        return self.own[z] + self.context[z].mean(1, keepdim=True)


def batch(B=3, L=12, prompt=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, MASK, (B, L), generator=g)
    completion = torch.zeros(B, L, dtype=torch.bool)
    completion[:, prompt:] = True
    completion[1, -2:] = False  # a row whose completion ends early (a suffix after it)
    return tokens, completion


def by_hand(logits, tokens, positions):
    """SUBS's log p of each token at `positions`, written out: the mask's logit removed, a
    log-softmax, the token's entry; 0 elsewhere."""
    logits = logits.float().clone()
    logits[..., MASK] = float("-inf")
    logp = logits.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
    return torch.where(positions, logp, torch.zeros_like(logp))


def test_d1_is_one_pass_with_the_completion_masked_and_the_prompt_masked_with_p():
    tokens, completion = batch(B=4, L=400, prompt=300)
    model = Toy()
    got = estimate("d1", model, tokens, completion, mask_id=MASK, seed=7, p_mask_prompt=0.15)
    assert got.passes == 1 and len(model.calls) == 1
    g = torch.Generator().manual_seed(7)
    u = torch.rand(tokens.shape, generator=g)
    masked = completion | (~completion & (u < 0.15))
    z = torch.where(masked, torch.full_like(tokens, MASK), tokens)
    assert torch.equal(model.calls[0], z)
    with torch.no_grad():
        want = by_hand(Toy()(z), tokens, completion)
    torch.testing.assert_close(got.logp.detach(), want)
    assert (got.logp[~completion] == 0).all()
    prompt_masked = (z == MASK)[~completion].float().mean().item()
    assert 0.12 < prompt_masked < 0.18  # about p of the prompt


def test_d1_same_seed_same_masks_for_policy_old_and_reference():
    tokens, completion = batch()
    policy, old = Toy(0), Toy(1)
    estimate("d1", policy, tokens, completion, mask_id=MASK, seed=3, p_mask_prompt=0.5)
    estimate("d1", old, tokens, completion, mask_id=MASK, seed=3, p_mask_prompt=0.5)
    assert torch.equal(policy.calls[0], old.calls[0])
    estimate("d1", old, tokens, completion, mask_id=MASK, seed=4, p_mask_prompt=0.5)
    assert not torch.equal(old.calls[0], old.calls[1])


def test_coupled_pair_partitions_the_completion_and_equals_the_two_passes_by_hand():
    tokens, completion = batch(B=3, L=40, prompt=10)
    model = Toy()
    got = estimate("coupled", model, tokens, completion, mask_id=MASK, seed=11)
    assert got.passes == 2 and len(model.calls) == 2
    first, second = (z == MASK for z in model.calls)
    assert not (first & second).any()  # no token scored twice
    assert torch.equal(first | second, completion)  # every completion token scored once
    assert not ((first | second) & ~completion).any()  # the context never masked
    g = torch.Generator().manual_seed(11)
    t = 0.2 + 0.6 * float(torch.rand((), generator=g, dtype=torch.float64))
    u = torch.rand(tokens.shape, generator=g)
    assert torch.equal(first, completion & (u < t))
    with torch.no_grad():
        ref = Toy()
        lp_first = by_hand(ref(model.calls[0]), tokens, first)
        lp_second = by_hand(ref(model.calls[1]), tokens, second)
    want = torch.where(first, lp_first / t, lp_second / (1 - t))
    torch.testing.assert_close(got.logp.detach(), want)


def test_coupled_full_pass_is_the_sources_three_pass_average():
    tokens, completion = batch()
    model = Toy()
    pair = estimate("coupled", Toy(), tokens, completion, mask_id=MASK, seed=5)
    got = estimate("coupled", model, tokens, completion, mask_id=MASK, seed=5, full_pass=True)
    assert got.passes == 3
    full = torch.where(completion, torch.full_like(tokens, MASK), tokens)
    assert torch.equal(model.calls[2], full)
    with torch.no_grad():
        p0 = by_hand(Toy()(full), tokens, completion)
    torch.testing.assert_close(got.logp.detach(), (p0 + pair.logp.detach()) / 2)


def test_elbo_is_the_k_sample_monte_carlo_formula():
    tokens, completion = batch(B=3, L=16, prompt=6)
    model, K = Toy(), 3
    got = estimate("elbo", model, tokens, completion, mask_id=MASK, seed=2, samples=K)
    assert got.passes == K and len(model.calls) == K
    schedule = get_schedule("loglinear")
    g = torch.Generator().manual_seed(2)
    u0 = torch.rand(tokens.shape[0], generator=g)
    want = torch.zeros(tokens.shape)
    for k in range(K):
        t = schedule.t_min + (1 - schedule.t_min) * ((u0 + k / K) % 1.0)
        masked = completion & (torch.rand(tokens.shape, generator=g) < (1 - schedule.alpha(t))[:, None])
        z = torch.where(masked, torch.full_like(tokens, MASK), tokens)
        assert torch.equal(model.calls[k], z)
        with torch.no_grad():
            want += by_hand(Toy()(z), tokens, masked) / t[:, None]  # log-linear: w = 1/t
    torch.testing.assert_close(got.logp.detach(), want / K)


def test_elbo_of_an_input_independent_model_has_its_closed_form_expectation():
    """For logits that ignore the input, every masked draw scores the token with the same
    log p_i, so E[w(t) 1[masked] log p_i] = log p_i E_t[-alpha'(t)]: with t uniform on
    [t_min, 1], log p_i (alpha(t_min) - alpha(1)) / (1 - t_min) (log-linear: 1 - eps)."""
    table = torch.randn(8, V, generator=torch.Generator().manual_seed(0))
    B = 256
    tokens = torch.randint(0, MASK, (1, 8), generator=torch.Generator().manual_seed(1)).expand(B, 8)
    completion = torch.zeros(B, 8, dtype=torch.bool)
    completion[:, 2:] = True

    def fixed(z):
        return table.expand(z.shape[0], -1, -1)

    for name in ("loglinear", "cosine"):
        got = estimate("elbo", fixed, tokens, completion, mask_id=MASK, seed=0, samples=64,
                       schedule=name)
        s = get_schedule(name)
        factor = (s.alpha(torch.tensor(s.t_min)) - s.alpha(torch.tensor(1.0))) / (1 - s.t_min)
        exact = by_hand(table[None], tokens[:1], completion[:1])[0] * factor
        torch.testing.assert_close(got.logp.mean(0), exact, atol=0.06 * exact.abs().max().item(),
                                   rtol=0.0)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_every_estimator_is_zero_off_the_completion_finite_and_differentiable(name):
    tokens, completion = batch()
    model = Toy()
    got = estimate(name, model, tokens, completion, mask_id=MASK, seed=0)
    assert got.logp.shape == tokens.shape and got.logp.dtype == torch.float32
    assert torch.isfinite(got.logp).all() and (got.logp[~completion] == 0).all()
    assert (got.logp[completion] <= 0).all()  # log-probabilities, weighted by w >= 1
    assert got.passes == len(model.calls)
    got.logp.sum().backward()
    assert model.own.grad is not None and model.own.grad.abs().sum() > 0
    again = estimate(name, Toy(), tokens, completion, mask_id=MASK,
                     generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(again.logp, got.logp)  # a seed is a generator seeded with it


def test_bad_calls_are_one_line_errors():
    tokens, completion = batch()
    cases = [
        ({"name": "nope", "seed": 0}, "unknown likelihood estimator 'nope'; choose one of: d1"),
        ({"name": "d1"}, "exactly one of seed= or generator="),
        ({"name": "d1", "seed": 0, "generator": torch.Generator()}, "exactly one of"),
        ({"name": "d1", "seed": 0, "samples": 2}, "estimator d1 has no option 'samples'"),
        ({"name": "d1", "seed": 0, "p_mask_prompt": 2.0}, "p_mask_prompt must be in [0, 1]"),
        ({"name": "elbo", "seed": 0, "schedule": "nope"}, "schedule must be one of"),
        ({"name": "coupled", "seed": 0, "t_low": 0.9, "t_high": 0.5}, "t_low (0.9) must not"),
    ]
    for kwargs, message in cases:
        name = kwargs.pop("name")
        with pytest.raises(MdlmError) as e:
            estimate(name, Toy(), tokens, completion, mask_id=MASK, **kwargs)
        assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(MdlmError, match="must both be"):
        estimate("d1", Toy(), tokens, completion[:, :-1], mask_id=MASK, seed=0)


def test_iteration_seeds_one_per_iteration_repeatable():
    a = iteration_seeds(12, torch.Generator().manual_seed(0))
    b = iteration_seeds(12, torch.Generator().manual_seed(0))
    assert a == b and len(a) == 12 and len(set(a)) == 12


def test_a_real_denoiser_through_denoiser_logits_matches_its_own_pass(tmp_path):
    """The tiny LLaDA folder the tests build: d1 through `denoiser_logits` is the model's own
    call on the same masked rows; a time-conditioned denoiser is refused in one line."""
    from mdlm_cli.checkpoints.load import load_checkpoint
    from mdlm_cli.rl import denoiser_logits
    from tests.open_model_folders import write_llada

    loaded = load_checkpoint(str(write_llada(tmp_path / "llada")))
    denoiser, mask = loaded.denoiser(), loaded.mask_id
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    completion = torch.zeros(2, 12, dtype=torch.bool)
    completion[:, 7:] = True
    with torch.no_grad():
        got = estimate("d1", denoiser_logits(denoiser), tokens, completion, mask_id=mask, seed=1)
        u = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(1))
        z = torch.where(completion | (u < 0.15), torch.full_like(tokens, mask), tokens)
        want = -torch.nn.functional.cross_entropy(
            denoiser(z, torch.ones(2))[completion].float().index_fill(
                -1, torch.tensor([mask]), float("-inf")), tokens[completion], reduction="none")
    torch.testing.assert_close(got.logp[completion], want)

    class Timed:
        time_agnostic = False

        def __call__(self, z, t):
            return torch.zeros(*z.shape, 4)

    with pytest.raises(MdlmError, match="need a denoiser that ignores t"):
        denoiser_logits(Timed())
