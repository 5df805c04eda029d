"""What fine-tuning a backbone needs in memory, by part, printed before a LoRA or checkpointed
run starts (and for 8B-class models, BENCHMARKS.md): full fine-tuning, LoRA and QLoRA, with and
without gradient checkpointing.

    weights      every parameter at the bytes it is held in (nf4: half a byte and a scale per
                 64 weights)
    trainable    the trained tensors' gradient and AdamW's two moments (float32), and their EMA
    activations  what autograd keeps for the backward pass, per token and block: about 10 H + 4 M
                 floats for a LLaMA-style block (its norms' inputs and outputs, q, k, v, the
                 attention output and its log-sum-exp, the gate, up and SwiGLU products); with
                 LoRA the frozen projections keep no input of their own (2 H fewer) but each
                 adapter keeps its rank-r middle; with checkpointing, one block input (H) per
                 block plus one block's worth, recomputed in the backward pass
    logits       the masked positions' logits, their log-softmax and its gradient (float32): of
                 all of them at once, or, where the backbone scores in chunks (the folder
                 backbones' `chunked_nll`), of one chunk

The coefficients were counted with autograd's saved-tensor hooks on the native LLaDA block
(tests/unit/test_memory_model.py pins them) and the total is checked against measured peaks
(benchmarks/memory_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

FLOAT = 4
NF4_BYTES = 0.5 + 4 / 64  # a 4-bit weight and its block's float32 scale (64 weights a block)


@dataclass(frozen=True)
class Shape:
    """The sizes the estimate reads (a LLaDA or Dream config.json, or a DiT's)."""

    hidden: int  # H
    mlp: int  # M, the MLP's inner width
    layers: int
    vocab: int
    parameters: int  # every parameter of the model
    block_linear: int  # parameters in the blocks' linear layers (what LoRA and nf4 touch)


@dataclass(frozen=True)
class Plan:
    """How it is fine-tuned: rows of `length` tokens, `masked` of them scored per row."""

    rows: int
    length: int
    masked: int
    lora_rank: int = 0  # 0: full fine-tuning
    lora_parameters: int = 0  # the adapters' (and any layer trained whole)
    quantize: bool = False  # nf4 base (QLoRA)
    checkpointing: bool = False
    weight_bytes: int = FLOAT  # bytes per base weight as held (2: bf16)
    ema: bool = False
    chunk: int = 0  # masked positions whose logits exist at once (0: all of them)


@dataclass(frozen=True)
class Estimate:
    weights: float
    trainable: float
    activations: float
    logits: float

    @property
    def total(self) -> float:
        return self.weights + self.trainable + self.activations + self.logits


def block_floats_per_token(shape: Shape, plan: Plan) -> float:
    """What one block keeps for the backward pass per token, in floats."""
    full = 10 * shape.hidden + 4 * shape.mlp
    if not plan.lora_rank:
        return full
    return full - 2 * shape.hidden + 7 * plan.lora_rank  # 7 adapted projections a block


def estimate(shape: Shape, plan: Plan) -> Estimate:
    tokens = plan.rows * plan.length
    linear = shape.block_linear if plan.quantize else 0
    weights = linear * NF4_BYTES + (shape.parameters - linear) * plan.weight_bytes
    trained = plan.lora_parameters if plan.lora_rank else shape.parameters
    trainable = trained * FLOAT * (3 + plan.ema)  # gradient, AdamW's moments, the EMA
    per_block = block_floats_per_token(shape, plan) * tokens * FLOAT
    if plan.checkpointing:
        activations = shape.layers * tokens * shape.hidden * FLOAT + per_block
    else:
        activations = shape.layers * per_block
    scored = plan.rows * plan.masked
    logits = (min(scored, plan.chunk) if plan.chunk else scored) * shape.vocab * FLOAT * 3
    return Estimate(weights, trainable, activations, logits)


def plan_of(cfg, model, *, dtype) -> Plan:
    """A run's plan: a micro-batch of data.length tokens, half of them masked (the mean under
    a uniform t), the adapters' parameters where it trains LoRA, the loss's chunk where the
    backbone scores in chunks."""
    import torch

    from ..models.open_weights import NLL_CHUNK, ReleasedBackbone
    from ..objectives import OBJECTIVES

    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    lora = cfg.lora.rank
    return Plan(rows=cfg.train.micro_batch_size, length=cfg.data.length,
                masked=cfg.data.length // 2, lora_rank=lora,
                lora_parameters=trained if lora else 0,
                quantize=cfg.lora.quantize == "4bit", checkpointing=cfg.train.checkpointing,
                weight_bytes=2 if lora and dtype == torch.bfloat16 else FLOAT,
                ema=cfg.train.ema > 0,
                chunk=NLL_CHUNK if isinstance(model, ReleasedBackbone)
                and OBJECTIVES[cfg.diffusion.objective].loss_in_chunks else 0)


def describe(e: Estimate) -> str:
    gb = 1e9
    return (f"memory model: {e.total / gb:.2f} GB = weights {e.weights / gb:.2f} + trained "
            f"tensors' gradients/AdamW/EMA {e.trainable / gb:.2f} + activations "
            f"{e.activations / gb:.2f} + logits {e.logits / gb:.2f}")


def shape_of(model) -> Shape:
    """The estimate's sizes of a backbone: H (the input width most of its blocks' linear layers
    share) and M (the widest), the linear parameters inside its blocks."""
    from torch import nn

    blocks = list(model.blocks) if hasattr(model, "blocks") else []
    linears = [m for b in blocks for m in b.modules() if isinstance(m, nn.Linear)]
    widths = [m.in_features for m in linears]
    hidden = max(set(widths), key=widths.count) if widths else 0  # most layers read H
    mlp = max((m.in_features for m in linears), default=0)
    return Shape(hidden=hidden, mlp=mlp, layers=len(blocks), vocab=model.vocab_size,
                 parameters=sum(p.numel() for p in model.parameters()),
                 block_linear=sum(m.weight.numel() for m in linears))
