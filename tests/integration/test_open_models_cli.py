"""The commands on the tiny random LLaDA and Dream folders (tests/open_model_folders.py), each
through the CLI: eval-ppl on a local text file, gen-ppl of sample records, bench-sampler."""

import json
import math
import random

import pytest

from tests.open_model_folders import write_dream, write_llada

from .conftest import invoke

FAMILIES = ["llada", "dream"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("open-cli")
    return {"llada": write_llada(base / "llada"), "dream": write_dream(base / "dream")}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """60 documents of the folders' words, blank-line separated (3 go to the test split)."""
    rng = random.Random(0)
    docs = [" ".join(f"w{rng.randint(1, 78)}" for _ in range(rng.randint(8, 30)))
            for _ in range(60)]
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return path


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_ppl_gives_a_finite_bound(folders, text_file, tmp_path, family):
    out = tmp_path / "ppl.json"
    invoke("eval-ppl", "-c", folders[family], "--dataset", text_file, "-k", "2", "--json", out)
    (result,) = json.loads(out.read_text())["results"]
    assert result["kind"] == "bound" and result["tokens"] > 0
    assert math.isfinite(result["nats_per_token"]) and result["nats_per_token"] > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_gen_ppl_scores_sample_records(folders, tmp_path, family):
    from tests.unit.test_genppl import save_ar_judge

    judge = save_ar_judge(tmp_path / "judge")
    samples = tmp_path / "s.jsonl"
    invoke("sample", "-c", folders[family], "-n", "2", "--length", "32", "--steps", "8",
           "--sampler", "ancestral", "--quiet", "--out", samples)
    out = invoke("gen-ppl", "--samples", samples, "--judge", judge)
    assert "gen PPL" in out and "nats/token" in out


@pytest.mark.parametrize("family", FAMILIES)
def test_bench_sampler_rows(folders, tmp_path, family):
    out = tmp_path / "b.json"
    invoke("bench-sampler", "-c", folders[family], "--samplers", "confidence,first-hitting",
           "--steps", "8", "-n", "2", "--batch-size", "2", "--repeats", "1", "--length", "32",
           "--json", out)
    rows = json.loads(out.read_text())["results"]
    assert [r["sampler"] for r in rows] == ["confidence", "first-hitting"]
    assert rows[0]["options"] == {"k_schedule": family}  # the family's default
