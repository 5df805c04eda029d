"""A question put to a chat model through its tokeniser's chat template (`mdlm sample --chat`):
the prompt's token ids with the generation prompt, and the tokens an answer ends at (the
template's end-of-turn token, e.g. LLaDA's `<|eot_id|>` or Dream's `<|im_end|>`, and EOS)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import MdlmError

if TYPE_CHECKING:
    from .tokenizers import Tokenizer

MARKER = "\u2063answer\u2063"  # an assistant turn's content that no template writes itself


def _template_of(tokenizer: Tokenizer):
    hf = tokenizer.hf
    if hf is None or not getattr(hf, "chat_template", None):
        raise MdlmError(f"--chat needs a tokenizer with a chat template; {tokenizer.name}'s has "
                        "none: give --prompt instead")
    return hf


def chat_prompt_ids(tokenizer: Tokenizer, question: str) -> list[int]:
    """The ids of one user turn and the generation prompt, as the template renders them (its
    own BOS included: nothing is added before or after)."""
    hf = _template_of(tokenizer)
    text = hf.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                  add_generation_prompt=True)
    return tokenizer.encode(text)


def end_of_turn_ids(tokenizer: Tokenizer) -> list[int]:
    """EOS and the special token the template writes right after an assistant turn's content,
    read from a rendered conversation (a template names its end-of-turn token nowhere else)."""
    hf = _template_of(tokenizer)
    turns = [{"role": "user", "content": "?"}, {"role": "assistant", "content": MARKER}]
    text = hf.apply_chat_template(turns, tokenize=False)
    after = text.split(MARKER, 1)[1] if MARKER in text else ""
    ids = tokenizer.encode(after)[:1] if after else []
    added = hf.added_tokens_decoder
    turn_end = [i for i in ids if i in added and added[i].special]
    return [tokenizer.eos_id] + [i for i in turn_end if i != tokenizer.eos_id]
