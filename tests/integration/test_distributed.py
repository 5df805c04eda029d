"""torchrun on CPU (gloo, 2 processes) against one process: same global batch, same seed.

One single-process reference run of 12 steps (checkpoints at 6 and 12) is compared with
2-process DDP and FSDP2 runs, with a 2-process checkpoint resumed on one process, and
with a run stopped by SIGTERM. A tiny local corpus keeps the final validations short.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as tdist
from safetensors.torch import load_file
from typer.testing import CliRunner

from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.cli import app

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not tdist.is_available() or not tdist.is_gloo_available(),
                       reason="this torch build has no torch.distributed / gloo"),
]

ROOT = Path(__file__).resolve().parents[2]
MASK_ID = 11  # of the evaluation problem below
runner = CliRunner()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """CLI arguments of the test preset (with dropout) on a ~350-row corpus (13 validation rows)."""
    from mdlm_cli.data.sources import get_source

    text = " ".join(get_source("bigtxt").all_documents()[:3])
    corpus = tmp_path_factory.mktemp("corpus") / "small.txt"
    corpus.write_text("\n\n".join(text[i * 600:(i + 1) * 600] for i in range(60)))
    return ["train", "--preset", "test", "--no-print-config", "--set", f"data.dataset={corpus}",
            "--set", "model.dropout=0.1", "--set", "train.log_every=1", "--set", "train.save_every=6",
            "--set", "train.eval_every=100"]


@pytest.fixture(scope="module")
def reference(base, tmp_path_factory):
    """One process, 12 steps, checkpoints at steps 6 and 12."""
    out = tmp_path_factory.mktemp("runs") / "one"
    run_cli(*base, "--out", str(out), "--max-steps", "12")
    return out


@pytest.fixture(scope="module")
def two_ranks(base, tmp_path_factory):
    """2-process DDP, 6 steps."""
    out = tmp_path_factory.mktemp("runs") / "two"
    return out, torchrun(*base, "--out", str(out), "--max-steps", "6")


def run_cli(*args):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def torchrun_cmd(*args, nproc=2):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "mdlm_cli", *args]


def env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


def torchrun(*args):
    """Output of both ranks and torchrun, with rich's line wrapping undone."""
    proc = subprocess.run(torchrun_cmd(*args), env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return " ".join((proc.stdout + proc.stderr).split())


def step_dir(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:08d}"


def assert_same_weights(a: Path, b: Path):
    for name in ("model.safetensors", "ema.safetensors"):
        wa, wb = load_file(a / name), load_file(b / name)
        assert wa.keys() == wb.keys()
        for key in wa:
            torch.testing.assert_close(wa[key], wb[key], rtol=1e-5, atol=1e-6, msg=f"{name}:{key}")


def losses(run: Path):
    return {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r}


def state(ckpt: Path):
    return json.loads((ckpt / "state.json").read_text())


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one_process(parallel, base, reference, two_ranks, tmp_path):
    if parallel == "ddp":
        out, log = two_ranks
    else:
        out = tmp_path / parallel
        log = torchrun(*base, "--out", str(out), "--max-steps", "6", "--set", f"train.parallel={parallel}")
    assert f"2 ranks ({'FSDP2' if parallel == 'fsdp' else 'DDP'}, gloo)" in log
    assert log.count("Done:") == 1  # output on rank 0 only
    assert_same_weights(step_dir(out, 6), step_dir(reference, 6))
    ref = losses(reference)
    assert losses(out) == pytest.approx({s: ref[s] for s in range(1, 7)}, rel=1e-6)
    assert state(step_dir(out, 6))["samples_seen"] == state(step_dir(reference, 6))["samples_seen"] == 96
    # the consolidated checkpoint is an ordinary one: single-process sampling loads it
    sample = run_cli("sample", "--checkpoint", str(out), "-n", "2", "--quiet")
    assert "NFE" in sample


def test_two_process_checkpoint_resumes_on_one_process(base, reference, two_ranks, tmp_path):
    out = tmp_path / "two-then-one"
    shutil.copytree(two_ranks[0], out)
    log = run_cli(*base, "--out", str(out), "--max-steps", "12", "--resume")
    assert "Resumed from" in log and "step-00000006" in log
    assert state(step_dir(out, 12))["samples_seen"] == 12 * 16
    ref = losses(reference)
    assert losses(out) == pytest.approx(ref, rel=1e-6)  # steps 7-12 saw the same data and draws
    assert_same_weights(step_dir(out, 12), step_dir(reference, 12))


def test_sigterm_saves_a_loadable_checkpoint_and_exits(base, tmp_path):
    out = tmp_path / "preempted"
    args = [*base, "--out", str(out), "--max-steps", "100000", "--set", "train.save_every=100000"]
    proc = subprocess.Popen(torchrun_cmd(*args), env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "metrics.jsonl").is_file() or len((out / "metrics.jsonl").read_text().splitlines()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # what SLURM and torchrun's shutdown send
        log, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "Stopped by SIGTERM" in log and "Traceback (most recent call last)" not in log.split("Stopped by")[0]
    ckpt = out / "checkpoints" / (out / "latest").read_text().strip()
    step = state(ckpt)["step"]
    assert 2 <= step < 100000 and state(ckpt)["samples_seen"] == 16 * step
    loaded = load_checkpoint(out)  # single process, no distributed setup
    assert loaded.state["step"] == step and (ckpt / "optimizer.pt").is_file()
    resumed = run_cli(*base, "--out", str(out), "--max-steps", str(step + 1), "--resume")
    assert f"at step {step}" in resumed


def test_sigterm_on_one_process(base, tmp_path):
    out = tmp_path / "one-preempted"
    cmd = [sys.executable, "-m", "mdlm_cli", *base, "--out", str(out), "--max-steps", "100000",
           "--set", "train.save_every=100000"]
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        log, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, log
    assert "Stopped by SIGTERM" in log
    assert load_checkpoint(out).state["step"] >= 1


# ------------------------------------------------------------------ evaluation under torch.distributed

def _bound_worker(rank: int, world: int, store: str, out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    from mdlm_cli.engine.schedules import get_schedule
    from mdlm_cli.models import DiffusionDenoiser

    from ..nelbo_passes import nelbo_pass

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results = []
        for parallel in ("replicated", "fsdp"):
            model, split = _bound_problem()
            if parallel == "fsdp":  # forward passes gather shards: every rank must call the model equally often
                for block in model.blocks:
                    fully_shard(block)
                fully_shard(model)
            result = nelbo_pass(DiffusionDenoiser(model, get_schedule("loglinear")), split,
                                 schedule=get_schedule("loglinear"), mask_id=MASK_ID, batch_size=4,
                                 device=torch.device("cpu"), seed=7, rank=rank, world_size=world)
            results.append([result.nats, result.tokens, result.sequences])
        Path(f"{out}.{rank}").write_text(json.dumps(results))
    finally:
        tdist.destroy_process_group()


def _objective_worker(rank: int, world: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        Path(f"{out}.{rank}").write_text(json.dumps(_evaluate_every_objective(rank, world)))
    finally:
        tdist.destroy_process_group()


def _evaluate_every_objective(rank: int = 0, world: int = 1) -> dict:
    """Each objective's evaluation of the bound problem's rows (its own model: causal or not)."""
    from types import SimpleNamespace

    from mdlm_cli.build import resolve_config
    from mdlm_cli.objectives import OBJECTIVES, SplitSweep, get_objective

    from ..objective_configs import overrides as objective_overrides

    out = {}
    for name in OBJECTIVES:
        objective = get_objective(resolve_config("test", objective_overrides(name)),
                                  SimpleNamespace(mask_id=MASK_ID, bos_id=0))
        model, split = _bound_problem(causal=objective.causal)
        sweep = SplitSweep(4, torch.device("cpu"), rank=rank, world_size=world, per_sequence=True)
        result = objective.evaluate(objective.denoiser(model), split, sweep, seeds=[7])[0]
        out[name] = [result.nats, result.tokens, result.sequences, result.per_sequence.tolist()]
    return out


def test_every_objective_evaluates_rank_sharded(tmp_path):
    """Every objective's evaluation (a bound, or the exact AR likelihood) splits its batches over
    the ranks and all-reduces them to the one-process value, the per-row values included."""
    one = _evaluate_every_objective()
    torch.multiprocessing.spawn(_objective_worker, args=(2, str(tmp_path / "store"), str(tmp_path / "r")), nprocs=2)
    for rank in range(2):
        got = json.loads((tmp_path / f"r.{rank}").read_text())
        assert set(got) == set(one)
        for name, (nats, tokens, sequences, each) in got.items():
            assert (tokens, sequences) == tuple(one[name][1:3]), name
            assert nats == pytest.approx(one[name][0], rel=1e-6), name
            # every row's value reaches every rank (all-gathered), each computed once
            assert each == pytest.approx(one[name][3], rel=1e-6) and sum(each) == pytest.approx(nats, rel=1e-6), name


def _bound_problem(causal: bool = False):
    from mdlm_cli.config import ModelConfig
    from mdlm_cli.data.store import TokenSplit
    from mdlm_cli.models import DiT

    torch.manual_seed(0)
    model = DiT(ModelConfig(hidden_size=32, n_blocks=2, n_heads=2, cond_dim=16, dropout=0.0), 12, causal=causal).eval()
    for p in model.output_layer.parameters():  # non-zero logits so that the bound depends on the model
        torch.nn.init.normal_(p, std=0.5)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 11, size=(19, 16)).astype(np.uint16)  # 5 batches of 4: ranks get 3 and 2
    lengths = rng.integers(8, 17, size=19).astype(np.int32)  # some padding
    return model, TokenSplit(tokens, lengths)



def test_the_nelbo_reduces_across_ranks(tmp_path):
    """Replicated weights (DDP's evaluation) and FSDP2-sharded weights, 5 batches over 2 ranks."""
    from mdlm_cli.engine.schedules import get_schedule
    from mdlm_cli.models import DiffusionDenoiser

    from ..nelbo_passes import nelbo_pass

    model, split = _bound_problem()
    one = nelbo_pass(DiffusionDenoiser(model, get_schedule("loglinear")), split, schedule=get_schedule("loglinear"),
                      mask_id=MASK_ID, batch_size=4, device=torch.device("cpu"), seed=7)
    torch.multiprocessing.spawn(_bound_worker, args=(2, str(tmp_path / "store"), str(tmp_path / "r")), nprocs=2)
    for rank in range(2):
        for nats, tokens, sequences in json.loads((tmp_path / f"r.{rank}").read_text()):
            assert (tokens, sequences) == (one.tokens, one.sequences) == (int(split.lengths.sum()), 19)
            assert nats == pytest.approx(one.nats, rel=1e-6)  # every rank holds the whole set's bound


# ------------------------------------------------------------------ GPUs (skipped without 2 CUDA devices)

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_gpus_nccl_bf16(parallel, base, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    gpu = [*base, "--device", "cuda", "--max-steps", "6"]
    run_cli(*gpu, "--out", str(one))
    log = torchrun(*gpu, "--out", str(two), "--set", f"train.parallel={parallel}")
    assert f"2 ranks ({'FSDP2' if parallel == 'fsdp' else 'DDP'}, nccl)" in log and "bf16" in log
    # bf16 compute: the same data and draws, different rounding
    assert losses(two) == pytest.approx(losses(one), rel=2e-2)
    assert load_checkpoint(two).state["samples_seen"] == 96
