"""The shapes the batching worker runs network calls at, chosen so a row's bits never depend
on its batch.

A seeded request must get the same tokens alone or batched with any others (docs/serving.md).
Its draws come from its own generator, so what remains is the network: a matrix product's
rounding may depend on how many rows it multiplies, in which case a row's logits differ in the
last bits between a call of 1 row and of 8. Padding every call to `max_batch` rows removes the
question, but then a lone request pays for `max_batch` rows (17 s against 1.2 s at 16 rows on a
2-core CPU, BENCHMARKS.md section 10).

So the worker asks the model once per row length, at the first call of that length (not at
start: a window of 4096 positions would cost the server gigabytes before any request):
`probe` runs one call of `max_batch` random rows (fewer where that many do not fit in memory,
serve/worker.py `Memory`) and calls of fewer rows (the first and the last rows of it, so a
row's place in the batch moves too) and keeps the sizes whose rows are bit-identical to those
of the full call. A call of n rows then runs at the smallest kept size >= n
(`Shapes.size_for`); the largest size is always kept. Where the model declares
`output_mask`, the probe asks for a few random positions per row only, and the requests'
calls then ask only for the positions the samplers need (N x V logits, not B x L x V).

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


PROBE_POSITIONS = 8  # positions per row whose logits a probe with output masks compares


def probe(network: Network, *, max_batch: int, length: int, mask_id: int, masks: bool,
          device: torch.device) -> Shapes:
    """The sizes that keep every row's logits bit-identical to those of a call of `max_batch`
    rows, on one random half-masked state at `length`. Where the model takes output masks the
    calls ask for `PROBE_POSITIONS` random positions per row only, and the calls of the served
    requests then always ask for the positions they need (never B x L x V logits at once:
    at LLaDA-8B's 4096 positions and 126,464 tokens, 8 full rows are 16.6 GB)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randint(0, max(mask_id, 1), (max_batch, length), generator=g)
    z = z.masked_fill(torch.rand(max_batch, length, generator=g) < 0.5, mask_id).to(device)
    t = torch.rand(max_batch, generator=g).to(device)
    wanted = _probe_positions(max_batch, length, g).to(device) if masks else None

    def bits(n: int, last: bool) -> Tensor:  # (n, checksums per row)
        rows = slice(max_batch - n, None) if last else slice(0, n)
        out = network(z[rows], t[rows], None if wanted is None else wanted[rows])
        return _bits(out).view(n, -1)

    reference = bits(max_batch, False)
    sizes = [n for n in candidate_sizes(max_batch)
             if torch.equal(bits(n, False), reference[:n])
             and torch.equal(bits(n, True), reference[max_batch - n:])]
    sizes.append(max_batch)
    if len(sizes) == 1:
        why = (f"every call padded to {max_batch} rows: on this device a row's logits differ "
               "between batch sizes, and padding keeps seeded answers batch-invariant")
    elif len(sizes) == max_batch:
        why = "calls run at the rows they have: a row's logits are the same bits at every size"
    else:
        why = (f"calls run at {', '.join(map(str, sizes))} rows: the sizes whose rows give "
               "the same bits as a full call")
    return Shapes(tuple(sizes), masks, why + ("; logits only where the samplers ask"
                                              if masks else ""))


def _probe_positions(rows: int, length: int, g: torch.Generator) -> Tensor:
    """(rows, length) bool: the same number of random positions in every row."""
    k = min(length, PROBE_POSITIONS)
    order = torch.rand(rows, length, generator=g).argsort(dim=1)[:, :k]
    return torch.zeros(rows, length, dtype=torch.bool).scatter_(1, order, True)


def _bits(logits: Tensor, chunk: int = 1 << 22) -> Tensor:
    """A checksum of each row's bits over the last dimension (all leading dimensions kept):
    equal bits give equal sums, and a change in the last bit of one value changes the sum
    (what the probe compares without keeping the logits twice). Computed `chunk` values at a
    time, so that the int64 copy it sums is never the size of the logits."""
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    flat = logits.detach().contiguous().view(-1, logits.shape[-1])
    weights = torch.arange(1, flat.shape[-1] + 1, device=flat.device)  # a permutation shows too
    step = max(1, chunk // flat.shape[-1])
    sums = [(flat[i:i + step].view(ints[flat.element_size()]).long() * weights).sum(-1)
            for i in range(0, len(flat), step)]
    return torch.cat(sums).view(logits.shape[:-1])
