"""Sampler options as data: each spec's options dataclass, the one check, and the CLI flags
generated from them."""

import dataclasses

import pytest
import torch
from typer.testing import CliRunner

from mdlm_cli import engine
from mdlm_cli.cli import app
from mdlm_cli.commands.sampling_args import sampling_from
from mdlm_cli.commands.sampling_parse import option_flags, parse_sampling, parse_sweep
from mdlm_cli.engine.ancestral import AncestralOptions
from mdlm_cli.engine.first_hitting import FirstHittingOptions
from mdlm_cli.engine.options import OPTION_TYPES, option, problem
from mdlm_cli.errors import MdlmError

from ..analytic import AnalyticDenoiser

WITH_OPTIONS = [name for name, spec in engine.SAMPLERS.items() if spec.options is not None]


@pytest.fixture(scope="module")
def den():
    return AnalyticDenoiser.random(length=4, vocab=3, seed=1)


def draw(den, sampler, **kw):
    return engine.sample(
        den,
        sampler=sampler,
        num_samples=8,
        length=den.length,
        mask_id=den.mask_id,
        generator=torch.Generator().manual_seed(0),
        **kw,
    )


@pytest.mark.parametrize("sampler", WITH_OPTIONS)
def test_each_option_is_declared_with_help_and_a_valid_default(sampler):
    cls = engine.SAMPLERS[sampler].options
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    for f in dataclasses.fields(cls):
        assert f.metadata["help"].strip(), f.name
        assert type(f.default) in OPTION_TYPES, f.name
        assert problem(f, f.default) is None, f.name  # the default passes its own check


def test_an_option_shared_by_samplers_is_the_same_option():
    seen = {}
    for spec in engine.SAMPLERS.values():
        for f in dataclasses.fields(spec.options) if spec.options else ():
            first = seen.setdefault(f.name, f)
            assert (first.default, dict(first.metadata)) == (f.default, dict(f.metadata)), (
                f.name,
                spec.name,
            )
    assert set(seen) == set(engine.option_names()) == set(option_flags())


def test_an_instance_and_keywords_draw_the_same(den):
    by_keyword, s_keyword = draw(den, "first-hitting", tokens_per_step=2, return_stats=True)
    by_instance, s_instance = draw(
        den, "first-hitting", options=FirstHittingOptions(tokens_per_step=2), return_stats=True
    )
    assert (
        torch.equal(by_keyword, by_instance) and s_keyword.nfe == s_instance.nfe == den.length / 2
    )
    # keywords replace the instance's fields; another sampler's option is not read (as before)
    again, s_again = draw(
        den,
        "first-hitting",
        options=FirstHittingOptions(),
        tokens_per_step=2,
        eta=0.5,
        return_stats=True,
    )
    assert torch.equal(again, by_keyword) and s_again.nfe == den.length / 2
    assert draw(den, "first-hitting", return_stats=True)[1].nfe == den.length  # the default: exact


@pytest.mark.parametrize(
    "sampler, kw, message",
    [
        (
            "first-hitting",
            {"etta": 0.1},
            "unknown sampler option 'etta'; the options are: block_length, cache, eta, final_denoise",
        ),
        ("threshold", {"threshold": 1.5}, r"threshold must be in \[0, 1\] \(got 1.5\)"),
        ("remdm", {"steps": 3, "eta": float("nan")}, r"eta must be a finite number in \[0, 1\] \(got nan\)"),
        (
            "remdm",
            {"steps": 3, "remdm_schedule": "loop"},
            "remdm_schedule must be one of: cap, rescale",
        ),
        ("remdm", {"steps": 3, "eta": -0.1}, r"eta must be in \[0, 1\]"),
        (
            "confidence",
            {"steps": 3, "k_schedule": "square"},
            "k_schedule must be one of: linear, cosine",
        ),
        ("first-hitting", {"tokens_per_step": 0}, "tokens_per_step must be at least 1"),
        (
            "first-hitting",
            {"tokens_per_step": 1.5},
            r"tokens_per_step must be an integer \(got 1.5\)",
        ),
        (
            "first-hitting",
            {"options": AncestralOptions()},
            "first-hitting takes options=FirstHittingOptions",
        ),
    ],
)
def test_bad_options_are_engine_errors_naming_the_option(den, sampler, kw, message):
    with pytest.raises(engine.EngineError, match=message):
        draw(den, sampler, **kw)


def test_the_fallback_keeps_the_options(den):
    """ancestral-cache falls back to ancestral for a time-dependent denoiser, options and all."""
    with pytest.warns(UserWarning, match="falling back"):
        def undeclared(z, t):  # declares nothing: it may depend on t
            return den(z, t)

        undeclared.length, undeclared.mask_id = den.length, den.mask_id
        cached = draw(undeclared, "ancestral-cache", steps=3, final_denoise=False)
    assert torch.equal(cached, draw(den, "ancestral", steps=3, final_denoise=False))


def values(**given):
    base = {
        "sampler": None,
        "steps": None,
        "precision": "fp64",
        "temperature": 1.0,
        "top_p": 1.0,
        "opt": None,
    }
    return base | {name: None for name in option_flags()} | given


def test_flags_and_opt_give_the_same_options():
    by_flag = parse_sampling(values(eta=0.1, final_denoise=False, k_schedule="cosine"))
    by_opt = parse_sampling(values(opt=["eta=0.1", "final-denoise=off", "k_schedule=cosine"]))
    assert (
        by_flag.options
        == by_opt.options
        == {"eta": 0.1, "final_denoise": False, "k_schedule": "cosine"}
    )
    remdm = engine.get_sampler("remdm")
    assert by_flag.read_by(remdm) == {
        "eta": 0.1,
        "final_denoise": False,
    }  # k_schedule: confidence's
    assert parse_sampling(values()).options == {}  # nothing given, nothing passed on


@pytest.mark.parametrize(
    "given, message",
    [
        ({"opt": ["eta"]}, "--opt expects name=value"),
        ({"opt": ["etta=1"]}, "unknown sampler option 'etta'"),
        (
            {"opt": ["tokens-per-step=two"]},
            "--tokens-per-step expects an integer, at least 1 (got 'two')",
        ),
        ({"opt": ["final_denoise=maybe"]}, "--final-denoise expects true or false (got 'maybe')"),
        ({"opt": ["eta=0.1"], "eta": 0.2}, "--eta is given twice"),
        ({"threshold": 2.0}, r"--threshold must be in [0, 1]"),
        ({"remdm_schedule": "loop"}, "--remdm-schedule must be one of: cap, rescale (got 'loop')"),
        ({"tokens_per_step": 0}, "--tokens-per-step must be at least 1"),
        ({"steps": 0}, "--steps must be at least 1"),
        ({"precision": "fp16"}, "--precision must be one of: fp64, fp32"),
        ({"top_p": 0.0}, "--top-p must be a finite number in (0, 1]"),
    ],
)
def test_flag_mistakes_name_the_flag(given, message):
    with pytest.raises(MdlmError) as caught:
        parse_sampling(values(**given))
    assert message in str(caught.value)


def test_sweep_lists():
    sweep = parse_sweep(
        values(
            samplers="first-hitting,remdm",
            steps="5,10",
            precision="fp64,fp32",
            tokens_per_step="1,4",
            final_denoise=False,
            opt=["eta=0,0.1"],
        )
    )
    assert sweep.samplers == ["first-hitting", "remdm"] and sweep.steps == [5, 10]
    assert sweep.precisions == ["fp64", "fp32"]
    assert sweep.options == {"tokens_per_step": [1, 4], "final_denoise": [False], "eta": [0.0, 0.1]}
    with pytest.raises(MdlmError, match="--threshold needs at least one value"):
        parse_sweep(values(samplers=None, steps=None, threshold=","))


@pytest.mark.parametrize("command", ["sample", "semi-ar", "gen-ppl", "bench-sampler", "lm-eval"])
def test_every_sampling_command_has_a_flag_per_option(command):
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    flags = {f"--{name.replace('_', '-')}" for name in option_flags()} | {
        "--opt",
        "--temperature",
        "--top-p",
    }
    missing = [flag for flag in flags if flag not in result.output]
    assert not missing, (command, missing)


def test_a_bad_option_fails_before_anything_is_loaded(tmp_path):
    result = CliRunner().invoke(app, ["sample", "-c", str(tmp_path / "none"), "--threshold", "2"])
    assert result.exit_code == 1 and "--threshold must be in [0, 1]" in result.output
    result = CliRunner().invoke(
        app, ["gen-ppl", "--samples", str(tmp_path / "s.jsonl"), "--eta", "0.1"]
    )
    assert result.exit_code == 1 and "--eta only apply with --sample-first" in result.output


def test_a_new_sampler_gets_its_flag_from_its_options(monkeypatch):
    """Adding a sampler with an option is data: its spec (function and options dataclass) in
    SAMPLERS; the engine checks the option, the shared arguments make its flag."""

    @dataclasses.dataclass(frozen=True)
    class GreedyOptions:
        patience: int = option(2, "calls without change before stopping.", low=1)

    def greedy(z, ctx):
        z[z == ctx.mask_id] = ctx.options.patience
        return z

    spec = engine.SamplerSpec(
        "greedy-test", greedy, help="a test sampler", exact=False, options=GreedyOptions
    )
    monkeypatch.setitem(engine.SAMPLERS, spec.name, spec)

    import typer

    from mdlm_cli.commands.sampling_args import SamplingCommand

    mini = typer.Typer()

    @mini.command(cls=SamplingCommand)
    def command(ctx: typer.Context) -> None:
        print(dict(sampling_from(ctx).options))

    result = CliRunner().invoke(mini, ["--patience", "3", "--opt", "eta=0.1"])
    assert result.exit_code == 0 and "{'patience': 3, 'eta': 0.1}" in result.output, result.output
    assert parse_sampling(values(patience=3)).read_by(spec) == {"patience": 3}
    tokens = engine.sample(
        object(), sampler="greedy-test", num_samples=1, length=3, mask_id=9, patience=1
    )
    assert tokens.tolist() == [[1, 1, 1]]
    with pytest.raises(engine.EngineError, match="patience must be at least 1"):
        engine.sample(
            object(), sampler="greedy-test", num_samples=1, length=3, mask_id=9, patience=0
        )
