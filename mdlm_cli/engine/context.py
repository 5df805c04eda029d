"""What every sampler shares: the work counters and the per-run context."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor

from .categorical import sample_tokens, sample_tokens_with_probs, sample_tokens_with_weights
from .diffusion import call_denoiser, subs_log_score
from .errors import EngineError
from .guidance import guided_logits
from .protocols import Denoiser, score_method
from .schedules import Schedule


@dataclass
class SampleStats:
    """Work counters. NFE and NCS are per sequence (means over the samples)."""

    num_sequences: int = 0
    calls: int = 0  # batched denoiser invocations
    sequence_evals: int = 0  # sequences evaluated, summed over calls
    draws: int = 0  # categorical draws over the vocabulary (one per drawn position)

    @property
    def nfe(self) -> float:
        return self.sequence_evals / max(self.num_sequences, 1)

    @property
    def ncs(self) -> float:
        return self.draws / max(self.num_sequences, 1)

    def merge(self, other: SampleStats) -> None:
        """Add the work of `other` (more calls on the same sequences, e.g. a semi-AR block)."""
        for f in fields(self):
            if f.name != "num_sequences":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict:
        return {**asdict(self), "nfe": self.nfe, "ncs": self.ncs}


@dataclass
class SamplerContext:
    denoiser: Denoiser
    schedule: Schedule
    mask_id: int
    generator: torch.Generator | None
    stats: SampleStats
    steps: int = 1000
    precision: str = "fp64"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # vocabulary top-k (0: every token), after top_p (categorical.py)
    # the sampler's own options: an instance of its spec's options dataclass (None where it
    # has none), checked before the run (engine/options.py), e.g. `ctx.options.final_denoise`
    options: Any = None
    eps: float = 1e-5  # last time of the ancestral grid, as the reference
    # caching samplers report, per batch, the steps at which any sequence changed and the number
    # of steps run with a mask left (for benchmarks: what a whole-batch cache would have cost)
    on_changes: Callable[[list[int], int], None] | None = None
    # a `RevealRecorder` (reveals.py): the samplers that record (`SamplerSpec.records_reveals`)
    # hand it each draw's positions, logits and tokens; None: nothing recorded
    recorder: Any = None
    # sees the batch's whole state z (B, L) before each network call, and once after its last
    # (sampling.py; generation/decode.py's events); it may raise to stop the run
    on_step: Callable[[Tensor], None] | None = None
    # classifier-free guidance (guidance.py): its scale (0: off), and the batch's prompt
    # positions (B, L) bool, what the unconditional half masks (set per batch: sampling.py)
    cfg_scale: float = 0.0
    prompt: Tensor | None = None

    def count_call(self, z: Tensor, rows: int) -> None:
        """One network call over `rows` of the batch whose state is `z`: counted, and shown to
        `on_step`."""
        if self.on_step is not None:
            self.on_step(z)
        self.stats.calls += 1
        self.stats.sequence_evals += rows

    def _select(self, z: Tensor, t: Tensor, positions: Tensor | None, rows: Tensor | None):
        """Count one network call over the sequences `rows` (all if None) and select them."""
        if rows is not None and len(rows) == len(z):
            rows = None
        n = len(z) if rows is None else len(rows)
        self.count_call(z, 2 * n if self.cfg_scale else n)  # guided: one call of twice the rows
        t = t.expand(len(z)) if t.dim() == 0 else t
        if rows is not None:
            z, t = z[rows], t[rows]
            positions = None if positions is None else positions[rows]
        return z, t, positions

    def _call(self, z: Tensor, t: Tensor, positions: Tensor | None,
              rows: Tensor | None) -> Tensor:
        """The selected rows' logits, under guidance where it is on."""
        if not self.cfg_scale:
            return call_denoiser(self.denoiser, z, t.float(), output_mask=positions)
        prompt = (self.prompt if rows is None or len(rows) == len(self.prompt)
                  else self.prompt[rows])
        return guided_logits(self.denoiser, z, t.float(), prompt=prompt, scale=self.cfg_scale,
                             mask_id=self.mask_id, output_mask=positions)

    def logits(
        self, z: Tensor, t: Tensor, positions: Tensor | None, rows: Tensor | None = None
    ) -> Tensor:
        """Logits (N, V) at the True entries of `positions[rows]` (all positions if None) for
        the sequences `rows` (all if None); t is one time for all or one per sequence."""
        chosen = rows
        z, t, positions = self._select(z, t, positions, rows)
        with torch.no_grad():
            return self._call(z, t, positions, chosen)

    def log_score(
        self, z: Tensor, t: Tensor, positions: Tensor, rows: Tensor | None = None
    ) -> Tensor:
        """Log concrete scores (N, V) at the masked positions `positions[rows]`: the
        denoiser's own `log_score(z_t, t, output_mask=)` where it has one (a score model:
        SEDD), else its logits read as SUBS's p_theta and converted (`subs_log_score`)."""
        chosen = rows
        z, t, positions = self._select(z, t, positions, rows)
        scorer = score_method(self.denoiser)
        with torch.no_grad():
            if scorer is not None:
                if self.cfg_scale:
                    raise EngineError("cfg_scale guides a model's logits; a score model's own "
                                      "log-scores (SEDD) take no guidance")
                return scorer(z, t.float(), output_mask=positions)
            logits = self._call(z, t, positions, chosen)
            log_k = (self.schedule.log_odds(t.double())[:, None]
                     .expand(positions.shape)[positions])
            return subs_log_score(logits, log_k, self.mask_id)

    def refresh_cache(self, z: Tensor, cache: Any, rows: Tensor | None) -> Tensor:
        """One full pass over the sequences `rows` (all if None; a `BlockCached` denoiser's):
        logits (R, L, V), their keys and values kept in `cache`."""
        z = self._count_rows(z, rows)
        with torch.no_grad():
            return self.denoiser.block_cache(z, cache, rows)[0]

    def cached_logits(self, z: Tensor, cache: Any, rows: Tensor | None, start: int,
                      end: int) -> Tensor:
        """Logits (R, end - start, V) of positions [start, end) of the sequences `rows` (all if
        None), the other positions read from `cache`."""
        z = self._count_rows(z, rows)
        with torch.no_grad():
            return self.denoiser.from_cache(z[:, start:end], cache, start, rows)

    def _count_rows(self, z: Tensor, rows: Tensor | None) -> Tensor:
        self.count_call(z, len(z) if rows is None else len(rows))
        return z if rows is None else z[rows]

    @property
    def filters(self) -> dict[str, Any]:
        """The temperature and the top-p / top-k filters every draw of the run applies."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}

    def _draw_settings(self) -> dict[str, Any]:
        """How every categorical draw of the run is made: its stream, precision and filters."""
        return {
            "generator": self.generator,
            "precision": self.precision,
            **self.filters,
        }

    def draw(self, logits: Tensor, where: Any = None) -> Tensor:
        """Tokens drawn from `logits` (N, V); `where` (the N positions in (B, L): a bool mask
        or an index) is for the recorder, if any."""
        self.stats.draws += logits.shape[0]
        tokens = sample_tokens(logits, self.mask_id, **self._draw_settings())
        self.record(where, logits, tokens)
        return tokens

    def record(self, where: Any, logits: Tensor, tokens: Tensor) -> None:
        """Tell the recorder (if any) the tokens chosen at `where` from these logits."""
        if self.recorder is not None and where is not None:
            self.recorder.record(where, logits, tokens, mask_id=self.mask_id, **self.filters)

    def draw_with_probs(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """`draw`, and the probability of each drawn token (float64) under the distribution
        drawn from."""
        self.stats.draws += logits.shape[0]
        return sample_tokens_with_probs(logits, self.mask_id, **self._draw_settings())

    def draw_with_weights(
        self, logits: Tensor, untempered: bool = False
    ) -> tuple[Tensor, Tensor]:
        """`draw`, and the weights (N, V) drawn from (`untempered`: the untempered softmax's)."""
        self.stats.draws += logits.shape[0]
        return sample_tokens_with_weights(logits, self.mask_id, untempered=untempered,
                                          **self._draw_settings())

    def rand(self, shape, device) -> Tensor:
        return torch.rand(shape, generator=self.generator, device=device, dtype=torch.float64)


def rows_active(span: Tensor, span_host: list[int], i: int) -> Tensor | None:
    """The rows b with i < span[b] (B,), None when all are. `span_host` (the same values,
    read once) gives their number, so the device is not waited for at each step."""
    count = sum(i < s for s in span_host)
    return None if count == len(span_host) else torch.nonzero_static(span > i, size=count)[:, 0]
