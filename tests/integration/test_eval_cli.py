"""End to end through the CLI: train the AR baseline and an MDLM on the test preset,
then eval-ppl (bound vs exact on the same tokens), AR sampling and gen-ppl."""

import json

import pytest
from typer.testing import CliRunner

from mdlm_cli.cli import app

runner = CliRunner()


def run(*args, code=0):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def models(trained_runs):
    return trained_runs


@pytest.mark.slow
def test_eval_ppl_bound_and_exact_on_the_same_tokens(models, tmp_path):
    ar_run, mdlm_run = models
    run("eval-ppl", "-c", str(ar_run), "--rows", "40", "--json", str(tmp_path / "ar.json"))
    out = run("eval-ppl", "-c", str(mdlm_run), "--rows", "40", "-k", "3", "--json", str(tmp_path / "md.json"))
    assert "≤" in out and "bits/char" in out
    exact = json.loads((tmp_path / "ar.json").read_text())["results"][0]
    bound = json.loads((tmp_path / "md.json").read_text())["results"][0]
    assert exact["kind"] == "exact" and bound["kind"] == "bound"
    assert exact["tokens"] == bound["tokens"] == 40 * 32 and exact["split"] == bound["split"] == "test"
    assert bound["mc_samples"] == 3 and bound["standard_error"] > 0
    assert bound["bits_per_char"] == pytest.approx(bound["nats_per_token"] / 0.6931471805599453)
    discrete = run("eval-ppl", "-c", str(mdlm_run), "--rows", "40", "-k", "2", "--T", "10")
    assert "10-step discrete-time NELBO" in discrete


@pytest.mark.slow
def test_zero_shot_table_over_local_data_sets(models, tmp_path):
    _, mdlm_run = models
    for name in ("alpha", "beta"):
        (tmp_path / f"{name}.txt").write_text("\n\n".join(f"{name} document number {i} " * 8 for i in range(30)))
    out = run("eval-ppl", "-c", str(mdlm_run), "-k", "2", "--split", "valid",
              "--datasets", f"{tmp_path / 'alpha.txt'},{tmp_path / 'beta.txt'}")
    assert "alpha" in out and "beta" in out
    run("eval-ppl", "-c", str(mdlm_run), "--datasets", "a", "--dataset", "b", code=1)


@pytest.mark.slow
def test_ar_sampling_and_gen_ppl_with_the_ar_judge(models, tmp_path):
    ar_run, mdlm_run = models
    out = run("sample", "-c", str(ar_run), "-n", "3", "--prompt", "the", "--quiet", "--out", str(tmp_path / "a.jsonl"))
    assert "autoregressive-kv-cache" in out
    records = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["text"].startswith("the") and len(r["tokens"]) == 32 for r in records)
    assert records[0]["nfe"] == 29  # one call per new token, the first one with the prompt
    run("semi-ar", "-c", str(ar_run), code=1)
    run("sample", "-c", str(ar_run), "--infill", "a <mask> b", code=1)

    run("sample", "-c", str(mdlm_run), "-n", "5", "--batch-size", "2", "--quiet", "--out", str(tmp_path / "m.jsonl"))
    out = run("gen-ppl", "--samples", str(tmp_path / "m.jsonl"), "--judge", str(ar_run), "--batch-size", "2",
              "--json", str(tmp_path / "g.json"))
    assert "EOS policy keep" in out
    scored = json.loads((tmp_path / "g.json").read_text())
    assert scored["num_samples"] == 5 and len(scored["per_sample"]) == 5  # every sample, none dropped
    texts = [json.loads(x)["text"] for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert scored["scored_tokens"] == sum(len(t) for t in texts)  # characters: one token each
    assert scored["entropy_of"] == "sample tokens"

    out = run("gen-ppl", "--sample-first", "-c", str(mdlm_run), "--sampler", "ancestral", "--steps", "8",
              "-n", "4", "--judge", str(ar_run), "--samples", str(tmp_path / "sf.jsonl"),
              "--no-final-denoise", "--temperature", "0.9", "--eta", "0.1")
    records = [json.loads(line) for line in (tmp_path / "sf.jsonl").read_text().splitlines()]
    assert len(records) == 4 and records[0]["final_denoise"] is False and records[0]["temperature"] == 0.9
    assert "--eta 0.1 does not apply to ancestral" in out  # the shared sampling flags, as in mdlm sample
    run("gen-ppl", "--samples", str(tmp_path / "m.jsonl"), "--judge", str(mdlm_run), code=1)  # not causal


@pytest.mark.slow
def test_gen_ppl_diversity_and_mauve(models, tmp_path):
    """MAUVE against a JSONL of texts and against a split of the model's data, with the judge's
    features (the AR checkpoint's last hidden state); the samples against themselves score 1."""
    ar_run, mdlm_run = models
    samples, judge = str(tmp_path / "s.jsonl"), str(ar_run)
    out = run("gen-ppl", "--sample-first", "-c", str(mdlm_run), "--sampler", "ancestral",
              "--steps", "8", "-n", "12", "--judge", judge, "--samples", samples,
              "--mauve-reference", "test", "--mauve-seeds", "0,1",
              "--json", str(tmp_path / "g.json"))
    assert "biased upward" in out and "MAUVE" in out and "self-BLEU" in out
    scored = json.loads((tmp_path / "g.json").read_text())
    m, d = scored["mauve"], scored["diversity"]
    assert 0 < m["mauve"] <= 1 and len(m["mauve_per_seed"]) == 2
    assert m["mauve_num_reference"] == 12 and 0 <= d["dist_1"] <= 1
    assert m["featurizer"].startswith(judge) and m["pooling"] == "last token"
    run("gen-ppl", "--samples", samples, "--judge", judge, "--mauve-reference", samples,
        "--json", str(tmp_path / "self.json"))
    assert json.loads((tmp_path / "self.json").read_text())["mauve"]["mauve"] == pytest.approx(1.0)
    for flags, message in ((["--mauve-reference", "test"], "needs --sample-first"),
                           (["--featurizer", judge], "needs --mauve-reference"),
                           (["--mauve-seeds", "a"], "--mauve-seeds")):
        assert message in run("gen-ppl", "--samples", samples, "--judge", judge, *flags, code=1)


@pytest.mark.slow
def test_commands_ask_the_objective_which_samplers_apply(models, tmp_path):
    ar_run, mdlm_run = models
    out = run("sample", "-c", str(ar_run), "--sampler", "ancestral", code=1)
    assert "sampler ancestral does not serve ar models; choose one of: autoregressive-kv-cache" in out
    assert "takes no steps" in run("sample", "-c", str(ar_run), "-n", "1", "--steps", "10", "--quiet")
    run("bench-sampler", "-c", str(ar_run), "--batch-size", "1,2", "-n", "2", "--repeats", "1",
        "--json", str(tmp_path / "b.json"))
    rows = json.loads((tmp_path / "b.json").read_text())["results"]
    # both exact AR samplers by default: the cached one and the reference's (the prefix each call)
    assert [r["sampler"] for r in rows] == ["autoregressive-kv-cache"] * 2 + ["autoregressive-recompute"] * 2
    assert rows[0]["nfe"] == 32 and rows[2]["nfe"] == 32
    assert "does not serve ar models" in run("bench-sampler", "-c", str(ar_run), "--samplers", "first-hitting",
                                             code=1)
    assert "--mc-samples 3 does not apply" in run("eval-ppl", "-c", str(ar_run), "--rows", "8", "-k", "3")
    (tmp_path / "s.jsonl").write_text('{"text": "the cat"}\n')
    assert "only apply with --sample-first" in run("gen-ppl", "--samples", str(tmp_path / "s.jsonl"),
                                                   "--judge", str(ar_run), "--steps", "10", code=1)


@pytest.mark.slow
def test_bench_quality_columns_are_gen_ppl_of_the_same_samples(models, tmp_path):
    """bench-sampler --judge scores the samples it timed; mdlm gen-ppl on the samples it saved
    gives the same numbers, and the real-text reference is the test split scored the same way."""
    ar_run, mdlm_run = models
    run("bench-sampler", "-c", str(mdlm_run), "--samplers", "first-hitting,threshold", "--threshold", "0,0.5",
        "-n", "4", "--batch-size", "2", "--repeats", "1", "--judge", str(ar_run), "--reference-text", "test",
        "--save-samples", str(tmp_path / "s"), "--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "f.png"))
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"  # the frontier plot of the run
    bench = json.loads((tmp_path / "b.json").read_text())
    assert len(bench["results"]) == 3
    for row, name in zip(bench["results"], ["first-hitting-default", "threshold-threshold0.0",
                                             "threshold-threshold0.5"], strict=True):
        samples = tmp_path / "s" / f"fp64-{name}-b2.jsonl"
        run("gen-ppl", "--samples", str(samples), "--judge", str(ar_run), "--json", str(tmp_path / "g.json"))
        scored = json.loads((tmp_path / "g.json").read_text())
        q = row["quality"]
        assert (q["gen_ppl"], q["nats_per_char"], q["entropy"], q["num_samples"]) == (
            scored["gen_ppl"], scored["nats_per_char"], scored["entropy_mean"], scored["num_samples"])
        assert json.loads(samples.read_text().splitlines()[0])["nfe"] == row["nfe"]
    assert bench["results"][1]["nfe"] == 1  # threshold 0: everything in one call
    ref = bench["reference"]
    assert ref["split"] == "test" and ref["per_group"] == 4 and ref["groups"] == 8
    assert ref["band"]["gen_ppl"][0] <= ref["quality"]["gen_ppl"] <= ref["band"]["gen_ppl"][1]
    # MAUVE (the judge's features) and diversity: every row, and the band over the real sets
    for name in ("mauve", "self_bleu", "dist_2", "repetition_4"):
        assert ref["band"][name][0] <= ref["quality"][name] <= ref["band"][name][1]
        assert all(0 <= row["quality"][name] <= 1 for row in bench["results"])
    assert all(row["quality"]["mauve_sd"] >= 0 for row in bench["results"])
