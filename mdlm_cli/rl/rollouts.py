"""Rollouts for `mdlm rl`: the prompts of a data set (each in the run's prompt template) and
the policy's completions of them, drawn through the generation layer (its row rule and any
sampler), the prompts of one length batched into one call."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from ..data.sft import encode_example, example_source
from ..engine.settings import SamplingSettings
from ..errors import MdlmError
from ..generation.capabilities import capabilities_of
from ..generation.layout import LayoutError, lay_out
from ..generation.request import GenerationRequest
from ..sample.generate import cut_at_eos, generate


@dataclass
class Policy:
    """What the loop holds: the loaded model (its module adapted), the runtime, the sampling
    settings of the rollouts."""

    loaded: object
    rt: object
    sampling: SamplingSettings

    @cached_property
    def end_ids(self) -> tuple[int, ...]:
        """The ids that end a completion: EOS, and a chat model's end of turn (the generation
        layer's `Capabilities.end_of_turn`): nothing after them is scored or rewarded."""
        return capabilities_of(self.loaded).end_of_turn


RESERVED_FIELDS = ("prompts", "completions")  # the reward function's own arguments


def fill_template(template: str, prompt: str) -> str:
    """`template` with the example's prompt at `{prompt}` (its only field)."""
    try:
        return template.format(prompt=prompt)
    except (KeyError, IndexError, ValueError) as e:
        raise MdlmError(f"--prompt-template {template!r} must hold {{prompt}} and no other "
                        f"field ({type(e).__name__}: {e}); write a literal brace as {{{{ or }}}}"
                        ) from None


def read_prompts(source: str, tokenizer, template: str = "{prompt}"
                 ) -> list[tuple[list[int], dict]]:
    """(prompt ids, the example's fields) of every example in `source`, each prompt/response
    example's prompt put in `template` (a conversation's messages are taken as they are)."""
    examples = example_source(source).all_examples()
    if not examples:
        raise MdlmError(f"{source} holds no examples")
    taken = sorted(set(examples[0]) & set(RESERVED_FIELDS))
    if taken:
        raise MdlmError(f"{source}: a field named {taken[0]!r} clashes with the reward "
                        "function's own argument; rename it in the data")
    out = []
    for e in examples:
        shown = e if "messages" in e else {**e, "prompt": fill_template(template, e["prompt"])}
        out.append((encode_example(tokenizer, shown)[0], e))
    return out


def rollouts(policy: Policy, prompts: list[list[int]], rows: int, answer: int, seed: int
             ) -> list[Tensor]:
    """`rows` completions of each prompt by the policy (no gradient): tokens (rows, L) per
    prompt, its completion after the prompt. The prompts of one length are drawn together, in
    one batch of rows x their number (each row laid out by the generation layer's rule,
    `lay_out`), seeded by `seed` and that length; prompts of other lengths in their own."""
    loaded, caps = policy.loaded, capabilities_of(policy.loaded)
    by_length: dict[int, list[int]] = {}
    for j, ids in enumerate(prompts):
        by_length.setdefault(len(ids), []).append(j)
    out: list[Tensor | None] = [None] * len(prompts)
    loaded.model.eval()
    for length, members in sorted(by_length.items()):
        try:
            layouts = [lay_out(caps, prompts[j], answer=answer, start=[]) for j in members]
        except LayoutError as e:
            raise MdlmError(f"a prompt does not fit: {e}") from None
        template = torch.stack([lay.template(loaded.mask_id) for lay in layouts])
        template = template.repeat_interleave(rows, dim=0)  # a prompt's rows consecutive
        request = GenerationRequest(policy.sampling, num_samples=len(template),
                                    seed=seed * 65537 + length, stop_at_eos=False)
        with torch.no_grad():
            records, _, _ = generate(loaded, policy.rt, request, length=layouts[0].length,
                                     prompt=template)
        tokens = torch.tensor([r.tokens for r in records], device=policy.rt.device)
        for k, j in enumerate(members):
            out[j] = tokens[k * rows:(k + 1) * rows]
    return out


def completions_text(policy: Policy, tokens: Tensor, start: int) -> list[str]:
    """Each row's completion as text, cut at its first end id (`Policy.end_ids`)."""
    out = []
    for row in tokens.tolist():
        kept, _, _ = cut_at_eos(row, start, policy.end_ids)
        out.append(policy.loaded.tokenizer.decode(kept[start:]))
    return out
