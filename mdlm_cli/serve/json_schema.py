"""`response_format: {"type": "json_schema", ...}`: JSON that always parses and validates.

A schema becomes a skeleton: its punctuation and keys are fixed tokens and each value is a
masked span of a fixed number of tokens whose text must lie in a regular language (a small
character DFA per value: a string's quotes and length, an integer's digits, an enum's options),
followed by spaces (JSON allows whitespace after a value). The spans are
enforced by `engine/constraints.py` (a forward and backward reachability over (position, DFA
state) at every network call; its docstring states the guarantee and what it needs): the
requests run the first-hitting sampler with one token per call and fp64 draws, and each span
is checked satisfiable when the skeleton is built. A value's string holds no quote, backslash
or control character (no escapes are written), so the text between its quotes is the value.
Schemas whose outputs this cannot guarantee are refused with a 400 naming the keyword.
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass

import torch

from ..engine.constraints import Span, SpanConstraint, language_tables
from ..generation.layout import lay_out
from .schema import BLOCKS_ONLY, Row, invalid

PAD = "pad"  # the state after a value's end: only spaces follow
SPAN_TOKENS = {"integer": 8, "number": 10}  # span lengths of the unbounded types
MAX_DEPTH = 32  # nesting (deeper schemas would not fit a window anyway)
IGNORED = ("title", "description", "$schema")
KEYWORDS = {  # what each type may say besides `type`, `enum` and `const`
    "object": ("properties", "required", "additionalProperties"),
    "array": ("items", "minItems", "maxItems"),
    "string": ("maxLength", "minLength"),
    "integer": (),
    "number": (),
    "boolean": (),
    "null": (),
}


def _unsupported(keyword: str, why: str = "") -> Exception:
    return invalid(f"unsupported json_schema keyword {keyword!r}{why}", "response_format",
                   "unsupported_json_schema")


# ---------------------------------------------------------------------- value languages

@dataclass(frozen=True)
class Value:
    """A value's language as a character DFA: `kind` with its parameters, span length in
    tokens (an upper bound of the value's characters where single characters are tokens)."""

    kind: str  # string | integer | number | literal
    span: int
    min_length: int = 0
    max_length: int = 0
    options: tuple[str, ...] = ()  # literal: the JSON texts allowed

    start = "start"

    def step(self, state, ch: str):
        """The state after `ch`, None where no value continues so; spaces after a value."""
        if state == PAD or (ch == " " and self.accepts(state) and state != PAD):
            return PAD if ch == " " else None
        if self.kind == "string":
            if state == "start":
                return ("in", 0) if ch == '"' else None
            if isinstance(state, tuple):
                k = state[1]
                if ch == '"':
                    return "end" if k >= self.min_length else None
                ok = ch not in '"\\' and ord(ch) >= 32 and k < self.max_length
                return ("in", k + 1) if ok else None
            return None
        if self.kind in ("integer", "number"):
            digit = ch.isascii() and ch.isdigit()
            if state in ("start", "minus"):
                if ch == "-" and state == "start":
                    return "minus"
                return ("zero" if ch == "0" else "int") if digit else None
            if state == "int" and digit:
                return "int"
            if self.kind == "number":
                if state in ("zero", "int") and ch == ".":
                    return "dot"
                if state in ("dot", "frac") and digit:
                    return "frac"
            return None
        prefix = ("" if state == "start" else state) + ch  # literal: the prefix typed so far
        return prefix if any(o.startswith(prefix) for o in self.options) else None

    def accepts(self, state) -> bool:
        if state == PAD:
            return True
        if self.kind == "string":
            return state == "end"
        if self.kind == "integer":
            return state in ("zero", "int")
        if self.kind == "number":
            return state in ("zero", "int", "frac")
        return state != "start" and state in self.options


def _literal(options: list, keyword: str) -> Value:
    texts = []
    for o in options:
        if not (o is None or isinstance(o, str | int | float | bool)) or (
                isinstance(o, float) and not math.isfinite(o)):
            raise _unsupported(keyword, ": only strings, numbers, booleans and null")
        texts.append(json.dumps(o, ensure_ascii=False))
    if not texts:
        raise _unsupported(keyword, ": an empty enum has no value")
    return Value("literal", max(len(t) for t in texts), options=tuple(dict.fromkeys(texts)))


def skeleton(schema, depth: int = 0) -> list[str | Value]:
    """The schema's JSON as fixed text and value slots (objects' properties all emitted, in
    the schema's order); anything else is refused with a 400 naming the keyword."""
    if not isinstance(schema, dict):
        raise invalid("a json_schema schema must be an object", "response_format")
    if depth > MAX_DEPTH:
        raise invalid(f"a json_schema nests at most {MAX_DEPTH} levels", "response_format")
    kind = schema.get("type") if isinstance(schema.get("type"), str) else None
    for key in schema:
        if key in IGNORED or key in ("type", "enum", "const"):
            continue
        if key not in KEYWORDS.get(kind, ()):
            raise _unsupported(key, f" for type {kind!r}" if kind in KEYWORDS else "")
    if "const" in schema:
        return [_literal([schema["const"]], "const")]
    if "enum" in schema:
        if not isinstance(schema["enum"], list):
            raise _unsupported("enum", ": it must be a list")
        return [_literal(schema["enum"], "enum")]
    if kind not in KEYWORDS:
        raise _unsupported("type", f": {schema.get('type')!r} (supported: "
                                   f"{', '.join(KEYWORDS)})")
    if kind == "object":
        return _object(schema, depth)
    if kind == "array":
        return _array(schema, depth)
    if kind == "string":
        top, low = schema.get("maxLength"), schema.get("minLength", 0)
        if not isinstance(top, int) or isinstance(top, bool) or top < 0:
            raise _unsupported("type", ": a string needs maxLength (a non-negative integer)")
        if not isinstance(low, int) or isinstance(low, bool) or not 0 <= low <= top:
            raise _unsupported("minLength", ": it must be between 0 and maxLength")
        return [Value("string", top + 2, low, top)]
    if kind == "boolean":
        return [_literal([True, False], "type")]
    if kind == "null":
        return [_literal([None], "type")]
    return [Value(kind, SPAN_TOKENS[kind])]


def _object(schema: dict, depth: int) -> list[str | Value]:
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not props:
        raise _unsupported("properties", ": an object needs at least one property")
    if schema.get("additionalProperties", False) is not False:
        raise _unsupported("additionalProperties", ": only false")
    required = schema.get("required", [])
    if not isinstance(required, list) or set(required) - set(props):
        raise _unsupported("required", ": it must list properties of the object")
    out: list[str | Value] = ["{"]
    for i, (name, sub) in enumerate(props.items()):
        key = (", " if i else "") + json.dumps(name, ensure_ascii=False) + ": "
        out += [key, *skeleton(sub, depth + 1)]
    return out + ["}"]


def _array(schema: dict, depth: int) -> list[str | Value]:
    low, top = schema.get("minItems"), schema.get("maxItems")
    if not isinstance(low, int) or isinstance(low, bool) or low != top or low < 0:
        raise _unsupported("maxItems" if isinstance(low, int) else "minItems",
                           ": an array needs minItems = maxItems (a fixed length)")
    item = skeleton(schema.get("items", None), depth + 1)
    out: list[str | Value] = ["["]
    for i in range(low):
        out += ([", "] if i else []) + item
    return out + ["]"]


def json_schema_of(response_format) -> dict | None:
    """The schema of a `response_format`, None for plain text; what it cannot be is a 400."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text" and set(response_format) == {"type"}:
        return None
    if kind == "json_object":
        raise invalid("response_format json_object needs a schema here: use "
                      "{'type': 'json_schema', 'json_schema': {'schema': ...}}",
                      "response_format")
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise invalid("response_format must be {'type': 'text'} or {'type': 'json_schema', "
                      "'json_schema': {'name': ..., 'schema': {...}}}", "response_format")
    return spec["schema"]


# ---------------------------------------------------------------------- the constraint

# per tokeniser (while it lives): its tokens' texts and the tables of the values seen
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_strings(tokenizer) -> list[str | None]:
    """Each token's text, None for the specials and for tokens whose texts do not simply
    concatenate (a byte of a split character, an empty text): never part of a value."""
    specials = {tokenizer.mask_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}
    out: list[str | None] = []
    for i in range(tokenizer.vocab_size):
        text = None if i in specials else tokenizer.decode([i])
        ok = text and "\ufffd" not in text and tokenizer.decode([i, i]) == text * 2
        out.append(text if ok else None)
    return out


class JsonConstraint(SpanConstraint):
    """A schema's skeleton laid on a row from position `offset`: its fixed tokens (`ids`,
    mask_id in the value spans), the spans' DFAs and the JSON text of a filled row."""

    def __init__(self, schema: dict, tokenizer, offset: int):
        cache = _TABLES.setdefault(tokenizer, {})
        if "strings" not in cache:
            cache["strings"] = token_strings(tokenizer)
        self.strings: list[str | None] = cache["strings"]
        self.offset, self.pieces, ids = offset, [], []
        for part in _merged(skeleton(schema)):
            if isinstance(part, str):
                piece = tokenizer.encode(part)
                if tokenizer.decode(piece) != part:
                    bad = next(c for c in part if tokenizer.decode(tokenizer.encode(c)) != c)
                    raise invalid(f"this model's tokenizer ({tokenizer.name}) cannot write "
                                  f"{bad!r}, which the JSON needs", "response_format")
                self.pieces.append(part)
                ids += piece
            else:
                if part not in cache:
                    if len(cache) > 256:  # many distinct values: start again
                        cache.clear()
                        cache["strings"] = self.strings
                    cache[part] = language_tables(part, self.strings)
                span = Span(offset + len(ids), part.span, *cache[part])
                self.pieces.append((part, span))
                ids += [tokenizer.mask_id] * part.span
        self.ids = ids
        super().__init__([s for _, s in self.values], tokenizer.mask_id, tokenizer.vocab_size)
        z = torch.full((1, offset + len(ids)), tokenizer.mask_id)
        z[0, offset:] = torch.tensor(ids)
        for value, span in self.values:
            if not SpanConstraint([span], self.mask_id, self.vocab_size).satisfiable(z).all():
                raise invalid(f"this model's tokenizer ({tokenizer.name}) cannot write a "
                              f"{value.kind} value in {span.length} tokens", "response_format")

    @property
    def values(self) -> list[tuple[Value, Span]]:
        return [p for p in self.pieces if not isinstance(p, str)]

    def text(self, tokens: list[int]) -> str:
        """The JSON of a row's skeleton tokens (from the skeleton's first): the fixed text and
        each value's tokens' texts, the spaces after it dropped."""
        out = []
        for piece in self.pieces:
            if isinstance(piece, str):
                out.append(piece)
            else:
                at = piece[1].start - self.offset
                ids = tokens[at : at + piece[1].length]
                out.append("".join(self.strings[i] or "" for i in ids).rstrip(" "))
        return "".join(out)


def _merged(parts: list[str | Value]) -> list[str | Value]:
    out: list[str | Value] = []
    for part in parts:
        if isinstance(part, str) and out and isinstance(out[-1], str):
            out[-1] += part
        else:
            out.append(part)
    return out


# ---------------------------------------------------------------------- requests

REFUSED = {  # request fields that cannot go with a schema, and why
    "stream": "the JSON comes whole",
    "stream_states": "the JSON comes whole",
    "stop": "the schema ends the answer",
    "logprobs": "log-probabilities of constrained draws are not recorded",
    "top_logprobs": "log-probabilities of constrained draws are not recorded",
    "echo": "the answer is the JSON alone",
    "suffix": "the answer is the JSON alone",
    "stride": "the skeleton lies in one window",
    "semi_ar": "the skeleton lies in one window",
}


def json_request(body: dict, served) -> tuple[dict | None, dict]:
    """The request's schema (None without one) and the body its sampling settings are read
    from: the first-hitting sampler, one token per call, fp64 draws (what the guarantee
    needs; anything else asked is a 400)."""
    schema = json_schema_of(body.get("response_format"))
    if schema is None:
        return None, body
    if served.block_size:
        raise invalid(BLOCKS_ONLY.format(what="cannot fill a json_schema skeleton"),
                      "response_format")
    for name, why in REFUSED.items():
        if body.get(name) not in (None, False):
            raise invalid(f"{name} does not go with a json_schema response_format ({why})", name)
    if body.get("sampler") not in (None, "first-hitting"):
        raise invalid("a json_schema response_format runs the first-hitting sampler (one token "
                      "per network call, each checked against the schema)", "sampler")
    if body.get("tokens_per_step") not in (None, 1):
        raise invalid("a json_schema response_format reveals one token per network call: "
                      "tokens_per_step must be 1", "tokens_per_step")
    if body.get("precision") not in (None, "fp64"):
        raise invalid("a json_schema response_format draws in fp64", "precision")
    if "first-hitting" not in [s.name for s in served.loaded.objective.samplers]:
        raise invalid(f"{served.loaded.objective.name} models have no first-hitting sampler, "
                      "which a json_schema response_format needs", "response_format")
    return schema, {**body, "sampler": "first-hitting"}


def json_rows(schema: dict, ids: list[int], max_tokens: int | None,
              served, start: list[int] | None = None) -> tuple[list[Row], int, JsonConstraint]:
    """The one row of a schema request, laid out by the one rule (generation/layout.py): row
    start (or `start`) + prompt + the skeleton as the answer + a suffix of EOS to the end of
    the window for a model trained on rows of L (none for LLaDA and Dream, whose rows end at
    the answer); the new tokens (the skeleton's) and the constraint."""
    loaded, caps = served.loaded, served.capabilities
    start = list(caps.row_start) if start is None else start
    prefix = start + ids
    constraint = JsonConstraint(schema, loaded.tokenizer, len(prefix))
    n = len(constraint.ids)
    if len(prefix) + n > loaded.length:
        raise invalid(f"prompt ({len(ids)} tokens) + the schema's JSON ({n} tokens) exceeds the "
                      f"window of {loaded.length} tokens", "response_format",
                      "context_length_exceeded")
    if max_tokens is not None and max_tokens < n:
        raise invalid(f"the schema's JSON takes {n} tokens; max_tokens is {max_tokens}",
                      "max_tokens")
    # a model trained on rows of L (a DiT) sees its rows end in EOS to the window; a family
    # whose release denoises prompt + answer only (LLaDA, Dream: answer_tokens) ends at the JSON
    fill = loaded.length - len(prefix) - n if caps.answer_tokens is None else 0
    eos = [loaded.tokenizer.eos_id] * fill
    layout = lay_out(caps, ids, answer=n, suffix=eos, start=start)
    fixed = layout.template(loaded.mask_id)
    fixed[layout.answer_start : layout.answer_start + n] = torch.tensor(constraint.ids)
    row = Row(fixed, layout.prefix, len(ids), 0, loaded.tokenizer.decode(ids))
    return [row], n, constraint
