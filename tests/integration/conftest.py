"""Helpers for the CLI tests: a small corpus (so a final validation takes a moment), the
real commands through typer's runner, and what "one line, exit 1" means."""

import pytest
from typer.testing import CliRunner

from mdlm_cli.cli import app

runner = CliRunner()


def invoke(*args, code=0, input=None) -> str:
    result = runner.invoke(app, [str(a) for a in args], input=input)
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


def one_line_error(*args, input=None) -> str:
    """Run a command that must fail: exit code 1, no traceback, exactly one error line."""
    result = runner.invoke(app, [str(a) for a in args], input=input)
    out = result.output
    assert result.exit_code == 1, (args, out, repr(result.exception))
    assert "Traceback" not in out, (args, out)
    errors = [line.strip() for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and out.rstrip().endswith(errors[0]), (args, out)
    return errors[0]


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """~350 rows of L=32 characters from the embedded corpus (13 validation rows)."""
    from mdlm_cli.data.sources import get_source

    text = " ".join(get_source("bigtxt").all_documents()[:3])
    corpus = tmp_path_factory.mktemp("corpus") / "small.txt"
    corpus.write_text("\n\n".join(text[i * 600:(i + 1) * 600] for i in range(60)))
    return corpus


@pytest.fixture(scope="session")
def train_args(small_corpus):
    """`mdlm train` of the test preset on the small corpus, checkpoints every 2 steps."""
    return ["train", "--preset", "test", "--no-print-config", "--set", f"data.dataset={small_corpus}",
            "--set", "train.save_every=2", "--set", "train.eval_every=100", "--set", "train.log_every=1"]


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    """(AR run, MDLM run): 6 steps each of the test preset, shared by every test that only reads
    a trained checkpoint (eval, lm-eval, serve); a test that writes into a run copies it."""
    root = tmp_path_factory.mktemp("trained")
    base = ["train", "--preset", "test", "--no-print-config", "--max-steps", "6",
            "--set", "train.eval_rows=16"]
    invoke(*base, "--out", root / "ar", "--set", "diffusion.objective=ar")
    invoke(*base, "--out", root / "mdlm")
    return root / "ar", root / "mdlm"
