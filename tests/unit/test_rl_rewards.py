"""The rewards: each built-in on hand-made completions, weighted sums, the user's
`module:function`, and every way a spec or a user function can fail, in one line."""

import json
import sys

import pytest

from mdlm_cli.errors import MdlmError
from mdlm_cli.rl import REWARDS, extract_answer, load_reward

PROMPTS = ["q1", "q2", "q3"]


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_answers_follow_gsm8ks_hashes_then_the_last_number():
    assert extract_answer("48 / 2 = 24 clips.\n#### 1,072") == "1072"
    assert extract_answer("so 3 + 4 = 7") == "7"
    assert extract_answer("twelve") == "twelve"
    assert extract_answer("#### 5 apples, not 6") == "5"


def test_exact_matches_the_reference_answer_by_value():
    reward = load_reward("exact")
    completions = ["The total is 1,072.", "#### 3.0", "I think 8"]
    refs = ["Natalia sold ... #### 1072", "3", "7"]
    assert reward(PROMPTS, completions, response=refs) == [1.0, 1.0, 0.0]
    assert reward(PROMPTS, completions, answer=["1072", "3", "8"], response=refs) == [1, 1, 1]
    by_field = load_reward("exact:gold")
    assert by_field(PROMPTS, completions, gold=["0", "3", "8"]) == [0.0, 1.0, 1.0]
    assert load_reward("exact")(["a"], ["dfh"], response=["dfh"]) == [1.0]  # no number: as text
    with pytest.raises(MdlmError) as e:
        reward(PROMPTS, completions, other=refs)
    assert "needs the reference answer" in one_line(e)


def test_format_searches_the_regex():
    reward = load_reward(r"format:^<answer>\d+</answer>$")
    assert reward(PROMPTS, ["<answer>12</answer>", "<answer>x</answer>", "a <answer>1</answer>"]
                  ) == [1.0, 0.0, 0.0]
    with pytest.raises(MdlmError) as e:
        load_reward("format:(")
    assert "not a regular expression" in one_line(e)
    with pytest.raises(MdlmError) as e:
        load_reward("format")
    assert "needs an argument" in one_line(e)


def test_json_validates_against_the_schema_file(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["a"],
                                  "properties": {"a": {"type": "integer"}}}))
    reward = load_reward(f"json:{schema}")
    assert reward(PROMPTS, ['{"a": 1}', '{"a": "x"}', "not json"]) == [1.0, 0.0, 0.0]
    with pytest.raises(MdlmError) as e:
        load_reward(f"json:{tmp_path / 'missing.json'}")
    assert "cannot read a JSON schema" in one_line(e)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": 5}))
    with pytest.raises(MdlmError) as e:
        load_reward(f"json:{bad}")
    assert "not a valid schema" in one_line(e)


def test_json_without_jsonschema_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import fails as if not installed
    with pytest.raises(MdlmError) as e:
        load_reward(f"json:{tmp_path / 's.json'}")
    assert "pip install 'mdlm[rl]'" in one_line(e)


def test_length_peaks_at_n_characters():
    reward = load_reward("length:4")
    assert reward(PROMPTS, ["abcd", "ab", "abcdefghij"]) == [1.0, 0.5, 0.0]
    for spec in ("length:0", "length:x"):
        with pytest.raises(MdlmError) as e:
            load_reward(spec)
        assert "positive number of characters" in one_line(e)


def test_weighted_terms_sum_and_keep_their_own_scores():
    reward = load_reward(["2*exact", "0.5*length:2"])
    fields = {"response": ["12", "12", "3"]}
    assert reward(PROMPTS, ["12", "1", "12"], **fields) == [2.5, 0.25, 0.5]
    parts = reward.terms_of(PROMPTS, ["12", "1", "12"], **fields)
    assert parts == {"exact": [1.0, 0.0, 0.0], "length:2": [1.0, 0.5, 1.0]}
    with pytest.raises(MdlmError) as e:
        load_reward(["exact", "3*exact"])
    assert "given twice" in one_line(e)
    with pytest.raises(MdlmError) as e:
        load_reward("nope")
    assert f"use one of: {', '.join(REWARDS)}" in one_line(e)


USER_MODULE = '''
def chars(prompts, completions, **fields):
    return [len(c) + len(fields.get("extra", [""])[0]) for c in completions]

def boom(prompts, completions, **fields):
    raise ValueError("bad\\ninput")

def short(prompts, completions, **fields):
    return [1.0]

def words(prompts, completions, **fields):
    return ["one" for _ in completions]

def nan(prompts, completions, **fields):
    return [float("nan") for _ in completions]

def scalar(prompts, completions, **fields):
    return 1.0

not_callable = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_user_function_gets_prompts_completions_and_the_data_sets_fields(user_module):
    reward = load_reward([f"{user_module}:chars", "0.5*exact"])
    assert reward(["p", "p"], ["ab", "7"], extra=["xyz", "xyz"], response=["1", "7"]) == [
        5.0, 4.5]


@pytest.mark.parametrize("fn, message", [
    ("boom", "reward my_rewards:boom raised ValueError: bad input"),
    ("short", "reward my_rewards:short returned 1 values for 2 completions"),
    ("words", "reward my_rewards:words returned 'one' for completion 0; return finite numbers"),
    ("nan", "reward my_rewards:nan returned nan for completion 0"),
    ("scalar", "reward my_rewards:scalar returned float, not a list of 2 numbers"),
])
def test_a_failing_user_function_is_one_line_naming_it(user_module, fn, message):
    reward = load_reward(f"{user_module}:{fn}")
    with pytest.raises(MdlmError) as e:
        reward(["p", "p"], ["a", "b"])
    assert message in one_line(e)


def test_a_user_function_that_cannot_be_found_is_one_line(user_module):
    for spec, message in [("no_such_module_xyz:fn", "cannot import no_such_module_xyz"),
                          (f"{user_module}:missing", "has no function 'missing'"),
                          (f"{user_module}:not_callable", "has no function 'not_callable'")]:
        with pytest.raises(MdlmError) as e:
            load_reward(spec)
        assert message in one_line(e)
