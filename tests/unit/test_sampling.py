"""Statistical tests of the samplers against an exactly enumerable joint distribution."""

import math
import warnings

import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.engine import EngineError
from mdlm_cli.engine.categorical import sample_tokens
from mdlm_cli.objectives import objectives_served_by
from mdlm_cli.sample.bench import WholeBatchCount

from ..analytic import AnalyticDenoiser, AnalyticPosterior, AnalyticScore

N = 6000


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson goodness of fit; cells with small expectation are pooled."""
    expected = probs * counts.sum()
    order = expected.argsort()
    pooled_o, pooled_e, acc_o, acc_e = [], [], 0.0, 0.0
    for i in order.tolist():
        acc_o += counts[i].item()
        acc_e += expected[i].item()
        if acc_e >= 5:
            pooled_o.append(acc_o)
            pooled_e.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e:
        pooled_o[-1] += acc_o
        pooled_e[-1] += acc_e
    o, e = torch.tensor(pooled_o, dtype=torch.float64), torch.tensor(pooled_e, dtype=torch.float64)
    stat = ((o - e) ** 2 / e).sum()
    dof = len(o) - 1
    return torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2).item()


def empirical(den: AnalyticDenoiser, tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(den.index(tokens), minlength=len(den.probs)).double()


@pytest.fixture(scope="module")
def den():
    return AnalyticDenoiser.random(length=3, vocab=3, seed=0, concentration=0.3)


def draw(den, sampler, n=N, seed=0, **kw):
    kw = {"length": getattr(den, "length", None), "mask_id": getattr(den, "mask_id", None), **kw}
    return engine.sample(den, sampler=sampler, num_samples=n, generator=torch.Generator().manual_seed(seed),
                         return_stats=True, **kw)


def test_first_hitting_reproduces_the_joint(den):
    tokens, stats = draw(den, "first-hitting")
    assert chi2_pvalue(empirical(den, tokens), den.probs) > 1e-3
    assert stats.nfe == den.length and stats.ncs == den.length  # one call and one draw per token


def test_ancestral_many_steps_reproduces_the_joint(den):
    tokens, stats = draw(den, "ancestral", steps=200)
    assert chi2_pvalue(empirical(den, tokens), den.probs) > 1e-3
    assert stats.ncs <= den.length  # draws only where a position unmasks


def test_ancestral_one_step_does_not(den):
    """One step unmasks every position independently: the test must reject it (power)."""
    tokens, _ = draw(den, "ancestral", steps=1, final_denoise=False)
    assert chi2_pvalue(empirical(den, tokens), den.probs) < 1e-6


def test_ancestral_cache_matches_ancestral_with_fewer_calls(den):
    plain, s_plain = draw(den, "ancestral", steps=100, seed=1)
    cached, s_cache = draw(den, "ancestral-cache", steps=100, seed=1)
    assert chi2_pvalue(empirical(den, cached), den.probs) > 1e-3
    assert s_cache.nfe <= den.length + 1 < s_plain.nfe
    # identical random streams: decisions and draws are the same, only the calls differ
    assert torch.equal(plain, cached)


def test_ancestral_cache_counts_per_sequence_calls():
    den = AnalyticDenoiser.random(length=4, vocab=2, seed=3)
    whole = WholeBatchCount()
    tokens, stats = draw(den, "ancestral-cache", n=8, steps=50, on_changes=whole)
    # every network evaluation of a sequence coincides with a step that changed it
    assert stats.sequence_evals <= 8 * den.length
    assert whole.calls >= stats.calls


def test_prompted_sampling_reproduces_the_conditional(den):
    prompt = torch.tensor([den.mask_id, 2, den.mask_id])
    cond = den.probs * (den.configs[:, 1] == 2)
    cond = cond / cond.sum()
    for sampler, kw in (("first-hitting", {}), ("ancestral-cache", {"steps": 200})):
        tokens, _ = draw(den, sampler, prompt=prompt, **kw)
        assert (tokens[:, 1] == 2).all()
        assert chi2_pvalue(empirical(den, tokens), cond) > 1e-3, sampler


def model_for(spec: engine.SamplerSpec, den: AnalyticDenoiser):
    """A model each sampler can serve: the analytic denoiser (as SUBS, SEDD or D3PM would see
    it), or a tiny random causal LM with the same vocabulary (BOS 0, mask 3) for left-to-right
    samplers."""
    served = objectives_served_by(spec.name)
    if "mdlm" in served:
        return den
    if "sedd" in served:
        from mdlm_cli.engine.schedules import LogLinear

        return AnalyticScore(den, LogLinear())
    if "d3pm" in served:
        return AnalyticPosterior(den)
    from mdlm_cli.config import ModelConfig
    from mdlm_cli.models import DiT
    from mdlm_cli.objectives.ar import CausalLMAdapter

    torch.manual_seed(0)
    model = DiT(ModelConfig(hidden_size=16, n_blocks=1, n_heads=2, cond_dim=8, dropout=0.0), den.vocab + 1, causal=True)
    torch.nn.init.normal_(model.output_layer.linear.weight, std=1.0)
    return CausalLMAdapter(model.eval(), bos_id=0, mask_id=den.mask_id)


@pytest.mark.parametrize("sampler", list(engine.SAMPLERS))
@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_no_mask_left_and_seed_determinism(den, sampler, precision):
    model = model_for(engine.SAMPLERS[sampler], den)
    a = draw(model, sampler, n=64, seed=5, steps=10, precision=precision, length=den.length, mask_id=den.mask_id)[0]
    b = draw(model, sampler, n=64, seed=5, steps=10, precision=precision, length=den.length, mask_id=den.mask_id)[0]
    assert torch.equal(a, b)
    assert not (a == den.mask_id).any() and a.shape == (64, den.length)


def test_first_hitting_parallel_variant(den):
    tokens, stats = draw(den, "first-hitting", tokens_per_step=2)
    assert stats.nfe == math.ceil(den.length / 2)
    assert stats.ncs == den.length


def test_fp32_draw_cannot_reach_classes_below_its_grid():
    """Classes at 1e-8 of the leading one: float32 noise (E >= ~6e-8) never lets them win."""
    logits = torch.cat([torch.zeros(1), torch.full((1000,), math.log(1e-8)), torch.zeros(1)]).expand(100_000, -1)
    rare32 = (sample_tokens(logits, 1001, generator=torch.Generator().manual_seed(0), precision="fp32") > 0).sum()
    assert rare32.item() == 0  # the exact draw would give each row a 1e-5 chance


def test_fp64_draw_matches_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05 - 1e-4, 1e-4], dtype=torch.float64)
    logits = torch.cat([probs.log(), torch.zeros(1, dtype=torch.float64)]).float().expand(400_000, -1)  # + the mask
    draws = sample_tokens(logits, 5, generator=torch.Generator().manual_seed(1))
    assert chi2_pvalue(torch.bincount(draws, minlength=5).double(), probs) > 1e-3


def fixed_uniform(monkeypatch, r: float) -> None:
    """Every torch.rand call returns r (the draw's one uniform per row)."""
    monkeypatch.setattr(torch, "rand", lambda shape, **k: torch.full(shape, r, dtype=torch.float64))


def test_fp64_draw_keeps_a_class_far_below_float32_resolution(monkeypatch):
    """Class 1 holds 1e-9 of the mass, far below float32's spacing near 1 (~6e-8), so a
    float32 running sum would give it an empty interval. The float64 one keeps it: a
    target inside its interval draws it, one just below does not."""
    logits = torch.tensor([[0.0, math.log(1e-9), 0.0]])  # classes 0, 1 and the mask (2)
    total = 1.0 + 1e-9
    for target, expected in [((1.0 + 0.5e-9) / total, 1), ((1.0 - 1e-12) / total, 0)]:
        fixed_uniform(monkeypatch, 1.0 - target)  # the target is (1 - u) times the total
        assert sample_tokens(logits, 2, generator=None).item() == expected


def test_fp64_draw_keeps_rare_classes_of_a_large_vocabulary():
    """1,324 classes, the mask in the middle, 40 classes at e^-4 of their weight: the draw
    reproduces the distribution, the rare classes' share included, and never the mask."""
    g = torch.Generator().manual_seed(3)
    v, mask_id, n = 1324, 700, 100_000  # ~64 draws of the rare classes expected
    logits = torch.randn(v, generator=g, dtype=torch.float64) * 2
    rare = torch.randperm(v, generator=g)[:40]
    logits[rare] -= 4
    probs = logits.index_fill(0, torch.tensor([mask_id]), float("-inf")).softmax(0)
    counts = torch.bincount(sample_tokens(logits.float().expand(n, -1), mask_id, generator=g), minlength=v).double()
    assert counts[mask_id] == 0
    assert chi2_pvalue(counts, probs) > 1e-3
    expected = n * probs[rare].sum().item()  # the chi-square pools most of these cells
    assert expected > 50 and abs(counts[rare].sum().item() - expected) < 5 * math.sqrt(expected)


@pytest.mark.parametrize("r, expected", [(0.0, 1), (1.0 - 2.0 ** -53, 0)])
def test_fp64_draw_ends_on_classes_with_weight(monkeypatch, r, expected):
    """The extreme uniforms land on the last and the first class with weight, never on the
    classes of weight 0 after them (filtered out, and the mask, the last column here)."""
    logits = torch.full((1, 300), -math.inf)
    logits[0, :2] = 0.0
    fixed_uniform(monkeypatch, r)
    assert sample_tokens(logits, 299, generator=None).item() == expected


def test_the_mask_keeps_no_interval_even_if_the_scan_rounds_it_one(monkeypatch):
    """A parallel scan (CUDA) can round the mask's running sum an ulp above its
    predecessor's; `never` pins it, so a target in that sliver goes to the next class."""
    from mdlm_cli.engine.categorical import inverse_cdf_draw

    weights = torch.tensor([[1.0, 1e-10, 1.0]], dtype=torch.float64)  # 1e-10: the rounding, exaggerated
    fixed_uniform(monkeypatch, 1.0 - (1.0 + 0.5e-10) / (2.0 + 1e-10))  # the target falls in the sliver
    assert inverse_cdf_draw(weights, generator=None).item() == 1
    assert inverse_cdf_draw(weights, generator=None, never=1).item() == 2


@pytest.mark.slow
def test_ancestral_fp32_truncates_rare_tokens_that_fp64_keeps():
    """10,000 rare tokens at 1e-6 each (1% together). With 100 steps, a rare token's weight in a
    step, 1e-6 * dt / t, is below float32's ~6e-8 floor for every t > 0.17: the reference draw
    loses most of that 1%, the float64 sampler keeps it (Zheng et al. 2024). The fp32 run draws
    over all (B, L, V) at every step, so it gets a quarter of the rows (its time is the test's)."""
    n_rare, L = 10_000, 256
    probs = torch.cat([torch.tensor([0.99]), torch.full((n_rare,), 0.01 / n_rare)])
    row = torch.cat([probs.log(), torch.zeros(1)])  # + the mask column

    class Constant:
        supports_output_mask = True
        time_agnostic = True

        def __call__(self, z, t, output_mask=None):
            n = int(output_mask.sum()) if output_mask is not None else z.numel()
            out = row.expand(n, -1)
            return out if output_mask is not None else out.reshape(*z.shape, -1)

    share = {}
    for precision, rows in (("fp64", 16), ("fp32", 4)):
        tokens = engine.sample(Constant(), sampler="ancestral-cache", num_samples=rows, length=L,
                               mask_id=n_rare + 1, steps=100, precision=precision,
                               generator=torch.Generator().manual_seed(0))
        share[precision] = (tokens > 0).double().mean().item()
    assert 0.006 < share["fp64"] < 0.015, share  # ~41 of 4096 positions
    assert share["fp32"] < 0.005, share  # ~1.7 of 1024 positions expected, 5 allowed


def test_temperature_and_top_p():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1, 0.0]])).expand(20000, -1)
    g = torch.Generator().manual_seed(0)
    top = sample_tokens(logits, 3, generator=g, top_p=0.8)
    assert set(top.tolist()) == {0, 1}
    cold = sample_tokens(logits, 3, generator=g, temperature=0.1)
    assert (cold == 0).double().mean() > 0.99
    assert not (sample_tokens(logits, 3, generator=g) == 3).any()


def test_semi_ar_length_and_carried_prefix(den):
    blocks = []
    out = engine.semi_ar(den, sampler="first-hitting", num_samples=5, window=3, stride=1, rounds=4,
                         mask_id=den.mask_id, generator=torch.Generator().manual_seed(0),
                         on_block=lambda r, new: blocks.append(new.clone()))
    assert out.tokens.shape == (5, 3 + 4 * 1)
    assert torch.equal(torch.cat(blocks, 1), out.tokens)
    # every window (carried prefix + new token) is a configuration the model can produce
    for start in range(0, 5):
        window = out.tokens[:, start:start + 3]
        assert (den.probs[den.index(window)] > 1e-5).all()


def test_semi_ar_target_length_and_prompt(den):
    out = engine.semi_ar(den, sampler="ancestral", steps=20, num_samples=2, window=3, stride=2,
                         target_length=8, prompt=torch.tensor([1, 2]), mask_id=den.mask_id,
                         generator=torch.Generator().manual_seed(0))
    assert out.tokens.shape == (2, 8)
    assert (out.tokens[:, :2] == torch.tensor([1, 2])).all()


def test_bad_arguments_are_user_errors(den):
    with pytest.raises(EngineError, match="unknown sampler"):
        engine.sample(den, sampler="nope", num_samples=1, length=3, mask_id=den.mask_id)
    with pytest.raises(EngineError, match="needs steps"):
        engine.sample(den, sampler="ancestral", num_samples=1, length=3, mask_id=den.mask_id)
    with pytest.raises(EngineError, match="prompt has shape"):
        engine.sample(den, sampler="first-hitting", num_samples=2, length=3, mask_id=den.mask_id,
                      prompt=torch.zeros(4, dtype=torch.long))


def test_cache_refuses_time_conditioned_models(den):
    def timed(z, t):
        return den(z, t)

    timed.time_agnostic = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.sample(timed, sampler="ancestral-cache", num_samples=4, length=3, mask_id=den.mask_id, steps=5)
    assert any("falling back" in str(w.message) for w in caught)


def test_unmask_steps_follow_the_per_step_bernoulli_law():
    """Drawn up front, the step at which a position unmasks has the law of one Bernoulli
    per step with probability (alpha_s - alpha_t) / (1 - alpha_t), the rest left to the end."""
    from mdlm_cli.engine.ancestral import _unmask_steps
    from mdlm_cli.engine.context import SamplerContext, SampleStats
    from mdlm_cli.engine.schedules import get_schedule

    steps, n = 6, 300_000
    schedule = get_schedule("cosine")
    ctx = SamplerContext(None, schedule, 0, torch.Generator().manual_seed(0), SampleStats(), steps=steps)
    times = torch.linspace(1.0, 1e-3, steps + 1, dtype=torch.float64)
    masked = torch.ones(1, n, dtype=torch.bool)
    masked[0, :10] = False  # unmasked positions never count
    at = _unmask_steps(masked, times, ctx)
    assert (at[0, :10] == steps).all()
    p = schedule.unmask_prob(times[:-1], times[1:])
    survive = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(1 - p, 0)])
    expected = torch.cat([survive[:-1] * p, survive[-1:]])  # unmasks at step i, or not before the end
    counts = torch.bincount(at[0, 10:], minlength=steps + 1).double()
    assert chi2_pvalue(counts, expected) > 1e-3


# ----------------------------------------------------------------------------- the inexact fast samplers

class Peaked:
    """Output-mask denoiser: position `sure` puts 0.999 on token 0, the others are uniform over
    the V real tokens; records, per call, the masked positions of the first row."""

    supports_output_mask = True
    time_agnostic = True

    def __init__(self, V: int, sure: list[int]):
        self.V, self.sure, self.seen = V, sure, []

    def __call__(self, z, t, output_mask=None):
        self.seen.append((z[0] == self.V).nonzero()[:, 0].tolist())
        logits = torch.zeros(*z.shape, self.V + 1)
        logits[:, self.sure, 0] = math.log(0.999 * (self.V - 1) / 0.001)
        logits[..., self.V] = -math.inf
        return logits[output_mask]


def test_confidence_reveals_the_most_confident_position_first():
    den = Peaked(V=4, sure=[2])
    tokens, stats = engine.sample(den, sampler="confidence", num_samples=1, length=5, mask_id=4, steps=5,
                                  generator=torch.Generator().manual_seed(0), return_stats=True)
    assert 2 not in den.seen[1]  # revealed by the first call: its drawn token has probability ~0.999
    assert stats.nfe == 5 and stats.ncs == 5 + 4 + 3 + 2 + 1  # a draw at every masked position of every call


def test_threshold_reveals_what_exceeds_it_and_at_least_one():
    den = Peaked(V=4, sure=[0, 3])
    tokens, stats = engine.sample(den, sampler="threshold", num_samples=1, length=5, mask_id=4, threshold=0.9,
                                  generator=torch.Generator().manual_seed(0), return_stats=True)
    assert den.seen[1] and 0 not in den.seen[1] and 3 not in den.seen[1]  # both sure positions at the first call
    assert len(den.seen[1]) == 3 - 0 and stats.nfe == 1 + 3  # then one uniform position per call


@pytest.mark.parametrize("value, nfe", [(0.0, 1), (1.0, 3)])
def test_threshold_zero_reveals_all_at_once_and_one_reveals_one_per_call(den, value, nfe):
    tokens, stats = draw(den, "threshold", n=50, threshold=value)
    assert stats.nfe == nfe and not (tokens == den.mask_id).any()


@pytest.mark.parametrize("k_schedule", ["linear", "cosine"])
def test_confidence_nfe_is_the_steps_that_reveal_something(k_schedule):
    from mdlm_cli.engine.transfer import reveal_counts

    counts = reveal_counts([64, 10, 0], 16, k_schedule)
    assert counts.sum(1).tolist() == [64, 10, 0] and (counts >= 0).all()
    den = Peaked(V=3, sure=[])
    prompt = torch.full((3, 64), 3)
    prompt[1, 10:] = 1  # 10 free positions
    prompt[2] = 2  # none
    _, stats = engine.sample(den, sampler="confidence", num_samples=3, length=64, mask_id=3, steps=16,
                             k_schedule=k_schedule, prompt=prompt, generator=torch.Generator().manual_seed(0),
                             return_stats=True)
    assert stats.sequence_evals == int((counts > 0).sum())  # no call for a sequence that reveals nothing
    if k_schedule == "linear":
        assert (counts > 0).sum(1).tolist() == [16, 10, 0]  # min(steps, masked positions)


@pytest.mark.parametrize("sampler, kw", [("confidence", {"steps": 2}), ("threshold", {"threshold": 0.5}),
                                         ("remdm", {"steps": 30, "eta": 0.2})])
def test_inexact_samplers_keep_the_prompt_fixed(sampler, kw):
    """Fixed positions never change, and remdm never masks them again (checked at every call)."""
    den = AnalyticDenoiser.random(length=4, vocab=3, seed=1)
    prompt = torch.tensor([2, den.mask_id, 0, den.mask_id])

    def checked(z, t, **k):
        assert (z[:, 0] == 2).all() and (z[:, 2] == 0).all()
        return den(z, t, **k)

    tokens, _ = draw(checked, sampler, n=200, length=4, mask_id=den.mask_id, prompt=prompt, **kw)
    assert (tokens[:, 0] == 2).all() and (tokens[:, 2] == 0).all() and not (tokens == den.mask_id).any()


def test_remdm_with_eta_zero_is_ancestral_draw_for_draw():
    """sigma = 0 leaves ReMDM's probabilities MDLM's, and the reveal decisions are drawn as
    ancestral draws them: same tokens (prompt included); the calls are those of ancestral-cache."""
    from mdlm_cli.config import ModelConfig
    from mdlm_cli.engine.schedules import LogLinear
    from mdlm_cli.models import DiffusionDenoiser, DiT

    model = DiT(ModelConfig(hidden_size=32, n_blocks=1, n_heads=2, cond_dim=8, dropout=0.0), 21)
    torch.nn.init.normal_(model.output_layer.linear.weight, std=1.0)
    net = DiffusionDenoiser(model.eval(), LogLinear())
    prompt = torch.full((40,), 20)
    prompt[:4], prompt[25:28] = torch.arange(4), 7
    runs = {s: draw(net, s, n=6, steps=60, length=40, mask_id=20, prompt=prompt, eta=0.0)
            for s in ("ancestral", "ancestral-cache", "remdm")}
    assert torch.equal(runs["remdm"][0], runs["ancestral"][0])
    assert runs["remdm"][1].sequence_evals == runs["ancestral-cache"][1].sequence_evals
    assert runs["remdm"][1].ncs == runs["ancestral"][1].ncs


@pytest.mark.parametrize("remdm_schedule, eta", [("cap", 0.05), ("rescale", 0.5), ("rescale", 1.0)])
def test_remdm_keeps_the_forward_marginals(remdm_schedule, eta):
    """Remasking and its raised reveal probability balance: after the grid from 1 to s, a
    position is masked with probability rate(s) / rate(1) (here 1/2), as without remasking."""
    from mdlm_cli.engine.context import SamplerContext, SampleStats
    from mdlm_cli.engine.remdm import RemdmOptions, remdm
    from mdlm_cli.engine.schedules import LogLinear

    left = []

    def uniform(z, t, output_mask=None):
        assert output_mask.any(1).all()  # NFE: a call only for the sequences that reveal something
        if float(t[0]) == 0.5:  # the final step: what is still masked
            left.append(int(output_mask.sum()))
        return torch.zeros(int(output_mask.sum()), 4)

    uniform.supports_output_mask = True
    stats = SampleStats(num_sequences=4000)
    ctx = SamplerContext(uniform, LogLinear(), 3, torch.Generator().manual_seed(0), stats, steps=40, eps=0.5,
                         options=RemdmOptions(eta=eta, remdm_schedule=remdm_schedule))
    z = remdm(torch.full((4000, 4), 3), ctx)
    n = z.numel()
    assert stats.draws > n - sum(left)  # tokens were remasked and drawn again (the rest: argmax at the end)
    assert abs(sum(left) / n - 0.5) < 4 * math.sqrt(0.25 / n)


@pytest.mark.parametrize("sampler, kw, nfe", [("confidence", {"steps": 2}, 2), ("confidence", {"steps": 5}, 3),
                                              ("threshold", {"threshold": 0.5}, None),
                                              ("remdm", {"steps": 30, "eta": 0.2}, None)])
def test_inexact_samplers_count_the_calls_they_make(den, sampler, kw, nfe):
    """The stats' calls and NFE are the invocations and sequences the denoiser saw; confidence
    makes min(steps, masked positions) calls per sequence, threshold at most one per position,
    remdm at most one per step and the final one."""
    seen = []

    def counted(z, t, **k):
        seen.append(len(z))
        return den(z, t, **k)

    tokens, stats = draw(counted, sampler, n=200, length=den.length, mask_id=den.mask_id, **kw)
    assert not (tokens == den.mask_id).any()
    assert stats.calls == len(seen) and stats.sequence_evals == sum(seen) and stats.num_sequences == 200
    if nfe is not None:
        assert stats.nfe == nfe
    limit = {"threshold": den.length, "remdm": kw.get("steps", 0) + 1}.get(sampler)
    if limit is not None:
        assert 1 <= stats.nfe <= limit
