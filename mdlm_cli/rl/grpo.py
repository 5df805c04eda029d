"""Group-relative policy optimisation (GRPO, Shao et al. 2024, DeepSeekMath §4.1) over
per-token log-probability estimates (estimators.py): the group advantages, the clipped-ratio
policy loss and the k3 KL to the reference, as d1 writes them (dllm-reasoning/d1,
diffu-grpo/diffu_grpo_trainer.py, `DiffuGRPOTrainer.compute_loss` and
`_generate_and_score_completions`).

Rows are laid out group by group: a prompt's G completions are G consecutive rows (TRL's
`repeat_interleave` order, `rewards.view(-1, G)`).

Why not TRL's `GRPOTrainer`: it is a `transformers.Trainer` around an autoregressive HF
model (its generation, its `_get_per_token_logps` reading causal logits, accelerate, its own
loop, logging and checkpoints); d1 and DiffuCoder each subclass it and override most of it
(the generation, the log-probabilities, the loss). mdlm has its own loop (run folders,
resume, time budget, JSONL logs), samplers and denoisers, so none of the trainer fits; its
loss is a few tensor lines, written here against d1's so that both normalisations can be
named and tested, and TRL need not be a dependency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import MdlmError

NORMS = ("token", "sequence")


def group_advantages(rewards: Tensor, group_size: int, *, scale: bool = False,
                     eps: float = 1e-4) -> Tensor:
    """(N,) advantages of N = groups x `group_size` rewards: each reward minus its group's
    mean (d1: no division by the std, "advantages = rewards - mean_grouped_rewards"); with
    `scale`, divided by the group's std + `eps` (DeepSeekMath's normalisation, TRL's
    `scale_rewards`; the std is torch's unbiased one, as TRL's `.std(dim=1)`, and `eps` TRL's
    1e-4). A group whose rewards are all equal has advantage 0: it teaches nothing."""
    rewards = rewards.float()
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise MdlmError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size)
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped)
        advantages = advantages / (std + eps)
    return advantages.reshape(-1)


def k3_kl(new: Tensor, ref: Tensor, kl_max: float = 0.0) -> Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref) (Schulman's "Approximating KL
    divergence"; DeepSeekMath eq. 4): exp(ref - new) - (ref - new) - 1, >= 0, zero where
    new == ref. With `kl_max` > 0 each token's term is bounded there (verl's `low_var_kl`
    bounds it at 10): a token the policy has pushed far below the reference then stops
    pulling, where the exponential would overflow the loss (d1 and TRL do not bound it)."""
    delta = ref - new
    if kl_max > 0:
        delta = delta.clamp(-20.0, 20.0)  # exp stays finite; bounded below anyway
        return (torch.exp(delta) - delta - 1).clamp(max=kl_max)
    return torch.exp(delta) - delta - 1


@dataclass(frozen=True)
class GrpoTerms:
    """The loss's settings: the PPO clip epsilon, the KL weight beta, the normalisation
    (`NORMS`) and the bound of each token's k3 term (`kl_max`, 0: none, d1's)."""

    clip: float = 0.5
    beta: float = 0.04
    norm: str = "token"
    kl_max: float = 10.0

    def validate(self) -> GrpoTerms:
        if self.norm not in NORMS:
            raise MdlmError(f"norm must be one of: {', '.join(NORMS)} (got {self.norm!r})")
        if not self.clip > 0:
            raise MdlmError(f"clip must be positive (got {self.clip})")
        if not self.kl_max >= 0:
            raise MdlmError(f"kl_max must be at least 0 (got {self.kl_max}; 0: unbounded)")
        return self


@dataclass(frozen=True)
class GrpoStats:
    """What the loss reports (plain floats, for the JSONL log), every one a token mean over the
    scored tokens, as d1 logs them (`clip_ratio`, `kl`)."""

    policy: float  # the clipped surrogate's loss alone, -min(r A, clip(r) A)
    kl: float  # the k3 KL to the reference (0 without a reference)
    clip_fraction: float  # tokens whose clipped term is the active one (no gradient)
    ratio: float  # the mean ratio exp(new - old)
    tokens: int  # scored tokens in the batch


def scored_through_eos(tokens: Tensor, completion: Tensor,
                       eos_id: int | Sequence[int]) -> Tensor:
    """(B, L) bool: the completion up to and including its first EOS (all of it without one):
    d1's and DiffuCoder's `completion_mask` ("mask everything after the first EOS token"), the
    EOS itself scored so the policy learns where to stop. `eos_id`: an id, or the ids that each
    end a completion (EOS and a chat model's end of turn)."""
    completion = completion.bool()
    ids = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id),
                       device=tokens.device)
    eos = completion & torch.isin(tokens, ids)  # any of the ids ends it (a chat turn's end)
    seen_before = (torch.cumsum(eos.int(), dim=1) - eos.int()) > 0  # an EOS earlier in the row
    return completion & ~seen_before


def _reduce(per_token: Tensor, scored: Tensor, norm: str) -> Tensor:
    weights = scored.to(per_token.dtype)
    if norm == "token":
        return (per_token * weights).sum() / weights.sum().clamp_min(1.0)
    per_row = (per_token * weights).sum(1) / weights.sum(1).clamp_min(1.0)
    return per_row.mean()


def grpo_loss(new: Tensor, old: Tensor | None, ref: Tensor | None, advantages: Tensor,
              scored: Tensor, terms: GrpoTerms | None = None) -> tuple[Tensor, GrpoStats]:
    """The GRPO loss of one inner iteration and its stats.

    `new`, `old`, `ref`: (B, L) per-token log-probability estimates under the policy (with
    gradient), the policy that drew the rollouts and the reference, from one estimator with
    one seed; `old` None means the first iteration (mu = 1), where d1 and TRL use
    `new.detach()` (ratio 1, the gradient that of log p); `ref` None needs `beta = 0`.
    `advantages` (B,) (`group_advantages`), `scored` (B, L) bool: the tokens the loss counts
    (`scored_through_eos`); `terms` clip, beta, norm and kl_max (`GrpoTerms()` by default).
    Per token, as d1's `compute_loss` (but for the bound kl_max, which d1 does not have):

        r = exp(new - old)
        loss_i = -min(r A, clip(r, 1 - clip, 1 + clip) A) + beta * min(k3(new, ref), kl_max)

    reduced by `norm`: "token" (d1's and DiffuCoder's `(loss * mask).sum() / mask.sum()`, one
    mean over every scored token of the batch, TRL's `loss_type="bnpo"`) or "sequence" (each
    row's mean, then the mean over rows: DeepSeekMath's eq. 3, TRL's `loss_type="grpo"`).

    The clip fraction counts the tokens where the clipped term is active, r < 1 - clip with
    A < 0 or r > 1 + clip with A > 0 (DiffuCoder's and TRL's `is_region_clipped`). d1 logs
    `per_token_loss1 < per_token_loss2` instead: the tokens outside the range on the side
    where the unclipped term wins, not the clipped ones.
    """
    terms = (terms or GrpoTerms()).validate()
    clip, beta, norm = terms.clip, terms.beta, terms.norm
    if ref is None and beta != 0:
        raise MdlmError(f"beta {beta} needs the reference's log-probabilities; pass ref= or "
                        "set beta to 0")
    if advantages.shape != new.shape[:1] or scored.shape != new.shape:
        raise MdlmError(f"advantages {tuple(advantages.shape)} and scored {tuple(scored.shape)} "
                        f"do not fit log-probabilities {tuple(new.shape)}")
    scored = scored.bool()
    old = new.detach() if old is None else old
    ratio = torch.exp(new - old)
    a = advantages.to(new.dtype)[:, None]
    unclipped, clipped = ratio * a, torch.clamp(ratio, 1 - clip, 1 + clip) * a
    policy = -torch.min(unclipped, clipped)
    kl = k3_kl(new, ref, terms.kl_max) if ref is not None else torch.zeros_like(new)
    loss = _reduce(policy + beta * kl if beta else policy, scored, norm)
    region = ((ratio < 1 - clip) & (a < 0)) | ((ratio > 1 + clip) & (a > 0))
    with torch.no_grad():
        stats = GrpoStats(policy=float(_reduce(policy, scored, "token")),
                          kl=float(_reduce(kl, scored, "token")),
                          clip_fraction=float(_reduce(region.float(), scored, "token")),
                          ratio=float(_reduce(ratio, scored, "token")),
                          tokens=int(scored.sum()))
    return loss, stats
