"""A question put to a chat model through its tokeniser's chat template (`mdlm sample --chat`):
the prompt's token ids with the generation prompt, and the tokens an answer ends at (the
template's end-of-turn token, e.g. LLaDA's `<|eot_id|>` or Dream's `<|im_end|>`, and EOS).
A fine-tuning example goes through the same template (`chat_example_ids`), so that the model
is trained on the very prompts `--chat` gives it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import MdlmError

if TYPE_CHECKING:
    from .tokenizers import Tokenizer

MARKER = "\u2063answer\u2063"  # an assistant turn's content that no template writes itself


def has_chat_template(tokenizer: Tokenizer) -> bool:
    return tokenizer.hf is not None and bool(getattr(tokenizer.hf, "chat_template", None))


def _template_of(tokenizer: Tokenizer):
    if not has_chat_template(tokenizer):
        raise MdlmError(f"--chat needs a tokenizer with a chat template; {tokenizer.name}'s has "
                        "none: give --prompt instead")
    return tokenizer.hf


def chat_prompt_ids(tokenizer: Tokenizer, question: str) -> list[int]:
    """The ids of one user turn and the generation prompt, as the template renders them (its
    own BOS included: nothing is added before or after)."""
    hf = _template_of(tokenizer)
    text = hf.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                  add_generation_prompt=True)
    return tokenizer.encode(text)


def _turn_end(tokenizer: Tokenizer) -> int | None:
    """The special token the template writes right after an assistant turn's content, read
    from a rendered conversation (a template names its end-of-turn token nowhere else)."""
    hf = _template_of(tokenizer)
    turns = [{"role": "user", "content": "?"}, {"role": "assistant", "content": MARKER}]
    text = hf.apply_chat_template(turns, tokenize=False)
    after = text.split(MARKER, 1)[1] if MARKER in text else ""
    ids = tokenizer.encode(after)[:1] if after else []
    added = hf.added_tokens_decoder
    return ids[0] if ids and ids[0] in added and added[ids[0]].special else None


def end_of_turn_ids(tokenizer: Tokenizer) -> list[int]:
    """EOS and the template's end-of-turn token (`_turn_end`), where it has one."""
    turn_end = _turn_end(tokenizer)
    return [tokenizer.eos_id] + ([turn_end] if turn_end not in (None, tokenizer.eos_id) else [])


def chat_example_ids(tokenizer: Tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a conversation whose last message is the assistant's: the
    turns before it with the generation prompt, as `chat_prompt_ids` renders a question (the
    template's own BOS included, none added), then the answer as the template renders it, up
    to and including its end-of-turn token (EOS where the template writes none). What the
    template writes after that token (LLaDA's next generation prompt, Dream's newline) is no
    part of the answer."""
    hf = _template_of(tokenizer)
    prompt = hf.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    full = hf.apply_chat_template(messages, tokenize=False)
    if not full.startswith(prompt):
        raise MdlmError(f"the chat template of {tokenizer.name} does not render the "
                        "conversation as its prompt followed by the answer; it cannot make "
                        "fine-tuning rows")
    answer = tokenizer.encode(full[len(prompt):])
    turn_end = _turn_end(tokenizer)
    if turn_end is not None and turn_end in answer:
        return tokenizer.encode(prompt), answer[: answer.index(turn_end) + 1]
    return tokenizer.encode(prompt), answer + [tokenizer.eos_id]
