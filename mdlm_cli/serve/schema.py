"""Requests of `mdlm serve`: OpenAI's completion body (plus mdlm's diffusion fields at the top
level, as OpenAI clients send extra fields) checked and turned into a `Plan` the worker runs.

Every mistake is an `ApiError` (OpenAI's error shape, 4xx); nothing in a request names a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..engine.sampling import SamplerSpec, get_sampler, option_names
from ..engine.settings import SamplingSettings
from ..errors import MdlmError
from ..generation.request import GenerationRequest, RequestError

OPENAI_FIELDS = (
    "model",
    "prompt",
    "suffix",
    "max_tokens",
    "n",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "echo",
    "logprobs",
    "user",
)
# OpenAI fields mdlm cannot honour: accepted only at their neutral value
NEUTRAL = {
    "logprobs": (None,),
    "best_of": (None, 1),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None,),
    "functions": (None, []),
    "response_format": (None,),  # json_schema: chat and completions (json_schema.py)
}
SAMPLER_OPTIONS = tuple(option_names())  # from the samplers' options: a new one is a field too
MDLM_FIELDS = (
    "max_new_tokens",  # `mdlm sample`'s name for max_tokens
    "top_k",  # vocabulary top-k, as vLLM's extra field (-1 or 0: off; absent: the model's)
    "cfg_scale",  # LLaDA's classifier-free guidance (0: off)
    "sampler",
    "steps",
    "precision",
    "stride",
    "semi_ar",
    "stream_states",
    *SAMPLER_OPTIONS,
)
INFILL_FIELDS = (
    "model",
    "template",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "cfg_scale",
    "seed",
    "stream",
    "stream_options",
    "sampler",
    "steps",
    "precision",
    "stream_states",
    "user",
    *SAMPLER_OPTIONS,
)


# what a bd3lm model refuses (serve/blocks.py), in one line
BLOCKS_ONLY = ("a bd3lm model {what}: it generates block after block, left to right, from a "
               "prompt (/v1/completions with prompt and max_tokens)")


class ApiError(Exception):
    """A request the server refuses: HTTP status and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class Limits:
    max_n: int = 16  # choices per prompt
    max_prompts: int = 16
    max_steps: int = 10000
    max_semi_ar_windows: int = 16  # semi-AR: at most this many windows of new tokens
    max_logprobs: int = 20  # top alternatives per token


@dataclass
class Row:
    """One prompt: the fixed tokens around the positions the sampler fills."""

    # (L,) mask_id at free positions; None: a prefix only (semi-AR, bd3lm)
    template: torch.Tensor | None
    prefix: list[int]  # row start (BOS) and prompt tokens
    n_prompt: int  # prompt tokens (without the row start)
    n_suffix: int = 0
    echo: str = ""  # the prompt's text, for echo
    length: int = 0  # a prefix-only row's positions (bd3lm: generation/layout.py's rounded row)


@dataclass
class Plan:
    """What one request runs: a sampler on every (prompt, choice) row with its own generator."""

    endpoint: str  # completion | infill | chat
    # what the body asks, validated once (generation/request.py): the settings (with the
    # sampler that runs, a fallback's name), seed, n, the answer's length as the row rule
    # resolved it, stops, the end of a turn, echo, stride and suffix
    request: GenerationRequest
    rows: list[Row]
    stream: bool = False
    states: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # alternatives per token, None = no log-probabilities
    constraint: Any = None  # a `JsonConstraint` (json_schema.py): the rows' skeleton
    block_size: int = 0  # L' of a bd3lm model: generated block by block (serve/blocks.py)

    # what the worker and the responses read of the request
    @property
    def settings(self) -> SamplingSettings:
        return self.request.settings

    @property
    def seed(self) -> int:
        return self.request.seed

    @property
    def n(self) -> int:
        return self.request.num_samples

    @property
    def max_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def stride(self) -> int | None:
        return self.request.stride

    @property
    def stop(self) -> list[str]:
        return list(self.request.stop)

    @property
    def echo(self) -> bool:
        return self.request.echo

    @property
    def end_ids(self) -> tuple[int, ...]:
        return self.request.end_ids

    @property
    def num_rows(self) -> int:
        return self.n * len(self.rows)

    @property
    def alone(self) -> bool:
        """Whether it runs by itself on the model: a block cache's calls do not batch (a bd3lm
        model's key/value cache of its finished blocks, or a sampler's `cache`)."""
        return bool(self.block_size) or self.settings.options.get("cache", "none") != "none"

    # what the response's record reads (app.py)
    @property
    def sampler(self) -> SamplerSpec:
        return get_sampler(self.settings.sampler)

    @property
    def steps(self) -> int | None:
        return self.settings.steps

    @property
    def precision(self) -> str:
        return self.settings.precision

    @property
    def options(self) -> dict:
        return dict(self.settings.options)


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def make_plan(common: dict, rows: list[Row], *, constraint: Any = None, **asked: Any) -> Plan:
    """The plan of `common_fields` and the rows laid out, its request given the fields the
    endpoint asks (`max_new_tokens` resolved by the row rule, `stop`, ...) and validated
    once (`GenerationRequest.validate`; a broken rule is a 400 naming its field)."""
    try:
        request = common["request"].with_(**asked).validate()
    except RequestError as e:
        raise invalid(str(e), e.param) from None
    except MdlmError as e:
        raise invalid(str(e)) from None
    return Plan(**{**common, "request": request}, rows=rows, constraint=constraint)


def check_states(plan: Plan) -> Plan:
    if plan.states and not plan.stream:
        raise invalid("stream_states needs stream: true", "stream_states")
    if plan.states and plan.num_rows != 1:
        raise invalid(
            "stream_states follows one sequence: give one prompt and n = 1", "stream_states"
        )
    if plan.states and plan.block_size:
        raise invalid("stream_states is not offered for a bd3lm model: its stream is its "
                      "finished blocks", "stream_states")
    if plan.states and plan.settings.options.get("cache", "none") != "none":
        raise invalid("stream_states needs cache none: a cached call sees its block only",
                      "stream_states")
    return plan
