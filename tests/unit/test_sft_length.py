"""Padding as EOS teaches the answer's length: a tiny model fine-tuned on a toy task whose answer
length depends on the prompt (prompt letter i, answer i + 1 copies of "a") ends where it should;
`mdlm sample`, `semi-ar` and `eval-ppl` on it."""

import json
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from mdlm_cli.build import resolve_config
from mdlm_cli.checkpoints.folder import load_run_folder
from mdlm_cli.cli import app
from mdlm_cli.data.store import prepare
from mdlm_cli.engine import SamplingSettings
from mdlm_cli.generation.request import GenerationRequest
from mdlm_cli.sample.generate import generate, stops_at_eos, template
from mdlm_cli.train.loop import train

PROMPTS = "bcdefg"  # prompt i -> i + 1 letters "a", then EOS
TOY = ["data.tokenizer=char", "data.length=10", "data.packing=sft", "model.hidden_size=64",
       "model.n_blocks=2", "model.n_heads=2", "model.cond_dim=32", "train.global_batch_size=16",
       "train.micro_batch_size=16", "train.max_steps=250", "train.log_every=50",
       "train.eval_every=1000", "train.save_every=1000", "train.precision=fp32", "optim.lr=3e-3",
       "optim.warmup_steps=10", "train.ema=0"]


def toy_examples(path, repeats: int = 10):
    lines = [json.dumps({"prompt": p, "response": "a" * (i + 1)})
             for _ in range(repeats) for i, p in enumerate(PROMPTS)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    data = toy_examples(root / "toy.jsonl")
    cfg = resolve_config("test", [*TOY, f"data.dataset={data}", f"train.out_dir={root / 'run'}"])
    return root / "run", train(cfg, console=Console(quiet=True))


def test_pad_as_eos_model_learns_where_the_answer_ends(toy_run):
    run, result = toy_run
    assert result.losses[-1] < 0.2 * result.losses[0]
    loaded = load_run_folder(run)
    assert stops_at_eos(loaded)  # trained with padding as EOS: samples end at their EOS by default
    right = 0
    for i, p in enumerate(PROMPTS):
        request = GenerationRequest(SamplingSettings("first-hitting"), num_samples=4, seed=i)
        rt = SimpleNamespace(device=torch.device("cpu"), dtype=None)
        records, _, _ = generate(loaded, rt, request, prompt=template(loaded, 10, prompt=p))
        for r in records:
            assert loaded.tokenizer.eos_id not in r.tokens  # nothing from the EOS on is returned
            right += r.ended and r.length == i + 1 and r.text == p + "a" * (i + 1)
    assert right >= 22  # of 24 (measured: 24 with train.seed 0, 1 and 2; 150 steps give 20)


def test_sample_semi_ar_and_eval_ppl_commands(toy_run, tmp_path):
    run, result = toy_run
    runner = CliRunner()
    out = tmp_path / "s.jsonl"
    res = runner.invoke(app, ["sample", "--checkpoint", str(run), "--prompt", "e", "-n", "2",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["ended"] and r["length"] == len(r["tokens"]) - 2 for r in records)
    assert "tokens)" in res.output  # the panel titles give the answers' lengths
    res = runner.invoke(app, ["sample", "--checkpoint", str(run), "--no-stop-at-eos", "-n", "1",
                              "--prompt", "e", "--out", str(out)])
    assert res.exit_code == 0 and len(json.loads(out.read_text())["tokens"]) == 10
    res = runner.invoke(app, ["semi-ar", "--checkpoint", str(run), "--prompt", "c",
                              "--max-new-tokens", "30", "--stride", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    record = json.loads(out.read_text())
    assert record["ended"] and record["nfe"] <= 9  # one window (8 reveals at most), no block more
    res = runner.invoke(app, ["eval-ppl", "--checkpoint", str(run), "--split", "valid", "-k", "1",
                              "--json", str(tmp_path / "e.json")])
    assert res.exit_code == 0, res.output
    valid = json.loads((tmp_path / "e.json").read_text())["results"][0]
    # rows 18, 38 and 58 of the 60 examples: [BOS] letter, then 8 target tokens each (no prompt)
    assert valid["tokens"] == result.final_valid.tokens == 3 * 8 and valid["sequences"] == 3


def gen_ppl(*args, code: int = 0) -> str:
    res = CliRunner().invoke(app, ["gen-ppl", *map(str, args)])
    assert res.exit_code == code, res.output + repr(res.exception)
    return res.output


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    """A random mdlm AR checkpoint (char, wrap-packed data: not a prompt/response model)."""
    from .test_genppl import save_ar_judge

    return save_ar_judge(tmp_path_factory.mktemp("judge") / "ar")


def test_gen_ppl_scores_responses_to_held_out_prompts(toy_run, judge, tmp_path):
    run, _ = toy_run
    samples, out = tmp_path / "r.jsonl", tmp_path / "g.json"
    text = gen_ppl("--sample-first", "-c", run, "--prompts", "test", "--judge", judge,
                   "--samples", samples, "--json", out)
    assert "responses to prompts of test split" in text and "ended at EOS" in text
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    scored = json.loads(out.read_text())
    held_out = prepare(load_run_folder(run).config.data).split("test")
    assert len(records) == scored["num_samples"] == len(held_out) > 0  # -n 32: all of them
    for r, s in zip(records, scored["per_sample"], strict=True):
        assert r["prompt"] in PROMPTS and r["reference"] == "a" * (PROMPTS.index(r["prompt"]) + 1)
        assert r["text"] == r["prompt"] + r["response"] and r["ended"]
        assert (s["context_tokens"], s["scored"]) == (1, len(r["response"]))  # the letter: read
    right = sum(r["response"] == r["reference"] for r in records)
    assert right >= len(records) - 1  # the toy model answers its own test prompts
    assert scored["conditional"] and scored["responses"]["ended_at_eos"] == len(records)
    assert scored["scored_tokens"] == sum(len(r["response"]) for r in records)
    # the records score again as written, given their prompts; --unconditional: whole texts
    again = tmp_path / "again.json"
    gen_ppl("--samples", samples, "--judge", judge, "--json", again)
    rescored = json.loads(again.read_text())
    assert rescored["nats_per_token"] == pytest.approx(scored["nats_per_token"])
    gen_ppl("--samples", samples, "--judge", judge, "--unconditional", "--json", again)
    whole = json.loads(again.read_text())
    assert not whole["conditional"]
    assert whole["scored_tokens"] == sum(len(r["text"]) for r in records)
    # MAUVE of responses against a split: that split's held-out responses (12 of train here)
    gen_ppl("--sample-first", "-c", run, "--prompts", "train", "-n", "12", "--judge", judge,
            "--mauve-reference", "train", "--mauve-seeds", "0", "--json", again)
    mauve = json.loads(again.read_text())["mauve"]
    assert mauve["mauve_num_reference"] == 12 and 0 < mauve["mauve"] <= 1


def test_gen_ppl_of_responses_to_a_prompt_file_and_of_sample_records(toy_run, judge, tmp_path):
    run, _ = toy_run
    prompts, out = tmp_path / "p.jsonl", tmp_path / "g.json"
    prompts.write_text('{"prompt": "c"}\n{"prompt": "f", "response": "aaaaa"}\n{"prompt": "b"}\n')
    gen_ppl("--sample-first", "-c", run, "--prompts", prompts, "-n", "2", "--judge", judge,
            "--json", out)
    scored = json.loads(out.read_text())
    assert scored["num_samples"] == 2
    assert [s["context_tokens"] for s in scored["per_sample"]] == [1, 1]
    # a left-to-right model (the random AR judge) answers prompts of several lengths, in order
    several = tmp_path / "several.jsonl"
    several.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("ab", "c", "de", "fgh")))
    gen_ppl("--sample-first", "-c", judge, "--prompts", several, "--judge", judge,
            "--samples", tmp_path / "ar.jsonl")
    records = [json.loads(line) for line in (tmp_path / "ar.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["ab", "c", "de", "fgh"]
    assert all(r["text"] == r["prompt"] + r["response"] for r in records)
    samples = tmp_path / "s.jsonl"  # mdlm sample --prompt writes the response after the prompt
    res = CliRunner().invoke(app, ["sample", "-c", str(run), "--prompt", "e", "-n", "3",
                                   "--out", str(samples)])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert all(r["text"] == "e" + r["response"] for r in records)
    gen_ppl("--samples", samples, "--judge", judge, "--json", out)
    scored = json.loads(out.read_text())
    assert scored["conditional"] and scored["entropy_of"] == "sample tokens"
    assert scored["scored_tokens"] == sum(len(r["response"]) for r in records)


def test_gen_ppl_prompt_errors_are_one_line(toy_run, judge, tmp_path):
    run, _ = toy_run
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "c"}\n')
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"text": "abc"}\n')
    for args, message in (
        (["--prompts", "test", "--judge", judge], "needs --sample-first"),
        (["--sample-first", "-c", judge, "--prompts", "test", "--judge", judge],
         "holds no prompts"),
        (["--sample-first", "-c", run, "--prompts", bad, "--judge", judge],
         ":1: no 'prompt' string"),
        (["--sample-first", "-c", run, "--prompts", "nowhere", "--judge", judge],
         "no such file, and not a split"),
        (["--sample-first", "-c", run, "--prompts", "test", "--unconditional"],
         "--unconditional does not apply"),
        (["--samples", plain, "--conditional", "--judge", judge], "is no response"),
    ):
        text = gen_ppl(*args, code=1)
        assert message in text and "Traceback" not in text, text


def test_eval_ppl_of_a_model_before_fine_tuning_on_the_held_out_responses(toy_run, judge, tmp_path):
    """`eval-ppl --data FOLDER`: a model not trained on prompt/response data (here a random AR
    one) scored on the sft folder: the exact NLL of the same 3 x 8 target tokens."""
    run, result = toy_run
    folder = prepare(load_run_folder(run).config.data).folder
    res = CliRunner().invoke(app, ["eval-ppl", "-c", str(judge), "--data", str(folder),
                                   "--split", "valid", "--json", str(tmp_path / "e.json")])
    assert res.exit_code == 0, res.output
    valid = json.loads((tmp_path / "e.json").read_text())["results"][0]
    assert valid["kind"] == "exact" and valid["tokens"] == result.final_valid.tokens == 3 * 8


def test_semi_ar_rows_are_the_one_rules(toy_run, tmp_path):
    """`mdlm semi-ar`'s rows (generation/layout.py's semi-AR rule): the row start, the prompt
    and --max-new-tokens, else --length in all (default two windows). Without a prompt the
    row has no row start, so --max-new-tokens N keeps N tokens (it kept one more, counting
    a row start that was never there)."""
    run, _ = toy_run
    out = tmp_path / "s.jsonl"
    for flags, tokens in ((["--prompt", "c", "--max-new-tokens", "13"], 2 + 13),
                          (["--max-new-tokens", "13"], 13), (["--length", "21"], 21), ([], 20)):
        res = CliRunner().invoke(app, ["semi-ar", "--checkpoint", str(run), "--stride", "4",
                                       "--no-stop-at-eos", "-n", "1", "--out", str(out), *flags])
        assert res.exit_code == 0, res.output
        assert len(json.loads(out.read_text())["tokens"]) == tokens, flags
