"""`mdlm eval-ppl`: the test perplexity of a loaded model on a prepared split, with K
independent Monte-Carlo passes of its objective's bound (objectives/bound.py holds the
arithmetic). The spread of the K pass estimates gives a standard error, so the paper's "one
sample is enough" is measured rather than assumed. Exact objectives (AR) give their exact
likelihood on the same tokens, in one pass.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..config import SFT_PACKINGS
from ..data.sft import holds_examples
from ..data.store import PreparedData, prepare
from ..errors import MdlmError, MdlmWarning
from ..objectives.bound import BoundResult, SplitSweep
from ..runtime import derive_seed

if TYPE_CHECKING:
    from ..checkpoints.folder import LoadedModel

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
    # Table 9's per-datapoint spread: for each sequence, the sd (variance) of its bound over the
    # K passes, in nats/token of that sequence, averaged over the sequences (K >= 2, bounds only)
    sequence_sd: float | None = None
    sequence_var: float | None = None
    kind: str = ""  # "masked-token" for an MLM (neither exact nor a bound)
    # prompt/response rows: the bound (or NLL) of the responses given their prompts, per
    # response token (the prompt clean, never masked or scored)
    conditional: bool = False

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
        d.update(
            kind="exact" if self.exact else (self.kind or "bound"),
            nats_per_token=self.nats_per_token,
            perplexity=self.perplexity,
            standard_error=self.standard_error,
            pass_std=self.pass_std,
            bits_per_char=self.bits_per_char,
            mc_samples=len(self.passes),
        )
        return d


def evaluation_data(loaded: LoadedModel, *, dataset: str | None = None, data: str | None = None,
                    progress: Callable[[str, int, int | None], None] | None = None,
                    load_dataset=None) -> tuple[str, PreparedData]:
    """The prepared data to evaluate on: a prepared folder (`data`), or a data set name or
    local path tokenised and packed as the checkpoint's own training data (prepared if needed).
    Prompt/response examples (data/sft.py) are packed as prompt/response rows whatever the
    model was trained on (a LLaDA or Dream folder, a DiT trained on text), so the bound is the
    conditional one; a model trained on such rows keeps its own packing (sft or sft-pack)."""
    if data is not None and (Path(data) / "meta.json").is_file():
        prepared = PreparedData(Path(data))
    else:
        cfg = dataclasses.replace(
            loaded.config.data, dataset=data or dataset or loaded.config.data.dataset
        )
        if cfg.packing not in SFT_PACKINGS and holds_examples(cfg.dataset):
            # one example a row, [BOS] prompt response [EOS] then padding that is never scored
            cfg = dataclasses.replace(cfg, packing="sft", pad_as_eos=False)
        prepared = prepare(cfg, progress=progress, load_dataset=load_dataset)
    name = prepared.meta["source"]["name"]  # a registry name, or a local file's stem
    tok, mine = prepared.meta["tokenizer"], loaded.tokenizer
    if (tok["vocab_size"], tok["mask_id"]) != (mine.vocab_size, mine.mask_id):
        raise MdlmError(
            f"{prepared.folder.name} uses tokenizer {tok['name']} (vocab {tok['vocab_size']}); "
            f"the checkpoint's has vocab {mine.vocab_size}: prepare it with the same tokenizer"
        )
    return name, prepared


def pick_split(prepared: PreparedData, split: str) -> tuple[str, str | None]:
    """`split`, or `valid` where a data set has no test split (OpenWebText); with a note."""
    if split in prepared.splits:
        return split, None
    if split == "test" and "valid" in prepared.splits:
        return "valid", f"{prepared.meta['source']['name']} has no test split; used valid"
    raise MdlmError(
        f"split {split!r} is not in {prepared.folder.name}; "
        f"available: {', '.join(prepared.splits)}"
    )


@dataclass(frozen=True)
class PplOptions:
    """What one evaluation runs (`mdlm eval-ppl`'s flags): the split (`valid` where a data set
    has no test split), K Monte-Carlo passes, the discrete T (None: as trained), rows per
    batch, the seed of the passes, the first `rows` rows (0: all), and this process's `rank`
    of `world_size` (torchrun). None for `mc_samples` or `batch_size` is a flag not given:
    `eval_options` resolves it (4 passes for a bound, 1 for an exact likelihood; the
    checkpoint's train.micro_batch_size)."""

    split: str = "test"
    mc_samples: int | None = 4
    T: int | None = None
    batch_size: int | None = 16
    seed: int = 0
    rows: int = 0
    rank: int = 0
    world_size: int = 1
    estimator: str | None = None  # t or l (LLaDA's masked counts); None: the family's own

    def validate(self) -> PplOptions:
        if self.mc_samples is None or self.batch_size is None:
            raise ValueError("PplOptions: mc_samples and batch_size are not resolved "
                             "(eval_options resolves them)")
        if self.mc_samples < 1:
            raise MdlmError(f"--mc-samples must be at least 1 (got {self.mc_samples})")
        return self

    def sweep(self, device: torch.device, on_batch: Callable[[int], None] | None,
              per_sequence: bool) -> SplitSweep:
        """How each pass sweeps the split."""
        return SplitSweep(self.batch_size, device, rows=self.rows, rank=self.rank,
                          world_size=self.world_size, per_sequence=per_sequence,
                          on_batch=on_batch)


def evaluate(
    loaded: LoadedModel,
    prepared: PreparedData,
    options: PplOptions,
    *,
    name: str,
    device: torch.device,
    dtype: torch.dtype | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> PplResult:
    """Perplexity (bound or exact, as the checkpoint's objective gives it) on one split of
    the data set `name`, with the model's autocast `dtype`; `on_batch(rows)` as rows finish."""
    options.validate()
    split_name, note = pick_split(prepared, options.split)
    token_split = prepared.split(split_name)
    if len(token_split) == 0:
        raise MdlmError(f"split {split_name} of {prepared.folder.name} is empty")
    t0 = time.perf_counter()
    objective, mc_samples = loaded.objective, options.mc_samples
    results = objective.evaluate(
        loaded.denoiser(dtype),
        token_split,
        options.sweep(device, on_batch, per_sequence=not objective.exact and mc_samples > 1),
        seeds=[derive_seed(options.seed, "eval-ppl", k) for k in range(mc_samples)],
        T=options.T,
        estimator=options.estimator or "t",
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first = results[0]
    spread = sequence_spread(results, token_split.lengths[:first.sequences])
    return PplResult(
        name,
        split_name,
        first.tokens,
        first.sequences,
        [r.nats_per_token for r in results],
        exact=first.exact,
        T=first.T,
        char_level=loaded.tokenizer.is_character_level,
        seconds=time.perf_counter() - t0,
        notes=[note] if note else [],
        sequence_sd=spread[0],
        sequence_var=spread[1],
        kind=first.kind,
        conditional=prepared.meta.get("packing") in SFT_PACKINGS,
    )


def sequence_spread(
    results: list[BoundResult], lengths: np.ndarray
) -> tuple[float | None, float | None]:
    """(mean sd, mean variance) over sequences of each sequence's bound across the passes, in
    nats/token of the sequence: the per-datapoint variance of a one-sample estimate (Table 9).
    None with fewer than two passes or without per-sequence values."""
    if len(results) < 2 or any(r.per_sequence is None for r in results):
        return None, None
    # (K, n)
    per_token = np.stack([r.per_sequence for r in results]) / np.maximum(lengths, 1)[None]
    var = per_token.var(axis=0, ddof=1)
    return float(np.sqrt(var).mean()), float(var.mean())


def eval_options(loaded: LoadedModel, device, flags: PplOptions, *,
                 schedule: str | None = None) -> tuple[PplOptions, str]:
    """`evaluate`'s options for `mdlm eval-ppl`'s `flags`, and the trained schedule's name: the
    passes (`eval_passes`), the batch size (the checkpoint's where not given), the schedule
    swapped in (`use_schedule`) and a batch refused where it cannot fit (`check_eval_memory`)."""
    mc_samples, T = eval_passes(loaded.objective, flags.mc_samples, flags.T)
    trained = use_schedule(loaded.objective, schedule)
    batch_size = flags.batch_size or loaded.config.train.micro_batch_size
    options = dataclasses.replace(flags, mc_samples=mc_samples, T=T, batch_size=batch_size,
                                  estimator=ppl_estimator(loaded, flags.estimator, T))
    check_eval_memory(loaded, device, options)
    return options, trained


def ppl_estimator(loaded: LoadedModel, asked: str | None, T: int | None) -> str:
    """The bound's estimator: as asked, else the model family's (LLaDA's `l`) where it
    applies, else `t`; `l` asked where it cannot run is refused in one line."""
    return loaded.objective.choose_estimator(
        asked, loaded.sampling_defaults.get("estimator", "t"), T)


def check_eval_memory(loaded: LoadedModel, device, options: PplOptions) -> None:
    """An evaluation batch that cannot fit in memory is refused before any data is read."""
    from ..memory import Workload, check_memory

    rows, batch = options.rows, options.batch_size
    batch = min(batch, rows) if rows > 0 else batch
    work = Workload(batch, loaded.length,
                    what=f"evaluating {batch} rows of {loaded.length} tokens per batch",
                    fix="lower --batch-size")
    check_memory(loaded.model, loaded.config.model, loaded.tokenizer.vocab_size, work,
                 device=device)


def eval_passes(objective, mc_samples: int | None, T: int | None) -> tuple[int, int | None]:
    """(K, T) of an evaluation: an exact likelihood takes one pass and no T (a warning where
    either is asked for)."""
    if not objective.exact:
        return 4 if mc_samples is None else mc_samples, T
    for flag, value in (("--mc-samples", mc_samples), ("--T", T)):
        if value is not None:
            warnings.warn(f"{flag} {value} does not apply: the {objective.name} model's "
                          "likelihood is exact", MdlmWarning, stacklevel=2)
    return 1, None


def use_schedule(objective, schedule: str | None) -> str:
    """Swap the objective's schedule for `schedule` (the bound and its time draws read it); the
    trained schedule's name. Refused where the swap changes what the model computes."""
    from ..engine.schedules import get_schedule

    trained = objective.schedule.name
    if schedule is None:
        return trained
    if not objective.uses_time:
        raise MdlmError(f"--schedule does not apply: the {objective.name} objective has no "
                        "diffusion time")
    if objective.takes_time:
        raise MdlmError(f"--schedule needs a model without time conditioning: this "
                        f"{objective.name} model reads sigma(t) of its {trained} schedule, so "
                        "its bound is not invariant to the schedule")
    objective.schedule = get_schedule(schedule, objective.schedule.eps)
    return trained
