"""Diversity and repetition of a set of samples, over whitespace-separated words.

Words rather than a tokeniser's ids, so that samples of models with different tokenisers
(and real text) compare; the unigram entropy of `genppl.py` stays over token ids.

- Dist-n (Li et al. 2016): distinct n-grams over all n-grams of the whole sample set;
- repetition: the fraction of a sample's n-grams that repeat an earlier n-gram of the
  same sample, 1 - unique / total (seq-rep-n, Welleck et al. 2019), averaged over samples;
- self-BLEU (Zhu et al. 2018): BLEU-4 of each sample against all the others as references,
  averaged. BLEU is Papineni et al.'s (clipped n-gram precisions, geometric mean, brevity
  penalty against the closest reference length) with Lin and Och's (2004) add-one smoothing
  of the 2- to 4-gram precisions (Chen and Cherry 2014, smoothing 2): identical samples score
  1, samples that share no word score 0. Implemented here; sacrebleu would add a dependency
  for one sentence-level formula.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np


def ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def distinct_n(samples: list[list[str]], n: int) -> float:
    """Distinct n-grams / all n-grams, pooled over the samples (0 where there are none)."""
    grams = [g for words in samples for g in ngrams(words, n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition(words: list[str], n: int = 4) -> float:
    """Fraction of the sample's n-grams that are repeats: 1 - unique / total (0 if none)."""
    grams = ngrams(words, n)
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def _closest_lengths(lengths: np.ndarray) -> np.ndarray:
    """For each sample the length of the closest other sample (the shorter on ties)."""
    out = np.empty_like(lengths)
    for i, c in enumerate(lengths):
        others = np.delete(lengths, i)
        gap = np.abs(others - c) * 2 + (others > c)  # ties go to the shorter reference
        out[i] = others[int(gap.argmin())]
    return out


def self_bleu(samples: list[list[str]], max_n: int = 4) -> float | None:
    """Mean BLEU-`max_n` of each sample against all the others (see the module docstring);
    None for fewer than 2 samples."""
    if len(samples) < 2:
        return None
    counts = [[Counter(ngrams(words, n)) for n in range(1, max_n + 1)] for words in samples]
    # per order, each n-gram's two highest counts over the samples and the owner of the highest:
    # the clipping count against "all the others" without a pass per sample
    top: list[dict[tuple, list]] = [{} for _ in range(max_n)]
    for i, per_order in enumerate(counts):
        for order, counter in enumerate(per_order):
            for gram, c in counter.items():
                best = top[order].setdefault(gram, [0, -1, 0])
                if c > best[0]:
                    best[:] = [c, i, best[0]]
                elif c > best[2]:
                    best[2] = c
    refs = _closest_lengths(np.array([len(w) for w in samples]))
    scores = []
    for i, per_order in enumerate(counts):
        logs = []
        for order, counter in enumerate(per_order):
            total = sum(counter.values())
            matched = 0
            for gram, c in counter.items():
                first, owner, second = top[order][gram]
                matched += min(c, second if owner == i else first)
            if order > 0:  # add-one smoothing of the higher orders
                matched, total = matched + 1, total + 1
            logs.append(math.log(matched / total) if matched else -math.inf)
        length = len(samples[i])
        bp = 1.0 if length > refs[i] else math.exp(1 - refs[i] / length) if length else 0.0
        scores.append(
            bp * math.exp(sum(logs) / max_n) if all(math.isfinite(v) for v in logs) else 0.0
        )
    return float(np.mean(scores))


@dataclass
class Diversity:
    dist_1: float
    dist_2: float
    dist_3: float
    self_bleu: float | None  # BLEU-4 against the other samples; None with a single sample
    repetition_4: float  # mean fraction of repeated 4-grams within a sample
    words: int  # total words

    def to_dict(self) -> dict:
        return asdict(self)


def diversity(texts: list[str]) -> Diversity:
    """Dist-1/2/3, self-BLEU-4 and 4-gram repetition of a set of texts."""
    samples = [text.split() for text in texts]
    return Diversity(
        distinct_n(samples, 1),
        distinct_n(samples, 2),
        distinct_n(samples, 3),
        self_bleu(samples),
        float(np.mean([repetition(w) for w in samples])) if samples else 0.0,
        sum(map(len, samples)),
    )
