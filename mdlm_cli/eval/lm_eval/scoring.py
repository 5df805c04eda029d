"""Scoring and generating text as an evaluation harness asks for it, for every objective.

EleutherAI's lm-evaluation-harness asks a model three things (`lm_eval_adapter.py` serves
them with what is here; nothing here imports lm-eval):
- `loglikelihood(context, continuation)`: log p(continuation | context) and whether greedy
  decoding would give the continuation. The row is [row start] + context + continuation,
  the context truncated from the left to fit the model length (as the harness's HF models
  do); the objective's `loss_terms(..., targets=continuation positions)` gives the exact
  conditional NLL (AR) or the conditional NELBO (diffusion: only continuation positions are
  masked, the context is clean), averaged over K Monte-Carlo passes stratified in t.
- `loglikelihood_rolling(text)`: the whole document's likelihood, cut into windows of the
  model length with the harness's rolling-window convention (every token scored once, one
  token of context per window, the last window with a full context), each window scored
  as above; for diffusion models a bound.
- `generate_until(context, until)`: text sampled after the context by the objective's
  samplers (semi-autoregressive for diffusion models past the model length), cut at the
  first stop sequence: generation.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ...checkpoints.folder import LoadedModel
from ...engine.counted import counted_terms, stratified_counts
from ...engine.diffusion import Masking
from ...engine.guidance import GuidedDenoiser
from ...errors import MdlmError
from ...runtime import derive_seed, generator

# top-p below every class's probability but the largest: `engine.sample` then keeps only the
# most likely token (greedy requests are now served at temperature 0, which draws no noise
# and keeps the confidence samplers' probabilities; this stays for callers that used it)
GREEDY_TOP_P = 1e-12

Pair = tuple[list[int], list[int]]  # (context tokens, continuation tokens)


@dataclass
class Scored:
    """One continuation scored: -log p(continuation | context), or its bound."""

    passes: list[float]  # nats of each Monte-Carlo pass (one entry when exact)
    greedy: bool  # see `ConditionalScorer.score`
    tokens: int  # continuation tokens scored
    exact: bool
    dropped: int = 0  # context tokens truncated from the left

    @property
    def nll(self) -> float:
        return statistics.fmean(self.passes) if self.passes else 0.0

    @property
    def standard_error(self) -> float | None:
        """sd of the K passes / sqrt(K); 0 for an exact value, None for K = 1."""
        if self.exact or not self.tokens:
            return 0.0
        return (
            statistics.stdev(self.passes) / math.sqrt(len(self.passes))
            if len(self.passes) > 1
            else None
        )


def encode_pair(tokenizer, context: str, continuation: str) -> Pair:
    """The harness's split of a request into tokens: trailing whitespace of the context
    belongs to the continuation, and the continuation is what encoding the whole text adds
    after the context's tokens (so a word-boundary merge is not split)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    if not context:
        return [], tokenizer.encode(continuation)
    context_ids = tokenizer.encode(context)
    return context_ids, tokenizer.encode(context + continuation)[len(context_ids):]


def build_row(
    start: list[int], context: list[int], continuation: list[int], length: int
) -> tuple[list[int], int]:
    """[start] + context + continuation in at most `length` tokens, the context truncated
    from the left (the row start kept: training rows start with it). Returns the row and
    the number of context tokens dropped."""
    room = length - len(start) - len(continuation)
    if room < 0:
        raise MdlmError(
            f"a continuation of {len(continuation)} tokens does not fit the model length "
            f"{length}"
        )
    kept = context[len(context) - room:] if len(context) > room else context
    return start + kept + continuation, len(context) - len(kept)


def rolling_windows(tokens: list[int], max_len: int, context_len: int = 1) -> list[Pair]:
    """(context, predicted) windows of a document: the harness's convention
    (`lm_eval.utils.get_rolling_token_windows` then `make_disjoint_window`). Every token is
    predicted exactly once; the first window predicts the first `max_len` tokens with no
    context (the harness puts a prefix token there: here the row start, and an AR model's
    own start token, play its part); each later one predicts up to max_len - context_len + 1
    tokens after the tokens just before them, so that context + predicted is max_len + 1
    tokens, and the last one has a full context."""
    if not 1 <= context_len <= max_len:
        raise MdlmError(
            f"rolling windows need 1 <= context_len <= max_len (got {context_len}, {max_len})"
        )
    if not tokens:
        return []
    windows = [([], tokens[:max_len])]
    pred_len, done = max_len - context_len + 1, min(max_len, len(tokens))
    while done < len(tokens):
        n = min(len(tokens) - done, pred_len)
        end = done + n
        windows.append((tokens[max(end - max_len - 1, 0): end - n], tokens[end - n: end]))
        done = end
    return windows


class ConditionalScorer:
    """Batches of (context, continuation) pairs through the objective's conditional loss."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        mc_samples: int = 4,
        batch_size: int = 16,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        seed: int = 0,
        estimator: str | None = None,
        cfg_scale: float = 0.0,
    ):
        if mc_samples < 1 or batch_size < 1:
            raise MdlmError(
                "--mc-samples and --batch-size must be at least 1 "
                f"(got {mc_samples}, {batch_size})"
            )
        self.objective, self.denoiser = loaded.objective, loaded.denoiser(dtype)
        if not self.objective.scores_targets:
            raise MdlmError(
                f"{loaded.path} is a {self.objective.name} model, which gives no likelihood "
                "of a continuation; score an mdlm, sedd, d3pm or ar checkpoint"
            )
        self.exact = self.objective.exact
        self.mc_samples = 1 if self.exact else mc_samples
        self.T = self.objective.eval_T(None)
        self.draw = self.objective.draw_times(self.T, antithetic=True)
        self.start, self.length, self.pad_id = (
            loaded.row_start(),
            loaded.length,
            loaded.tokenizer.pad_id,
        )
        self.batch_size, self.device, self.seed = batch_size, torch.device(device), seed
        self.batches = 0  # batches scored so far: each has its own random stream
        self.mask_id = loaded.mask_id
        self.estimator = self.objective.choose_estimator(
            estimator, loaded.sampling_defaults.get("estimator", "t"))
        if cfg_scale:  # LLaDA's guided likelihood: each batch's context masked in the other half
            if self.exact:
                raise MdlmError(f"cfg_scale does not apply to a {self.objective.name} model")
            self.denoiser = GuidedDenoiser(self.denoiser, cfg_scale, loaded.mask_id)

    @property
    def rolling_max_len(self) -> int:
        """Window size for rolling windows: the row start + one context token + the
        predicted tokens fill the model length."""
        return self.length - len(self.start) - 1

    @torch.no_grad()
    def score(self, pairs: list[Pair], on_done: Callable[[int], None] | None = None,
              greedy: bool | str = True, suffix: list[int] | None = None) -> list[Scored]:
        """Each pair's -log p(continuation | context) (bound for diffusion), K passes with
        times stratified over [0, 1) per pair, and `greedy`: whether the model's argmax at
        every continuation position is the continuation's token, the argmax read in one call
        with the whole continuation masked and the context clean (diffusion), or given the
        true tokens before it (AR: greedy decoding; `greedy=False` skips that call and says
        False; "by-confidence": LLaDA's check, one token a call by confidence, as
        `Objective.greedy_by_confidence`). `suffix`: tokens after every continuation,
        attended and never masked nor scored (Dream's evaluation appends a clean EOS).
        Longest rows first, in batches."""
        suffix = suffix or []
        built = [build_row(self.start, c, x + suffix, self.length) for c, x in pairs]
        out: list[Scored | None] = [None] * len(pairs)
        todo = [i for i, (_, x) in enumerate(pairs) if x]
        for i in set(range(len(pairs))) - set(todo):  # an empty continuation has probability 1
            out[i] = Scored([0.0], True, 0, self.exact, built[i][1])
        todo.sort(key=lambda i: -len(built[i][0]))
        for b in range(0, len(todo), self.batch_size):
            idx = todo[b:b + self.batch_size]
            rows = [built[i][0] for i in idx]
            n_cont = [len(pairs[i][1]) for i in idx]
            passes, is_greedy = self._score_batch(rows, n_cont, greedy, len(suffix))
            for j, i in enumerate(idx):
                out[i] = Scored(
                    passes[:, j].tolist(), bool(is_greedy[j]), n_cont[j], self.exact, built[i][1]
                )
            if on_done is not None:
                on_done(len(idx))
        return out  # type: ignore[return-value]

    def _score_batch(
        self, rows: list[list[int]], n_cont: list[int], greedy: bool | str, n_suffix: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Rows right-padded (padding neither attended nor scored), their continuations the
        `n_cont` tokens before the last `n_suffix`: nats (K, B), greedy (B,)."""
        B, width = len(rows), max(map(len, rows))
        x0 = torch.full((B, width), self.pad_id, dtype=torch.long)
        targets = torch.zeros((B, width), dtype=torch.bool)
        for j, row in enumerate(rows):
            x0[j, :len(row)] = torch.tensor(row)
            end = len(row) - n_suffix
            targets[j, end - n_cont[j]:end] = True
        lengths = torch.tensor([len(r) for r in rows])
        attention_mask = torch.arange(width)[None] < lengths[:, None]
        x0, targets = x0.to(self.device), targets.to(self.device)
        attention_mask = None if bool(attention_mask.all()) else attention_mask.to(self.device)
        if isinstance(self.denoiser, GuidedDenoiser):  # the context and row start: the prompt
            real = torch.ones_like(targets) if attention_mask is None else attention_mask.bool()
            self.denoiser.prompt = real & ~targets
        gen = generator(self.device, derive_seed(self.seed, "lm-eval", self.batches))
        self.batches += 1
        # K times per row, stratified over [0, 1) (antithetic), as engine.nelbo draws them
        t = (
            None
            if self.draw is None
            else torch.stack([self.draw(self.mc_samples, gen) for _ in range(B)])
        )
        if self.estimator == "l":
            passes = self._counted(x0, targets, attention_mask, gen)
        else:
            passes = torch.stack([
                self.objective.loss_terms(self.denoiser, x0, None if t is None else t[:, k],
                                          generator=gen, attention_mask=attention_mask,
                                          T=self.T, targets=targets).double()
                for k in range(self.mc_samples)
            ])
        if not greedy:
            return passes.cpu(), torch.zeros(B, dtype=torch.bool)
        check = (self.objective.greedy_by_confidence if greedy == "by-confidence"
                 else self.objective.greedy_tokens)
        best = check(self.denoiser, x0, targets, attention_mask)
        return passes.cpu(), ((best == x0) | ~targets).all(dim=1).cpu()

    def _counted(self, x0: Tensor, targets: Tensor, attention_mask: Tensor | None,
                 gen: torch.Generator) -> Tensor:
        """(K, B) nats: LLaDA's estimator, K masked counts per row stratified over 1..n."""
        masking = Masking(gen, attention_mask, targets)
        counts = stratified_counts(targets.sum(1), self.mc_samples, gen)
        return torch.stack([counted_terms(self.denoiser, x0, counts[k], mask_id=self.mask_id,
                                          masking=masking).double()
                            for k in range(self.mc_samples)])

    def score_rolling(self, documents: list[list[int]],
                      on_done: Callable[[int], None] | None = None) -> list[Scored]:
        """Each document's -log p (bound for diffusion) over its rolling windows. Pass k of a
        document is the sum of pass k of its windows (the windows' draws are independent)."""
        windows = [rolling_windows(doc, self.rolling_max_len) for doc in documents]
        flat = self.score([w for ws in windows for w in ws], on_done, greedy=False)
        out, pos = [], 0
        for ws in windows:
            parts, pos = flat[pos:pos + len(ws)], pos + len(ws)
            passes = (
                [sum(p.passes[k] for p in parts) for k in range(self.mc_samples)]
                if parts
                else [0.0]
            )
            out.append(Scored(passes, False, sum(p.tokens for p in parts), self.exact))
        return out


def summarise(scores: list[Scored]) -> dict:
    """Task-level Monte-Carlo summary: requests, tokens, the mean NLL per request and per
    token, and their standard errors (sqrt of the summed per-request variances)."""
    n, tokens = len(scores), sum(s.tokens for s in scores)
    total = sum(s.nll for s in scores)
    ses = [s.standard_error for s in scores]
    var = None if any(se is None for se in ses) else sum(se * se for se in ses)
    se_total = None if var is None else math.sqrt(var)
    return {"requests": n, "tokens": tokens, "nats": total,
            "nll_per_request": total / max(n, 1),
            "nll_per_request_se": None if se_total is None else se_total / max(n, 1),
            "nats_per_token": total / max(tokens, 1),
            "nats_per_token_se": None if se_total is None else se_total / max(tokens, 1),
            "dropped_context_tokens": sum(s.dropped for s in scores)}
