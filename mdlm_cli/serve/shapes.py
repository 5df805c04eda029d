"""The shapes the batching worker runs network calls at, chosen so a row's bits never depend
on its batch.

A seeded request must get the same tokens alone or batched with any others (docs/serving.md).
Its draws come from its own generator, so what remains is the network: a matrix product's
rounding may depend on how many rows it multiplies, in which case a row's logits differ in the
last bits between a call of 1 row and of 8. Padding every call to `max_batch` rows removes the
question, but then a lone request pays for `max_batch` rows (17 s against 1.2 s at 16 rows on a
2-core CPU, BENCHMARKS.md section 10).

So the worker asks the model once, at start: `probe` runs one call of `max_batch` random rows
and calls of fewer rows (the first and the last rows of it, so a row's place in the batch
moves too) and keeps the sizes whose rows are bit-identical to those of the full call. A call
of n rows then runs at the smallest kept size >= n (`Shapes.size_for`); `max_batch` is always
kept. Where the model declares `output_mask`, the probe also compares logits asked for at
random positions only with the full call's logits there: if they agree, calls ask only for
the positions the samplers need (N x V logits, not B x L x V).

The probe is evidence, not proof (it checks one random state per size), which is why
`--batch-padding always` (every call at `max_batch` rows, full logits: the invariance by
construction) exists next to `auto` (the probe) and `never` (every call at the rows it has).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

PADDINGS = ("auto", "always", "never")

# network(z (B, L), t (B,), output_mask (B, L) bool or None) -> (B, L, V), or (N, V) at the mask
Network = Callable[[Tensor, Tensor, Tensor | None], Tensor]


@dataclass(frozen=True)
class Shapes:
    sizes: tuple[int, ...]  # ascending row counts calls run at; the last is max_batch
    masked: bool  # calls ask only for the logits the samplers need
    why: str  # one line for the server's log

    def size_for(self, rows: int) -> int:
        """The rows a call of `rows` rows runs at (rows <= max_batch)."""
        return next(s for s in self.sizes if s >= rows)


def candidate_sizes(max_batch: int) -> list[int]:
    """The sizes probed below max_batch: all of them up to 16 rows, powers of two beyond
    (each probe is a network call)."""
    if max_batch <= 16:
        return list(range(1, max_batch))
    return [1 << k for k in range(max_batch.bit_length()) if (1 << k) < max_batch]


def fixed_shapes(padding: str, max_batch: int, masks: bool) -> Shapes | None:
    """The shapes `always` and `never` give without a probe (None for `auto`)."""
    if padding == "always":
        return Shapes((max_batch,), False, f"every call padded to {max_batch} rows "
                                           "(--batch-padding always)")
    if padding == "never":
        return Shapes(tuple(range(1, max_batch + 1)), masks,
                      "calls run at the rows they have (--batch-padding never: a seeded answer "
                      "may change in rare draws with the requests batched beside it)")
    return None


def probe(network: Network, *, max_batch: int, length: int, mask_id: int, masks: bool,
          device: torch.device) -> Shapes:
    """The sizes (and whether output masks) keep every row's logits bit-identical to those of
    a call of `max_batch` rows, on one random half-masked state at `length`."""
    g = torch.Generator().manual_seed(0)
    z = torch.randint(0, max(mask_id, 1), (max_batch, length), generator=g)
    z = z.masked_fill(torch.rand(max_batch, length, generator=g) < 0.5, mask_id).to(device)
    t = torch.rand(max_batch, generator=g).to(device)
    reference = _bits(network(z, t, None))  # (M, L)
    sizes = [n for n in candidate_sizes(max_batch)
             if torch.equal(_bits(network(z[:n], t[:n], None)), reference[:n])
             and torch.equal(_bits(network(z[-n:], t[-n:], None)), reference[-n:])]
    sizes.append(max_batch)
    masked = False
    if masks:
        wanted = (torch.rand(max_batch, length, generator=g) < 0.3).to(device)
        masked = all(torch.equal(_bits(network(z[:n], t[:n], wanted[:n])),
                                 reference[:n][wanted[:n]]) for n in sizes)
    if len(sizes) == 1:
        why = (f"every call padded to {max_batch} rows: on this device a row's logits differ "
               "between batch sizes, and padding keeps seeded answers batch-invariant")
    elif len(sizes) == max_batch:
        why = "calls run at the rows they have: a row's logits are the same bits at every size"
    else:
        why = (f"calls run at {', '.join(map(str, sizes))} rows: the sizes whose rows give "
               "the same bits as a full call")
    return Shapes(tuple(sizes), masked, why + ("; logits only where the samplers ask"
                                               if masked else ""))


def _bits(logits: Tensor) -> Tensor:
    """A checksum of each row's bits, over the last dimension: equal bits give equal sums, and
    a change in the last bit of one value changes the sum (what the probe compares, without
    keeping B x L x V logits twice)."""
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    raw = logits.detach().contiguous().view(ints[logits.element_size()]).long()
    weights = torch.arange(1, raw.shape[-1] + 1, device=raw.device)  # a permutation shows too
    return (raw * weights).sum(-1)
