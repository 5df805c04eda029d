"""Genomes as sources: the human reference genome hg38 with HyenaDNA's intervals, and a
synthetic genome in the same file layout for offline demos and tests. The files, the
intervals and the pieces they yield are read in dna.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from .source import Source


@dataclass
class HG38(Source):
    """The human reference genome with HyenaDNA's train/valid/test intervals (data/dna.py)."""

    name: str = "hg38"
    description: str = ("human genome hg38, HyenaDNA's BED intervals (hg38.ml.fa + "
                        "sequences_human.bed in hg38:FOLDER, $MDLM_HG38 or <cache>/hg38); "
                        "N excluded from the loss")
    unscored: str = "N"
    spec: str = "hg38"
    extend: int = 2 ** 20  # every BED interval -> [start, start + extend)

    @property
    def files(self):
        from .dna import HG38Files, hg38_folder

        return HG38Files(hg38_folder(self.spec))

    @property
    def fingerprint(self) -> str:
        return f"hg38:{self.files.fingerprint()}:union-{self.extend}-pieces-v1"

    def documents(self, split, load_dataset=None):
        from .dna import hg38_pieces

        return hg38_pieces(self.files, split, extend=self.extend), None


@dataclass
class SyntheticDNA(HG38):
    """A generated 900 kb genome in HG38's file layout (`data/dna.py`): offline DNA demos and
    tests."""

    name: str = "dna-synthetic"
    description: str = ("synthetic genome: 3 x 300 kb, order-3 Markov chain, motifs on both "
                        "strands, N runs; offline")
    extend: int = 4096

    @property
    def files(self):
        from .dna import SYNTHETIC_VERSION, HG38Files, write_synthetic_genome
        from .tokenizers import default_cache_root

        folder = default_cache_root() / f"dna-synthetic-v{SYNTHETIC_VERSION}"
        if not (folder / "sequences_human.bed").is_file():
            write_synthetic_genome(folder)
        return HG38Files(folder)

    @property
    def fingerprint(self) -> str:
        from .dna import SYNTHETIC_VERSION

        return f"dna-synthetic:v{SYNTHETIC_VERSION}:{self.extend}"
