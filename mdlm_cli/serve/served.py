"""The model a server holds: the loaded checkpoint, its device and what `/v1/models` says of
it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ..checkpoints.folder import LoadedModel
from ..engine.block_sampling import BLOCK_OPTIONS
from ..engine.protocols import is_time_agnostic
from ..generation.capabilities import Capabilities, capabilities_of
from ..memory import ForwardCost


@dataclass
class Served:
    loaded: LoadedModel
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype, None = fp32
    name: str  # the model id requests name
    created: int = field(default_factory=lambda: int(time.time()))

    @cached_property
    def denoiser(self):
        """The engine-facing callable (a denoiser, or a causal LM)."""
        return self.loaded.denoiser(self.dtype)

    @cached_property
    def cost(self) -> ForwardCost:
        """The memory of a forward pass per row position (what requests are admitted by)."""
        loaded = self.loaded
        return ForwardCost.of(loaded.model, loaded.config.model, loaded.tokenizer.vocab_size)

    @property
    def time_agnostic(self) -> bool:
        return is_time_agnostic(self.denoiser)

    @cached_property
    def capabilities(self) -> Capabilities:
        """What the model declares it can do (generation/capabilities.py); the properties below
        read it, so the server asks one record."""
        causal = self.loaded.objective.causal
        return capabilities_of(self.loaded, None if causal else self.denoiser)

    @property
    def block_size(self) -> int:
        """L' of a model sampled block by block (bd3lm: serve/blocks.py), else 0."""
        return self.capabilities.block_size

    @property
    def causal(self) -> bool:
        return self.capabilities.causal

    @property
    def chat(self) -> bool:
        """Whether its tokeniser has a chat template (/v1/chat/completions answers)."""
        return self.capabilities.chat

    def options_of(self, spec) -> frozenset[str]:
        """The options a request may give the sampler: a bd3lm model's within-block step reads
        only its own (engine/block_sampling.py)."""
        if self.block_size:
            return BLOCK_OPTIONS.get(spec.name, frozenset())
        return spec.option_names

    def card(self) -> dict:
        """`GET /v1/models`'s entry: OpenAI's fields and what a diffusion request may set."""
        objective = self.loaded.objective
        samplers = [
            s for s in objective.samplers if not s.needs_time_agnostic or self.time_agnostic
        ]
        return {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "mdlm",
            "mdlm": {
                "objective": objective.name,
                "length": self.loaded.length,
                "vocab_size": self.loaded.tokenizer.vocab_size,
                "tokenizer": self.loaded.tokenizer.name,
                "default_sampler": objective.default_sampler or None,
                "samplers": {
                    s.name: {
                        "exact": s.exact,
                        "steps": objective.sampling_steps(s) if s.uses_steps else None,
                        "options": sorted(self.options_of(s)),
                        "help": s.help,
                    }
                    for s in samplers
                },
                "infill": not objective.causal and not self.block_size,
                "chat": self.chat,
                "semi_ar": not objective.causal and not self.block_size,
                "block_size": self.block_size or None,  # bd3lm: generated block by block
            },
        }
