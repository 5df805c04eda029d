"""LLaDA's classifier-free guidance (engine/guidance.py): the combination un + (s + 1)(cond -
un) of one call on z and on z with the prompt masked; scale 0 is no guidance; NFE counts one
call of twice the rows; sampling, scoring and the refusals."""

import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.engine.guidance import guided_logits
from mdlm_cli.engine.settings import SettingsError
from mdlm_cli.errors import MdlmError
from mdlm_cli.eval.lm_eval.scoring import ConditionalScorer
from tests.open_model_folders import write_llada

L, V = 12, 7
MASK = V - 1


class Seen:
    """Logits that depend on how many prompt tokens a row can see (the unconditional half
    sees none), recording each call's rows."""

    time_agnostic, supports_output_mask = True, True

    def __init__(self):
        self.rows = []

    def __call__(self, z, t, output_mask=None, attention_mask=None):
        self.rows.append(len(z))
        visible = (z[:, :3] != MASK).sum(1).float()  # the prompt is the first 3 positions
        logits = torch.arange(V).float() * (1 + visible)[:, None, None] + z[..., None] * 0.1
        logits = logits.expand(len(z), z.shape[1], V).clone()
        return logits if output_mask is None else logits[output_mask]


def test_the_combination_is_llada_s():
    den = Seen()
    z = torch.full((2, L), MASK)
    z[:, :3] = torch.tensor([1, 2, 3])
    prompt = z != MASK
    cond = den(z, torch.ones(2))
    un = den(z.masked_fill(prompt, MASK), torch.ones(2))
    for s in (0.0, 0.5, 2.0):
        out = guided_logits(den, z, torch.ones(2), prompt=prompt, scale=s, mask_id=MASK)
        torch.testing.assert_close(out, un + (s + 1) * (cond - un))
    torch.testing.assert_close(guided_logits(den, z, torch.ones(2), prompt=prompt, scale=0.0,
                                             mask_id=MASK), cond)  # scale 0: the model's own
    positions = z == MASK
    masked = guided_logits(den, z, torch.ones(2), prompt=prompt, scale=0.5, mask_id=MASK,
                           output_mask=positions)
    full = guided_logits(den, z, torch.ones(2), prompt=prompt, scale=0.5, mask_id=MASK)
    torch.testing.assert_close(masked, full[positions])


def sample(den, cfg_scale: float, sampler: str = "confidence"):
    prompt = torch.full((L,), MASK)
    prompt[:3] = torch.tensor([1, 2, 3])
    how = engine.SamplingSettings(sampler, 3, temperature=0.0, cfg_scale=cfg_scale)
    return engine.sample(den, how, engine.Canvas(2, L, MASK, prompt), return_stats=True,
                         generator=torch.Generator().manual_seed(0))


def test_guided_sampling_calls_twice_the_rows_once_and_zero_is_off():
    plain, guided = Seen(), Seen()
    tokens0, stats0 = sample(plain, 0.0)
    tokens2, stats2 = sample(guided, 2.0)
    assert stats2.calls == stats0.calls and stats2.sequence_evals == 2 * stats0.sequence_evals
    assert all(n == 4 for n in guided.rows) and all(n == 2 for n in plain.rows)
    assert stats2.nfe == 2 * stats0.nfe  # NFE: sequence evaluations per sequence
    assert (tokens2[:, :3] == torch.tensor([1, 2, 3])).all()
    how = engine.SamplingSettings("confidence", 3, temperature=0.0)  # no cfg_scale given
    prompt = torch.full((L,), MASK)
    prompt[:3] = torch.tensor([1, 2, 3])
    unset = engine.sample(Seen(), how, engine.Canvas(2, L, MASK, prompt),
                          generator=torch.Generator().manual_seed(0))
    assert torch.equal(unset, tokens0)  # 0 is off: the same path, bit for bit


def test_what_guidance_cannot_apply_to_is_refused_with_the_settings():
    with pytest.raises(SettingsError, match="cfg_scale needs cache none"):
        engine.SamplingSettings("confidence", 4, cfg_scale=1.0,
                                options={"cache": "dual", "block_length": 4}).validate()
    with pytest.raises(SettingsError, match="does not apply to autoregressive-kv-cache"):
        engine.SamplingSettings("autoregressive-kv-cache", cfg_scale=1.0).validate()
    with pytest.raises(SettingsError, match="cfg_scale must be a finite number at least 0"):
        engine.SamplingSettings("confidence", 4, cfg_scale=-1.0).validate()


def test_guided_scoring_masks_the_context_in_the_other_half(tmp_path):
    loaded = load_checkpoint(str(write_llada(tmp_path / "llada")))
    pair = ([5, 17, 3, 9], [40])  # one token: the l estimator is exact, the passes equal
    plain = ConditionalScorer(loaded, mc_samples=2).score([pair], greedy=False)[0].passes
    zero = ConditionalScorer(loaded, mc_samples=2, cfg_scale=0.0).score([pair],
                                                                       greedy=False)[0].passes
    guided = ConditionalScorer(loaded, mc_samples=2, cfg_scale=0.5).score([pair],
                                                                         greedy=False)[0].passes
    assert zero == plain and guided != plain and guided[0] == pytest.approx(guided[1])
    from .test_lm_scoring import loaded_model

    with pytest.raises(MdlmError, match="cfg_scale does not apply to a ar model"):
        ConditionalScorer(loaded_model("ar"), cfg_scale=1.0)
