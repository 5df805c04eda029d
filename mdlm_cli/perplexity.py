"""`mdlm eval-ppl`: test perplexity of a checkpoint on any prepared data set.

Diffusion models get the NELBO bound (continuous time, or the T-step discrete bound
of Table 11) over every token of the split, from K independent Monte-Carlo passes
(each pass: one t per sequence, antithetic over the whole split). The spread of the
K pass estimates gives a standard error, so the paper's "one sample is enough" is
measured rather than assumed. Autoregressive checkpoints get their exact perplexity
on the same tokens (the AR model scores every token of a row; see `ar.py`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import ar
from .checkpoint import LoadedModel
from .data.store import PreparedData, TokenSplit, prepare
from .engine.diffusion import Denoiser
from .engine.schedules import Schedule
from .errors import MdlmError
from .evaluation import BoundResult, nelbo_bound
from .runtime import derive_seed


@dataclass
class PplResult:
    dataset: str
    split: str
    tokens: int
    sequences: int
    passes: list[float]  # nats per token of each Monte-Carlo pass (one entry when exact)
    exact: bool  # True: exact likelihood (AR); False: an upper bound on the NLL
    T: int = 0
    char_level: bool = False
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def nats_per_token(self) -> float:
        return statistics.fmean(self.passes)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.nats_per_token, 700.0))

    @property
    def pass_std(self) -> float | None:
        """Standard deviation of one pass's estimate (nats/token): the Monte-Carlo error of
        a single-sample evaluation."""
        return statistics.stdev(self.passes) if len(self.passes) > 1 else None

    @property
    def standard_error(self) -> float | None:
        """Standard error of the K-pass mean (nats/token); 0 for an exact value."""
        if self.exact:
            return 0.0
        return None if self.pass_std is None else self.pass_std / math.sqrt(len(self.passes))

    @property
    def bits_per_char(self) -> float | None:
        return self.nats_per_token / math.log(2) if self.char_level else None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(kind="exact" if self.exact else "bound", nats_per_token=self.nats_per_token,
                 perplexity=self.perplexity, standard_error=self.standard_error,
                 pass_std=self.pass_std, bits_per_char=self.bits_per_char, mc_samples=len(self.passes))
        return d


def bound_passes(denoiser: Denoiser, split: TokenSplit, *, schedule: Schedule, mask_id: int,
                 mc_samples: int, batch_size: int, device: torch.device, seed: int = 0, rows: int = 0,
                 T: int = 0, on_batch: Callable[[int], None] | None = None, rank: int = 0,
                 world_size: int = 1) -> list[BoundResult]:
    """`mc_samples` independent NELBO passes over the split (antithetic t within each pass)."""
    if mc_samples < 1:
        raise MdlmError(f"--mc-samples must be at least 1 (got {mc_samples})")
    return [nelbo_bound(denoiser, split, schedule=schedule, mask_id=mask_id, batch_size=batch_size,
                        device=device, seed=derive_seed(seed, "eval-ppl", k), rows=rows, T=T,
                        antithetic=True, on_batch=on_batch, rank=rank, world_size=world_size)
            for k in range(mc_samples)]


def evaluation_data(loaded: LoadedModel, *, dataset: str | None = None, data: str | None = None,
                    progress: Callable[[str, int, int | None], None] | None = None,
                    load_dataset=None) -> tuple[str, PreparedData]:
    """The prepared data to evaluate on: a prepared folder (`data`), or a data set name or
    local path tokenised and packed as the checkpoint's own training data (prepared if needed)."""
    if data is not None and (Path(data) / "meta.json").is_file():
        prepared = PreparedData(Path(data))
    else:
        cfg = dataclasses.replace(loaded.config.data, dataset=data or dataset or loaded.config.data.dataset)
        prepared = prepare(cfg, progress=progress, load_dataset=load_dataset)
    name = prepared.meta["source"]["name"]  # a registry name, or a local file's stem
    tok, mine = prepared.meta["tokenizer"], loaded.tokenizer
    if (tok["vocab_size"], tok["mask_id"]) != (mine.vocab_size, mine.mask_id):
        raise MdlmError(f"{prepared.folder.name} uses tokenizer {tok['name']} (vocab {tok['vocab_size']}); "
                        f"the checkpoint's has vocab {mine.vocab_size}: prepare it with the same tokenizer")
    return name, prepared


def pick_split(prepared: PreparedData, split: str) -> tuple[str, str | None]:
    """`split`, or `valid` where a data set has no test split (OpenWebText); with a note."""
    if split in prepared.splits:
        return split, None
    if split == "test" and "valid" in prepared.splits:
        return "valid", f"{prepared.meta['source']['name']} has no test split; used valid"
    raise MdlmError(f"split {split!r} is not in {prepared.folder.name}; available: {', '.join(prepared.splits)}")


def evaluate(loaded: LoadedModel, prepared: PreparedData, *, name: str, split: str = "test",
             mc_samples: int = 4, T: int | None = None, batch_size: int = 16, device: torch.device,
             dtype: torch.dtype | None = None, seed: int = 0, rows: int = 0,
             on_batch: Callable[[int], None] | None = None, rank: int = 0, world_size: int = 1) -> PplResult:
    """Perplexity (bound or exact) of `loaded` on one split of `prepared`."""
    split_name, note = pick_split(prepared, split)
    token_split = prepared.split(split_name)
    if len(token_split) == 0:
        raise MdlmError(f"split {split_name} of {prepared.folder.name} is empty")
    t0 = time.perf_counter()
    tok = loaded.tokenizer
    if loaded.config.diffusion.objective == "ar":
        results = [ar.exact_nll(loaded.model, token_split, bos_id=tok.bos_id, mask_id=tok.mask_id,
                                batch_size=batch_size, device=device, rows=rows, autocast_dtype=dtype,
                                on_batch=on_batch)]
        T = 0
    else:
        T = loaded.config.diffusion.T if T is None else T
        if T < 0:
            raise MdlmError(f"--T must be 0 (continuous time) or a number of steps (got {T})")
        denoiser = loaded.denoiser(dtype)
        results = bound_passes(denoiser, token_split, schedule=denoiser.schedule, mask_id=tok.mask_id,
                               mc_samples=mc_samples, batch_size=batch_size, device=device, seed=seed,
                               rows=rows, T=T, on_batch=on_batch, rank=rank, world_size=world_size)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first = results[0]
    return PplResult(name, split_name, first.tokens, first.sequences, [r.nats_per_token for r in results],
                     exact=first.exact, T=T, char_level=tok.is_character_level,
                     seconds=time.perf_counter() - t0, notes=[note] if note else [])
