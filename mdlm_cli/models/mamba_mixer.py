"""The Mamba (S6) mixer of Gu & Dao (2023), with two implementations of its selective scan.

Parameter names and shapes are mamba-ssm's `Mamba` (`in_proj`, `conv1d`, `x_proj`,
`dt_proj`, `A_log`, `D`, `out_proj`), so the released Caduceus and Mamba checkpoints load
into it whichever implementation runs:

- `cuda`: mamba-ssm's fused `selective_scan_fn` (and causal-conv1d when installed); CUDA
  tensors only, `pip install mamba-ssm` on a CUDA machine (never a dependency);
- `torch`: the parallel (Blelloch) scan of the PyPI package `mambapy` (MIT, pure
  PyTorch), on any device; `pip install mambapy`;
- `auto`: `cuda` for CUDA tensors when mamba-ssm imports, `torch` otherwise.

The recurrence (eq. 2a/2b of the Mamba paper, zero-order hold): with
delta = softplus(dt_proj(dt)), A = -exp(A_log),
    h_l = exp(delta_l A) * h_{l-1} + delta_l B_l x_l,   y_l = C_l . h_l + D x_l,
then y * silu(z) and the output projection. `step` advances the same recurrence one
token from a `MixerState` (the causal conv window and h), for left-to-right decoding.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import MdlmError

MIXERS = ("auto", "cuda", "torch")


@dataclass
class MixerState:
    """Recurrent state of one mixer: the last d_conv conv inputs (B, E, d_conv) and h (B, E,
    N)."""

    conv: Tensor
    ssm: Tensor


def mamba_ssm_available() -> bool:
    return importlib.util.find_spec("mamba_ssm") is not None


def mambapy_available() -> bool:
    return importlib.util.find_spec("mambapy") is not None


def resolve_mixer(impl: str, device: torch.device) -> str:
    """The implementation that runs for tensors on `device` (`cuda` or `torch`)."""
    if impl not in MIXERS:
        raise MdlmError(f"model.mixer must be one of: {', '.join(MIXERS)} (got {impl!r})")
    if impl == "auto":
        return "cuda" if device.type == "cuda" and mamba_ssm_available() else "torch"
    if impl == "cuda" and (device.type != "cuda" or not mamba_ssm_available()):
        raise MdlmError(
            "model.mixer=cuda needs CUDA tensors and mamba-ssm (pip install mamba-ssm on a CUDA "
            "machine); use model.mixer=torch (mambapy) or auto"
        )
    return impl


def torch_scan(deltaA: Tensor, BX: Tensor) -> Tensor:
    """h_l = deltaA_l * h_{l-1} + BX_l (h_0 = 0) for (B, L, E, N) tensors, by mambapy's parallel
    scan."""
    if not mambapy_available():
        raise MdlmError("the torch Mamba mixer needs the mambapy package: pip install mambapy "
                        "(or pip install -e '.[dna]')")
    from mambapy.pscan import pscan

    return pscan(deltaA, BX)


def _scan_dtype(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


class MambaMixer(nn.Module):
    """`MambaMixer(d_model)(x (B, L, d_model)) -> (B, L, d_model)`; mamba-ssm's defaults
    (d_state 16, d_conv 4, expand 2, dt_rank ceil(d/16), dt in [1e-3, 0.1], S4D-real A)."""

    def __init__(
        self,
        d_model: int,
        *,
        d_state: int = 16,
        d_conv: int = 4,
        expand: int = 2,
        impl: str = "auto",
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
    ):
        super().__init__()
        self.d_model, self.d_state, self.d_conv, self.impl = d_model, d_state, d_conv, impl
        self.d_inner = expand * d_model
        self.dt_rank = math.ceil(d_model / 16)
        E = self.d_inner
        self.in_proj = nn.Linear(d_model, 2 * E, bias=False)
        self.conv1d = nn.Conv1d(E, E, kernel_size=d_conv, groups=E, padding=d_conv - 1,
                                bias=True)
        self.x_proj = nn.Linear(E, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, E, bias=True)
        std = (
            self.dt_rank**-0.5
        )  # keeps the variance of dt_proj's output at init (mamba-ssm's "random")
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        log_dt = torch.rand(E) * (math.log(dt_max) - math.log(dt_min)) + math.log(
            dt_min
        )  # log-uniform dt
        dt = torch.exp(log_dt).clamp(min=dt_init_floor)
        with torch.no_grad():  # softplus(bias) = dt: the inverse softplus
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(
            torch.log(torch.arange(1, d_state + 1, dtype=torch.float32).repeat(E, 1))
        )
        self.D = nn.Parameter(torch.ones(E))
        self.out_proj = nn.Linear(E, d_model, bias=False)

    def forward(self, x: Tensor, state: MixerState | None = None) -> Tensor:
        """With `state` (zeros), also leave in it the state after the last position (prefill)."""
        L = x.shape[1]
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # (B, L, E) each
        if state is not None:  # the last d_conv conv inputs, zero-padded on the left
            state.conv.copy_(F.pad(xs.transpose(1, 2), (self.d_conv - L, 0)) if L < self.d_conv
                             else xs[:, -self.d_conv:].transpose(1, 2))
        xs = F.silu(self.conv1d(xs.transpose(1, 2))[..., :L]).transpose(
            1, 2
        )  # causal depthwise conv
        dt, B, C = self.x_proj(xs).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        A = -torch.exp(self.A_log.to(_scan_dtype(x)))  # (E, N)
        if resolve_mixer(self.impl, x.device) == "cuda" and state is None:
            y = self._cuda_scan(xs, dt, A, B, C, z)
        else:
            y = self._torch_scan(xs, dt, A, B, C, z, state)
        return self.out_proj(y)

    def _torch_scan(self, xs, dt, A, B, C, z, state: MixerState | None) -> Tensor:
        f = _scan_dtype(
            xs
        )  # the scan in float32 at least (bf16 autocast), float64 for float64 models
        delta = F.softplus(self.dt_proj(dt)).to(f)  # (B, L, E)
        deltaA = torch.exp(delta[..., None] * A.to(f))  # (B, L, E, N)
        BX = delta[..., None] * B.to(f)[:, :, None, :] * xs.to(f)[..., None]  # (B, L, E, N)
        h = torch_scan(deltaA, BX)
        if state is not None:
            state.ssm.copy_(h[:, -1])
        y = (h @ C.to(f)[..., None]).squeeze(-1) + self.D.to(f) * xs.to(f)  # (B, L, E)
        return (y * F.silu(z.to(f))).to(xs.dtype)

    def _cuda_scan(self, xs, dt, A, B, C, z) -> Tensor:
        from mamba_ssm.ops.selective_scan_interface import (  # type: ignore[import-not-found]
            selective_scan_fn,
        )

        delta = F.linear(
            dt, self.dt_proj.weight
        )  # the bias and softplus are applied inside the kernel
        y = selective_scan_fn(
            xs.transpose(1, 2).contiguous(),
            delta.transpose(1, 2).contiguous(),
            A,
            B.transpose(1, 2).contiguous(),
            C.transpose(1, 2).contiguous(),
            self.D.float(),
            z=z.transpose(1, 2).contiguous(),
            delta_bias=self.dt_proj.bias.float(),
            delta_softplus=True,
        )  # (B, E, L)
        return y.transpose(1, 2)

    def new_state(
        self, batch: int, device: torch.device, dtype: torch.dtype = torch.float32
    ) -> MixerState:
        return MixerState(torch.zeros(batch, self.d_inner, self.d_conv, device=device,
                                      dtype=dtype),
                          torch.zeros(batch, self.d_inner, self.d_state, device=device,
                                      dtype=torch.promote_types(dtype, torch.float32)))

    def step(self, x: Tensor, state: MixerState) -> Tensor:
        """One new position x (B, 1, d_model) after those `state` summarises; updates `state`."""
        xs, z = self.in_proj(x[:, 0]).chunk(2, dim=-1)  # (B, E)
        state.conv.copy_(
            torch.cat([state.conv[..., 1:], xs[..., None].to(state.conv.dtype)], dim=-1)
        )
        xs = F.silu((state.conv * self.conv1d.weight[:, 0]).sum(-1)
                    + self.conv1d.bias).to(x.dtype)
        dt, B, C = self.x_proj(xs).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        f = _scan_dtype(xs)
        delta = F.softplus(self.dt_proj(dt)).to(f)  # (B, E)
        A = -torch.exp(self.A_log.to(f))
        state.ssm.copy_(torch.exp(delta[..., None] * A) * state.ssm
                        + delta[..., None] * B.to(f)[:, None, :] * xs.to(f)[..., None])
        y = (state.ssm.to(f) @ C.to(f)[..., None]).squeeze(-1) + self.D.to(f) * xs.to(f)
        return self.out_proj((y * F.silu(z.to(f))).to(x.dtype))[:, None]
