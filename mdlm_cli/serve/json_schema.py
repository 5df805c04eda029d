"""`response_format: {"type": "json_schema", ...}`: JSON that always parses and validates.

A schema becomes a skeleton: its punctuation and keys are fixed tokens and each value is a
masked span of a fixed number of tokens whose text must lie in a regular language (a small
character DFA per value: a string's quotes and length, an integer's digits, an enum's options),
followed by spaces (JSON allows whitespace after a value). A masked diffusion model reveals
positions in any order, so a left-to-right rule is not enough: at every network call
`JsonConstraint.allowed` runs a forward and a backward reachability over (position, DFA state)
of each span, given the tokens already revealed, and allows at a masked position exactly the
tokens after which some completion of the span is accepted.

Why that guarantees validity: the spans start satisfiable (checked when the skeleton is built);
the denoiser's logits of every disallowed token are -inf (`ConstrainedDenoiser`), so a draw
keeps a completion possible; the first-hitting sampler with one token per network call (the
only sampler these requests run) reveals one position per row between two calls, so each
draw is made against the state it is checked on and never leaves masked positions unchanged
tokens revealed; once every position is revealed, each span's text is accepted.
Schemas whose outputs this cannot guarantee are refused with a 400 naming the keyword.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..engine.diffusion import call_denoiser
from ..engine.protocols import is_time_agnostic
from .schema import Row, invalid

PAD = "pad"  # the state after a value's end: only spaces follow
SPAN_TOKENS = {"integer": 8, "number": 10}  # span lengths of the unbounded types
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

    def walk(self, state, text: str):
        for ch in text:
            state = self.step(state, ch)
            if state is None:
                return None
        return state


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


def skeleton(schema) -> list[str | Value]:
    """The schema's JSON as fixed text and value slots (objects' properties all emitted, in
    the schema's order); anything else is refused with a 400 naming the keyword."""
    if not isinstance(schema, dict):
        raise invalid("a json_schema schema must be an object", "response_format")
    for key in schema:
        kind = schema.get("type")
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
    kind = schema.get("type")
    if not isinstance(kind, str) or kind not in KEYWORDS:
        raise _unsupported("type", f": {kind!r} (supported: {', '.join(KEYWORDS)})")
    if kind == "object":
        return _object(schema)
    if kind == "array":
        return _array(schema)
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


def _object(schema: dict) -> list[str | Value]:
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
        out += [(", " if i else "") + json.dumps(name, ensure_ascii=False) + ": ", *skeleton(sub)]
    return out + ["}"]


def _array(schema: dict) -> list[str | Value]:
    low, top = schema.get("minItems"), schema.get("maxItems")
    if not isinstance(low, int) or isinstance(low, bool) or low != top or low < 0:
        raise _unsupported("maxItems" if isinstance(low, int) else "minItems",
                           ": an array needs minItems = maxItems (a fixed length)")
    item = skeleton(schema.get("items", None))
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
                      "{'type': 'json_schema', 'json_schema': {'schema': ...}}", "response_format")
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise invalid("response_format must be {'type': 'text'} or {'type': 'json_schema', "
                      "'json_schema': {'name': ..., 'schema': {...}}}", "response_format")
    return spec["schema"]


# ---------------------------------------------------------------------- the constraint

@dataclass
class Span:
    """A value slot at positions [start, start + length) of a row: its DFA as tables."""

    value: Value
    start: int
    length: int
    table: Tensor  # (S, V) long: the state after each token's text, -1 where none
    reach: Tensor  # (S, S) float: 1 where some token leads from s to s'
    accept: Tensor  # (S,) bool


def _compile(value: Value, strings: list[str | None]) -> tuple[Tensor, Tensor, Tensor]:
    """The value's states reachable through tokens (breadth first) and their tables."""
    index, states, rows = {value.start: 0}, [value.start], []
    while len(rows) < len(states):
        row = []
        for text in strings:
            nxt = None if text is None else value.walk(states[len(rows)], text)
            if nxt is not None and nxt not in index:
                index[nxt] = len(states)
                states.append(nxt)
            row.append(-1 if nxt is None else index[nxt])
        rows.append(row)
    table = torch.tensor(rows, dtype=torch.long)
    reach = torch.zeros(len(states), len(states) + 1)
    reach.scatter_(1, table + 1, 1.0)
    accept = torch.tensor([value.accepts(s) for s in states])
    return table, reach[:, 1:].contiguous(), accept


class JsonConstraint:
    """A schema's skeleton laid on a row from position `offset`: its fixed tokens, its value
    spans, which tokens each masked position allows, and the JSON text of filled rows."""

    def __init__(self, schema: dict, tokenizer, offset: int):
        self.mask_id, self.offset = tokenizer.mask_id, offset
        specials = {tokenizer.mask_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}
        self.strings: list[str | None] = []  # each token's text; None: never in a value
        for i in range(tokenizer.vocab_size):
            text = None if i in specials else tokenizer.decode([i])
            ok = text and "\ufffd" not in text and tokenizer.decode([i, i]) == text * 2
            self.strings.append(text if ok else None)
        self.pieces: list[str | Span] = []
        ids: list[int] = []
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
                span = Span(part, offset + len(ids), part.span, *_compile(part, self.strings))
                self.pieces.append(span)
                ids += [self.mask_id] * part.span
        self.ids = ids  # the skeleton's tokens, mask_id in the spans
        z = torch.tensor([ids], dtype=torch.long)
        for span in self.spans:
            first = self._forward(span, z[:, span.start - offset:])[-1]
            if not (first & span.accept).any():
                raise invalid(f"this model's tokenizer ({tokenizer.name}) cannot write a "
                              f"{span.value.kind} value in {span.length} tokens",
                              "response_format")

    @property
    def spans(self) -> list[Span]:
        return [p for p in self.pieces if isinstance(p, Span)]

    def _forward(self, span: Span, z: Tensor) -> list[Tensor]:
        """States reachable before each position of the span (B, S), z's columns from its
        start: fixed tokens move along the table, masked ones along any token."""
        B, S = len(z), len(span.accept)
        states = torch.zeros(B, S, dtype=torch.bool)
        states[:, 0] = True
        out = [states]
        for p in range(span.length):
            tok = z[:, p]
            moved = torch.zeros(B, S + 1).scatter_add_(1, span.table[:, tok].T + 1,
                                                       states.float())[:, 1:] > 0
            free = (states.float() @ span.reach) > 0
            states = torch.where((tok == self.mask_id)[:, None], free, moved)
            out.append(states)
        return out

    def allowed(self, z: Tensor) -> Tensor:
        """(B, L, V) bool: at each masked position of a span, the tokens after which the span
        can still be completed to an accepted text; True elsewhere."""
        z = z.cpu()
        B, L = z.shape
        V = len(self.strings)
        out = torch.ones(B, L, V, dtype=torch.bool)
        for span in self.spans:
            zs = z[:, span.start : span.start + span.length]
            forward = self._forward(span, zs)
            back = span.accept.expand(B, -1)
            for p in reversed(range(span.length)):
                tok = zs[:, p]
                masked = tok == self.mask_id
                padded = torch.cat([torch.zeros(B, 1, dtype=torch.bool), back], 1)  # (B, S + 1)
                ok = padded[:, span.table + 1] & forward[p][:, :, None]  # (B, S, V)
                out[:, span.start + p] = torch.where(masked[:, None], ok.any(1), True)
                free = (back.float() @ span.reach.T) > 0
                moved = padded.gather(1, span.table[:, tok].T + 1)
                back = torch.where(masked[:, None], free, moved)
        return out

    def text(self, tokens: list[int]) -> str:
        """The JSON of a row's skeleton tokens (from the skeleton's first): the fixed text and
        each value's tokens' texts, the spaces after it dropped."""
        out, at = [], 0
        for piece in self.pieces:
            if isinstance(piece, str):
                out.append(piece)
            else:
                at = piece.start - self.offset
                ids = tokens[at : at + piece.length]
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


class ConstrainedDenoiser:
    """A denoiser whose logits are -inf at the tokens `constraint` disallows, given the state
    z_t it is called on (the rows of one request share the skeleton, so a subset of rows is
    masked the same way)."""

    supports_output_mask = True

    def __init__(self, base, constraint: JsonConstraint):
        self.base, self.constraint = base, constraint
        self.time_agnostic = is_time_agnostic(base)

    def __call__(self, z_t: Tensor, t: Tensor, *, output_mask: Tensor | None = None,
                 attention_mask: Tensor | None = None) -> Tensor:
        logits = call_denoiser(self.base, z_t, t, output_mask=output_mask,
                               attention_mask=attention_mask)
        ok = self.constraint.allowed(z_t).to(logits.device)
        if ok.shape[-1] < logits.shape[-1]:  # a vocabulary padded past the tokeniser's
            pad = ok.new_zeros(*ok.shape[:-1], logits.shape[-1] - ok.shape[-1])
            ok = torch.cat([ok, pad], -1)
        if output_mask is not None:
            ok = ok[output_mask]
        return logits.masked_fill(~ok, -math.inf)


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
              served) -> tuple[list[Row], int, JsonConstraint]:
    """The one row of a schema request: row start, prompt, the skeleton, EOS to the end of
    the window; the new tokens (the skeleton's) and the constraint."""
    loaded = served.loaded
    prefix = loaded.row_start() + ids
    constraint = JsonConstraint(schema, loaded.tokenizer, len(prefix))
    n = len(constraint.ids)
    if len(prefix) + n > loaded.length:
        raise invalid(f"prompt ({len(ids)} tokens) + the schema's JSON ({n} tokens) exceeds the "
                      f"window of {loaded.length} tokens", "response_format",
                      "context_length_exceeded")
    if max_tokens is not None and max_tokens < n:
        raise invalid(f"the schema's JSON takes {n} tokens; max_tokens is {max_tokens}",
                      "max_tokens")
    fixed = torch.full((loaded.length,), loaded.tokenizer.eos_id, dtype=torch.long)
    fixed[: len(prefix)] = torch.tensor(prefix, dtype=torch.long)
    fixed[len(prefix) : len(prefix) + n] = torch.tensor(constraint.ids, dtype=torch.long)
    row = Row(fixed, prefix, len(ids), 0, loaded.tokenizer.decode(ids))
    return [row], n, constraint
