"""DNA data: the human reference genome (HG38) as HyenaDNA and Caduceus use it, the Genomic
Benchmarks folders, and reverse-complement (RC) augmentation.

HG38 (`data.dataset=hg38`): `hg38.ml.fa` (or `.fa.gz`) and `sequences_human.bed` (chr, start,
end, split; HyenaDNA's intervals, 34,021 of them in train) in one folder: `hg38:PATH`, or
`$MDLM_HG38`, or `<cache>/hg38`. As HyenaDNA, every interval is extended to 2^20 bases from
its start (clamped to its chromosome). mdlm then takes the union of a split's extended
intervals, so every base is stored once (Caduceus cuts each interval into windows, so bases
of overlapping intervals repeat), in pieces of at most 2^20 bases that `window` packing cuts
into rows of L (a power of two up to 2^20 tiles every piece exactly). N becomes [PAD]
(as in Caduceus's HG38 pipeline) and is kept out of the masking and the loss.

Genomic Benchmarks: the on-disk layout of the `genomic-benchmarks` package,
`<task>/{train,test}/<class>/<id>.txt`, one sequence per file, read as it is (its
downloader is never called); labels are the class folder names in sorted order.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import MdlmError

# HyenaDNA's MAX_ALLOWED_LENGTH: every BED interval becomes [start, start + 2^20)
EXTEND = 2 ** 20
HG38_URLS = ("https://storage.googleapis.com/basenji_barnyard2/hg38.ml.fa.gz",
             "https://storage.googleapis.com/basenji_barnyard2/sequences_human.bed")
BED_NAMES = ("sequences_human.bed", "human-sequences.bed")
FASTA_NAMES = ("hg38.ml.fa", "hg38.ml.fa.gz")
BED_SPLITS = {"train": "train", "valid": "valid", "test": "test"}


# ----------------------------------------------------------------------------- FASTA and BED

def read_fasta(path: Path) -> Iterator[tuple[str, bytes]]:
    """(record name, sequence bytes) for each record of a FASTA file (.gz too), one at a time."""
    opener = gzip.open if path.suffix == ".gz" else open
    name, chunks = None, []
    with opener(path, "rb") as f:
        for line in f:
            if line.startswith(b">"):
                if name is not None:
                    yield name, b"".join(chunks)
                name, chunks = line[1:].split()[0].decode(), []
            else:
                chunks.append(line.strip())
    if name is not None:
        yield name, b"".join(chunks)


def read_bed(path: Path, split: str) -> dict[str, list[tuple[int, int]]]:
    """Chromosome -> [(start, end)] of the rows of `split` (4 columns: chr, start, end,
    split)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if not parts or parts[0].startswith(("#", "track", "browser")):
            continue
        if len(parts) < 4:
            raise MdlmError(
                f"{path}:{n}: expected 4 columns (chr, start, end, split), got {len(parts)}"
            )
        if parts[3] == split:
            out.setdefault(parts[0], []).append((int(parts[1]), int(parts[2])))
    return out


def merged_pieces(
    intervals: list[tuple[int, int]], chrom_len: int, extend: int = EXTEND
) -> list[tuple[int, int]]:
    """The union of [start, start + extend) over the intervals, clamped to the chromosome, in
    pieces of at most `extend` bases aligned to the start of each merged run."""
    spans = sorted(
        (max(0, min(s, chrom_len - extend)), min(chrom_len, max(s, 0) + extend))
        for s, _ in intervals
    )
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(p, min(p + extend, e)) for s, e in merged for p in range(s, e, extend)]


@dataclass
class HG38Files:
    folder: Path

    @property
    def fasta(self) -> Path:
        return self._find(FASTA_NAMES)

    @property
    def bed(self) -> Path:
        return self._find(BED_NAMES)

    def _find(self, names: tuple[str, ...]) -> Path:
        for name in names:
            if (self.folder / name).is_file():
                return self.folder / name
        raise MdlmError(
            f"HG38 data not found: {self.folder} needs {' or '.join(names)}; with a network, "
            f"once: mkdir -p {self.folder} && curl -L {HG38_URLS[0]} -o "
            f"{self.folder}/hg38.ml.fa.gz && "
            f"curl -L {HG38_URLS[1]} -o {self.folder}/sequences_human.bed "
            "(or point data.dataset at hg38:FOLDER or $MDLM_HG38)"
        )

    def fingerprint(self) -> str:
        """Sizes and a hash of the first and last MiB of both files (a full hash of 3 GB is
        slow)."""
        h = hashlib.sha256()
        for path in (self.fasta, self.bed):
            size = path.stat().st_size
            with open(path, "rb") as f:
                h.update(f"{path.name}:{size}".encode())
                h.update(f.read(1 << 20))
                f.seek(max(0, size - (1 << 20)))
                h.update(f.read())
        return h.hexdigest()


def hg38_folder(spec: str) -> Path:
    """`hg38:PATH`, else $MDLM_HG38, else <cache>/hg38."""
    if spec.startswith("hg38:"):
        return Path(spec[5:]).expanduser()
    if os.environ.get("MDLM_HG38"):
        return Path(os.environ["MDLM_HG38"]).expanduser()
    from .tokenizers import default_cache_root

    return default_cache_root() / "hg38"


def hg38_pieces(
    files: HG38Files, split: str, batch: int = 8, extend: int = EXTEND
) -> Iterator[list[str]]:
    """Batches of the split's pieces (strings of at most `extend` bases), chromosome by
    chromosome."""
    wanted = read_bed(files.bed, BED_SPLITS[split])
    found = set()
    for name, seq in read_fasta(files.fasta):
        if name not in wanted:
            continue
        found.add(name)
        pieces = [
            seq[s:e].decode("latin-1") for s, e in merged_pieces(wanted[name], len(seq), extend)
        ]
        for i in range(0, len(pieces), batch):
            yield pieces[i:i + batch]
    missing = sorted(set(wanted) - found)
    if missing:
        raise MdlmError(
            f"{files.bed} names chromosome {missing[0]}, which {files.fasta} does not hold"
        )


# ------------------------------------------------------------------------- a synthetic genome

SYNTHETIC_VERSION = 1


def write_synthetic_genome(
    folder: Path,
    *,
    chromosomes: int = 3,
    length: int = 300_000,
    interval: int = 4096,
    seed: int = 0,
) -> Path:
    """A small genome with structure to learn, as FASTA + BED in HG38's layout (offline demos,
    tests).

    An order-3 Markov chain with Dirichlet(0.3) transitions, 12 motifs of 24-64 bases inserted
    on either strand (so reverse complements recur), lower-case soft-masked stretches and one
    run of N per chromosome; BED intervals of `interval` bases, 1 in 20 to valid and 1 in 20 to
    test (the same rule as the text corpora's blocks).
    """
    rng = np.random.default_rng(seed)
    bases = np.frombuffer(b"ACGT", dtype=np.uint8)
    # context (3 bases) -> next-base CDF
    trans = rng.dirichlet(np.full(4, 0.3), size=64).cumsum(1)
    motifs = [rng.integers(0, 4, rng.integers(24, 65)) for _ in range(12)]
    folder.mkdir(parents=True, exist_ok=True)
    fasta, bed = [], []
    for c in range(chromosomes):
        u, seq, ctx = rng.random(length), np.empty(length, dtype=np.int64), 0
        for i in range(length):
            seq[i] = int(np.searchsorted(trans[ctx], u[i]))
            ctx = (ctx * 4 + seq[i]) % 64
        for start in rng.integers(0, length - 64, length // 400):  # motifs on either strand
            m = motifs[rng.integers(len(motifs))]
            seq[start:start + len(m)] = m if rng.random() < 0.5 else (3 - m)[::-1]
        text = bases[seq].copy()
        for start in rng.integers(0, length - 200, 20):  # soft-masked (lower-case) stretches
            text[start:start + 200] += 32
        n_start = int(rng.integers(0, length - 500))
        text[n_start:n_start + 500] = ord("N")
        body = text.tobytes().decode()
        fasta.append(f">chr{c + 1}\n" + "\n".join(body[i:i + 80] for i in range(0, length, 80)))
        for k, start in enumerate(range(0, length - interval + 1, interval)):
            split = "valid" if k % 20 == 18 else "test" if k % 20 == 19 else "train"
            bed.append(f"chr{c + 1}\t{start}\t{start + interval}\t{split}")
    for name, lines in (
        ("hg38.ml.fa", fasta),
        ("sequences_human.bed", bed),
    ):  # the BED last: it marks completion
        tmp = folder / f".{name}.tmp-{os.getpid()}"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, folder / name)
    return folder


def write_motif_task(
    folder: str | Path, *, n_train: int = 200, n_test: int = 100, seed: int = 0
) -> Path:
    """A two-class task in the Genomic Benchmarks layout (CPU smoke runs of `mdlm classify`):
    uniform random sequences of 50-70 bases; class `motif` carries GATTACAGGCTA on either
    strand at a random place, class `plain` does not."""
    import random

    rng, folder = random.Random(seed), Path(folder)
    motif = "GATTACAGGCTA"
    strands = (motif, motif[::-1].translate(str.maketrans("ACGT", "TGCA")))
    for split, n in (("train", n_train), ("test", n_test)):
        for cls in ("motif", "plain"):
            (folder / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(n // 2):
                seq = [rng.choice("ACGT") for _ in range(rng.randint(50, 70))]
                if cls == "motif":
                    p = rng.randint(0, len(seq) - len(motif))
                    seq[p:p + len(motif)] = rng.choice(strands)
                (folder / split / cls / f"{i}.txt").write_text("".join(seq))
    return folder


# ------------------------------------------------------------------------- reverse complement

def reverse_complement(tokens: Tensor, complement: Tensor) -> Tensor:
    """rc(x): positions reversed, each token replaced by its complement (B, L)."""
    return complement[tokens.flip(-1)]


def rc_augment(x0: Tensor, attention_mask: Tensor | None, complement: list[int],
               generator: torch.Generator) -> tuple[Tensor, Tensor | None]:
    """Each row reverse-complemented with probability 1/2 (its mask flipped with it)."""
    flip = torch.rand(x0.shape[0], generator=generator,
                      device=generator.device).to(x0.device) < 0.5
    comp = torch.tensor(complement, device=x0.device)
    x0 = torch.where(flip[:, None], reverse_complement(x0, comp), x0)
    if attention_mask is not None:
        attention_mask = torch.where(flip[:, None], attention_mask.flip(-1), attention_mask)
    return x0, attention_mask


# ------------------------------------------------------------------------- Genomic Benchmarks

# Caduceus's configs/dataset/genomic_benchmark.yaml: task -> (max length, classes)
GENOMIC_BENCHMARKS = {
    "dummy_mouse_enhancers_ensembl": (1024, 2),
    "demo_coding_vs_intergenomic_seqs": (200, 2),
    "demo_human_or_worm": (200, 2),
    "human_enhancers_cohn": (500, 2),
    "human_enhancers_ensembl": (512, 2),
    "human_ensembl_regulatory": (512, 3),
    "human_nontata_promoters": (251, 2),
    "human_ocr_ensembl": (512, 2),
}


@dataclass
class GenomicTask:
    name: str
    classes: list[str]
    train: list[tuple[str, int]] = field(default_factory=list)  # (sequence, label)
    test: list[tuple[str, int]] = field(default_factory=list)

    @property
    def max_length(self) -> int:
        known = GENOMIC_BENCHMARKS.get(self.name)
        return known[0] if known else max(len(s) for s, _ in self.train)


def read_genomic_task(folder: str | Path) -> GenomicTask:
    """A task folder `<task>/{train,test}/<class>/<id>.txt`; labels from the sorted class
    names."""
    folder = Path(folder)
    if not (folder / "train").is_dir() or not (folder / "test").is_dir():
        raise MdlmError(
            f"{folder} is not a Genomic Benchmarks task folder (it needs train/ and test/, each "
            "with one folder per class of .txt files)"
        )
    classes = sorted(p.name for p in (folder / "train").iterdir() if p.is_dir())
    if len(classes) < 2:
        raise MdlmError(
            f"{folder}/train has {len(classes)} class folder(s); a classification task needs 2 "
            "or more"
        )
    task = GenomicTask(folder.name, classes)
    for split in ("train", "test"):
        extra = sorted(
            p.name for p in (folder / split).iterdir() if p.is_dir() and p.name not in classes
        )
        if extra:
            raise MdlmError(f"{folder}/{split} has class {extra[0]!r}, which train/ does "
                            "not have")
        rows = getattr(task, split)
        for label, name in enumerate(classes):
            for path in (
                sorted((folder / split / name).glob("*.txt"))
                if (folder / split / name).is_dir()
                else []
            ):
                rows.append(("".join(path.read_text().split()), label))
        if not rows:
            raise MdlmError(f"{folder}/{split} holds no sequences")
    return task


def encode_left_padded(seqs: list[str], tokenizer, length: int) -> Tensor:
    """(N, length) ids: each sequence truncated to its first `length` bases and padded on the
    left with [PAD], as Caduceus's tokeniser pads (padding_side left, truncation right)."""
    out = np.full((len(seqs), length), tokenizer.pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        ids = tokenizer.encode_array(s)[:length]
        if len(ids):
            out[i, length - len(ids):] = ids
    return torch.from_numpy(out)
