"""BD3-LM (Arriola et al. 2025, "Block Diffusion"): autoregressive over blocks of L' =
`diffusion.block_size` tokens, masked diffusion with SUBS inside each block.

The loss is the block NELBO (engine/blocks.py): each block's continuous-time masked-diffusion
bound given the clean blocks before it, one time t_b per block, all blocks in one pass of the
DiT over [x_t, x_0] under the block attention mask, the x_0 half at the same rotary positions
as the x_t half. L' = L is MDLM; at L' = 1 the bound equals the AR NLL in expectation (each
block is one token: masked with probability ~t, weighted 1/t), and the evaluation gives that
NLL exactly, every token masked (t = 1) given the clean tokens before it (the reference's
L' = 1 likelihood).

Training may draw t from a clipped interval [clip_min, clip_max] (the paper's data-driven
schedule, chosen by the variance search of objectives/clipping.py when `clip_search_widths`
is set); evaluation always draws it from the whole interval, the bound the paper reports.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from ..data.store import TokenSplit
from ..engine.block_sampling import (
    BLOCK_OPTIONS,
    BLOCK_STEPS,
    BlockDraw,
    BlockHooks,
    BlockRows,
    BlockSamples,
    sample_blocks,
)
from ..engine.blocks import block_attention_mask, block_nelbo_tokens, block_times
from ..engine.diffusion import Masking, without_mask
from ..engine.settings import SamplingSettings
from ..errors import MdlmError
from ..models import BACKBONES, KVCache, autocast_for, unwrap
from ..runtime import derive_seed, generator
from .base import Objective, SamplerChoice
from .clipping import candidate_intervals, interval_name, select_interval, variance_table

SEARCH_BATCHES = 100  # validation batches of a search at most (the reference's 100)


class BlockDenoiser:
    """The block denoiser of engine/blocks.py over a backbone that `takes_query_masks` (the DiT,
    a converted llada, dream or gpt2 folder): one call on [z_t, x0] (B, 2L) with the block
    attention mask and positions 0..L-1 twice; logits of the z_t half only. A shifted backbone
    reads each position's logits from the key it attends one position before (a block's first
    position: the clean copy's last state of the block before: predecessor_states in
    models/decoder_layers.py)."""

    supports_output_mask = True
    samples_by_blocks = True  # engine.sample refuses it: BD3LM.sample draws block by block

    def __init__(self, model: nn.Module, block_size: int,
                 autocast_dtype: torch.dtype | None = None):
        self.model, self.block_size, self.autocast_dtype = model, block_size, autocast_dtype
        self._mask: Tensor | None = None

    def attention(self, length: int, device: torch.device,
                  attention_mask: Tensor | None) -> Tensor:
        """(B | 1, 1, 2L, 2L) bool: the block mask, padded keys removed (each query keeps
        itself, so no row of the softmax is empty)."""
        if self._mask is None or self._mask.shape[-1] != 2 * length \
                or self._mask.device != device:
            self._mask = block_attention_mask(length, self.block_size, device)
        mask = self._mask[None]
        if attention_mask is not None and not bool(attention_mask.all()):
            real = attention_mask.bool().repeat(1, 2)  # (B, 2L): the keys x_t and x0 share
            mask = (mask & real[:, None, :]) | torch.eye(2 * length, dtype=torch.bool,
                                                         device=device)
        return mask[:, None]

    def __call__(self, z_t: Tensor, x0: Tensor, *, output_mask: Tensor | None = None,
                 attention_mask: Tensor | None = None) -> Tensor:
        L = x0.shape[1]
        tokens = torch.cat([z_t, x0], dim=1)  # (B, 2L)
        positions = torch.arange(L, device=x0.device).repeat(2)  # x0 at x_t's positions
        mask = self.attention(L, x0.device, attention_mask)
        wanted = None if output_mask is None else torch.cat(
            [output_mask, torch.zeros_like(output_mask)], dim=1)
        with autocast_for(x0.device, self.autocast_dtype):
            logits = self.model(tokens, None, attention_mask=mask, output_mask=wanted,
                                positions=positions)
        return logits if output_mask is not None else logits[:, :L]


class CachedBlocks:
    """The engine's `BlockModel` over the DiT with a block key/value cache of the finished
    blocks: each call runs the current block only (exact: attention is block-causal)."""

    def __init__(self, model: nn.Module, autocast_dtype: torch.dtype | None = None):
        self.model, self.autocast_dtype = model, autocast_dtype
        self.cache: KVCache | None = None

    def start(self, batch: int, max_len: int, device: torch.device) -> None:
        dtype = self.autocast_dtype or torch.float32
        self.cache = KVCache.empty(unwrap(self.model), batch, max_len, device, dtype)
        self.cache.block = True

    def _run(self, block: Tensor) -> Tensor:
        with autocast_for(block.device, self.autocast_dtype):
            return self.model(block, kv_cache=self.cache)

    def logits(self, block: Tensor) -> Tensor:
        finished = self.cache.length
        logits = self._run(block)
        self.cache.length = finished  # a noisy block's keys are not kept
        return logits

    def commit(self, block: Tensor) -> None:
        self._run(block)


class RecomputedBlocks:
    """The same `BlockModel` without a cache: every call runs all the finished blocks and the
    current one under the block-causal mask (what the cache must equal)."""

    def __init__(self, model: nn.Module, block_size: int,
                 autocast_dtype: torch.dtype | None = None):
        self.model, self.block_size, self.autocast_dtype = model, block_size, autocast_dtype
        self.done: Tensor | None = None

    def start(self, batch: int, max_len: int, device: torch.device) -> None:
        self.done = torch.zeros(batch, 0, dtype=torch.long, device=device)

    def logits(self, block: Tensor) -> Tensor:
        tokens = torch.cat([self.done, block], dim=1)
        index = torch.arange(tokens.shape[1], device=block.device) // self.block_size
        mask = (index[:, None] >= index[None, :])[None, None]  # (1, 1, n, n): block-causal
        with autocast_for(block.device, self.autocast_dtype):
            logits = self.model(tokens, None, attention_mask=mask)
        return logits[:, -block.shape[1]:]

    def commit(self, block: Tensor) -> None:
        self.done = torch.cat([self.done, block], dim=1)


class BD3LM(Objective):
    name = "bd3lm"
    # the within-block steps (engine/block_sampling.py); first-hitting is the reference's
    # default (`sampling.first_hitting: True` in bd3lms configs/config.yaml)
    default_sampler = "first-hitting"
    sampler_names = tuple(BLOCK_STEPS)
    samples_by_blocks = True  # sampled block by block (`sample`), not by engine.sample
    description = ("block diffusion: autoregressive over blocks, masked diffusion in each "
                   "(a bound; exact NLL at block size 1)")
    own_keys = ("block_size", "clip_min", "clip_max", "clip_search_widths", "clip_search_delta")

    @classmethod
    def validate(cls, cfg) -> None:
        d, length = cfg.diffusion, cfg.data.length
        if d.block_size <= 0 or length % d.block_size:
            raise MdlmError(f"diffusion.block_size must be a divisor of data.length ({length}) "
                            f"for the bd3lm objective (got {d.block_size})")
        if cfg.model.time_conditioning:
            raise MdlmError("the bd3lm objective draws a time per block and the DiT takes one "
                            "per row; set model.time_conditioning=false")
        cls.refuse_unused(cfg, "T", "zero_masking", "carry_over")
        if not BACKBONES[cfg.model.backbone].takes_query_masks:
            raise MdlmError(f"the bd3lm objective needs the block attention mask, which the "
                            f"{cfg.model.backbone} backbone cannot take; use the dit backbone, "
                            "or a folder mdlm convert --target bd3lm wrote (llada, dream, gpt2)")
        if cfg.train.attention_anneal_steps:
            raise MdlmError("train.attention_anneal_steps anneals MDLM's full attention; the "
                            "bd3lm objective's block mask is not annealed; set it to 0")
        if cfg.data.packing == "sft-pack":
            raise MdlmError("the bd3lm objective does not take several examples per row; use "
                            "data.packing=sft")
        cls.check_clip(cfg)

    @classmethod
    def check_clip(cls, cfg) -> None:
        d = cfg.diffusion
        if d.clip_min > d.clip_max:
            raise MdlmError(f"diffusion.clip_min ({d.clip_min}) must not exceed "
                            f"diffusion.clip_max ({d.clip_max})")
        if d.clip_min >= 1.0 and d.block_size != 1:
            raise MdlmError("diffusion.clip_min=1 (every token masked) is the exact NLL of "
                            "block size 1 only; lower it, or set diffusion.block_size=1")

    def __init__(self, cfg, tokenizer):
        super().__init__(cfg, tokenizer)
        self.block_size = cfg.diffusion.block_size
        self.clip = (cfg.diffusion.clip_min, cfg.diffusion.clip_max)  # the training interval

    pass_factor = 2  # one pass over x_t ⊕ x_0 (2L positions) per row of L tokens
    # at L' = 1 the first block (the row's first token) has no clean block before it
    first_token_context = "the first from no context"

    @property
    def exact(self) -> bool:  # type: ignore[override]  # per run: block size 1 is exact
        return self.block_size == 1

    def denoiser(self, model: nn.Module,
                 autocast_dtype: torch.dtype | None = None) -> BlockDenoiser:
        return BlockDenoiser(model, self.block_size, autocast_dtype)

    def token_terms(self, denoiser: BlockDenoiser, x0: Tensor, t: Tensor, *, generator,
                    attention_mask, targets: Tensor | None = None) -> Tensor:
        """The loss at each position (B, L); t (B, K) per block, or (B,) the same for all. A
        row shorter than the model length (lm-eval's) takes the times of its first blocks."""
        blocks = -(-x0.shape[1] // self.block_size)
        if t.dim() == 1:
            t = t[:, None].expand(-1, blocks)
        if t.shape[1] < blocks:
            raise MdlmError(f"rows of {x0.shape[1]} tokens are longer than the bd3lm model's "
                            f"{t.shape[1] * self.block_size}")
        return block_nelbo_tokens(denoiser, x0, t, mask_id=self.mask_id,
                                  schedule=self.schedule, block_size=self.block_size,
                                  masking=Masking(generator, attention_mask, targets))

    def loss_terms(self, denoiser, x0: Tensor, t: Tensor | None, *, generator, attention_mask,
                   T: int | None = None, targets: Tensor | None = None) -> Tensor:
        return self.token_terms(denoiser, x0, t, generator=generator,
                                attention_mask=attention_mask, targets=targets).sum(dim=1)

    def times_between(self, low: float, high: float, antithetic: bool):
        """`draw(n, generator)`: times (n, K) uniform on [low, high], floored at t_min (as
        the schedule's own draws)."""
        low, high = max(low, self.schedule.t_min), max(high, self.schedule.t_min)
        blocks = self.cfg.data.length // self.block_size
        return lambda n, gen: block_times(n, blocks, gen, low=low, high=high,
                                          antithetic=antithetic)

    def draw_times(self, T: int, antithetic: bool = True):
        """The bound's times: the whole interval; t = 1 at block size 1 (the exact NLL)."""
        return self.times_between(1.0 if self.exact else 0.0, 1.0, antithetic)

    def training_times(self, T: int, antithetic: bool = True):
        return self.times_between(*self.clip, antithetic)

    def eval_T(self, T: int | None) -> int:
        if T:
            raise MdlmError(f"--T {T} does not apply: the bd3lm bound is continuous-time")
        return 0

    def greedy_tokens(self, denoiser: BlockDenoiser, x0: Tensor, targets: Tensor,
                      attention_mask: Tensor | None = None) -> Tensor:
        """The argmax at each target position with every target masked, given the true blocks
        before its own (teacher-forced over blocks, as the AR model's greedy check)."""
        targets = targets.bool()
        z = x0.masked_fill(targets, self.mask_id)
        logits = denoiser(z, x0, output_mask=targets, attention_mask=attention_mask)
        return x0.masked_scatter(targets, without_mask(logits, self.mask_id).argmax(-1))

    @torch.no_grad()
    def after_validation(self, denoiser: BlockDenoiser, split: TokenSplit, *, batch_size: int,
                         device: torch.device, seed: int, rows: int = 0) -> dict | None:
        """The clipped-schedule search (objectives/clipping.py), when
        `diffusion.clip_search_widths` asks for it: the training interval becomes the one of
        least loss variance over the first `rows` validation rows (0 = all; at most
        SEARCH_BATCHES batches). Returns the record to log: the interval and every variance."""
        d = self.cfg.diffusion
        if not d.clip_search_widths:
            return None
        intervals = candidate_intervals(d.clip_search_widths, d.clip_search_delta,
                                        self.schedule.t_min, self.block_size)
        n = len(split) if rows <= 0 else min(rows, len(split))
        batches = min(-(-n // batch_size), SEARCH_BATCHES)

        def block_losses(interval, b: int) -> Tensor:  # (B, K); every interval: the same draws
            idx = np.arange(b * batch_size, min((b + 1) * batch_size, n))
            x0, attention_mask, targets = split.batch_with_targets(idx, device)
            draw = self.times_between(*interval, d.antithetic)
            t = draw(len(idx), generator(device, derive_seed(seed, "clip", b)))
            masks = generator(device, derive_seed(seed, "clip-masks", b))
            terms = self.token_terms(denoiser, x0, t, generator=masks,
                                     attention_mask=attention_mask, targets=targets)
            return terms.view(len(idx), -1, self.block_size).mean(-1)

        table = variance_table(block_losses, intervals, batches)
        self.clip = select_interval(table)
        return {"clip": list(self.clip),
                "clip_variance": {interval_name(k): v / batches for k, v in table.items()}}

    def training_state(self) -> dict:
        return {"clip": list(self.clip)} if self.cfg.diffusion.clip_search_widths else {}

    def load_training_state(self, state: dict) -> None:
        if "clip" in state:
            self.clip = (float(state["clip"][0]), float(state["clip"][1]))

    def choose_sampler(self, sampler: str | None, steps: int | None,
                       options: dict | None = None) -> SamplerChoice:
        """As every objective's, the options that the within-block step does not read
        (e.g. confidence's --k-schedule) among the ignored ones."""
        choice = super().choose_sampler(sampler, steps, options)
        reads = BLOCK_OPTIONS.get(choice.spec.name, frozenset())
        extra = {k: v for k, v in (options or {}).items()
                 if k not in reads and k not in choice.ignored}
        return SamplerChoice(choice.spec, choice.steps, choice.note, {**choice.ignored, **extra})

    def block_model(self, model: nn.Module, cache: bool = True,
                    autocast_dtype: torch.dtype | None = None
                    ) -> CachedBlocks | RecomputedBlocks:
        """The `BlockModel` that `sample` runs: the exact cache where the model keeps finished
        blocks' keys and values (the unshifted DiT: `kv_cache_blocks`); the others recompute
        the finished blocks at every call."""
        if cache and unwrap(model).kv_cache_blocks:
            return CachedBlocks(model, autocast_dtype)
        return RecomputedBlocks(model, self.block_size, autocast_dtype)

    @torch.no_grad()
    def sample(self, model: nn.Module, how: SamplingSettings, rows: BlockRows, *,
               generator: torch.Generator | None, cache: bool = True,
               autocast_dtype: torch.dtype | None = None, hooks: BlockHooks | None = None,
               groups: list[tuple[int, torch.Generator | None]] | None = None) -> BlockSamples:
        """The `rows` (engine/block_sampling.py: up to their length, a multiple of L', past the
        training length if asked; their prompt fixed; done at their EOS), block by block, each
        block filled by the within-block sampler `how` names (BLOCK_STEPS, ancestral if none;
        its steps per block, 1000 if none, its draw settings and `tokens_per_step`).
        `cache=False` recomputes the finished blocks at every call. `hooks`: a server streams
        each block and checks its client. `groups`: several requests in one batch, (rows,
        generator) for consecutive rows (`BlockDraw.groups`), in place of `generator`."""
        sampler, hooks = how.sampler or "ancestral", hooks or BlockHooks()
        if how.cfg_scale:
            raise MdlmError("cfg_scale does not apply to a bd3lm model: its blocks are sampled "
                            "left to right after the prompt")
        length, prompt = rows.length, rows.prompt
        if length % self.block_size:
            raise MdlmError(f"--length must be a multiple of the block size {self.block_size} "
                            f"(got {length})")
        if sampler not in BLOCK_STEPS:
            raise MdlmError(f"sampler {sampler} does not serve bd3lm models; choose one of: "
                            f"{', '.join(BLOCK_STEPS)}")
        if prompt is not None and prompt.shape[-1] >= length:
            raise MdlmError(f"the prompt is {prompt.shape[-1]} tokens; the length is {length}")
        blocks = self.block_model(model, cache, autocast_dtype)
        device = next(model.parameters()).device
        draw = BlockDraw(self.mask_id, self.schedule, generator, steps=how.steps or 1000,
                         precision=how.precision, temperature=how.temperature, top_p=how.top_p,
                         top_k=how.top_k or 0,
                         tokens_per_step=int(how.options.get("tokens_per_step", 1)),
                         before_call=hooks.before_call, groups=groups)
        if hooks.counts is not None:
            draw.counts = hooks.counts
        return sample_blocks(blocks, draw, rows, block_size=self.block_size, device=device,
                             step=BLOCK_STEPS[sampler], on_block=hooks.on_block)
