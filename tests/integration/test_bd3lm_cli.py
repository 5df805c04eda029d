"""`mdlm sample` and `gen-ppl` on a bd3lm run: block by block past the training length, records
cut at EOS with `length` and `ended`, the within-block samplers, and one-line refusals."""

import json

import pytest

from .conftest import invoke, one_line_error


@pytest.fixture(scope="module")
def bd3_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bd3") / "run"
    invoke("train", "--preset", "test", "--no-print-config", "--max-steps", "3", "--set",
           "diffusion.objective=bd3lm", "--set", "diffusion.block_size=8", "--set",
           "train.eval_rows=16", "--out", out)
    return out


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sample_goes_past_the_training_length_in_blocks_and_cuts_at_eos(bd3_run, tmp_path):
    out = invoke("sample", "-c", bd3_run, "--length", "100", "-n", "5", "--batch-size", "2",
                 "--seed", "3", "--out", tmp_path / "s.jsonl", "--quiet")
    assert "rounded up to 104" in out
    rows = records(tmp_path / "s.jsonl")
    assert len(rows) == 5 and {r["max_length"] for r in rows} == {104}
    eos = 3  # the char tokenizer's
    for r in rows:
        assert len(r["tokens"]) == r["length"] <= 104 and eos not in r["tokens"]
        assert r["ended"] == (r["length"] < 104) and r["sampler"] == "first-hitting"
    assert any(r["ended"] for r in rows)
    again = invoke("sample", "-c", bd3_run, "--length", "104", "-n", "5", "--batch-size", "2",
                   "--seed", "3", "--out", tmp_path / "t.jsonl", "--quiet")
    assert "rounded" not in again
    assert [r["tokens"] for r in records(tmp_path / "t.jsonl")] == [r["tokens"] for r in rows]


@pytest.mark.parametrize("flags", [["--sampler", "ancestral", "--steps", "8"],
                                   ["--sampler", "confidence", "--steps", "4", "--top-p", "0.9"],
                                   ["--sampler", "first-hitting", "--tokens-per-step", "2"]])
def test_every_within_block_sampler_runs_from_the_cli(bd3_run, tmp_path, flags):
    invoke("sample", "-c", bd3_run, "--length", "48", "-n", "2", "--prompt", "the ",
           "--no-stop-at-eos", "--out", tmp_path / "s.jsonl", "--quiet", *flags)
    rows = records(tmp_path / "s.jsonl")
    assert all(len(r["tokens"]) == 48 and r["text"].startswith("the ") for r in rows)
    assert all("response" in r for r in rows)


def test_gen_ppl_scores_each_sample_up_to_its_length(bd3_run, tmp_path):
    invoke("sample", "-c", bd3_run, "--length", "64", "-n", "3", "--seed", "1", "--out",
           tmp_path / "s.jsonl", "--quiet")
    judge = tmp_path / "judge"
    invoke("train", "--preset", "test", "--no-print-config", "--max-steps", "2", "--set",
           "diffusion.objective=ar", "--set", "train.eval_rows=16", "--out", judge)
    out = invoke("gen-ppl", "--samples", tmp_path / "s.jsonl", "--judge", judge,
                 "--json", tmp_path / "g.json")
    rows = records(tmp_path / "s.jsonl")
    assert "gen PPL" in out and any(r["ended"] for r in rows)
    result = json.loads((tmp_path / "g.json").read_text())
    # the character judge reads one token per character of each text cut at its EOS (a random
    # model's special ids decode to nothing), not the 64 positions of the whole row
    assert result["scored_tokens"] == sum(len(r["text"]) for r in rows) < 3 * 64
    first = invoke("gen-ppl", "--sample-first", "-c", bd3_run, "--judge", judge, "-n", "2")
    assert "gen PPL" in first


@pytest.mark.parametrize("flags, message", [
    (["--sampler", "remdm"], "choose one of: ancestral, first-hitting, confidence"),
    (["--infill", "a <mask> b"], "--infill does not apply to a bd3lm model"),
    (["--chat", "hi"], "--chat does not apply to a bd3lm model"),
])
def test_what_does_not_apply_is_one_line(bd3_run, flags, message):
    assert message in one_line_error("sample", "-c", bd3_run, "-n", "1", *flags)


def test_commands_without_block_sampling_refuse_in_one_line(bd3_run):
    assert "block by block" in one_line_error("semi-ar", "-c", bd3_run, "--length", "64")


def test_eval_ppl_of_block_size_1_is_an_exact_nll_whose_first_token_has_no_context(tmp_path):
    """At L' = 1 eval-ppl reports the exact NLL; its footnote says what the first token is
    conditioned on (nothing: no clean block before it), not AR's "given BOS"."""
    out = tmp_path / "run"
    invoke("train", "--preset", "test", "--no-print-config", "--max-steps", "2", "--set",
           "diffusion.objective=bd3lm", "--set", "diffusion.block_size=1", "--set",
           "train.eval_rows=16", "--out", out)
    report = " ".join(invoke("eval-ppl", "-c", out, "--split", "valid", "--rows", "8").split())
    assert "exact likelihood of the bd3lm model" in report
    assert "the first from no context" in report and "given BOS" not in report


def test_a_prompt_near_the_training_length_gets_one_block_at_least(bd3_run, tmp_path):
    """The one rule's default answer for a block model (generation/layout.py): the rest of the
    training length, one block at least. A 30-token prompt of a 32-token run gets a block (8):
    38 positions, rounded up to 40. (Before, `mdlm sample` kept such a row at 32 positions,
    2 of them free, and refused a prompt past 32 tokens; the server gave one block.)"""
    for prompt, row in (("x" * 30, 40), ("x" * 40, 48), ("the ", 32)):
        out = tmp_path / f"{len(prompt)}.jsonl"
        invoke("sample", "-c", bd3_run, "--prompt", prompt, "-n", "2", "--no-stop-at-eos",
               "--out", out, "--quiet")
        got = records(out)
        assert {r["max_length"] for r in got} == {row}
        assert all(len(r["tokens"]) == row for r in got)
