"""Rewards: a score per completion, from built-ins or the user's own function.

A reward function is TRL's and d1's contract: `fn(prompts, completions, **fields) ->
one float per completion`, `prompts` and `completions` lists of strings, `fields` the data
set's other columns, each a list aligned with the completions (a prompt's value repeated
for each of its G completions; for prompt/response data, `response` is the reference).

A spec names one term; `load_reward` takes one spec or several and sums them:

    exact               1 if the completion's answer equals the reference's, else 0 (the
    exact:FIELD         reference from `answer`, else `response`, or FIELD); an answer is the
                        text after the last `####` (GSM8K's convention), else the last number,
                        else the whole stripped text; numbers compare as numbers
    format:REGEX        1 if `re.search(REGEX, completion)` finds it (anchor with ^ and $;
                        `(?s)` lets `.` cross lines), else 0
    json:SCHEMA_FILE    1 if the completion is JSON valid under the schema (`jsonschema`:
                        pip install 'mdlm[rl]'), else 0
    length:N            max(0, 1 - |characters - N| / N): 1 at N characters
    pkg.module:function the user's own function, imported by name
    W*SPEC              any of these weighted by the number W (`2*exact`, d1's 2.0 for a
                        correct answer)

A user function that raises, returns the wrong number of values, or anything but finite
numbers, ends in a one-line MdlmError naming it. Adding a built-in: a function
`make(arg) -> RewardFn` and an entry in `REWARDS`.
"""

from __future__ import annotations

import importlib
import json
import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MdlmError

RewardFn = Callable[..., Sequence[float]]

HASH_ANSWER = "####"
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
WEIGHT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*\*\s*")


def extract_answer(text: str) -> str:
    """A text's final answer: after its last `####` (GSM8K's reference convention), else its
    last number, else the whole text; stripped, thousands commas dropped from a number."""
    if HASH_ANSWER in text:
        text = text.rsplit(HASH_ANSWER, 1)[1]
        found = NUMBER.findall(text)
        return found[0].replace(",", "") if found else text.strip()
    found = NUMBER.findall(text)
    return found[-1].replace(",", "") if found else text.strip()


def same_answer(a: str, b: str) -> bool:
    """Two extracted answers equal: as numbers when both are, else as strings."""
    try:
        return math.isclose(float(a), float(b), rel_tol=0.0, abs_tol=1e-9)
    except ValueError:
        return a == b


def _exact(field: str | None) -> RewardFn:
    def exact(prompts, completions, **fields):
        name = field or next((k for k in ("answer", "response") if k in fields), None)
        if name is None or name not in fields:
            raise MdlmError(f"reward exact needs the reference answer: a data set field "
                            f"{name or 'answer or response'!r} (fields: {', '.join(fields)})")
        return [float(same_answer(extract_answer(c), extract_answer(str(r))))
                for c, r in zip(completions, fields[name], strict=True)]
    return exact


def _format(pattern: str | None) -> RewardFn:
    try:
        compiled = re.compile(pattern or "")
    except re.error as e:
        raise MdlmError(f"reward format:{pattern}: not a regular expression ({e})") from None

    def format_match(prompts, completions, **fields):
        return [float(compiled.search(c) is not None) for c in completions]
    return format_match


def _jsonschema():
    try:
        import jsonschema
    except ImportError:
        raise MdlmError("the json reward needs jsonschema: pip install 'mdlm[rl]'") from None
    return jsonschema


def _json(schema_file: str | None) -> RewardFn:
    jsonschema = _jsonschema()
    path = Path(schema_file or "")
    try:
        schema = json.loads(path.read_text())
        validator = jsonschema.validators.validator_for(schema)
        validator.check_schema(schema)
    except (OSError, ValueError) as e:
        raise MdlmError(f"reward json:{schema_file}: cannot read a JSON schema there "
                        f"({type(e).__name__})") from None
    except jsonschema.SchemaError as e:
        raise MdlmError(f"reward json:{schema_file}: not a valid schema ({e.message})") from None
    check = validator(schema)

    def json_valid(prompts, completions, **fields):
        out = []
        for c in completions:
            try:
                out.append(float(check.is_valid(json.loads(c))))
            except ValueError:  # not JSON at all (JSONDecodeError is a ValueError)
                out.append(0.0)
        return out
    return json_valid


def _length(target: str | None) -> RewardFn:
    try:
        n = int(target or "")
    except ValueError:
        n = 0
    if n < 1:
        raise MdlmError("reward length:N needs a positive number of characters (got "
                        f"{target!r})")

    def length(prompts, completions, **fields):
        return [max(0.0, 1.0 - abs(len(c) - n) / n) for c in completions]
    return length


@dataclass(frozen=True)
class RewardSpec:
    name: str
    make: Callable[[str | None], RewardFn]  # the spec's argument (after "name:") -> function
    help: str
    needs_arg: bool = False


REWARDS: dict[str, RewardSpec] = {spec.name: spec for spec in (
    RewardSpec("exact", _exact, "1 if the answer (after ####, else the last number) equals the "
                                "reference's (exact:FIELD names its field)"),
    RewardSpec("format", _format, "1 if the regular expression is found in the completion",
               needs_arg=True),
    RewardSpec("json", _json, "1 if the completion is JSON valid under the schema file",
               needs_arg=True),
    RewardSpec("length", _length, "max(0, 1 - |characters - N| / N)", needs_arg=True),
)}


def _user_function(spec: str) -> RewardFn:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise MdlmError(f"reward {spec}: cannot import {module_name} ({e}); is it on "
                        "PYTHONPATH?") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise MdlmError(f"reward {spec}: {module_name} has no function {attr!r}")
    return fn


@dataclass(frozen=True)
class RewardTerm:
    name: str  # the spec as given, weight aside: what the log's per-term means are named
    weight: float
    fn: RewardFn

    def __call__(self, prompts: list[str], completions: list[str], **fields: Any) -> list[float]:
        """The term's checked scores (unweighted): a failure is one line naming it."""
        try:
            values = self.fn(prompts, completions, **fields)
        except MdlmError:
            raise
        except Exception as e:  # the user's code: any failure, one line
            detail = " ".join(str(e).split())[:200]
            raise MdlmError(f"reward {self.name} raised {type(e).__name__}: {detail}") from None
        try:
            values = list(values)
        except TypeError:
            raise MdlmError(f"reward {self.name} returned {type(values).__name__}, not a "
                            f"list of {len(completions)} numbers") from None
        if len(values) != len(completions):
            raise MdlmError(f"reward {self.name} returned {len(values)} values for "
                            f"{len(completions)} completions; return one per completion")
        wrong = [i for i, v in enumerate(values)
                 if not isinstance(v, numbers.Real) or not math.isfinite(float(v))]
        if wrong:
            raise MdlmError(f"reward {self.name} returned {values[wrong[0]]!r} for completion "
                            f"{wrong[0]}; return finite numbers")
        return [float(v) for v in values]


def parse_term(spec: str) -> RewardTerm:
    """One spec (`W*` optional, then a built-in or `module:function`) as a term."""
    match = WEIGHT.match(spec)
    weight = float(match.group(1)) if match else 1.0
    body = spec[match.end():] if match else spec.strip()
    name, sep, arg = body.partition(":")
    if name in REWARDS:
        entry = REWARDS[name]
        if entry.needs_arg and not arg:
            raise MdlmError(f"reward {name} needs an argument: {name}:VALUE ({entry.help})")
        return RewardTerm(body, weight, entry.make(arg if sep else None))
    if sep and re.fullmatch(r"[A-Za-z_][\w.]*", name) and arg.isidentifier():
        return RewardTerm(body, weight, _user_function(body))
    raise MdlmError(f"unknown reward {body!r}; use one of: {', '.join(REWARDS)}, or "
                    "pkg.module:function")


@dataclass(frozen=True)
class Reward:
    """A weighted sum of reward terms: `reward(prompts, completions, **fields)` the totals,
    `reward.terms_of(...)` each term's own scores (for the log)."""

    terms: tuple[RewardTerm, ...]

    def terms_of(self, prompts: list[str], completions: list[str],
                 **fields: Any) -> dict[str, list[float]]:
        return {t.name: t(prompts, completions, **fields) for t in self.terms}

    def __call__(self, prompts: list[str], completions: list[str], **fields: Any) -> list[float]:
        parts = self.terms_of(prompts, completions, **fields)
        return [sum(t.weight * parts[t.name][i] for t in self.terms)
                for i in range(len(completions))]


def load_reward(spec: str | Sequence[str]) -> Reward:
    """The reward of one spec or a list of them, summed (see the module's docstring). Specs
    are not split on a separator: a regular expression may hold any character."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        raise MdlmError("no reward given; name at least one (e.g. exact)")
    terms = tuple(parse_term(s) for s in specs)
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
        raise MdlmError(f"reward {next(n for n in names if names.count(n) > 1)} is given twice; "
                        "weight it once instead (W*SPEC)")
    return Reward(terms)
