"""One optimisation step of the training loop (train/loop.py): the global batch's rows,
their diffusion times stratified over the whole batch, each micro-batch's draws from its own
stream seeded by (seed, step, its index in the global batch), the loss's gradients; then the
clipped update and the EMA."""

from __future__ import annotations

import math

import torch

from ..data.dna import rc_augment
from ..distributed import clip_grad_norm, set_gradient_sync
from ..errors import MdlmError
from ..models.anneal import AttentionAnneal, anneal_ratio, set_attention_anneal
from ..runtime import derive_seed, generator
from .optim import lr_at
from .setup import Run


def gradient_step(run: Run, step: int) -> tuple[float, int, float]:
    """One optimisation step over the global batch: (this rank's loss share, tokens, lr).
    Gradients are left in place; `apply_update` applies them after the ranks agree."""
    cfg, tc, dist, device = run.cfg, run.cfg.train, run.dist, run.rt.device
    lr = lr_at(step, cfg)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    rows = run.order.rows(run.state.samples_seen, tc.global_batch_size)
    n_tokens = run.train_split.count(rows)
    t = None
    if run.objective.uses_time:  # stratified over the global batch, then this rank's share
        draw = run.objective.training_times(cfg.diffusion.T, cfg.diffusion.antithetic)
        step_stream = generator(device, derive_seed(tc.seed, "step", step))
        t = draw(tc.global_batch_size, step_stream)[run.mine]
    rows = rows[run.mine]
    loss_sum = 0.0
    for i in range(run.accum):
        sl = slice(i * tc.micro_batch_size, (i + 1) * tc.micro_batch_size)
        # index in the global batch: draws independent of world size
        micro = dist.rank * run.accum + i
        gen = generator(device, derive_seed(tc.seed, "step", step, "micro", micro))
        torch.manual_seed(derive_seed(tc.seed, "dropout", step, micro))
        set_gradient_sync(run.net, i == run.accum - 1)
        if tc.attention_anneal_steps:  # its own stream: the other draws are a plain run's
            set_attention_anneal(run.model, AttentionAnneal(
                anneal_ratio(step, tc.attention_anneal_steps),
                generator(device, derive_seed(tc.seed, "anneal", step, micro))))
        x0, attention_mask, targets = run.train_split.batch_with_targets(rows[sl], device)
        if cfg.data.rc_augment:  # its own stream: the other draws are those of a run without it
            rc_stream = generator(device, derive_seed(tc.seed, "rc", step, micro))
            x0, attention_mask = rc_augment(x0, attention_mask, run.tokenizer.complement,
                                            rc_stream)
        terms = run.objective.training_terms(
            run.denoiser,
            x0,
            None if t is None else t[sl],
            generator=gen,
            attention_mask=attention_mask,
            targets=targets,
        )
        loss = terms.sum() / n_tokens
        loss.backward()
        loss_sum += loss.item()
    return loss_sum, n_tokens, lr


def apply_update(run: Run, step: int, loss: float) -> float | None:
    """Clip, apply and clear the gradients, update the EMA; returns the gradient norm."""
    grad_clip = run.cfg.optim.grad_clip
    grad_norm = clip_grad_norm(run.model.parameters(), grad_clip) if grad_clip > 0 else None
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    if run.ema is not None:
        run.ema.update(run.model)
    if not math.isfinite(loss):
        raise MdlmError(f"the loss became {loss} at step {step}; lower optim.lr or check "
                        "the data")
    return None if grad_norm is None else float(grad_norm)
