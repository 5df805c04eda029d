"""The objectives registry. Adding one is a module with an `Objective` subclass (naming the
samplers that serve it, `sampler_names`) and one entry here; the tests parametrised over
`OBJECTIVES` then cover it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .ar import Autoregressive
from .base import Objective
from .bd3lm import BD3LM
from .bound import SplitSweep
from .d3pm import D3PM
from .mdlm import MDLM
from .mlm import MaskedLM
from .sedd import SEDD

if TYPE_CHECKING:
    from ..config import Config
    from ..data.tokenizers import Tokenizer

OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls for cls in (MDLM, SEDD, D3PM, Autoregressive, MaskedLM, BD3LM)
}

__all__ = ["OBJECTIVES", "Objective", "SplitSweep", "get_objective", "objectives_served_by"]


def objectives_served_by(sampler: str) -> list[str]:
    """The objectives (registry order) whose models the sampler serves."""
    return [name for name, cls in OBJECTIVES.items() if sampler in cls.sampler_names]


def get_objective(cfg: Config, tokenizer: Tokenizer) -> Objective:
    """The objective of a run (`diffusion.objective`), bound to its config and tokeniser."""
    return OBJECTIVES[cfg.diffusion.objective](cfg, tokenizer)
