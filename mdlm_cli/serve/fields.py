"""The fields of `mdlm serve`'s request bodies, read and checked: the readers of a typed
field (a 400 naming it when it is wrong), the model field, the sampling settings (the CLI's
rules) and the fields every generating endpoint shares."""

from __future__ import annotations

import secrets

from ..engine.sampling import get_sampler, option_names
from ..engine.settings import SamplingSettings, SettingsError
from ..generation.request import GenerationRequest
from .schema import NEUTRAL, ApiError, Limits, invalid
from .served import Served


def check_fields(body: dict, allowed: tuple[str, ...]) -> None:
    for name, value in body.items():
        if name in NEUTRAL and name not in allowed:
            if isinstance(value, bool) or value not in NEUTRAL[name]:  # 0 and 0.0 both neutral
                raise invalid(
                    f"{name} is not supported by mdlm serve", name, "unsupported_parameter"
                )
        elif name not in allowed:
            raise invalid(
                f"unknown field {name!r}; the fields are: {', '.join(allowed)}",
                name,
                "unknown_parameter",
            )


def get_value(body: dict, name: str, kinds: tuple, default, what: str):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise invalid(f"{name} must be {what}", name)
    return value


def get_int(body: dict, name: str, lo: int, hi: int, default: int | None) -> int | None:
    value = get_value(body, name, (int,), default, "an integer")
    if value is not None and not lo <= value <= hi:
        raise invalid(f"{name} must be between {lo} and {hi} (got {value})", name)
    return value


def _choice(body: dict, name: str, choices, default: str | None) -> str | None:
    value = get_value(body, name, (str,), default, "a string")
    if value is not None and value not in choices:
        raise invalid(f"{name} must be one of: {', '.join(choices)} (got {value!r})", name)
    return value


def get_bool(body: dict, name: str, default: bool = False) -> bool:
    return get_value(body, name, (bool,), default, "true or false")


def check_model(body: dict, served: Served) -> None:
    model = body.get("model")
    if model is not None and model != served.name:
        raise ApiError(
            404,
            f"model {model!r} is not served here; this server serves {served.name!r}",
            param="model",
            code="model_not_found",
        )


def sampler_settings(body: dict, served: Served, limits: Limits) -> SamplingSettings:
    """The request's sampling settings, checked (`SamplingSettings.validate`, the CLI's rules):
    the sampler from `Objective.choose_sampler` and the rules of `mdlm sample`'s flags (steps
    alone pick the model's step-based sampler), except that a setting the sampler does not read
    is an error here, not a warning."""
    objective = served.loaded.objective
    if not objective.samplers:
        raise invalid(f"{objective.name} models have no sampler", "sampler")
    name = _choice(body, "sampler", [s.name for s in objective.samplers], None)
    steps = get_int(body, "steps", 1, limits.max_steps, None)
    options = {key: body[key] for key in option_names() if body.get(key) is not None}
    choice = objective.choose_sampler(name, steps, options)
    for key in choice.ignored:
        raise invalid(f"{key} does not apply to the {choice.spec.name} sampler", key)
    spec = choice.spec
    if spec.needs_time_agnostic and not served.time_agnostic:
        spec = get_sampler(spec.fallback)  # what the engine would run; the response names it
    settings = SamplingSettings(
        spec.name,
        choice.steps,
        get_value(body, "precision", (str,), "fp64", "a string"),
        float(get_value(body, "temperature", (int, float), 1.0, "a number")),
        float(get_value(body, "top_p", (int, float), 1.0, "a number")),
        options,
        top_k=_top_k(body),
        cfg_scale=float(get_value(body, "cfg_scale", (int, float), 0.0, "a number")),
    )
    try:  # the model family's own option defaults for the options not given
        return settings.validate().with_defaults(served.loaded.sampling_defaults).validate()
    except SettingsError as e:
        raise invalid(str(e), e.name) from None


def _top_k(body: dict) -> int | None:
    """`top_k`: None (absent: the model's own default), else k >= 0; vLLM's -1 means off (0)."""
    value = get_int(body, "top_k", -1, 2**31 - 1, None)
    return 0 if value == -1 else value


def common_fields(body: dict, served: Served, limits: Limits, endpoint: str) -> dict:
    """The fields both endpoints share, checked."""
    settings = sampler_settings(body, served, limits)
    stream = get_bool(body, "stream")
    stream_options = get_value(body, "stream_options", (dict,), {}, "an object")
    if stream_options and not stream:
        raise invalid("stream_options needs stream: true", "stream_options")
    if set(stream_options) - {"include_usage"}:
        raise invalid("stream_options takes only include_usage", "stream_options")
    seed = get_int(body, "seed", 0, 2**63 - 1, None)
    request = GenerationRequest(settings, num_samples=get_int(body, "n", 1, limits.max_n, 1),
                                seed=secrets.randbits(63) if seed is None else seed)
    return dict(
        endpoint=endpoint,
        request=request,
        stream=stream,
        states=get_bool(body, "stream_states"),
        include_usage=get_bool(stream_options, "include_usage"),
        block_size=served.block_size,
    )
