"""Caduceus (Schiff et al. 2024): a bidirectional Mamba DNA model, the backbone of §5.2.

Each layer is a BiMamba mixer, `mamba_fwd` on the sequence plus `mamba_rev` on the flipped
sequence (flipped back), added (or multiplied), the two sharing their in/out projections;
pre-norm (RMSNorm) residual blocks without an MLP, a final norm and a head tied to the
embedding. Two variants by config (`model.rcps`):

- **Caduceus-Ph** (rcps false): plain channels; reverse-complement (RC) augmentation in
  training and both strands averaged at test time give the symmetry post hoc;
- **Caduceus-PS** (rcps true): exactly RC equivariant. The hidden state has 2 x d channels,
  [emb(x), flip(emb(rc x))]; the mixer and norms run on both halves (the second in the RC
  frame), and the head adds the logits of the first half and of the channel-flipped second
  half through the complement-permuted embedding. `model.fused_add_norm` (true: the
  released checkpoints' layout) swaps the two halves at every block, as Caduceus's fused
  path does; false is its unfused path. Both are equivariant, with different functions.

The module tree matches Caduceus's `CaduceusForMaskedLM` (`caduceus.backbone.embeddings.
word_embeddings`, `caduceus.backbone.layers.i.{mixer, norm}`, `caduceus.backbone.norm_f`,
`lm_head`), so its safetensors load as they are (tied tensors stored once, `tied.py`).

Optional time conditioning (`model.time_conditioning`, for SEDD or a time-conditioned MDLM)
modulates each block's normed input by a shift and scale from sigma's embedding, both
zero-initialised: a loaded Caduceus computes the same function at the start (the reference
`dimamba.py` gates the mixers to zero instead).

The recurrence reads every position: `attention_mask` is accepted for the engine's contract,
but padding and N positions are fed as their tokens (PAD) and only kept out of the masking
and the loss, as Caduceus does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from ..errors import MdlmError
from .dit_layers import TimestepEmbedder
from .mamba_mixer import MIXERS, MambaMixer
from .section import keys_of, read_section
from .tied import count_parameters, store_tied_once
from .traits import BackboneTraits

if TYPE_CHECKING:
    from ..config import Config

BIDIRECTIONAL = ("add", "ew_multiply")


@dataclass(frozen=True)
class MambaConfig:
    """The `model:` keys of the Mamba-based backbones (models/section.py): hidden_size is
    d_model, n_blocks the number of layers; cond_dim sizes the optional time embedding. No
    attention heads, no dropout. The defaults are ModelConfig's (read from it: one place for
    them)."""

    hidden_size: int = ModelConfig.hidden_size
    n_blocks: int = ModelConfig.n_blocks
    cond_dim: int = ModelConfig.cond_dim
    time_conditioning: bool = ModelConfig.time_conditioning
    mixer: str = ModelConfig.mixer
    d_state: int = ModelConfig.d_state
    d_conv: int = ModelConfig.d_conv
    expand: int = ModelConfig.expand
    rms_norm: bool = ModelConfig.rms_norm
    norm_epsilon: float = ModelConfig.norm_epsilon


@dataclass(frozen=True)
class CaduceusConfig(MambaConfig):
    """Caduceus's keys: the Mamba ones and its bidirectional, reverse-complement layout."""

    rcps: bool = ModelConfig.rcps
    fused_add_norm: bool = ModelConfig.fused_add_norm
    bidirectional_strategy: str = ModelConfig.bidirectional_strategy
    bidirectional_weight_tie: bool = ModelConfig.bidirectional_weight_tie


def rc(h: Tensor) -> Tensor:
    """The reverse complement of a PS half (B, L, d): positions and channels flipped."""
    return h.flip(-2, -1)


class RMSNorm(nn.Module):
    """x / rms(x) * weight in float32 (mamba-ssm's RMSNorm; LayerNorm with a bias when rms_norm
    is off)."""

    def __init__(self, dim: int, eps: float = 1e-5, rms: bool = True):
        super().__init__()
        self.eps, self.rms = eps, rms
        self.weight = nn.Parameter(torch.ones(dim))
        if not rms:
            self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        f = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(f)
        if self.rms:
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.to(f)
        else:
            y = F.layer_norm(xf, (x.shape[-1],), self.weight.to(f), self.bias.to(f), self.eps)
        return y.to(x.dtype)


class Wrapped(nn.Module):
    """A module under `.submodule` (the names of Caduceus's RCPS wrappers)."""

    def __init__(self, submodule: nn.Module):
        super().__init__()
        self.submodule = submodule

    def forward(self, *args, **kwargs):
        return self.submodule(*args, **kwargs)


class BiMamba(nn.Module):
    def __init__(self, cfg: CaduceusConfig):
        super().__init__()
        kw = dict(d_state=cfg.d_state, d_conv=cfg.d_conv, expand=cfg.expand, impl=cfg.mixer)
        self.strategy = cfg.bidirectional_strategy
        self.mamba_fwd = MambaMixer(cfg.hidden_size, **kw)
        self.mamba_rev = MambaMixer(cfg.hidden_size, **kw)
        if cfg.bidirectional_weight_tie:  # most of the parameters sit in the in/out projections
            self.mamba_rev.in_proj.weight = self.mamba_fwd.in_proj.weight
            self.mamba_rev.out_proj.weight = self.mamba_fwd.out_proj.weight

    def forward(self, x: Tensor) -> Tensor:  # (B, L, d)
        fwd, rev = self.mamba_fwd(x), self.mamba_rev(x.flip(1)).flip(1)
        return fwd + rev if self.strategy == "add" else fwd * rev


class Block(nn.Module):
    """Add -> norm -> (time modulation) -> BiMamba, returning (mixer output, residual stream)."""

    def __init__(self, cfg: CaduceusConfig):
        super().__init__()
        self.rcps, self.swap = cfg.rcps, cfg.rcps and cfg.fused_add_norm
        self.d = cfg.hidden_size
        mixer, norm = BiMamba(cfg), RMSNorm(cfg.hidden_size, cfg.norm_epsilon, cfg.rms_norm)
        self.mixer = Wrapped(mixer) if cfg.rcps else mixer
        self.norm = Wrapped(norm) if cfg.rcps and not cfg.fused_add_norm else norm
        if (
            cfg.time_conditioning
        ):  # zero-initialised: the block's function is unchanged at the start
            self.time_modulation = nn.Linear(cfg.cond_dim, 2 * cfg.hidden_size)
            nn.init.zeros_(self.time_modulation.weight)
            nn.init.zeros_(self.time_modulation.bias)

    def _norm(self, x: Tensor, c: Tensor | None) -> Tensor:
        y = self.norm(x)
        if c is not None and hasattr(self, "time_modulation"):
            shift, scale = self.time_modulation(c)[:, None].chunk(2, dim=-1)
            y = y * (1 + scale) + shift
        return y

    def forward(
        self, hs: Tensor, residual: Tensor | None, c: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        if not self.rcps:
            residual = hs if residual is None else hs + residual
            return self.mixer(self._norm(residual, c)), residual
        d = self.d
        # the forward strand's residual comes from the second half under the fused layout
        first, second = (hs[..., d:], hs[..., :d]) if self.swap else (hs[..., :d], hs[..., d:])
        if residual is not None:
            r1, r2 = (
                (residual[..., d:], residual[..., :d])
                if self.swap
                else (residual[..., :d], residual[..., d:])
            )
            first, second = first + r1, second + r2
        fwd, rev = first, rc(second)  # each strand in its own frame
        residual = torch.cat([fwd, rc(rev)], dim=-1)
        x_fwd, x_rev = self._norm(fwd, c), self._norm(rev, c)
        mixer = self.mixer.submodule
        return torch.cat([mixer(x_fwd), rc(mixer(x_rev))], dim=-1), residual


class RCPSEmbedding(nn.Module):  # Caduceus's name: `.embedding`
    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.embedding = embedding


class RCPSHead(nn.Module):  # Caduceus's name: `.lm_head`
    def __init__(self, head: nn.Linear):
        super().__init__()
        self.lm_head = head


class Embeddings(nn.Module):
    def __init__(self, cfg: CaduceusConfig, vocab_size: int):
        super().__init__()
        embedding = nn.Embedding(vocab_size, cfg.hidden_size)
        nn.init.normal_(embedding.weight, std=0.02)
        self.word_embeddings = RCPSEmbedding(embedding) if cfg.rcps else embedding


class Backbone(nn.Module):
    def __init__(self, cfg: CaduceusConfig, vocab_size: int):
        super().__init__()
        self.embeddings = Embeddings(cfg, vocab_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_blocks))
        norm_f = RMSNorm(cfg.hidden_size, cfg.norm_epsilon, cfg.rms_norm)
        self.norm_f = Wrapped(norm_f) if cfg.rcps and not cfg.fused_add_norm else norm_f
        if cfg.time_conditioning:
            self.time_embed = TimestepEmbedder(cfg.cond_dim)


class Encoder(nn.Module):  # Caduceus's `Caduceus` module: `.backbone`
    def __init__(self, cfg: CaduceusConfig, vocab_size: int):
        super().__init__()
        self.backbone = Backbone(cfg, vocab_size)




class MambaBackbone(BackboneTraits):
    """What the Mamba-based backbones share of the backbone protocol (models.BACKBONES)."""

    @classmethod
    def validate_config(cls, cfg: Config) -> None:
        m = cfg.model
        if m.mixer not in MIXERS:
            raise MdlmError(f"model.mixer must be one of: {', '.join(MIXERS)} (got {m.mixer!r})")
        for key in ("hidden_size", "n_blocks", "cond_dim", "d_state", "d_conv", "expand"):
            if getattr(m, key) <= 0:
                raise MdlmError(f"model.{key} must be positive (got {getattr(m, key)})")

    @classmethod
    def from_checkpoint(
        cls, cfg: ModelConfig, vocab_size: int, folder: Path, *, causal: bool = False
    ):
        """config.yaml's model section is all it needs (the weights are loaded after)."""
        return cls(cfg, vocab_size, causal=causal)

    def save_checkpoint_files(self, folder: Path) -> None:
        """Nothing beside the weights: the config builds it."""


class Caduceus(MambaBackbone, nn.Module):
    """`Caduceus(cfg, vocab_size)(tokens (B, L), sigma (B,) | None) -> logits (B, L, V)`."""

    requires_causal = False  # bidirectional; the causal baseline is the `mamba` backbone
    config_keys = keys_of(CaduceusConfig)

    @classmethod
    def validate_config(cls, cfg: Config) -> None:
        super().validate_config(cfg)
        if cfg.model.bidirectional_strategy not in BIDIRECTIONAL:
            raise MdlmError(
                f"model.bidirectional_strategy must be one of: {', '.join(BIDIRECTIONAL)} "
                f"(got {cfg.model.bidirectional_strategy!r})"
            )

    def describe(self) -> str:
        variant = "PS" if self.config.rcps else "Ph"
        return f"Caduceus-{variant} {self.config.n_blocks}x{self.config.hidden_size}"

    def __init__(self, cfg: ModelConfig | CaduceusConfig, vocab_size: int, causal: bool = False,
                 complement: list[int] | None = None):
        super().__init__()
        cfg = read_section(CaduceusConfig, cfg)
        if causal:
            raise MdlmError(
                "the caduceus backbone is bidirectional; an autoregressive model uses "
                "model.backbone=mamba"
            )
        self.config, self.vocab_size, self.causal = cfg, vocab_size, False
        self.d, self.rcps = cfg.hidden_size, cfg.rcps
        self.caduceus = Encoder(cfg, vocab_size)
        complement = complement_ids(vocab_size) if complement is None else complement
        self.register_buffer(
            "complement_map", torch.tensor(complement, dtype=torch.long), persistent=False
        )
        head = nn.Linear(cfg.hidden_size, vocab_size, bias=False)
        head.weight = self.embedding.weight  # tied, as the released models
        self.lm_head = RCPSHead(head) if cfg.rcps else head
        rescale_out_proj(self, cfg.n_blocks)
        store_tied_once(self)

    @property
    def embedding(self) -> nn.Embedding:
        words = self.caduceus.backbone.embeddings.word_embeddings
        return words.embedding if self.rcps else words

    @property
    def head_weight(self) -> Tensor:
        return (self.lm_head.lm_head if self.rcps else self.lm_head).weight

    def features(self, tokens: Tensor, sigma: Tensor | None = None) -> Tensor:
        """Final hidden states: (B, L, d), or (B, L, 2d) for PS (second half in the RC frame,
        flipped)."""
        bb = self.caduceus.backbone
        c = (
            F.silu(bb.time_embed(sigma))
            if sigma is not None and hasattr(bb, "time_embed")
            else None
        )
        emb = self.embedding
        hs = emb(tokens)
        # [emb(x), flip(emb(rc x))]; flip(emb(rc x)) at l is the flipped embedding of
        # comp(x_l)
        if self.rcps:
            hs = torch.cat([hs, rc(emb(self.complement_map[tokens.flip(-1)]))], dim=-1)
        residual = None
        for layer in bb.layers:
            hs, residual = layer(hs, residual, c)
        norm_f = bb.norm_f.submodule if isinstance(bb.norm_f, Wrapped) else bb.norm_f
        if not self.rcps:
            return norm_f(hs + residual)
        d = self.d
        return torch.cat([norm_f(hs[..., :d] + residual[..., :d]),
                          rc(norm_f(rc(hs[..., d:]) + rc(residual[..., d:])))], dim=-1)

    def strands(self, hidden: Tensor) -> Tensor:
        """PS hidden states as the two strands' features (B, L, d, 2) (the second flipped back
        to the forward frame, as Caduceus's classification head takes them)."""
        return torch.stack([hidden[..., :self.d], hidden[..., self.d:].flip(-2, -1)], dim=-1)

    def head(self, hidden: Tensor) -> Tensor:
        if not self.rcps:
            return F.linear(hidden, self.head_weight)
        d, weight = self.d, self.head_weight
        return F.linear(hidden[..., :d], weight) + F.linear(
            hidden[..., d:].flip(-1), weight[self.complement_map]
        )

    def forward(
        self,
        tokens: Tensor,
        sigma: Tensor | None = None,
        attention_mask: Tensor | None = None,
        output_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, L, V), or (N, V) at the N True positions of `output_mask` (row-major)."""
        hidden = self.features(tokens, sigma)
        if output_mask is not None:
            hidden = hidden[output_mask]
        logits = self.head(hidden)
        return logits.to(
            torch.promote_types(logits.dtype, torch.float32)
        )  # bf16 autocast -> float32

    def num_parameters(self, non_embedding: bool = False) -> int:
        return count_parameters(self, [self.embedding.weight] if non_embedding else [])


def rescale_out_proj(model: nn.Module, n_layers: int) -> None:
    """GPT-2's scheme as Caduceus and Mamba initialise: each residual branch's output
    projection divided by sqrt(number of layers)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("out_proj.weight"):
                p /= n_layers ** 0.5


def complement_ids(vocab_size: int) -> list[int]:
    """The DNA tokeniser's complement map (A<->T, C<->G, the rest to themselves), padded to
    vocab_size."""
    from ..data.tokenizers import dna_complement

    ids = dna_complement()
    return (
        ids + list(range(len(ids), vocab_size))
        if vocab_size >= len(ids)
        else list(range(vocab_size))
    )
