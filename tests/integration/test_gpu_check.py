"""The prepared GPU check (benchmarks/gpu_check.sh) in its dry mode: every part's code on the
CPU with the test preset's model and tiny sizes, so the first GPU run does not fail on a typo;
and the driver's pieces (datasheet peaks, FLOPs per token, JUnit parsing, the time budget)."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402
from gpu_common import DRY, FULL, peak_tflops, preset_config  # noqa: E402
from gpu_parts import flops_per_token  # noqa: E402

PARTS = ["pytest", "parity", "throughput", "sampling", "ddp"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "GPU_CHECK_INSTALL": "0",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return out, done


def part(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_every_part_runs_and_prints_one_line(dry_run):
    out, done = dry_run
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("installs (")
    assert [p.name for p in gpu_check.PARTS] == ["env", *PARTS]
    for p in gpu_check.PARTS:  # "2. logits parity: ok in 9 s: max abs logit difference ..."
        assert any(line.startswith(f"{p.title}: ok in ") for line in lines), p.title
    assert lines[-1].startswith("6. summary: 5 of 5 parts ok")
    assert json.loads((out / "install.json").read_text())["yaml"] == "present"


@pytest.mark.slow
def test_part_results(dry_run):
    out, _ = dry_run
    env = part(out, "env")
    assert env["dry_run"] and env["torch"] and env["peak"] is None  # no MFU on a CPU
    tests = part(out, "pytest")
    assert tests["counts"]["failed"] == tests["counts"]["error"] == 0
    assert tests["counts"]["skipped"] == len(tests["cases"]) > 0  # no CUDA here: every test skips
    parity = {r["path"]: r for r in part(out, "parity")["rows"]}
    assert parity["sdpa fp32"]["max_abs_diff"] < 1e-4  # the same CPU path as the reference
    assert 0 < parity["sdpa bf16"]["max_abs_diff"] < 0.1
    throughput = part(out, "throughput")
    assert [r["compiled"] for r in throughput["rows"]] == [False, True]
    assert all(r["tokens_per_s"] > 0 and math.isfinite(r["loss_last"]) for r in throughput["rows"])
    assert throughput["largest_micro_batch"] == DRY.search_cap and throughput["search_capped"]
    sampling = part(out, "sampling")
    assert len(sampling["rows"]) == 3 * len(DRY.sample_batches) * 2
    for r in sampling["rows"]:
        expected = DRY.length if r["sampler"] == "first-hitting" else DRY.sample_steps
        assert r["nfe"] == expected and r["calls_per_s"] > 0
    assert {(d["rows"], d["precision"]) for d in sampling["draws"]} == {
        (n, p) for n in DRY.draw_rows for p in ("fp64", "fp32")}
    ddp = {r["parallel"]: r for r in part(out, "ddp")["rows"]}
    assert ddp["ddp"]["wrapped_as"] == "DistributedDataParallel" and ddp["ddp"]["backend"] == "gloo"
    assert ddp["fsdp"]["wrapped_as"].startswith("FSDP") and ddp["fsdp"]["steps"] == DRY.ddp_steps
    assert "model.safetensors" in ddp["ddp"]["checkpoint_files"]
    assert abs(ddp["ddp"]["loss_last"] - ddp["fsdp"]["loss_last"]) < 1e-4  # one rank: same run


@pytest.mark.slow
def test_summary_markdown(dry_run):
    out, _ = dry_run
    md = (out / "summary.md").read_text()
    assert md.startswith("## GPU check (dry run, CPU)")
    for heading in ("### 1. pytest tests/gpu", "### 2. Logits", "### 3. Training throughput",
                    "### 4. Sampling", "### 5. torchrun"):
        assert heading in md
    assert "| GPU | memory | driver | torch | CUDA | cuDNN |" in md
    assert "| precision | sampler | steps | batch | s/sample |" in md
    summary = json.loads((out / "summary.json").read_text())
    assert [p["part"] for p in summary["parts"]] == PARTS


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", ("H100 SXM", 989.4)), ("NVIDIA H100 PCIe", ("H100 PCIe", 756.0)),
    ("NVIDIA H200", ("H200 SXM", 989.4)), ("NVIDIA A100-SXM4-80GB", ("A100", 312.0)),
    ("NVIDIA RTX A5000", ("RTX A5000", 111.1)), ("NVIDIA L40S", ("L40S", 362.05)),
    ("NVIDIA GeForce RTX 4090", ("RTX 4090", 165.2)), ("NVIDIA H100 NVL", None), ("Tesla T4", None),
])
def test_datasheet_peaks(name, expected):
    assert peak_tflops(name) == expected


def test_flops_per_token_counts_the_models_matmuls():
    """6 x the weights each token passes through (the blocks' matmuls, half the output layer),
    counted on the owt preset's DiT itself, plus the attention term."""
    from mdlm_cli.models import build_model

    cfg = preset_config(FULL)
    with torch.device("meta"):  # shapes only
        model = build_model(cfg.model, FULL.vocab)
    blocks = sum(m.weight.numel() for b in model.blocks for name, m in b.named_modules()
                 if isinstance(m, torch.nn.Linear) and "adaLN" not in name)
    output = model.output_layer.linear.weight.numel()
    attention = 12 * cfg.model.n_blocks * FULL.length * cfg.model.hidden_size
    assert flops_per_token(cfg, FULL.length, FULL.vocab) == 6 * blocks + 3 * output + attention


def test_junit_results_and_the_budget(tmp_path, capsys):
    (tmp_path / "pytest.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.gpu.test_a" name="test_ok" time="1.5"/>'
        '<testcase classname="tests.gpu.test_a" name="test_bad"><failure message="boom">x</failure>'
        '</testcase><testcase classname="tests.gpu.test_b" name="test_skip">'
        '<skipped message="needs a CUDA device"/></testcase></testsuite></testsuites>')
    result = gpu_check.pytest_result(tmp_path)
    assert result["counts"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}
    assert result["cases"][1] == {"name": "test_a::test_bad", "outcome": "failed", "seconds": 0.0,
                                  "message": "boom"}
    late = gpu_check.run_part(gpu_check.PARTS[2], tmp_path, dry=True, deadline=0.0)
    assert late["status"] == "skipped" and "budget" in late["reason"]
    assert json.loads((tmp_path / "parity.json").read_text())["status"] == "skipped"
    assert "2. logits parity: skipped" in capsys.readouterr().out


def test_a_part_past_its_limit_keeps_what_it_wrote_and_the_next_runs(tmp_path):
    """The child writes its JSON as it goes; at the limit its process group is stopped, the
    JSON is kept with status timeout; a part that exits 1 is 'failed' with its log's tail."""
    write_then_sleep = (
        "import json, sys, time; "
        "row = json.dumps({'status': 'running', 'rows': [1]}); "
        "open(sys.argv[1] + '/slow.json', 'w').write(row); "
        "print('measured one row', flush=True); time.sleep(60)")
    slow = gpu_check.Part("slow", "7. slow", 2, (), ("-c", write_then_sleep, "{out}"))
    broken = gpu_check.Part("broken", "8. broken", 30, (),
                            ("-c", "raise SystemExit('no GPU here')"))
    deadline = time.monotonic() + 300
    t0 = time.monotonic()
    late = gpu_check.run_part(slow, tmp_path, dry=True, deadline=deadline)
    assert time.monotonic() - t0 < 30
    assert late["status"] == "timeout" and late["rows"] == [1] and late["limit_s"] == 2
    assert "measured one row" in late["log_tail"]
    failed = gpu_check.run_part(broken, tmp_path, dry=False, deadline=deadline)
    assert failed["status"] == "failed" and failed["rc"] == 1
    assert "no GPU here" in failed["log_tail"]
    assert json.loads((tmp_path / "broken.json").read_text())["status"] == "failed"
