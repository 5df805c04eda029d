"""Issue 33: every float of the config and every float flag is finite and in range, refused in
one line naming the key; the two messages that named the wrong problem."""

import dataclasses
import typing

import pytest
from typer.testing import CliRunner

from mdlm_cli.build import resolve_config
from mdlm_cli.cli import app
from mdlm_cli.config import SECTIONS
from mdlm_cli.errors import MdlmError


def float_keys() -> list[str]:
    """Every float of the config (tuples of floats included), from the dataclasses."""
    keys = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            hint = typing.get_type_hints(cls)[f.name]
            if hint is float or float in typing.get_args(hint):
                keys.append(f"{section}.{f.name}")
    return keys


def float_flags() -> list[tuple[str, str]]:
    """(command, --flag) for every float option of every command, as Typer built them (the
    sampling flags included)."""
    import typer

    out = []
    for name, command in typer.main.get_command(app).commands.items():
        for param in command.params:
            kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            if kind is float:
                out.append((name, max(param.opts, key=len)))
    return out


def test_the_lists_hold_what_the_issue_names():
    assert {"optim.lr", "diffusion.eps", "optim.betas", "train.ema"} <= set(float_keys())
    assert {("sample", "--temperature"), ("sample", "--top-p"), ("train", "--time-limit")} <= set(
        float_flags()
    )


@pytest.mark.parametrize("value", ["nan", ".nan", "inf", "-.inf"])
@pytest.mark.parametrize("key", float_keys())
def test_a_non_finite_config_float_is_refused_naming_its_key(key, value):
    tuples = {"optim.betas": f"[{value}, 0.9]", "diffusion.clip_search_widths": f"[{value}]"}
    assignment = f"{key}={tuples.get(key, value)}"
    with pytest.raises(
        MdlmError, match=rf"^{key} must be a finite number.* \(got -?(nan|inf)\)$"
    ):
        resolve_config("test", [assignment])


@pytest.mark.parametrize(
    ("key", "value"),
    [("diffusion.eps", "1.5"), ("diffusion.eps", "-1e-3"), ("model.norm_epsilon", "0")],
)
def test_a_config_float_out_of_its_range_is_refused(key, value):
    with pytest.raises(MdlmError, match=rf"^{key} must be a finite number (in|above) "):
        resolve_config(
            None,
            [f"{key}={value}", "model.backbone=caduceus"] if "norm" in key else [f"{key}={value}"],
        )


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize(("command", "flag"), float_flags())
def test_a_non_finite_float_flag_is_refused_in_one_line(command, flag, value):
    # the required options, checked first
    required = {"lm-eval": ["--tasks", "t"], "rl": ["--data", "d", "--out", "o"]}.get(command, [])
    result = CliRunner().invoke(app, [command, *required, f"{flag}={value}"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag} must be a finite number"), (
        result.output
    )


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--temperature", "-0.5"), ("--temperature", "-1"), ("--top-p", "0"), ("--top-p", "1.5")],
)
def test_a_float_flag_out_of_its_range_is_refused(flag, value):
    result = CliRunner().invoke(app, ["sample", flag, value])
    assert result.exit_code == 1 and result.output.startswith(
        f"error: {flag} must be a finite number"
    )


def test_a_jsonl_given_as_checkpoint_is_called_what_it_is(tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"index": 0, "text": "hello", "tokens": [1, 2]}\n')
    result = CliRunner().invoke(app, ["sample", "-c", str(samples), "-n", "1"])
    assert result.exit_code == 1
    assert "is not a PyTorch checkpoint" in result.output and "JSON-lines" in result.output
    assert "pickle" not in result.output


@pytest.mark.parametrize("judge", ["/nonexistent", "./no-such-folder", "../x/y"])
def test_a_missing_judge_folder_is_not_explained_with_the_hubs_rules(tmp_path, judge):
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"index": 0, "text": "hello there", "tokens": [1, 2]}\n')
    result = CliRunner().invoke(app, ["gen-ppl", "--samples", str(samples), "--judge", judge])
    assert result.exit_code == 1
    assert f"judge {judge}: no such folder, and not a Hugging Face hub id" in " ".join(
        result.output.split()
    )
    assert "repo_name" not in result.output and "Repo id" not in result.output
