"""What a sampler's draws reveal, for whoever asks (the server's `logprobs`): at every
position a draw fills, the log-probability of the drawn token under the distribution it was
drawn from, and the `top` likeliest tokens of that distribution, from the same network call.

For a diffusion sampler this is the model's conditional at reveal time, p(x_l | the tokens
revealed until then), not the left-to-right conditional: the values of a sequence do not sum
to its log-likelihood. A sampler that records passes its draws' positions to
`SamplerContext.draw(logits, where=...)` (`SamplerSpec.records_reveals`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .categorical import token_weights


class RevealRecorder:
    """Grids (B, L) of the sample being drawn: each position's log-probability at reveal and
    its top alternatives (ids and log-probabilities, likeliest first); `recorded` says where."""

    def __init__(self, shape: tuple[int, int], top: int, device: torch.device | str = "cpu"):
        B, L = shape
        self.top = top
        self.logprob = torch.full((B, L), float("nan"), dtype=torch.float64, device=device)
        self.top_ids = torch.zeros((B, L, top), dtype=torch.long, device=device)
        self.top_logprobs = torch.full((B, L, top), float("nan"), dtype=torch.float64,
                                       device=device)
        self.recorded = torch.zeros((B, L), dtype=torch.bool, device=device)

    def record(self, where, logits: Tensor, tokens: Tensor, *, mask_id: int,
               temperature: float, top_p: float, top_k: int = 0) -> None:
        """`logits` (N, V) of the N positions `where` indexes in (B, L) (a bool mask, in row
        order, or an index such as `(slice(None), l)`), `tokens` (N,) drawn there. A greedy
        draw (temperature 0) reports the model's own distribution (temperature 1, no top-p or
        top-k)."""
        if temperature <= 0:
            temperature, top_p, top_k = 1.0, 1.0, 0
        weights = token_weights(logits, mask_id, temperature=temperature, top_p=top_p,
                                top_k=top_k).double()
        log_p = (weights / weights.sum(-1, keepdim=True)).log()  # (N, V); the mask's is -inf
        self.logprob[where] = log_p.gather(-1, tokens[:, None])[:, 0]
        if self.top:
            k = min(self.top, log_p.shape[-1])  # a vocabulary smaller than `top`: -inf after it
            values, ids = log_p.topk(k, dim=-1)
            pad = self.top - k
            self.top_ids[where] = torch.nn.functional.pad(ids, (0, pad))
            self.top_logprobs[where] = torch.nn.functional.pad(values, (0, pad),
                                                               value=float("-inf"))
        self.recorded[where] = True
