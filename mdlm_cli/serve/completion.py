"""`POST /v1/completions`: OpenAI's completion body (prompts as text or token ids, suffix
infilling, stop strings, echo) and mdlm's semi-AR fields, checked and made into a `Plan`."""

from __future__ import annotations

from ..generation.layout import LayoutError, lay_out, lay_out_semi_ar, semi_ar_stride
from .blocks import block_rows
from .fields import check_fields, check_model, common_fields, get_bool, get_int, get_value
from .json_schema import json_request, json_rows
from .schema import (
    BLOCKS_ONLY,
    MDLM_FIELDS,
    OPENAI_FIELDS,
    Limits,
    Plan,
    Row,
    check_states,
    invalid,
    make_plan,
)
from .served import Served


def _prompts(body: dict, served: Served, limits: Limits) -> list[list[int]]:
    """The prompts as token ids: a string, strings, token ids, or lists of token ids."""
    tok = served.loaded.tokenizer
    value = body.get("prompt", "")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise invalid(
            "prompt must be a string, a list of strings, token ids or a list of token-id lists",
            "prompt",
        )
    if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        value = [value]
    if len(value) > limits.max_prompts:
        raise invalid(
            f"at most {limits.max_prompts} prompts per request (got {len(value)})", "prompt"
        )
    out = []
    for item in value:
        if isinstance(item, str):
            out.append(tok.encode(item) if item else [])
        elif isinstance(item, list) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in item
        ):
            bad = [x for x in item if not 0 <= x < tok.vocab_size or x == served.loaded.mask_id]
            if bad:
                raise invalid(
                    f"token id {bad[0]} is not a token of this model "
                    f"(ids 0 to {tok.vocab_size - 1}, "
                    f"not the mask {served.loaded.mask_id})",
                    "prompt",
                )
            out.append(list(item))
        else:
            raise invalid(
                "prompt must be a string, a list of strings, token ids or a list of "
                "token-id lists",
                "prompt",
            )
    return out


def stop_strings(body: dict) -> tuple[str, ...]:
    """`stop`: a string or a list of them (the request's `validate` checks them)."""
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not stop:
        raise invalid("stop must be a non-empty string or a list of 1 to 4 of them", "stop")
    return tuple(stop)


def _stride(body: dict, served: Served) -> int | None:
    """Semi-AR's new tokens per window (MDLM §4.2): `stride`, or `semi_ar: true` (half of L)."""
    window = served.loaded.length
    stride = get_int(body, "stride", 1, window - 1, None)
    semi_ar = body.get("semi_ar")
    if semi_ar is not None and not isinstance(semi_ar, bool):
        raise invalid("semi_ar must be true or false", "semi_ar")
    if semi_ar is False and stride is not None:
        raise invalid("stride asks for semi-AR generation; drop semi_ar: false", "stride")
    if served.block_size and (stride is not None or semi_ar):
        raise invalid(BLOCKS_ONLY.format(what="takes no stride or semi_ar") + "; max_tokens may "
                      "pass its length", "stride" if stride is not None else "semi_ar")
    if stride is None and semi_ar:
        stride = semi_ar_stride(served.capabilities, None)
    if stride is not None and served.loaded.objective.causal:
        raise invalid(
            f"semi-AR is for diffusion models; a left-to-right "
            f"({served.loaded.objective.name}) model "
            "generates up to its length",
            "stride",
        )
    return stride


def prompt_rows(
    prompts: list[list[int]],
    suffix: list[int],
    max_tokens: int | None,
    stride: int | None,
    served: Served,
    limits: Limits,
    semi_ar: bool = True,
    start: list[int] | None = None,
) -> tuple[list[Row], int]:
    """One `Row` per prompt and the number of new tokens, each row laid out by the one rule
    (generation/layout.py: start + prompt + answer + suffix, the answer as asked, else the
    model's default, else the rest of the window); semi-AR rows are a prefix only. `semi_ar`:
    a too-long error suggests it. `start`: the tokens before each prompt (default the row
    start; none for a chat prompt, whose template writes its own BOS)."""
    if served.block_size:  # no window: the blocks go on past the training length
        return block_rows(prompts, max_tokens, served, limits, start)
    loaded = served.loaded
    start = loaded.row_start() if start is None else start
    if stride is not None:
        return _semi_ar_rows(prompts, suffix, max_tokens, stride, served, limits, start)
    caps, longest = served.capabilities, max(prompts, key=len)
    try:  # one answer length for all: what the longest prompt leaves, where none is asked
        max_tokens = lay_out(caps, longest, answer=max_tokens, suffix=suffix, start=start).answer
        layouts = [lay_out(caps, ids, answer=max_tokens, suffix=suffix, start=start)
                   for ids in prompts]
    except LayoutError as e:
        hint = "" if suffix or not semi_ar else "; ask for semi-AR generation with stride"
        raise invalid(f"{e}{hint}", e.param, "context_length_exceeded") from None
    decode = loaded.tokenizer.decode
    return [Row(layout.template(loaded.mask_id), layout.prefix, len(ids), len(suffix),
                decode(ids)) for layout, ids in zip(layouts, prompts, strict=True)], max_tokens


def _semi_ar_rows(prompts: list[list[int]], suffix: list[int], max_tokens: int | None,
                  stride: int, served: Served, limits: Limits,
                  start: list[int]) -> tuple[list[Row], int]:
    """The prefix row of a semi-AR request by the one rule (generation/layout.py's
    `lay_out_semi_ar`, MDLM §4.2): one prompt, shorter than the window, then `max_tokens`
    (default: the rest of the window), up to `max_semi_ar_windows` windows in all."""
    window, prompt = served.loaded.length, prompts[0]
    if suffix or len(prompts) > 1:
        raise invalid("semi-AR (stride) takes one prompt and no suffix",
                      "stride" if not suffix else "suffix")
    try:
        layout = lay_out_semi_ar(served.capabilities, prompt, stride=stride, answer=max_tokens,
                                 start=start)
    except LayoutError as e:
        raise invalid(str(e), e.param, "context_length_exceeded") from None
    most = limits.max_semi_ar_windows * window
    if layout.length > most:
        raise invalid(f"prompt ({len(prompt)} tokens) + max_tokens ({layout.answer}) exceeds "
                      f"the semi-AR limit of {most} "
                      "tokens", "max_tokens", "context_length_exceeded")
    row = Row(None, layout.prefix, len(prompt), 0, served.loaded.tokenizer.decode(prompt),
              length=layout.length)
    return [row], layout.answer


def _max_tokens(body: dict) -> int | None:
    """`max_tokens`, or `max_new_tokens` (the name `mdlm sample` uses); not both."""
    given = [name for name in ("max_tokens", "max_new_tokens") if body.get(name) is not None]
    if len(given) == 2:
        raise invalid("give max_tokens or max_new_tokens, not both", "max_new_tokens")
    return get_int(body, given[0], 1, 2**31 - 1, None) if given else None


def _logprobs(body: dict, plan: Plan, served: Served, limits: Limits) -> int | None:
    """`logprobs: N`: each token's log-probability at the call that revealed it and the top N
    alternatives, from the samplers whose draws record them (fp64), within one window."""
    top = get_int(body, "logprobs", 0, limits.max_logprobs, None)
    return None if top is None else check_logprobs(plan, served, top)


def check_logprobs(plan: Plan, served: Served, top: int) -> int:
    """`top`, where the plan's sampler and settings can record log-probabilities (else a 400)."""
    spec = plan.sampler
    if plan.block_size:
        raise invalid("logprobs is not offered for a bd3lm model: its block sampler does not "
                      "record its draws", "logprobs", "unsupported_parameter")
    if not spec.records_reveals:
        recording = [s.name for s in served.loaded.objective.samplers if s.records_reveals]
        raise invalid("logprobs needs a sampler that records its draws "
                      f"({', '.join(recording)}); {spec.name} does not", "logprobs",
                      "unsupported_parameter")
    for asked, what in ((plan.precision != "fp64", "precision fp64"),
                        (plan.stride is not None, "one window (no stride / semi_ar)"),
                        (plan.echo, "echo: false (the prompt's tokens are not drawn)")):
        if asked:
            raise invalid(f"logprobs needs {what}", "logprobs", "unsupported_parameter")
    return top


def parse_completion(body: dict, served: Served, limits: Limits) -> Plan:
    """`POST /v1/completions`: OpenAI's fields and mdlm's diffusion fields, checked."""
    check_fields(body, OPENAI_FIELDS + MDLM_FIELDS + ("response_format",))
    check_model(body, served)
    schema, body = json_request(body, served)
    prompts = _prompts(body, served, limits)
    if schema is not None:
        if len(prompts) != 1:
            raise invalid("a json_schema response_format takes one prompt", "prompt")
        rows, max_tokens, constraint = json_rows(schema, prompts[0], _max_tokens(body), served)
        common = common_fields(body, served, limits, "completion")
        return check_states(make_plan(common, rows, constraint=constraint,
                                      max_new_tokens=max_tokens))
    suffix_text = get_value(body, "suffix", (str,), "", "a string")
    if suffix_text and served.block_size:
        raise invalid(BLOCKS_ONLY.format(what="cannot infill a suffix"), "suffix")
    if suffix_text and served.loaded.objective.causal:
        raise invalid(
            f"a left-to-right ({served.loaded.objective.name}) model cannot infill a suffix",
            "suffix",
        )
    suffix = served.loaded.tokenizer.encode(suffix_text) if suffix_text else []
    stride = _stride(body, served)
    max_tokens = _max_tokens(body)
    rows, max_tokens = prompt_rows(prompts, suffix, max_tokens, stride, served, limits)
    common = common_fields(body, served, limits, "completion")
    plan = make_plan(common, rows, max_new_tokens=max_tokens, stride=stride,
                     stop=stop_strings(body), echo=get_bool(body, "echo"),
                     suffix_ids=tuple(suffix))
    plan.logprobs = _logprobs(body, plan, served, limits)
    return check_states(plan)
