"""The fine-tuning loop GLUE and Genomic Benchmarks share: it stops after total_steps (mid-epoch
for fractional epochs), sets the task's learning rate before every step, and keeps the weights
of the best evaluated epoch."""

import math

import torch

from mdlm_cli.tasks.finetune import FitPlan, epochs_for, fit
from mdlm_cli.train.optim import warmup_cosine


def tiny():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def data(n_batches=2):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g))
            for _ in range(n_batches)]


def mse(model, batch):
    return torch.nn.functional.mse_loss(model(batch[0]), batch[1])


def test_it_stops_mid_epoch_at_total_steps_with_the_tasks_learning_rates():
    model, steps, rates = tiny(), [], []

    def lr_at(step):
        rates.append(step)
        return 0.1 * (1 - step / 5)

    assert epochs_for(5, 2) == 3
    plan = FitPlan(epochs=3, total_steps=5, lr_at=lr_at, weight_decay=0.0, grad_clip=1.0)
    result = fit(model, lambda: iter(data()), mse, plan, on_step=lambda s, t, loss: steps.append((s, t)))
    assert steps == [(i, 5) for i in range(1, 6)]
    assert rates[1:] == [0, 1, 2, 3, 4]  # rates[0]: the optimizer's start
    assert result.best_epoch is None and math.isfinite(result.last_epoch_loss)


def test_the_best_epoch_is_kept():
    model, scores, snapshots = tiny(), iter([0.1, 0.9, 0.5, 0.9]), []

    def evaluate(m):
        snapshots.append(m.weight.detach().clone())
        return next(scores)

    plan = FitPlan(epochs=4, total_steps=8,
                   lr_at=lambda s: warmup_cosine(s, lr=0.05, warmup=2, total=8, min_lr_ratio=0.1),
                   weight_decay=0.1, grad_clip=0.0)
    result = fit(model, lambda: iter(data()), mse, plan, evaluate=evaluate)
    assert (result.best_score, result.best_epoch) == (0.9, 2)  # the first of equals
    assert torch.equal(model.weight, snapshots[1]) and not torch.equal(snapshots[1], snapshots[3])
