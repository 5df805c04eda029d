"""`POST /v1/chat/completions`: OpenAI's chat body, the messages rendered by the tokeniser's
chat template (the generation prompt added) into one prompt, and the answer cut at the end of
the turn (EOS and the token the template writes after an assistant turn, read off the
template by `data.chat.end_of_turn_ids` as `mdlm sample --chat` reads it: no list of token
names); and the chat shapes of choices and stream chunks (`message`, `delta`)."""

from __future__ import annotations

from .completion import check_logprobs, prompt_rows, stop_strings
from .fields import check_fields, check_model, common_fields, get_int, get_value
from .json_schema import json_request, json_rows
from .schema import SAMPLER_OPTIONS, Limits, Plan, invalid, make_plan
from .served import Served

CHAT_FIELDS = (
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "cfg_scale",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "user",
    "logprobs",
    "top_logprobs",
    "sampler",
    "steps",
    "precision",
    "response_format",
    *SAMPLER_OPTIONS,
)
ROLES = ("system", "developer", "user", "assistant")  # developer: OpenAI's newer name for system


def _content(value, i: int) -> str:
    """A message's text: a string, or OpenAI's list of text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in value
    ):
        return "".join(p["text"] for p in value)
    raise invalid(f"messages[{i}].content must be a string or a list of text parts", "messages")


def messages_of(body: dict) -> list[dict]:
    """The messages checked: {role, content} objects, roles among `ROLES`."""
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise invalid("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or "content" not in message or set(message) - {
                "role", "content", "name"}:
            raise invalid(f"messages[{i}] must be an object with role and content", "messages")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"messages[{i}].role must be one of: {', '.join(ROLES)} (got "
                          f"{role!r})",
                          "messages")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _content(message["content"], i)})
    return out


def _max_tokens(body: dict) -> int | None:
    given = [n for n in ("max_completion_tokens", "max_tokens") if body.get(n) is not None]
    if len(given) == 2 and body[given[0]] != body[given[1]]:
        raise invalid("give max_completion_tokens or max_tokens, not both", "max_tokens")
    return get_int(body, given[0], 1, 2**31 - 1, None) if given else None


def parse_chat(body: dict, served: Served, limits: Limits) -> Plan:
    """`POST /v1/chat/completions`: the messages through the chat template, then as a
    completion of one window that ends at the end of the turn."""
    check_fields(body, CHAT_FIELDS)
    check_model(body, served)
    schema, body = json_request(body, served)
    tok = served.loaded.tokenizer
    if not served.chat:
        raise invalid(f"this model's tokenizer ({tok.name}) has no chat template; use "
                      "/v1/completions with a prompt", "messages", "no_chat_template")
    text = tok.hf.apply_chat_template(messages_of(body), tokenize=False,
                                      add_generation_prompt=True)
    # nothing before the rendered prompt: the template writes the BOS its model expects (LLaDA's
    # <|startoftext|>) or none (Dream), as `mdlm sample --chat` and the models' own chat code
    ids = tok.encode(text)
    constraint = None
    if schema is None:
        rows, max_tokens = prompt_rows([ids], [], _max_tokens(body), None, served, limits,
                                       semi_ar=False, start=[])
    else:
        rows, max_tokens, constraint = json_rows(schema, ids, _max_tokens(body), served,
                                                 start=[])
    common = common_fields(body, served, limits, "chat")
    plan = make_plan(common, rows, constraint=constraint, max_new_tokens=max_tokens,
                     stop=stop_strings(body), end_ids=served.capabilities.end_of_turn)
    plan.logprobs = _top_logprobs(body, plan, served, limits)
    return plan


def _top_logprobs(body: dict, plan: Plan, served: Served, limits: Limits) -> int | None:
    """Chat's `logprobs: true` with `top_logprobs: N` (0 to the limit): as completions'."""
    wanted = get_value(body, "logprobs", (bool,), False, "true or false")
    top = get_int(body, "top_logprobs", 0, limits.max_logprobs, None)
    if top is not None and not wanted:
        raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    return check_logprobs(plan, served, top or 0) if wanted else None


def _chat_logprobs(lp: dict | None) -> dict | None:
    """Completions' legacy `logprobs` in chat's shape: `content`, one entry per token."""
    if lp is None:
        return None

    def entry(token: str, value: float) -> dict:
        return {"token": token, "logprob": value, "bytes": list(token.encode("utf-8"))}

    return {"content": [
        {**entry(token, value), "top_logprobs": [entry(t, v) for t, v in top.items()]}
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                     strict=True)
    ], "refusal": None}


def chat_choice(choice: dict) -> dict:
    """A completion's choice as a chat choice: the assistant's message."""
    return {"index": choice["index"],
            "message": {"role": "assistant", "content": choice["text"]},
            "logprobs": _chat_logprobs(choice.get("logprobs")),
            "finish_reason": choice["finish_reason"]}


def chat_delta(index: int, text: str, first: bool) -> dict:
    """A stream chunk's choice: new content (the role with a choice's first)."""
    delta = {"role": "assistant", "content": text} if first else {"content": text}
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}


def chat_end(choice: dict) -> dict:
    """A choice's last stream chunk: its finish reason, and its log-probabilities if asked."""
    return {"index": choice["index"], "delta": {},
            "logprobs": _chat_logprobs(choice.get("logprobs")),
            "finish_reason": choice["finish_reason"]}
