"""GRPO's pieces on hand-computed numbers: group advantages (mean-centred, std scaling
optional), the clipped-ratio loss and its clip fraction, the k3 KL, both normalisations,
and d1's EOS rule for the scored tokens."""

import math

import pytest
import torch

from mdlm_cli.errors import MdlmError
from mdlm_cli.rl import GrpoTerms, group_advantages, grpo_loss, k3_kl, scored_through_eos


def test_group_advantages_centre_each_group_and_scale_only_when_asked():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    torch.testing.assert_close(group_advantages(rewards, 4),
                               torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    std = math.sqrt(1 / 3)  # the unbiased std of 1, 0, 0, 1
    scaled = group_advantages(rewards, 4, scale=True, eps=1e-4)
    torch.testing.assert_close(scaled[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-4))
    assert (scaled[4:] == 0).all()  # an all-equal group teaches nothing, scaled or not
    with pytest.raises(MdlmError, match="7 rewards do not split into groups of 4"):
        group_advantages(rewards[:7], 4)


def test_k3_on_hand_numbers():
    new, ref = torch.log(torch.tensor([0.5, 0.2])), torch.log(torch.tensor([0.25, 0.2]))
    # ref - new = log 0.5: exp = 0.5, 0.5 - log 0.5 - 1
    torch.testing.assert_close(k3_kl(new, ref), torch.tensor([0.5 + math.log(2) - 1, 0.0]))
    assert (k3_kl(torch.randn(100), torch.randn(100)) >= 0).all()


def ratios_case():
    """Row 0 has advantage +1, row 1 -1; their ratios exp(new - old) 1, 2, 0.25 and 1, 0.25, 2.
    With clip 0.5, per token -min(r A, clip(r) A): row 0 -1, -1.5 (clipped), -0.25; row 1 1,
    0.5 (clipped), 2."""
    old = torch.zeros(2, 3)
    new = torch.log(torch.tensor([[1.0, 2.0, 0.25], [1.0, 0.25, 2.0]])).requires_grad_()
    return new, old, torch.tensor([1.0, -1.0])


def test_clipped_ratio_loss_token_mean_and_clip_fraction():
    new, old, adv = ratios_case()
    scored = torch.ones(2, 3, dtype=torch.bool)
    loss, stats = grpo_loss(new, old, None, adv, scored, GrpoTerms(clip=0.5, beta=0.0))
    per_token = [-1, -1.5, -0.25, 1, 0.5, 2]
    assert loss.item() == pytest.approx(sum(per_token) / 6)
    assert stats.policy == pytest.approx(sum(per_token) / 6)
    assert stats.clip_fraction == pytest.approx(2 / 6)  # the two clipped tokens, not the others
    assert stats.kl == 0.0 and stats.tokens == 6
    loss.backward()
    # where the clipped term is active the token has no gradient
    assert new.grad[0, 1] == 0 and new.grad[1, 1] == 0
    # elsewhere d(-r A)/d new = -r A / 6
    assert new.grad[0, 2].item() == pytest.approx(-0.25 / 6)
    assert new.grad[1, 2].item() == pytest.approx(2.0 / 6)


def test_sequence_and_token_normalisations_differ_as_defined():
    new, old, adv = ratios_case()
    scored = torch.tensor([[True, True, False], [True, True, True]])
    token, _ = grpo_loss(new, old, None, adv, scored, GrpoTerms(beta=0.0, norm="token"))
    seq, _ = grpo_loss(new, old, None, adv, scored, GrpoTerms(beta=0.0, norm="sequence"))
    assert token.item() == pytest.approx((-1 - 1.5 + 1 + 0.5 + 2) / 5)
    assert seq.item() == pytest.approx(((-1 - 1.5) / 2 + (1 + 0.5 + 2) / 3) / 2)


def test_kl_term_adds_beta_times_k3_over_the_scored_tokens():
    new = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5], [0.5, 0.125]]))
    scored = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([1.0, -1.0])
    loss, stats = grpo_loss(new, None, ref, adv, scored, GrpoTerms(clip=0.5, beta=0.04))
    k = k3_kl(new, ref)
    kl = (k[0, 0] + k[0, 1] + k[1, 0]).item() / 3
    # old = new.detach(): ratio 1, so the policy term is -A per token
    assert loss.item() == pytest.approx((-1 - 1 + 1) / 3 + 0.04 * kl)
    assert stats.kl == pytest.approx(kl) and stats.ratio == pytest.approx(1.0)


def test_kl_max_bounds_each_tokens_k3_and_stops_its_pull_there():
    """A token the policy pushed 100 nats below the reference: unbounded, k3 overflows float32
    (d1's form, kl_max 0); bounded at 10 the term is 10 with no gradient, and the tokens under
    the bound keep their exact k3 and its gradient."""
    ref = torch.tensor([[-1.0, -1.0]])
    new = torch.tensor([[-101.0, -1.5]], requires_grad=True)
    assert not torch.isfinite(k3_kl(new, ref, 0.0)[0, 0])  # exp(100) in float32: inf
    bounded = k3_kl(new, ref, 10.0)
    assert bounded[0, 0].item() == 10.0
    assert bounded[0, 1].item() == pytest.approx(math.exp(0.5) - 0.5 - 1, rel=1e-6)
    bounded.sum().backward()
    assert new.grad[0, 0] == 0  # no pull past the bound
    assert new.grad[0, 1].item() == pytest.approx(-(math.exp(0.5) - 1), rel=1e-5)
    scored = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = grpo_loss(new, None, ref, torch.tensor([1.0]), scored, GrpoTerms(kl_max=0.0))
    assert not torch.isfinite(loss)
    loss, stats = grpo_loss(new, None, ref, torch.tensor([1.0]), scored)  # default: bounded
    assert torch.isfinite(loss) and stats.kl == pytest.approx((10 + bounded[0, 1].item()) / 2)
    with pytest.raises(MdlmError, match="kl_max must be at least 0"):
        grpo_loss(new, None, ref, torch.tensor([1.0]), scored, GrpoTerms(kl_max=-1.0))


def test_loss_refuses_what_it_cannot_compute():
    new, old, adv = ratios_case()
    scored = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(MdlmError, match="beta 0.04 needs the reference"):
        grpo_loss(new, old, None, adv, scored)
    with pytest.raises(MdlmError, match="norm must be one of: token, sequence"):
        grpo_loss(new, old, None, adv, scored, GrpoTerms(beta=0.0, norm="row"))
    with pytest.raises(MdlmError, match="do not fit"):
        grpo_loss(new, old, None, adv[:1], scored, GrpoTerms(beta=0.0))


def test_scored_through_eos_keeps_the_first_eos_and_nothing_after():
    EOS = 9
    tokens = torch.tensor([[1, 2, 3, EOS, 4, EOS], [1, EOS, 3, 4, 5, 6]])
    completion = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    got = scored_through_eos(tokens, completion, EOS)
    # row 1's EOS sits in the prompt: it ends nothing; its completion has none, so all of it
    assert got.tolist() == [[False, False, True, True, False, False],
                            [False, False, True, True, True, True]]


def test_any_end_id_ends_the_scored_completion():
    """A chat model's completion ends at its end-of-turn token as at EOS (Policy.end_ids):
    nothing after the first of them is scored."""
    EOT, EOS = 7, 9
    tokens = torch.tensor([[1, 2, 3, EOT, 4, EOS]])
    completion = torch.tensor([[0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    assert scored_through_eos(tokens, completion, (EOS, EOT)).tolist() == [
        [False, False, True, True, False, False]]
    assert scored_through_eos(tokens, completion, EOS).tolist() == [
        [False, False, True, True, True, True]]
