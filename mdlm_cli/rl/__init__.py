"""Reinforcement learning for masked diffusion LMs (issue 53): the pieces `mdlm rl`'s loop
calls, each a plain function over tensors or strings (docs/rl.md).

    from mdlm_cli import rl
    seeds = rl.iteration_seeds(mu)                     # one mask seed per inner iteration
    new = rl.estimate("d1", policy_logits, tokens, completion, mask_id=m, seed=seeds[i])
    loss, stats = rl.grpo_loss(new.logp, old, ref, advantages, scored, rl.GrpoTerms())
    reward = rl.load_reward(["2*exact", "0.5*format:^\\d+$"])

estimators.py: per-token log-probabilities of a completion (`ESTIMATORS`: d1, coupled,
elbo); grpo.py: group advantages, the clipped-ratio loss, k3 KL; rewards.py: built-in and
user rewards (`REWARDS`, `load_reward`); tasks.py: the generated digit-addition task.
"""

from .estimators import (
    ESTIMATORS,
    Estimate,
    EstimatorSpec,
    denoiser_logits,
    estimate,
    estimator_options,
    get_estimator,
    iteration_seeds,
)
from .grpo import GrpoStats, GrpoTerms, group_advantages, grpo_loss, k3_kl, scored_through_eos
from .rewards import REWARDS, Reward, extract_answer, load_reward
from .tasks import AdditionTask, addition_splits, exact_match, write_addition_task

__all__ = [
    "ESTIMATORS", "REWARDS", "AdditionTask", "Estimate", "EstimatorSpec", "GrpoStats",
    "GrpoTerms", "Reward",
    "addition_splits", "denoiser_logits", "estimate", "estimator_options", "exact_match",
    "extract_answer", "get_estimator", "group_advantages", "grpo_loss", "iteration_seeds",
    "k3_kl", "load_reward", "scored_through_eos", "write_addition_task",
]
