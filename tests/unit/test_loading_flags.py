"""The model-loading flag group: every command that runs a model has it (or --threads of its
own), and the flags arrive in the command as one ModelLoading."""

import pytest
import typer
from typer.testing import CliRunner

from mdlm_cli.cli import app
from mdlm_cli.commands.app import command_flags
from mdlm_cli.commands.loading import LoadingCommand, ModelLoading
from mdlm_cli.errors import MdlmError

LOADING = {"checkpoint", "device", "raw-weights", "threads"}
# the commands that run a model without the group: glue loads an encoder (or a Hub masked LM)
# itself, export only to verify its output, train builds one
RUN_A_MODEL = {"glue", "export", "train"}


def _commands() -> dict:
    return typer.main.get_command(app).commands


def test_the_commands_that_load_a_checkpoint_have_the_group():
    grouped = {name for name, c in _commands().items() if isinstance(c, LoadingCommand)}
    assert grouped == {"sample", "semi-ar", "gen-ppl", "eval-ppl", "lm-eval", "classify",
                       "serve", "bench-sampler", "rl"}
    for name in grouped:
        flags = command_flags(name)
        assert LOADING <= flags, name
        # where --precision is the draw's, the network's is --net-precision
        assert ("net-precision" if "sampler" in flags or "samplers" in flags
                else "precision") in flags, name
    for name in RUN_A_MODEL:
        assert "threads" in command_flags(name), name


@pytest.mark.parametrize("command, precision", [
    (["sample"], "--net-precision"), (["eval-ppl"], "--precision"),
    (["serve"], "--precision"), (["lm-eval", "--tasks", "x"], "--net-precision"),
])
def test_the_flags_arrive_as_one_model_loading(monkeypatch, command, precision):
    seen = []

    def load(self, device=None):
        seen.append(self)
        raise MdlmError("stop here")

    monkeypatch.setattr(ModelLoading, "load", load)
    monkeypatch.setattr("mdlm_cli.serve.launch.serve_checkpoint",
                        lambda checkpoint, options, **_: load(ModelLoading(
                            checkpoint, options.device, options.raw_weights, options.threads,
                            options.precision)))
    monkeypatch.setattr("mdlm_cli.eval.lm_eval.run.require_lm_eval", lambda: None)
    args = [*command, "-c", "nowhere", "--device", "cpu", "--raw-weights", "--threads", "1",
            precision, "fp32"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "stop here" in result.output, result.output
    assert seen == [ModelLoading("nowhere", "cpu", True, 1, "fp32")]


def test_a_bad_network_precision_is_refused_when_parsed():
    result = CliRunner().invoke(app, ["sample", "--net-precision", "fp16"])
    assert result.exit_code == 2 and "must be auto, bf16 or fp32" in result.output
