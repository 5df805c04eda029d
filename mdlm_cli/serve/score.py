"""`POST /v1/mdlm/score`: the likelihood bound of texts (or the conditional bound of
continuations after one prompt, ranked), through the machinery `mdlm eval-ppl` runs.

Each text is a one-row split [row start] + context + text, repeated K times: one call of
`Objective.evaluate` (eval-ppl's `sharded_sum` over the objective's `loss_terms`) with its
times stratified over the K copies gives K independent Monte-Carlo terms of the text's bound
(the context, if any, clean: only the text's tokens are masked and scored). An exact
objective (AR) gives its exact NLL in one row. Every text gets a fresh generator seeded from
the request's seed alone, so a text's score depends only on (seed, text, K): the same alone,
at any index, or next to other texts.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np
import torch

from ..data.store import TokenSplit
from ..engine.counted import counted_terms, stratified_counts
from ..engine.diffusion import Masking
from ..errors import MdlmError
from ..eval.lm_eval.scoring import encode_pair
from ..objectives.bound import SplitSweep
from ..runtime import derive_seed, generator
from .fields import check_fields, check_model, get_int, get_value
from .schema import Limits, invalid
from .served import Served

SCORE_FIELDS = ("model", "input", "prompt", "continuations", "mc_samples", "seed", "estimator",
                "user")
MAX_MC_SAMPLES = 256


@dataclass
class ScoreRequest:
    rows: list[list[int]]  # [row start] + context + text, one per text
    # leading tokens of each row that are clean context (row start included)
    n_context: list[int]
    texts: list[str]
    mc_samples: int
    seed: int
    ranked: bool  # continuations of one prompt: rank them
    estimator: str = "t"  # the bound's: t (times) or l (masked counts: engine/counted.py)

    @property
    def num_rows(self) -> int:
        return self.mc_samples

    @property
    def length(self) -> int:
        """The positions of its longest row (what its calls' memory grows with)."""
        return max(map(len, self.rows))


def _texts(body: dict, name: str) -> list[str]:
    value = body.get(name)
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
        raise invalid(f"{name} must be a non-empty string or a non-empty list of strings", name)
    return value


def _pairs(body: dict, served: Served, limits: Limits) -> tuple[list[tuple], list[str], bool]:
    """(context ids, text ids) of each text, the texts, and whether they are to be ranked."""
    tok = served.loaded.tokenizer
    if body.get("input") is not None:
        if body.get("prompt") is not None or body.get("continuations") is not None:
            raise invalid("give input, or prompt with continuations, not both", "input")
        texts = _texts(body, "input")
        pairs, name = [([], tok.encode(t)) for t in texts], "input"
    elif body.get("continuations") is not None:
        prompt = get_value(body, "prompt", (str,), "", "a string")
        texts = _texts(body, "continuations")
        pairs, name = [encode_pair(tok, prompt, t) for t in texts], "continuations"
    else:
        raise invalid("give input (text or texts), or prompt with continuations", "input")
    if len(texts) > limits.max_prompts:
        raise invalid(f"at most {limits.max_prompts} texts per request (got {len(texts)})", name)
    for i, (_, ids) in enumerate(pairs):
        if not ids:
            raise invalid(f"{name}[{i}] is empty: there is no token to score", name)
    return pairs, texts, name == "continuations"


def parse_score(body: dict, served: Served, limits: Limits) -> ScoreRequest:
    """The request checked: texts that fit the model's length, an objective with a bound."""
    check_fields(body, SCORE_FIELDS)
    check_model(body, served)
    objective = served.loaded.objective
    if not objective.scores_targets or objective.kind:
        raise invalid(f"a {objective.name} model has no likelihood bound to score text with "
                      f"({objective.description})", "model", "unsupported_model")
    pairs, texts, ranked = _pairs(body, served, limits)
    start, length = served.loaded.row_start(), served.loaded.length
    name = "continuations" if ranked else "input"
    for i, (context, ids) in enumerate(pairs):
        size = len(start) + len(context) + len(ids)
        if size > length:
            raise invalid(f"{name}[{i}] is {size} tokens with the prompt and row start; the "
                          f"model's length is {length}", name, "context_length_exceeded")
    default_k = 1 if objective.exact else 8
    k = get_int(body, "mc_samples", 1, MAX_MC_SAMPLES, default_k)
    return ScoreRequest(
        rows=[start + c + x for c, x in pairs],
        n_context=[len(start) + len(c) for c, _ in pairs],
        texts=texts,
        mc_samples=1 if objective.exact else k,
        seed=get_int(body, "seed", 0, 2**63 - 1, 0),
        ranked=ranked,
        estimator=_estimator(body, served),
    )


def _estimator(body: dict, served: Served) -> str:
    """`estimator`: t or l (LLaDA's), else the model family's own; l for masked diffusion."""
    asked = get_value(body, "estimator", (str,), None, "t or l")
    try:
        return served.loaded.objective.choose_estimator(
            asked, served.loaded.sampling_defaults.get("estimator", "t"), flag="estimator")
    except MdlmError as e:
        raise invalid(str(e), "estimator") from None


def counted_passes(served: Served, denoiser, row: list[int], n_context: int,
                   request: ScoreRequest) -> list[float]:
    """The K terms of LLaDA's estimator (engine/counted.py): K copies of the row, each masking
    a stratified count of the text's tokens (one-token texts: K exact terms)."""
    x0 = torch.tensor([row] * request.mc_samples, device=served.device)
    targets = torch.arange(len(row), device=served.device)[None].expand_as(x0) >= n_context
    gen = generator(served.device, derive_seed(request.seed, "mdlm-score"))
    counts = stratified_counts(targets[:1].sum(1), request.mc_samples, gen)[:, 0]
    return counted_terms(denoiser, x0, counts, mask_id=served.loaded.mask_id,
                         masking=Masking(gen, None, targets)).tolist()


def score_text(served: Served, denoiser, row: list[int], n_context: int, *, mc_samples: int,
               seed: int) -> list[float]:
    """The K Monte-Carlo terms (nats) of one text's bound, or its exact NLL (one term)."""
    tokens = np.tile(np.asarray(row, dtype=np.int64), (mc_samples, 1))  # (K, len(row))
    split = TokenSplit(tokens=tokens, lengths=np.full(mc_samples, len(row)),
                       prompt=np.full(mc_samples, n_context))
    sweep = SplitSweep(mc_samples, served.device, per_sequence=True)
    result = served.loaded.objective.evaluate(
        denoiser, split, sweep, seeds=[derive_seed(seed, "mdlm-score")])[0]
    return result.per_sequence.tolist()


def _entry(index: int, text: str, passes: list[float], tokens: int, exact: bool) -> dict:
    nats = statistics.fmean(passes)
    se = 0.0 if exact else (statistics.stdev(passes) / math.sqrt(len(passes))
                            if len(passes) > 1 else None)
    per_token = None if se is None else se / tokens
    return {
        "index": index, "text": text, "tokens": tokens, "kind": "exact" if exact else "bound",
        "nats": nats, "nats_se": se, "logprob": -nats,
        "nats_per_token": nats / tokens, "nats_per_token_se": per_token,
        "bits_per_token": nats / tokens / math.log(2),
        "bits_per_token_se": None if per_token is None else per_token / math.log(2),
    }


def run_score(request: ScoreRequest, served: Served, denoiser) -> dict:
    """Every text's score; for continuations their rank (1 = the lowest nats)."""
    exact = served.loaded.objective.exact
    data = []
    for i, (row, n_context) in enumerate(zip(request.rows, request.n_context, strict=True)):
        if request.estimator == "l":
            passes = counted_passes(served, denoiser, row, n_context, request)
        else:
            passes = score_text(served, denoiser, row, n_context, mc_samples=request.mc_samples,
                                seed=request.seed)
        data.append(_entry(i, request.texts[i], passes, len(row) - n_context, exact))
    if request.ranked:
        for rank, entry in enumerate(sorted(data, key=lambda e: e["nats"]), start=1):
            entry["rank"] = rank
    return {"object": "mdlm.score", "kind": "exact" if exact else "bound",
            "mc_samples": request.mc_samples, "seed": request.seed,
            "estimator": None if exact else request.estimator, "data": data,
            "usage": {"prompt_tokens": sum(map(len, request.rows)),
                      "total_tokens": sum(map(len, request.rows))}}
