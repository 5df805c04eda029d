"""What an objective is: everything that follows from "what is this model trained to do"."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from ..data.store import TokenSplit
from ..engine.diffusion import Masking, call_denoiser, without_mask
from ..engine.sampling import SamplerSpec, get_sampler
from ..engine.schedules import get_schedule
from ..errors import MdlmError
from .bound import BoundResult, SplitSweep, diffusion_times, sharded_sum

# how a diffusion model's bound is estimated: "t" draws times (engine.nelbo's), "l" masked
# counts (LLaDA's; engine/counted.py)
ESTIMATORS = ("t", "l")

if TYPE_CHECKING:
    from ..config import Config
    from ..data.tokenizers import Tokenizer


@dataclass
class SamplerChoice:
    spec: SamplerSpec
    steps: int | None  # None for a sampler without steps
    note: str = ""  # how an unnamed sampler was chosen
    ignored: dict[str, Any] = field(
        default_factory=dict
    )  # asked-for settings the sampler does not read


class Objective(ABC):
    """One training objective. The train loop, `eval-ppl`, `gen-ppl`, checkpoint loading and
    every command ask the loaded objective instead of branching on its name.

    Class attributes say what the objective is; an instance is bound to a run's config and
    tokeniser (the mask and BOS ids).
    """

    name: ClassVar[str]
    causal: ClassVar[bool] = False  # the backbone attends only to earlier positions
    exact: ClassVar[bool] = (
        False  # evaluation is an exact likelihood, not a bound (one pass is enough)
    )
    # positions the training pass runs per row token (bd3lm: 2, its input is x_t ⊕ x_0): what
    # the model FLOPs (MFU) and the memory check count
    pass_factor: ClassVar[int] = 1
    # what an exact likelihood conditions a row's first scored token on (eval-ppl's footnote)
    first_token_context: ClassVar[str] = "the first given BOS"
    # training and evaluation draw a diffusion time per sequence
    uses_time: ClassVar[bool] = True
    scores_targets: ClassVar[bool] = (
        True  # loss_terms(..., targets=) is a likelihood of the targets (lm-eval)
    )
    # sampled block by block by its own `sample` (bd3lm: its `block_size` tokens a block), not by
    # engine.sample
    samples_by_blocks: ClassVar[bool] = False
    # its bound may be estimated by masked counts as well as by times (engine/counted.py:
    # LLaDA's estimator), SUBS over an absorbing mask
    counts_masks: ClassVar[bool] = False
    # its training loss asks a backbone that scores in chunks for -log p itself
    # (engine.diffusion's masked terms: the folder backbones' chunked_nll), never for the
    # (N, V) logits at once
    loss_in_chunks: ClassVar[bool] = False
    default_sampler: ClassVar[str]  # "" for an objective without samplers (mlm)
    sampler_names: ClassVar[tuple[str, ...]] = ()  # the engine.SAMPLERS serving its models
    description: ClassVar[str]
    kind: ClassVar[str] = (
        ""  # what `evaluate` gives: "" = exact or bound as `exact` says; "masked-token" (mlm)
    )
    # diffusion.* keys only this objective reads: every other one refuses them (build.py)
    own_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: Config, tokenizer: Tokenizer):
        self.cfg = cfg
        self.mask_id, self.bos_id = tokenizer.mask_id, tokenizer.bos_id
        self.schedule = get_schedule(cfg.diffusion.schedule, cfg.diffusion.eps)

    @classmethod  # noqa: B027 - optional: most objectives add checks, some need none
    def validate(cls, cfg: Config) -> None:
        """Config checks of this objective (a one-line MdlmError naming the key)."""

    @property
    def takes_time(self) -> bool:
        """Whether the backbone is given the diffusion time (time conditioning)."""
        return False

    @property
    def samplers(self) -> list[SamplerSpec]:
        """The samplers that serve this objective's models (its `sampler_names`)."""
        return [get_sampler(name) for name in self.sampler_names]

    @abstractmethod
    def denoiser(self, model: nn.Module, autocast_dtype: torch.dtype | None = None) -> Any:
        """The callable the engine's losses and samplers take: a `Denoiser` or a `CausalLM`
        (engine/protocols.py) over the backbone."""

    @abstractmethod
    def loss_terms(
        self,
        denoiser: Any,
        x0: Tensor,
        t: Tensor | None,
        *,
        generator: torch.Generator | None,
        attention_mask: Tensor | None,
        T: int | None = None,
        targets: Tensor | None = None,
    ) -> Tensor:
        """Training loss of a batch x0 (B, L) at times t (B,): nats per sequence (B,). The train
        loop divides their sum by the number of tokens of the global batch. `T` overrides
        the configured number of discrete steps (evaluation at another T).

        `targets` (B, L) bool: the positions whose likelihood the terms cover (None: every
        real token). The other real positions are clean context: never noised, never
        scored, but attended (the conditional bound, or the exact conditional NLL, of the
        targets given the context; what `mdlm lm-eval` scores)."""

    def training_terms(self, denoiser: Any, x0: Tensor, t: Tensor | None, *,
                       generator: torch.Generator | None, attention_mask: Tensor | None,
                       targets: Tensor | None = None) -> Tensor:
        """The loss the train loop minimises, per sequence (B,): the bound's own `loss_terms`,
        unless the objective weights its training loss otherwise (mdlm's
        diffusion.loss_weighting); evaluation always scores `loss_terms`."""
        return self.loss_terms(denoiser, x0, t, generator=generator,
                               attention_mask=attention_mask, targets=targets)

    def greedy_tokens(self, denoiser: Any, x0: Tensor, targets: Tensor,
                      attention_mask: Tensor | None = None) -> Tensor:
        """The model's most likely token at each target position in one call, (B, L) (x0
        elsewhere): for a diffusion model, its argmax with every target masked and the context
        clean (the fully masked continuation, t = 1). Causal objectives override it."""
        targets = targets.bool()
        z = x0.masked_fill(targets, self.mask_id)
        t = torch.ones(x0.shape[0], device=x0.device)
        logits = call_denoiser(
            denoiser, z, t, output_mask=targets, attention_mask=attention_mask
        )  # (N, V)
        best = without_mask(logits, self.mask_id).argmax(-1)
        return x0.masked_scatter(targets, best)

    def choose_estimator(self, asked: str | None, family: str = "t", T: int | None = None,
                         flag: str = "--estimator") -> str:
        """The bound's estimator, the one choice of it for lm-eval, the server and eval-ppl:
        `asked` (t or l), else the model family's (`family`, LLaDA's `l`) where it can run,
        else `t`. `l` counts masks: an objective whose bound `counts_masks`, not exact, in
        continuous time. A refusal names the setting as `flag` spells it."""
        fits = self.counts_masks and not self.exact and not T
        if asked is None:
            return family if fits else "t"
        if asked not in ESTIMATORS:
            raise MdlmError(f"{flag} must be one of: {', '.join(ESTIMATORS)} (got {asked!r})")
        if asked == "l" and not fits:
            raise MdlmError(f"{flag} l counts masks of a continuous-time masked diffusion "
                            f"model; this {self.name} model (T={T or 0}) is scored with t")
        return asked

    def _counted_terms(self, denoiser: Any, x0: Tensor, gen, masking: Masking) -> Tensor:
        """One term a row of LLaDA's estimator: a count uniform in 1..n of its n noised
        tokens masked (engine/counted.py)."""
        from ..engine.counted import counted_terms

        noised = masking.noised
        n = (torch.ones_like(x0, dtype=torch.bool) if noised is None else noised.bool()).sum(1)
        u = torch.rand(len(x0), generator=gen, device=x0.device, dtype=torch.float64)
        counts = (u * n).long() + 1
        return counted_terms(denoiser, x0, counts, mask_id=self.mask_id, masking=masking)

    def greedy_by_confidence(self, denoiser: Any, x0: Tensor, targets: Tensor,
                             attention_mask: Tensor | None = None) -> Tensor:
        """The targets decoded one token a call (LLaDA's `suffix_greedy_prediction`, its
        LAMBADA accuracy): from every target masked, each call reveals, in every row with a
        mask left, its argmax at the masked position whose argmax is the most probable. (B, L),
        x0 elsewhere. Causal objectives decode left to right (`greedy_tokens`)."""
        targets = targets.bool()
        z = x0.masked_fill(targets, self.mask_id)
        t = torch.ones(x0.shape[0], device=x0.device)
        for _ in range(int(targets.sum(1).max())):
            masked = z == self.mask_id
            logits = without_mask(call_denoiser(denoiser, z, t, output_mask=masked,
                                                attention_mask=attention_mask), self.mask_id)
            conf, best = logits.float().softmax(-1).max(-1)  # (N,)
            score = torch.full(z.shape, -1.0, device=z.device).masked_scatter(masked, conf)
            pick = score.argmax(1)  # each row's most confident masked position
            live = masked.any(1)
            drawn = torch.zeros_like(z).masked_scatter(masked, best)
            rows = live.nonzero()[:, 0]
            z[rows, pick[rows]] = drawn[rows, pick[rows]]
        return z

    def diffusion_keywords(self, generator: torch.Generator | None,
                           attention_mask: Tensor | None,
                           targets: Tensor | None) -> dict[str, Any]:
        """The keywords every engine loss of a masked diffusion takes: this objective's mask id
        and schedule, and the batch's generator, padding and likelihood targets (a Masking)."""
        return {
            "mask_id": self.mask_id,
            "schedule": self.schedule,
            "masking": Masking(generator, attention_mask, targets),
        }

    def sampling_steps(self, spec: SamplerSpec) -> int:
        """Steps of a step-based sampler when none are asked for."""
        return spec.default_steps

    def choose_sampler(self, sampler: str | None, steps: int | None,
                       options: dict | None = None) -> SamplerChoice:
        """The sampler and steps to run from what the user asked (None: not asked), among the
        samplers serving this objective; what does not apply comes back in `ignored` (nothing
        is silently dropped: the caller warns)."""
        served = self.samplers
        if not served:
            raise MdlmError(f"{self.name} models have no sampler ({self.description})")
        note = ""
        if (
            sampler is None and steps is not None
        ):  # `--steps N` means "a step-based sampler with N steps"
            stepped = [s for s in served if s.uses_steps and s.exact
                       and (not self.takes_time or not s.needs_time_agnostic)]
            spec = (max(stepped, key=lambda s: s.needs_time_agnostic) if stepped
                    else get_sampler(self.default_sampler))
            note = f"steps {steps}: sampling with {spec.name}" if stepped else ""
        else:
            spec = get_sampler(sampler or self.default_sampler)
        if spec not in served:
            raise MdlmError(
                f"sampler {spec.name} does not serve {self.name} models; choose one of: "
                f"{', '.join(s.name for s in served)}"
            )
        ignored = {
            name: value for name, value in (options or {}).items()
            if name not in spec.option_names
        }
        if spec.uses_steps:
            steps = steps or self.sampling_steps(spec)
        elif steps is not None:
            ignored, steps = {"steps": steps, **ignored}, None
        return SamplerChoice(spec, steps, note, ignored)

    @classmethod
    def refuse_unused(cls, cfg: Config, *keys: str) -> None:
        """A one-line error for a `diffusion.KEY` switch moved from its default that this
        objective does not read (no flag is silently ignored)."""
        defaults = type(cfg.diffusion)  # the dataclass: its class attributes are the defaults
        for key in keys:
            if getattr(cfg.diffusion, key) != getattr(defaults, key):
                raise MdlmError(
                    f"diffusion.{key} does not apply to the {cls.name} objective; leave it at "
                    f"{getattr(defaults, key)}"
                )

    @classmethod
    def refuse_time(cls, cfg: Config, label: str) -> None:
        """The checks of an objective without diffusion time (`uses_time = False`, called the
        `label` objective in the message): no time input, and none of the diffusion switches,
        since it reads none of them."""
        if cfg.model.time_conditioning:
            raise MdlmError(
                f"the {label} objective has no time input; set model.time_conditioning=false"
            )
        cls.refuse_unused(cfg, "T", "zero_masking", "carry_over")

    def eval_T(self, T: int | None) -> int:
        """The discrete-time T of an evaluation (None: as trained); 0 for continuous time."""
        return 0

    def draw_times(
        self, T: int, antithetic: bool = True
    ) -> Callable[[int, torch.Generator], Tensor] | None:
        """`draw(n, generator)`: one time per sequence of a global batch or an evaluation set,
        stratified over it (antithetic), mapped to t (T steps, 0: continuous); None for
        objectives without time."""
        return diffusion_times(self.schedule, T, antithetic) if self.uses_time else None

    def training_times(
        self, T: int, antithetic: bool = True
    ) -> Callable[[int, torch.Generator], Tensor] | None:
        """The times of the training loss, drawn as `draw_times` draws those of the bound; an
        objective that trains on another distribution of t (bd3lm's clipped schedule) says so
        here."""
        return self.draw_times(T, antithetic)

    def after_validation(self, denoiser: Any, split: TokenSplit, *, batch_size: int,
                         device: torch.device, seed: int, rows: int = 0) -> dict | None:
        """What the objective learns from the validation split during training (bd3lm: its
        clipped schedule), with the evaluation model; the record to log, or None (nothing)."""
        return None

    def training_state(self) -> dict:
        """What `after_validation` chose, for the checkpoint's state.json ({}: nothing)."""
        return {}

    def load_training_state(self, state: dict) -> None:  # noqa: B027 - optional, as validate
        """Restore what `training_state` saved (a resumed run)."""

    def evaluate(self, denoiser: Any, split: TokenSplit, sweep: SplitSweep, *, seeds: list[int],
                 T: int | None = None, antithetic: bool = True,
                 estimator: str = "t") -> list[BoundResult]:
        """One result per seed (a Monte-Carlo pass each), or one result for an exact objective:
        the loss summed over the rows of `split` that `sweep` covers (rank-sharded; with
        `sweep.per_sequence` each result also holds every row's value), at the discrete `T`
        (None: as trained), the times antithetic over the set or not. `estimator` "l": each
        pass masks a uniform count of each row's noised tokens instead (engine/counted.py;
        the objectives whose bound `counts_masks`, continuous time)."""
        T = self.eval_T(T)

        def terms(x0, t, gen, attention_mask, targets=None):  # targets: sft data's responses
            if estimator == "l":
                return self._counted_terms(denoiser, x0, gen, Masking(gen, attention_mask,
                                                                      targets))
            return self.loss_terms(denoiser, x0, t, generator=gen, attention_mask=attention_mask,
                                   T=T, targets=targets)

        results = [sharded_sum(terms, split, sweep, seed=seed,
                               draw_times=self.draw_times(T, antithetic), exact=self.exact, T=T)
                   for seed in (seeds[:1] if self.exact else seeds)]
        for r in results:
            r.kind = self.kind or r.kind
        return results
