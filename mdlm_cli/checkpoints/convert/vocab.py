"""The mask token a converted model needs (the absorbing state of masked diffusion). A causal
LM's tokenizer has none: the tokenizer's own mask token is kept where it has one; otherwise
`<|mdm_mask|>` (LLaDA's) is added to the tokenizer. It takes the first id past the tokenizer's
tokens: where the embedding has rows to spare there (Qwen2's, padded to a multiple), that row
is used as it is (the head's logit of the mask is removed by SUBS anyway); where it has none
(GPT-2's, LLaMA-2's), the embedding and an untied head grow by the rows needed, each new row
the mean of its matrix's rows (a neutral start for a token the model has never seen).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import MdlmError

MASK_TOKEN = "<|mdm_mask|>"


@dataclass(frozen=True)
class MaskToken:
    """The mask's id, the embedding rows after the conversion and what was done (the record)."""

    id: int
    rows: int
    how: str


def add_mask_token(tokenizer, rows: int, label: str) -> MaskToken:
    """The mask id in `tokenizer` (a transformers tokeniser, given the token in place where it
    lacks one) for an embedding of `rows` rows."""
    own = tokenizer.mask_token_id
    if own is not None and own < rows:
        return MaskToken(own, rows, f"the tokenizer's own {tokenizer.mask_token!r} (id {own})")
    if own is not None:
        raise MdlmError(f"{label}: the tokenizer's mask token has id {own}, past the "
                        f"embedding's {rows} rows")
    tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
    mask_id = tokenizer.mask_token_id
    if mask_id < rows:
        return MaskToken(mask_id, rows, f"{MASK_TOKEN} added at id {mask_id}, a spare row of "
                                        f"the {rows}-row embedding")
    return MaskToken(mask_id, mask_id + 1, f"{MASK_TOKEN} added at id {mask_id}: embedding "
                                           f"and head grown from {rows} to {mask_id + 1} "
                                           "rows, the new rows their mean row")


def grow_rows(matrix: torch.Tensor, rows: int) -> torch.Tensor:
    """`matrix` (R, H) with rows appended up to `rows`, each the mean of its R rows (averaged in
    float32, stored in the matrix's dtype)."""
    extra = rows - matrix.shape[0]
    if extra <= 0:
        return matrix
    mean = matrix.float().mean(dim=0, keepdim=True).to(matrix.dtype)
    return torch.cat([matrix, mean.expand(extra, -1)], dim=0).contiguous()


def special_ids(tokenizer, config: dict, mask_id: int) -> dict:
    """config.json's special ids of the converted model: the mask, and EOS / BOS / pad as the
    tokenizer names them (the source config's where it does not), each an int or absent."""
    out = {"mask_token_id": mask_id}
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        value = getattr(tokenizer, key, None)
        if value is None:
            value = config.get(key)
        if isinstance(value, list):  # several EOS ids (LLaMA-3's): the first is the tokenizer's
            value = value[0] if value else None
        if isinstance(value, int):
            out[key] = value
    if "eos_token_id" not in out:
        raise MdlmError("neither the source's tokenizer nor its config.json names an EOS token; "
                        "mdlm needs one to end samples")
    return out
