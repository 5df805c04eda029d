"""Issue 33: sizes that cannot fit are refused, in one line and in well under a second, before
anything large is allocated; lengths past the trained one only with --allow-longer."""

import time

import pytest
import torch
from typer.testing import CliRunner

from mdlm_cli.build import resolve_config
from mdlm_cli.cli import app
from mdlm_cli.errors import MdlmError
from mdlm_cli.memory import available, footprint
from mdlm_cli.train.memory_check import check_train_memory


def test_the_machine_reports_its_memory():
    free, source = available(torch.device("cpu"))
    assert free is not None and free > 0 and source


def test_the_estimate_grows_with_length_batch_and_vocabulary():
    base = dict(params=10_000, hidden=64, n_blocks=2, mlp_ratio=4, vocab=35, batch=8, length=32)
    small = footprint(**base)
    assert footprint(**{**base, "length": 64}).activations == 2 * small.activations
    assert footprint(**{**base, "batch": 16}).logits == 2 * small.logits
    trained = footprint(**base, training=True)
    assert trained.optimizer == 4 * trained.weights and trained.total > small.total


@pytest.mark.parametrize("length", [10**8, 10**9])
def test_training_at_a_length_that_cannot_fit_is_refused_at_once(length):
    check_train_memory(resolve_config("test"))  # the imports, once: not what is timed
    cfg = resolve_config("test", [f"data.length={length}"])
    t0 = time.perf_counter()
    with pytest.raises(
        MdlmError,
        match=r"^training at data.length=\d+ with train.micro_batch_size=8 needs about "
        r"[\d.]+ [GT]B of memory \(activations .*\); this machine has [\d.]+ [KMGT]B "
        r"available RAM",
    ):
        check_train_memory(cfg)
    assert time.perf_counter() - t0 < 1.0


def test_the_test_preset_is_not_refused():
    check_train_memory(resolve_config("test"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory") / "run"
    result = CliRunner().invoke(
        app,
        ["train", "--preset", "test", "--out", str(out), "--max-steps", "1", "--no-print-config"],
    )
    assert result.exit_code == 0, result.output
    return str(out)


def test_a_length_past_the_trained_one_needs_allow_longer(checkpoint):
    result = CliRunner().invoke(app, ["sample", "-c", checkpoint, "-n", "1", "--length", "999999"])
    assert result.exit_code == 1
    assert (
        "--length 999999 is beyond the 32 tokens the model was trained at; add --allow-longer"
        in result.output
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["sample", "-n", "1", "--length", "1000000000", "--allow-longer"],
        ["eval-ppl", "--batch-size", "100000000"],
        [
            "bench-sampler",
            "--length",
            "1000000000",
            "--allow-longer",
            "-n",
            "1",
            "--batch-size",
            "1",
        ],
    ],
)
def test_a_forward_pass_that_cannot_fit_is_refused_in_one_line(checkpoint, argv):
    t0 = time.perf_counter()
    result = CliRunner().invoke(app, [argv[0], "-c", checkpoint, *argv[1:]])
    assert (
        time.perf_counter() - t0 < 10
    )  # the checkpoint's loading included; nothing large is allocated
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "needs about" in lines[0] and "this machine has" in lines[0], (
        result.output
    )
