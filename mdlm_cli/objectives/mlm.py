"""The masked-language-model objective (BERT; Caduceus's pretraining, Table 6's "Caduceus MLM").

Each real token is selected with probability 0.15; a selected token is replaced by the mask
with probability 0.8, else by a uniformly random token with probability 0.5 (10% overall),
else left as it is (10%), as Caduceus's `mlm_getitem` does (its random token ranges over the
tokeniser's named ids, the specials included; padding and N are never selected here, where
Caduceus selects them and then ignores their targets). The loss is the cross-entropy at the
selected positions only.

What its "perplexity" is: an MLM defines no likelihood of a sequence, so it gives no bound
and no exact value. `eval-ppl` reports the masked-token perplexity: exp of the mean
cross-entropy per selected token under this same 15% corruption, the validation loss the
Caduceus recipe logs (the quantity Table 6 lists for Caduceus MLM; it is not comparable with
the diffusion bounds or AR likelihoods beside it). Each sequence's term is the sum over its
selected positions divided by 0.15, so the split's total divided by its tokens estimates that
mean (Horvitz-Thompson) with the loop that divides every objective's sum by the token count.
It has no sampler.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import SFT_PACKINGS
from ..engine.diffusion import call_denoiser, sum_per_sequence
from ..errors import MdlmError
from ..models import DiffusionDenoiser
from .base import Objective

MLM_PROBABILITY = 0.15  # selected tokens
MASK_FRACTION = 0.8  # of the selected: replaced by the mask
RANDOM_FRACTION = 0.5  # of the rest: replaced by a random token (the others stay)


def bert_corruption(x0: Tensor, *, mask_id: int, n_tokens: int,
                    generator: torch.Generator | None,
                    attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(corrupted input z (B, L), selected positions (B, L) bool) of BERT's 80/10/10 recipe."""
    def coin(p: float) -> Tensor:
        return torch.rand(x0.shape, generator=generator, device=x0.device) < p

    selected = coin(MLM_PROBABILITY)
    if attention_mask is not None:
        selected &= attention_mask.bool()
    masked = coin(MASK_FRACTION) & selected
    randomised = coin(RANDOM_FRACTION) & selected & ~masked
    random_ids = torch.randint(n_tokens, x0.shape, generator=generator, device=x0.device)
    z = torch.where(masked, torch.full_like(x0, mask_id), x0)
    return torch.where(randomised, random_ids, z), selected


class MaskedLM(Objective):
    name = "mlm"
    uses_time = False
    # no likelihood of chosen positions: its loss is a masked-token estimate
    scores_targets = False
    default_sampler = ""  # none: an MLM is not a generative model
    kind = "masked-token"
    description = (
        "BERT-style masked LM (15%, 80/10/10; Caduceus's pretraining): masked-token perplexity, "
        "no bound"
    )

    def __init__(self, cfg, tokenizer):
        super().__init__(cfg, tokenizer)
        self.n_tokens = getattr(tokenizer, "named_tokens", None)  # else the model's vocabulary

    @classmethod
    def validate(cls, cfg) -> None:
        cls.refuse_time(cfg, "mlm")  # BERT's corruption reads no diffusion switch
        if cfg.data.packing in SFT_PACKINGS:
            raise MdlmError("the mlm objective has no loss on the response alone "
                            f"(data.packing={cfg.data.packing}); fine-tune with "
                            "diffusion.objective=mdlm, sedd, d3pm or ar")

    def denoiser(
        self, model: nn.Module, autocast_dtype: torch.dtype | None = None
    ) -> DiffusionDenoiser:
        return DiffusionDenoiser(
            model, self.schedule, time_conditioning=False, autocast_dtype=autocast_dtype
        )

    def loss_terms(self, denoiser, x0: Tensor, t: Tensor | None, *, generator, attention_mask,
                   T: int | None = None, targets: Tensor | None = None) -> Tensor:
        if targets is not None:
            raise MdlmError(
                "the mlm objective defines no likelihood of chosen positions (it scores a "
                "random 15% of tokens); conditional scoring (mdlm lm-eval) needs an mdlm, "
                "sedd, d3pm or ar checkpoint"
            )
        n_tokens = self.n_tokens or denoiser.model.vocab_size
        z, selected = bert_corruption(
            x0,
            mask_id=self.mask_id,
            n_tokens=n_tokens,
            generator=generator,
            attention_mask=attention_mask,
        )
        no_time = torch.zeros(x0.shape[0], device=x0.device)
        logits = call_denoiser(
            denoiser, z, no_time, output_mask=selected, attention_mask=attention_mask
        )  # (N, V)
        nll = F.cross_entropy(logits.float(), x0[selected], reduction="none")
        return sum_per_sequence(nll, selected) / MLM_PROBABILITY
