"""Speed at equal quality: `mdlm bench-sampler --judge`'s quality columns and the real-text
reference (the frontier plot: frontier_plot.py).

A sampler can be fast because it lowers the effective temperature (Zheng et al. 2024:
float32 draws truncate rare tokens; confidence-ordered decoding keeps likely draws), and
then its generative perplexity drops together with its entropy. So each benchmark row's
samples are scored as `mdlm gen-ppl` scores them (`genppl.score_samples`, the same
defaults: every token, chunks of the judge's context, 8 chunks per pass), and put next
to real text of the same length scored the same way.

Gen PPL and entropy can be gamed together; the rows also get the set's diversity (Dist-n,
self-BLEU, repetition: `eval/diversity.py`) and, with a reference, MAUVE against a set of
real rows disjoint from the reference's own sets (`eval/mauve.py`): each of those sets gets
the same MAUVE against it, so the band covers MAUVE too.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import MdlmError
from ..eval.diversity import diversity
from ..eval.genppl import GenPplResult, Judge, score_samples

# Quality's figures that a reference band covers (with the gen PPL, entropy and nats/char)
DIVERSITY_FIELDS = ("dist_1", "dist_2", "dist_3", "self_bleu", "repetition_4")


@dataclass
class Quality:
    """The judge's figures of one set of samples, with standard errors over the samples."""

    num_samples: int
    gen_ppl: float
    nats_per_token: float
    # ratio estimator: sd of (nll_i - r tokens_i) * sqrt(n) / total tokens
    nats_per_token_se: float | None
    nats_per_char: float
    entropy: float  # mean per-sample unigram entropy (nats)
    entropy_se: float | None
    dist_1: float | None = None  # diversity over words (eval/diversity.py)
    dist_2: float | None = None
    dist_3: float | None = None
    self_bleu: float | None = None
    repetition_4: float | None = None
    mauve: float | None = None  # against the reference's MAUVE set, mean over the k-means seeds
    mauve_sd: float | None = None  # sd over the seeds

    @classmethod
    def of(cls, result: GenPplResult) -> Quality:
        nll = np.array([s.nll for s in result.samples], dtype=np.float64)
        tokens = np.array([s.scored for s in result.samples], dtype=np.float64)
        entropy = np.array([s.entropy for s in result.samples], dtype=np.float64)
        n = len(nll)
        r = result.nats_per_token
        se = entropy_se = None
        if n > 1:
            residuals = nll - r * tokens
            se = math.sqrt((residuals**2).sum() / (n - 1) * n) / max(tokens.sum(), 1)
            entropy_se = float(entropy.std(ddof=1) / math.sqrt(n))
        return cls(n, result.gen_ppl, r, se, result.nats_per_char, result.entropy, entropy_se)

    def with_texts(self, texts: list[str], mauve_set: MauveSet | None = None) -> Quality:
        """The same figures with the texts' diversity and, given a MAUVE set, their MAUVE."""
        measured = diversity(texts)
        extra = {name: getattr(measured, name) for name in DIVERSITY_FIELDS}
        if mauve_set is not None:
            result = mauve_set.mauve(texts)
            extra.update(mauve=result.mauve, mauve_sd=result.mauve_sd)
        return dataclasses.replace(self, **extra)


@dataclass
class MauveSet:
    """Real text that MAUVE compares against: its features, computed once for the table."""

    featurizer: object  # eval.features.Featurizer
    features: torch.Tensor  # (n, d)
    seeds: tuple[int, ...]

    @classmethod
    def of(cls, featurizer, texts: list[str], seeds: tuple[int, ...]) -> MauveSet:
        return cls(featurizer, featurizer.features(texts), tuple(seeds))

    def mauve(self, texts: list[str]):
        from ..eval.features import text_mauve

        return text_mauve(self.featurizer, texts, self.features, seeds=self.seeds)


def score_tokens(judge: Judge, tokenizer, tokens: torch.Tensor) -> GenPplResult:
    """Score sampled token rows (B, L) as `mdlm gen-ppl --samples` scores `mdlm sample --out`:
    the decoded text under the judge, the unigram entropy over the sample's own ids."""
    rows = tokens.cpu().tolist()
    return score_samples(judge, [tokenizer.decode(row) for row in rows], sample_tokens=rows)


@dataclass
class Reference:
    """Real text of the benchmark's length from a prepared split, scored like the samples:
    pooled over `groups` disjoint sets of `per_group` rows, and the band (min, max) of each
    figure over those sets, where a set of real rows of the samples' size lands."""

    split: str
    length: int
    per_group: int
    groups: int
    quality: Quality
    band: dict[str, tuple[float, float]]

    def contains(self, quality: Quality) -> bool:
        """Whether gen PPL and entropy (and MAUVE, where measured) all lie in the band."""
        checked = [(getattr(quality, name), lo, hi) for name, (lo, hi) in self.band.items()
                   if name in ("gen_ppl", "entropy", "mauve")]
        return all(lo <= value <= hi for value, lo, hi in checked if value is not None)


def reference_rows(split, *, length: int, count: int) -> torch.Tensor:
    """`count` rows of the split evenly spread over it, among those with at least `length`
    real tokens, cut to `length` (LongTensor (count, length))."""
    if length > split.tokens.shape[1]:
        raise MdlmError(f"--reference-text: the data's rows hold {split.tokens.shape[1]} "
                        f"tokens; the benchmark's length is {length}")
    full = np.nonzero(split.lengths >= length)[0]
    if len(full) < count:
        raise MdlmError(
            f"--reference-text: the split has {len(full)} rows of {length} tokens; lower -n"
        )
    pick = full[np.linspace(0, len(full) - 1, count).round().astype(np.int64)]
    return torch.from_numpy(np.asarray(split.tokens[pick, :length]).astype(np.int64))


@dataclass(frozen=True)
class ReferenceSets:
    """The real rows a reference scores: up to `max_groups` disjoint sets of `per_group` rows
    of `length` tokens (as many as the prepared `split`, named `split_name`, holds)."""

    split: Any  # data.store.TokenSplit
    split_name: str
    length: int
    per_group: int
    max_groups: int = 8


def reference_quality(judge: Judge, tokenizer, reference: ReferenceSets, *, featurizer=None,
                      seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
                      ) -> tuple[Reference, MauveSet | None]:
    """Score the `reference` sets of real rows. With a featurizer, one more set of `per_group`
    rows, disjoint from them, is MAUVE's reference (returned, its MAUVE over `seeds`): every
    set gets its MAUVE against it, so the band covers MAUVE."""
    split, length, per_group = reference.split, reference.length, reference.per_group
    available = int((split.lengths >= length).sum())
    spare = 0 if featurizer is None else 1
    groups = max(min(reference.max_groups, available // per_group - spare), 1)
    rows = reference_rows(split, length=length, count=(groups + spare) * per_group)
    mauve_set = None
    if featurizer is not None:  # every (groups + 1)-th row: spread over the split like the sets
        pick = torch.arange(len(rows)) % (groups + 1) == groups
        real = [tokenizer.decode(r) for r in rows[pick].tolist()]
        mauve_set = MauveSet.of(featurizer, real, seeds)
        rows = rows[~pick]
    result = score_tokens(judge, tokenizer, rows)
    texts = [tokenizer.decode(r) for r in rows.tolist()]
    sets = [Quality.of(_subset(result, g * per_group, (g + 1) * per_group))
            .with_texts(texts[g * per_group:(g + 1) * per_group], mauve_set)
            for g in range(groups)]
    band = {}
    for name in ("gen_ppl", "entropy", "nats_per_char", *DIVERSITY_FIELDS, "mauve"):
        values = [getattr(q, name) for q in sets]
        if all(v is not None for v in values):
            band[name] = (min(values), max(values))
    # the pooled figures; a set's diversity and MAUVE depend on its size: their mean over the
    # sets
    means = {name: float(np.mean([getattr(q, name) for q in sets])) for name in band
             if name in (*DIVERSITY_FIELDS, "mauve")}
    if mauve_set is not None:
        means["mauve_sd"] = float(np.mean([q.mauve_sd or 0.0 for q in sets]))
    pooled = dataclasses.replace(Quality.of(result), **means)
    return Reference(reference.split_name, length, per_group, groups, pooled, band), mauve_set


def _subset(result: GenPplResult, start: int, end: int) -> GenPplResult:
    return dataclasses.replace(result, samples=result.samples[start:end])


def reference_split(data_cfg, tokenizer, split: str):
    """The prepared split (prepared now if missing) of the model's own data, and its name."""
    from ..data.store import prepare
    from ..eval.ppl import pick_split

    prepared = prepare(data_cfg)
    tok = prepared.meta["tokenizer"]
    if (tok["vocab_size"], tok["mask_id"]) != (tokenizer.vocab_size, tokenizer.mask_id):
        raise MdlmError(
            f"{prepared.folder.name} uses tokenizer {tok['name']}; the model's has vocab "
            f"{tokenizer.vocab_size}"
        )
    name, _ = pick_split(prepared, split)
    return prepared.split(name), name


class RowScorer:
    """`run_bench`'s `on_tokens`: scores each row's samples with one judge (loaded once for
    the table) and, with `save_dir`, writes them as `mdlm sample --out` JSONL, so that
    `mdlm gen-ppl --samples FILE --judge J` gives the row's numbers."""

    def __init__(self,
                 judge: Judge,
                 tokenizer,
                 *,
                 save_dir: str | None = None,
                 source: str = "",
                 seed: int = 0,
                 mauve_set: MauveSet | None = None):
        self.judge, self.tokenizer = judge, tokenizer
        self.save_dir, self.source, self.seed = save_dir, source, seed
        self.mauve_set = mauve_set

    def __call__(self, row, tokens: torch.Tensor) -> None:
        texts = [self.tokenizer.decode(ids) for ids in tokens.cpu().tolist()]
        scored = Quality.of(score_tokens(self.judge, self.tokenizer, tokens))
        row.quality = scored.with_texts(texts, self.mauve_set)
        if self.save_dir is not None:
            self._save(row, tokens)

    def _save(self, row, tokens: torch.Tensor) -> None:
        from pathlib import Path

        from .generate import SampleRecord, write_jsonl

        setting = row.setting.replace(" ", "-").replace("=", "") or "default"
        name = f"{row.precision}-{row.sampler}-{setting}-b{row.batch_size}.jsonl"
        extra = {
            "sampler": row.sampler,
            "steps": row.steps,
            "nfe": row.nfe,
            "ncs": row.ncs,
            "seed": self.seed,
            "precision": row.precision,
            "checkpoint": self.source,
            "seconds": row.seconds_per_sample,
            **row.options,
        }
        records = [
            SampleRecord(i, self.tokenizer.decode(ids), ids).to_json(**extra)
            for i, ids in enumerate(tokens.cpu().tolist())
        ]
        write_jsonl(Path(self.save_dir) / name, records)


def mauve_reference_texts(spec: str,
                          *,
                          checkpoint: str | None,
                          count: int,
                          length: int) -> list[str]:
    """`mdlm gen-ppl --mauve-reference`: the texts of a JSONL file (`mdlm sample --out`'s
    format), or `count` rows of `length` tokens of a split (test, valid, train) of the
    sampled checkpoint's prepared data."""
    from pathlib import Path

    from ..data.sources import SPLITS
    from ..eval.genppl import read_samples

    if Path(spec).is_file() or spec not in SPLITS:
        return read_samples(spec)[0]
    if checkpoint is None:
        raise MdlmError(f"--mauve-reference {spec}: a split of the model's own data needs "
                        "--sample-first --checkpoint; else give a JSONL file of real text")
    from ..checkpoints.load import load_checkpoint

    loaded = load_checkpoint(checkpoint, device=torch.device("cpu"))
    split, _ = reference_split(loaded.config.data, loaded.tokenizer, spec)
    rows = reference_rows(split, length=length, count=count)
    return [loaded.tokenizer.decode(r) for r in rows.tolist()]
