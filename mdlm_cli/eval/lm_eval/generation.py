"""What lm-eval's `generate_until(context, until)` gets of an mdlm model: text sampled after
the context with the sampling settings (one window where it fits, the context truncated from
the left; semi-autoregressive rounds past the model length for a diffusion model, MDLM
§4.2), cut at the first stop token and stop sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import engine
from ...checkpoints.folder import LoadedModel
from ...errors import MdlmError
from ...generation.capabilities import capabilities_of
from ...generation.layout import lay_out, lay_out_semi_ar
from ...runtime import derive_seed, generator


@dataclass
class GenerationSettings:
    how: engine.SamplingSettings  # its sampler one that serves the objective, named
    stride: int | None = None  # semi-AR stride L' (default: half the model length)
    seed: int = 0
    device: torch.device | str = "cpu"  # where the model runs
    dtype: torch.dtype | None = None  # its autocast dtype (None: fp32)

    @property
    def sampler(self) -> str:
        return self.how.sampler


def generation_plan(start: int, context: int, max_gen: int, length: int, *, causal: bool,
                    stride: int) -> tuple[int, int]:
    """(context tokens kept, tokens generated), `start` being the row start's length; the row
    itself is the one rule's (generation/layout.py: `lay_out`, past the window
    `lay_out_semi_ar`). Within
    one window the context is truncated from the left to leave room for `max_gen` new tokens
    (as the harness's HF models do). Past the window a diffusion model generates
    semi-autoregressively (the context then fills at most the first window's L - L'); a
    left-to-right model cannot, so it generates half its room after the context."""
    room = length - start
    if max_gen < room:
        return min(context, room - max_gen), max_gen
    if causal:
        gen = room // 2
        return min(context, room - gen), gen
    return min(context, room - stride), max_gen


@torch.no_grad()
def generate_after(
    loaded: LoadedModel,
    context: list[int],
    *,
    max_gen: int,
    settings: GenerationSettings,
    drawing: dict | None = None,
    index: int = 0,
    start: list[int] | None = None,
) -> list[int]:
    """Tokens sampled after `context` (the harness's `generate_until`): one window when they
    fit the model length, else semi-autoregressive rounds of `stride` new tokens (§4.2), on
    the settings' device and dtype. `drawing`: the request's temperature / top_p / top_k,
    where it sets them (else the settings'). `index`: the request's number (its seed).
    `start`: the tokens before the context (default the row start; [] for a context rendered
    by a chat template, which writes its own)."""
    device = settings.device
    start = loaded.row_start() if start is None else start
    length, mask_id = loaded.length, loaded.mask_id
    stride = settings.stride or length // 2
    if not 0 < stride < length - len(start):
        raise MdlmError(f"--stride must be between 1 and {length - len(start) - 1} "
                        f"(got {stride})")
    keep, gen = generation_plan(
        len(start), len(context), max_gen, length, causal=loaded.objective.causal, stride=stride
    )
    if gen < 1:
        return []
    how = settings.how.with_(**(drawing or {}))
    options = {
        "mask_id": mask_id,
        "schedule": loaded.objective.schedule,
        "device": device,
        "generator": generator(
            torch.device(device), derive_seed(settings.seed, "lm-eval-generate", index)
        ),
    }
    denoiser = loaded.denoiser(settings.dtype)
    caps = capabilities_of(loaded, denoiser)
    kept = context[len(context) - keep:]
    if len(start) + keep + gen <= length:  # one window: the one rule's row
        row = lay_out(caps, kept, answer=gen, start=start)
        tokens = engine.sample(denoiser, how, num_samples=1, length=row.length,
                               prompt=row.template(mask_id), **options)[0]
    else:  # the one rule's semi-AR row: the window, then extensions of `stride`
        row = lay_out_semi_ar(caps, kept, stride=stride, answer=gen, start=start)
        tokens = engine.semi_ar(
            denoiser,
            how,
            num_samples=1,
            window=row.window,
            stride=row.stride,
            prompt=torch.tensor(row.prefix, dtype=torch.long),
            target_length=row.length,
            **options,
        ).tokens[0]
    return tokens[row.answer_start:].tolist()


def cut_generation(tokenizer, tokens: list[int], until: list[str],
                   stop_ids: list[int] | None = None) -> str:
    """Text of the generated tokens up to the first stop token (`stop_ids`, default the
    end-of-text token; a chat model's end-of-turn token too) and the first stop sequence (not
    included)."""
    stops = set([tokenizer.eos_id] if stop_ids is None else stop_ids)
    first = next((i for i, t in enumerate(tokens) if t in stops), len(tokens))
    tokens = tokens[:first]
    text = tokenizer.decode(tokens)
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text
