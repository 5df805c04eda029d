"""The open models' recipes (LLaDA-8B and Dream-7B tables): their commands carry the released
evaluation's settings, and a recipe runs end to end at --scale tiny on the tiny LLaDA and Dream
folders (tests/open_model_folders.py), local lm-eval tasks standing in for the hub's
(`mdlm reproduce --model KEY=FOLDER --task TASK=LOCAL --include-path DIR`)."""

import json
import random
import re
import shlex

import pytest
from typer.testing import CliRunner

from mdlm_cli import recipes
from mdlm_cli.cli import app
from mdlm_cli.commands.app import command_flags
from mdlm_cli.errors import MdlmError
from mdlm_cli.recipes import plan, stand_in
from mdlm_cli.recipes.plan import TINY_GEN_LENGTH
from tests.open_model_folders import write_dream, write_llada

runner = CliRunner()
OPEN_MODEL_TABLES = ["llada-base-ppl", "llada-base-gen", "llada-instruct", "dream-base",
                     "dream-instruct"]


def load(name: str) -> recipes.Recipe:
    return recipes.load_recipe(name, command_flags)


def commands(name: str, *extra: str) -> dict[str, list[str]]:
    """`mdlm reproduce NAME --dry-run`'s commands, by the row whose output each writes."""
    out = runner.invoke(app, ["reproduce", name, "--dry-run", *extra])
    assert out.exit_code == 0, out.output
    lines = [shlex.split(x) for x in out.output.splitlines() if x.startswith("mdlm ")]
    return {argv[argv.index("--json") + 1].rsplit("/", 1)[1].split(".")[0]: argv[1:]
            for argv in lines}


def flags(argv: list[str]) -> dict[str, str | bool]:
    """--key value pairs of a command line (a flag without a value: True)."""
    found, i = {}, 0
    while i < len(argv):
        if argv[i].startswith("--"):
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            found[argv[i][2:]] = argv[i + 1] if has_value else True
            i += 2 if has_value else 1
        else:
            i += 1
    return found


@pytest.mark.parametrize("name", OPEN_MODEL_TABLES)
def test_every_runnable_row_prints_its_command_and_reads_one_lm_eval_key(name):
    recipe = load(name)
    printed = commands(name)
    runnable = [r for r in recipe.rows if not r.paper_only]
    assert sorted(printed) == sorted(r.name for r in runnable)
    for row in runnable:
        argv = flags(printed[row.name])
        assert argv["tasks"] == row.pick["task"] and argv["checkpoint"] == recipe.models[
            row.model].checkpoint
        assert row.paper["source"] and 0 < row.paper["value"] < 1  # a fraction, as lm-eval's


def test_llada_generation_rows_fix_the_scripts_lengths_and_low_confidence_remasking():
    base, instruct = commands("llada-base-gen"), commands("llada-instruct")
    gsm8k = flags(base["gsm8k"])
    assert (gsm8k["gen-length"], gsm8k["steps"], gsm8k["block-length"]) == ("1024",) * 3
    assert (gsm8k["order"], gsm8k["k-schedule"], gsm8k["temperature"]) == (
        "maskgit_plus", "llada", "0")
    assert "num-fewshot" not in gsm8k and "cfg-scale" not in gsm8k  # the task's shots, cfg 0
    assert flags(base["gsm8k-256"])["gen-length"] == "256"
    semi = flags(instruct["gsm8k-semi-ar"])
    assert semi["apply-chat-template"] is True and (semi["gen-length"], semi["block-length"]) == (
        "256", "8")
    assert flags(instruct["mmlu"])["gen-length"] == "3"


def test_dream_rows_carry_its_evaluations_conventions():
    base, instruct = commands("dream-base"), commands("dream-instruct")
    mc = flags(base["piqa"])
    assert (mc["mc-samples"], mc["batch-size"], mc["estimator"]) == ("128", "32", "t")
    assert mc["tokenizer-bos"] is True and mc["append-eos"] is True
    humaneval = flags(base["humaneval"])
    assert (humaneval["temperature"], humaneval["top-p"], humaneval["top-k"]) == ("0.2", "0.95",
                                                                                  "0")
    assert humaneval["order"] == "entropy" and humaneval["gen-length"] == humaneval["steps"]
    gpqa = flags(instruct["gpqa"])  # likelihood: diffllm's 32 passes, EOS after, no BOS text
    assert gpqa["mc-samples"] == "32" and gpqa["no-tokenizer-bos"] is True
    assert flags(instruct["gsm8k"])["temperature"] == "0.1"


def test_tiny_scale_keeps_generation_in_a_few_tokens_in_blocks_that_divide_them(tmp_path):
    """--scale tiny: at most TINY_GEN_LENGTH new tokens, the blocks dividing them and the steps a
    multiple of the blocks, whatever the recipe's lengths (1024, 3, 256 in blocks of 8)."""
    seen = set()
    for name in OPEN_MODEL_TABLES:
        for job in plan(load(name), out=tmp_path, runs=tmp_path, scale="tiny"):
            args = flags(job.argv[1:])
            assert args["limit"] == "4" and int(args.get("mc-samples", 1)) <= 4
            if "gen-length" not in args:
                continue
            length, steps = int(args["gen-length"]), int(args["steps"])
            block = int(args.get("block-length", length))
            assert length <= TINY_GEN_LENGTH and length % block == 0
            assert steps % (length // block) == 0 and 0 < steps <= length
            seen.add((length, block))
    assert {(8, 8), (3, 3)} <= seen


@pytest.mark.parametrize(("extra", "message"), [
    (["--model", "nope=/x"], "has no model 'nope'"),
    (["--model", "llada"], "--model takes KEY=VALUE"),
    (["--model", "llada=/x", "--model", "llada=/y"], "--model llada is given twice"),
    (["--task", "gsm8k=local", "--scale", "tiny"], "runs no lm-eval task 'gsm8k'"),
    (["--task", "arc_challenge=local"], "--task runs stand-in tasks, not the paper's"),
    (["--include-path", "/x"], "--include-path goes with --task"),
])
def test_stand_ins_that_cannot_be_are_one_line_errors(extra, message):
    out = runner.invoke(app, ["reproduce", "llada-base-ppl", "--dry-run", *extra])
    assert out.exit_code == 1 and message in out.output, out.output


def test_a_stand_in_for_a_training_run_is_refused():
    with pytest.raises(MdlmError, match="stands in for published checkpoints only"):
        stand_in(load("demo"), models={"mdlm": "/x"}, tasks={}, include_path=None)


def test_stand_ins_replace_the_tasks_their_per_task_passes_and_the_pick():
    recipe = stand_in(load("llada-base-ppl"), models={"llada": "/tiny"},
                      tasks={"mmlu": "tiny_choice"}, include_path="/tasks")
    mmlu = next(r for r in recipe.rows if r.name == "mmlu")
    assert mmlu.pick == {"task": "tiny_choice"} and mmlu.steps[0].args["include-path"] == "/tasks"
    assert recipe.models["llada"].checkpoint == "/tiny"
    assert recipe.models["llada"].stands_in_for == "GSAI-ML/LLaDA-8B-Base"
    untouched = next(r for r in recipe.rows if r.name == "piqa")
    assert "include-path" not in untouched.steps[0].args and untouched.pick == {"task": "piqa"}
    assert load("llada-base-ppl").models["llada"].checkpoint == "GSAI-ML/LLaDA-8B-Base"


def write_stand_in_tasks(folder):
    """Local lm-eval tasks standing in for the hub's (test_open_models_cli's way, offline): a
    generation whose filter is named as gsm8k's (so the record's key is the row's score) and a
    multiple choice of three words; the recipe's shots and the tiny limit are the run's."""
    folder.mkdir()
    rng = random.Random(1)
    # 12 documents: a recipe's 8 shots come from the same split (--limit 4 scores four)
    docs = [" ".join(f"w{rng.randint(4, 78)}" for _ in range(rng.randint(4, 9))) for _ in range(12)]
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    head = ("dataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {folder / 'docs.jsonl'}\ntest_split: test\n"
            "doc_to_text: \"{{text.split(' ')[:-1]|join(' ')}}\"\n")
    (folder / "tiny_gen.yaml").write_text("task: tiny_gen\n" + head + """output_type: generate_until
doc_to_target: "{{text.split(' ')[-1]}}"
generation_kwargs: {until: ["w3"], do_sample: false}
filter_list:
  - name: flexible-extract
    filter: [{function: take_first}]
metric_list:
  - {metric: exact_match, aggregation: mean, higher_is_better: true}
""")
    (folder / "tiny_choice.yaml").write_text("task: tiny_choice\n" + head + """output_type: multiple_choice
doc_to_choice: "{{[' ' + text.split(' ')[-1], ' w1', ' w2']}}"
doc_to_target: 0
metric_list:
  - {metric: acc, aggregation: mean, higher_is_better: true}
""")
    return folder


def reproduce_tiny(tmp_path, table: str, row: str, model: str, folder, task: str, local: str):
    """`mdlm reproduce TABLE --scale tiny` of one row, its model and task stood in for; the
    report's row and the job's command line."""
    out = tmp_path / table
    args = ["reproduce", table, "--scale", "tiny", "--rows", row, "--out", out,
            "--model", f"{model}={folder}", "--task", f"{task}={local}",
            "--include-path", tmp_path / "tasks"]
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    label = next(r.label for r in load(table).rows if r.name == row)
    line = next(x for x in report.splitlines() if x.startswith(f"| {label} |"))
    job = json.loads((out / "jobs.jsonl").read_text().splitlines()[-1])
    assert "NOT the paper's setting" in report and f"{local} (from" in report
    return line, flags(job["argv"])


@pytest.mark.slow
def test_llada_recipes_run_end_to_end_at_tiny_scale_on_stand_ins(tmp_path, monkeypatch):
    """The generation row's command comes from the recipe (its lengths cut to the tiny window),
    runs on the tiny LLaDA folder and fills the report beside EVAL.md's 70.3; so does a
    likelihood row with guidance (cfg 0.5) and LLaDA's estimator."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = write_llada(tmp_path / "llada")
    write_stand_in_tasks(tmp_path / "tasks")
    line, argv = reproduce_tiny(tmp_path, "llada-base-gen", "gsm8k", "llada", folder, "gsm8k",
                                "tiny_gen")
    assert (argv["gen-length"], argv["block-length"], argv["steps"]) == ("8", "8", "8")
    assert argv["tasks"] == "tiny_gen" and argv["checkpoint"] == str(folder)
    assert "| 0.703 |" in line and "| done |" in line
    assert "lm-eval exact_match,flexible-extract" in line and "standing in for" in line
    line, argv = reproduce_tiny(tmp_path, "llada-base-ppl", "arc-c", "llada", folder,
                                "arc_challenge", "tiny_choice")
    assert argv["cfg-scale"] == "0.5" and argv["mc-samples"] == "4"
    assert "| 0.479 |" in line and "| done |" in line and "lm-eval acc" in line


@pytest.mark.slow
def test_dream_recipes_run_end_to_end_at_tiny_scale_on_stand_ins(tmp_path, monkeypatch):
    """Dream's generation row (entropy order, top-k off) and its instruct GPQA row (likelihood,
    chat template, EOS after, no BOS text) on the tiny Dream folder."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = write_dream(tmp_path / "dream")
    write_stand_in_tasks(tmp_path / "tasks")
    line, argv = reproduce_tiny(tmp_path, "dream-base", "gsm8k", "dream", folder, "gsm8k_cot",
                                "tiny_gen")
    assert argv["order"] == "entropy" and argv["top-k"] == "0" and argv["gen-length"] == "8"
    assert "| 0.772 |" in line and "| done |" in line
    line, argv = reproduce_tiny(tmp_path, "dream-instruct", "gpqa", "dream", folder,
                                "gpqa_main_n_shot", "tiny_choice")
    assert argv["no-tokenizer-bos"] is True and argv["apply-chat-template"] is True
    assert "| 0.33 |" in line and "| done |" in line


@pytest.mark.parametrize(("row", "message"), [
    ("score: exact_match", "score names an lm-eval record's key as metric,filter"),
    ("score: 'acc,none'", "score (an lm-eval record's key) goes with metric accuracy"),
])
def test_a_score_key_is_checked_when_the_recipe_loads(tmp_path, row, message):
    path = tmp_path / "r.yaml"
    path.write_text("title: t\nmetric: ppl\nmodels:\n  m: {checkpoint: some/model}\nrows:\n"
                    f"  - {{name: a, model: m, {row}, steps: [{{lm-eval: {{tasks: x}}}}]}}\n")
    with pytest.raises(MdlmError, match=re.escape(message)):
        load(str(path))
