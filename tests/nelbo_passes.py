"""MDLM's NELBO over a split as the objectives' `evaluate` sums it (`bound.sharded_sum` of
`engine.diffusion.nelbo_terms` at `bound.diffusion_times`), for tests whose denoiser is not a
backbone (an analytic one) or that reduce across ranks."""

from mdlm_cli.engine.diffusion import Masking, nelbo_terms
from mdlm_cli.objectives.bound import BoundResult, SplitSweep, diffusion_times, sharded_sum
from mdlm_cli.runtime import derive_seed


def nelbo_pass(denoiser, split, *, schedule, mask_id: int, batch_size: int, device, seed: int = 0,
               T: int = 0, rank: int = 0, world_size: int = 1) -> BoundResult:
    def terms(x0, t, gen, attention_mask, targets=None):
        masking = Masking(generator=gen, attention_mask=attention_mask, targets=targets)
        return nelbo_terms(denoiser, x0, t, mask_id=mask_id, schedule=schedule, T=T, masking=masking)

    sweep = SplitSweep(batch_size, device, rank=rank, world_size=world_size)
    return sharded_sum(terms, split, sweep, seed=seed, draw_times=diffusion_times(schedule, T), T=T)


def nelbo_passes(denoiser, split, *, mc_samples: int, seed: int = 0, **kw) -> list[BoundResult]:
    """`mc_samples` passes seeded as `mdlm eval-ppl` seeds them."""
    return [nelbo_pass(denoiser, split, seed=derive_seed(seed, "eval-ppl", k), **kw)
            for k in range(mc_samples)]
