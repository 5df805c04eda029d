"""Text features for MAUVE: one vector per text from a language model's last hidden state.

A causal LM (the gen-PPL judge by default, as the papers use GPT-2 large) gives the hidden
state of the text's last token after its final layer, the text preceded by the judge's start
token and cut to its context (Pillutla et al. embed with GPT-2 large the same way); a masked
LM or encoder (BERT, the pip-packaged all-MiniLM-L6-v2) gives the mean of its last hidden
states over the text's tokens, since no single position of a bidirectional model sums up
the text. Offline: an mdlm autoregressive checkpoint (the demo's AR twins), or the packaged
models of `io/packaged.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from ..errors import MdlmError
from .genppl import HFJudge, Judge, MdlmARJudge, load_judge


class Featurizer(Protocol):
    name: str
    pooling: str  # "last token" or "mean"

    def features(self, texts: list[str], batch_size: int = 8) -> Tensor: ...


class CausalFeatures:
    """Last-token hidden states of a gen-PPL judge (an HF causal LM or an mdlm AR model)."""

    pooling = "last token"

    def __init__(self, judge: Judge):
        if isinstance(judge, MdlmARJudge) and not hasattr(judge.model, "trunk"):
            raise MdlmError(
                f"{judge.name}: its backbone does not expose hidden states (a DiT does); "
                "give --featurizer a Hugging Face model"
            )
        self.judge, self.name = judge, judge.name

    def _hidden(self, ids: Tensor, mask: Tensor) -> Tensor:  # (b, n) -> (b, n, H)
        if isinstance(self.judge, HFJudge):
            out = self.judge.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            return out.hidden_states[-1]
        sigma = torch.zeros(ids.shape[0], device=ids.device)
        return self.judge.model.trunk(ids, sigma)[0]  # causal: right padding is never seen

    @torch.no_grad()
    def features(self, texts: list[str], batch_size: int = 8) -> Tensor:
        j = self.judge
        rows = [[j.start_id] + ids[: j.context - 1] for ids in j.encode(texts)]
        out = []
        for first in range(0, len(rows), batch_size):
            batch = rows[first : first + batch_size]
            lengths = torch.tensor([len(r) for r in batch])
            ids = torch.zeros(len(batch), int(lengths.max()), dtype=torch.long)
            for i, r in enumerate(batch):
                ids[i, : len(r)] = torch.tensor(r)
            mask = torch.arange(ids.shape[1])[None] < lengths[:, None]
            # (b, n, H)
            hidden = self._hidden(ids.to(j.device), mask.to(j.device)).double().cpu()
            out.append(hidden[torch.arange(len(batch)), lengths - 1])
        return torch.cat(out)


class EncoderFeatures:
    """Mean last hidden state of a Hugging Face masked LM or encoder (its base model)."""

    pooling = "mean"

    def __init__(
        self, where: str, *, name: str, device: torch.device, context: int | None = None
    ):
        from transformers import AutoModel, AutoTokenizer

        from ..io.safe_load import refuse_remote_code

        refuse_remote_code(where, model=True)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
            self.model = AutoModel.from_pretrained(
                where, dtype=torch.float32, trust_remote_code=False
            )
        except (OSError, ValueError, ImportError) as e:
            first = " ".join(str(e).split())[:300] or type(e).__name__
            raise MdlmError(f"could not load the featurizer {name!r}: {first}") from None
        self.model.to(device).eval()
        self.name, self.device = name, device
        limit = getattr(self.model.config, "max_position_embeddings", None) or 512
        self.context = min(context or limit, limit)

    @torch.no_grad()
    def features(self, texts: list[str], batch_size: int = 8) -> Tensor:
        out = []
        for first in range(0, len(texts), batch_size):
            enc = self.tokenizer(
                list(texts[first : first + batch_size]),
                padding=True,
                truncation=True,
                max_length=self.context,
                return_tensors="pt",
            ).to(self.device)
            if enc["input_ids"].shape[1] == 0:  # only empty texts: no token to pool
                out.append(torch.zeros(enc["input_ids"].shape[0], self.model.config.hidden_size,
                                       dtype=torch.float64))
                continue
            hidden = self.model(**enc).last_hidden_state.double()  # (b, n, H)
            mask = enc["attention_mask"][..., None].double()
            out.append(((hidden * mask).sum(1) / mask.sum(1).clamp_min(1)).cpu())
        return torch.cat(out)


def _is_causal(where: str) -> bool:
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(where, trust_remote_code=False)
    except (OSError, ValueError) as e:
        first = " ".join(str(e).split())[:300] or type(e).__name__
        raise MdlmError(f"could not read the featurizer's config {where!r}: {first}") from None
    names = getattr(cfg, "architectures", None) or []
    return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in names) or bool(cfg.is_decoder)


def load_featurizer(
    spec: str | None,
    *,
    device: torch.device,
    judge: Judge | None = None,
    context: int | None = None,
) -> Featurizer:
    """The judge itself (spec None or the judge's name), an mdlm AR checkpoint, `smollm2`,
    a packaged model's name, or a Hugging Face causal or masked LM (hub id or folder)."""
    if spec is None or (judge is not None and spec == judge.name):
        if judge is None:
            raise MdlmError("MAUVE needs a featurizer: give --featurizer or a judge")
        return CausalFeatures(judge)
    from ..io.packaged import resolve_model

    packaged = resolve_model(spec)
    path = Path(spec)
    is_mdlm = path.is_dir() and ((path / "data.json").is_file() or (path / "latest").is_file())
    if spec == "smollm2" or path.suffix == ".gguf" or is_mdlm:
        return CausalFeatures(load_judge(spec, device=device, context=context))
    where = str(packaged) if packaged is not None else spec
    if packaged is None and not path.is_dir():
        from ..io.hub import hub_offline

        hub_offline()  # without a network only the local HF cache serves a hub id
    if _is_causal(where):
        return CausalFeatures(HFJudge(where, device=device, context=context))
    return EncoderFeatures(where, name=spec, device=device, context=context)


def text_mauve(
    featurizer: Featurizer,
    samples: list[str],
    reference: list[str] | Tensor,
    *,
    seeds: tuple[int, ...] | list[int] = (0, 1, 2, 3, 4),
    scale: float = 5.0,
    buckets: int | None = None,
    batch_size: int = 8,
):
    """MAUVE (`mauve.py`) of sample texts against reference texts (or their features)."""
    from .mauve import mauve

    ref = (reference if isinstance(reference, Tensor)
           else featurizer.features(reference, batch_size))
    return mauve(
        featurizer.features(samples, batch_size), ref, seeds=seeds, scale=scale, buckets=buckets
    )
