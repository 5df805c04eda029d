"""lm-evaluation-harness end to end, offline: local tasks (YAML + JSONL written here) of
each output type through `mdlm lm-eval` and through lm-eval's own `simple_evaluate` with the
registered `mdlm` model, on test-size MDLM and AR checkpoints. Skipped without lm-eval
(`pip install "mdlm[eval]"`), except the install hint."""

import json
import sys

import pytest
from typer.testing import CliRunner

from mdlm_cli.cli import app

runner = CliRunner()

DOCS = ["it was the best of times it was the worst of times it was the age of wisdom",
        "the quick brown fox jumps over the lazy dog and the dog sleeps all day",
        "call me ishmael some years ago never mind how long precisely having little money",
        "in a hole in the ground there lived a hobbit"]
TASKS = {
    "t_last_word": """output_type: loglikelihood
doc_to_text: "{{text.split(' ')[:-1]|join(' ')}}"
doc_to_target: "{{' '+text.split(' ')[-1]}}"
metric_list:
  - {metric: perplexity, aggregation: perplexity, higher_is_better: false}
  - {metric: acc, aggregation: mean, higher_is_better: true}
""",
    "t_choice": """output_type: multiple_choice
doc_to_text: "{{text.split(' ')[:-1]|join(' ')}}"
doc_to_choice: "{{[' ' + text.split(' ')[-1], ' the', ' of']}}"
doc_to_target: 0
metric_list:
  - {metric: acc, aggregation: mean, higher_is_better: true}
""",
    "t_rolling": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - {metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
  - {metric: byte_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
""",
    "t_generate": """output_type: generate_until
doc_to_text: "{{text.split(' ')[:-1]|join(' ')}}"
doc_to_target: "{{' '+text.split(' ')[-1]}}"
generation_kwargs: {until: ["the"], max_gen_toks: 6}
metric_list:
  - {metric: exact_match, aggregation: mean, higher_is_better: true}
""",
}


def run(*args, code=0):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def setup(trained_runs):
    """The shared test-size MDLM and AR checkpoints (conftest.trained_runs: root / "mdlm",
    root / "ar") and a folder of local tasks over a JSONL file (root / "tasks")."""
    pytest.importorskip("lm_eval")
    root = trained_runs[0].parent
    tasks = root / "tasks"  # beside the runs, none of which it touches
    tasks.mkdir()
    (tasks / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    for name, body in TASKS.items():
        (tasks / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                            f"    test: {tasks / 'docs.jsonl'}\ntest_split: test\n{body}")
    return root


def test_without_lm_eval_the_command_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    out = run("lm-eval", "--tasks", "lambada_openai", code=1)
    assert 'pip install "mdlm[eval]"' in out and len(out.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mdlm", "ar"])
def test_every_output_type_through_mdlm_lm_eval(setup, name, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    sampler = ["--steps", "4", "--sampler", "ancestral"] if name == "mdlm" else []
    out = run("lm-eval", "-c", str(setup / name), "--tasks", ",".join(TASKS), "--include-path",
              str(setup / "tasks"), "-k", "3", "--batch-size", "3", "--device", "cpu", "--bootstrap-iters", "10",
              "--json", str(tmp_path / "r.json"), *sampler)
    record = json.loads((tmp_path / "r.json").read_text())
    results, summary = record["results"], record["mdlm"]
    exact = name == "ar"
    assert record["exact"] is exact and record["mc_samples"] == (1 if exact else 3)
    assert ("= " if exact else "≤ ") in out
    assert 0 <= results["t_last_word"]["acc,none"] <= 1 and results["t_last_word"]["perplexity,none"] > 1
    assert 0 <= results["t_choice"]["acc,none"] <= 1
    assert results["t_rolling"]["word_perplexity,none"] > 1
    assert isinstance(results["t_generate"]["exact_match,none"], float)
    assert summary["t_last_word"]["loglikelihood"]["requests"] == len(DOCS)
    assert summary["t_choice"]["loglikelihood"]["requests"] == 3 * len(DOCS)
    rolling = summary["t_rolling"]["loglikelihood_rolling"]
    assert rolling["tokens"] == sum(len(d) for d in DOCS)  # characters: every one scored once
    assert (rolling["nats_per_token_se"] == 0) if exact else (rolling["nats_per_token_se"] > 0)
    assert summary["t_last_word"]["loglikelihood"]["dropped_context_tokens"] > 0  # contexts longer than L = 32


@pytest.mark.slow
def test_the_registered_model_through_simple_evaluate_is_exact_for_ar(setup, monkeypatch):
    """`lm_eval.simple_evaluate(model="mdlm", ...)` once the adapter is imported; the AR
    model's per-document log-likelihoods are the scorer's exact values."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    import mdlm_cli.eval.lm_eval.adapter  # noqa: F401 - registers `mdlm`
    from mdlm_cli.checkpoints.load import load_checkpoint
    from mdlm_cli.eval.lm_eval.scoring import ConditionalScorer, encode_pair

    out = lm_eval.simple_evaluate(model="mdlm", model_args=f"checkpoint={setup / 'ar'},batch_size=2",
                                  device="cpu", tasks=["t_last_word"], bootstrap_iters=10, log_samples=True,
                                  task_manager=TaskManager(include_path=str(setup / "tasks"), include_defaults=False))
    loaded = load_checkpoint(setup / "ar")
    for sample in out["samples"]["t_last_word"]:
        text = sample["doc"]["text"]
        context, word = text.rsplit(" ", 1)
        (expected,) = ConditionalScorer(loaded).score([encode_pair(loaded.tokenizer, context, " " + word)])
        assert sample["resps"][0][0][0] == pytest.approx(-expected.nll, rel=1e-5)


def test_rolling_windows_are_lm_evals_own():
    utils = pytest.importorskip("lm_eval.utils")
    from mdlm_cli.eval.lm_eval.scoring import rolling_windows

    for n, max_len, context_len in [(10, 4, 1), (3, 4, 1), (100, 31, 1), (64, 31, 1), (50, 8, 3)]:
        tokens = list(range(1000, 1000 + n))
        theirs = [utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(
            token_list=tokens, prefix_token=-1, max_seq_len=max_len, context_len=context_len)]
        theirs = [(ctx[1:] if i == 0 else ctx, pred) for i, (ctx, pred) in enumerate(theirs)]  # no prefix token
        assert rolling_windows(tokens, max_len, context_len) == theirs


UNSAFE_TASK = """task: t_unsafe
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
test_split: test
unsafe_code: true
output_type: generate_until
doc_to_text: "{{{{text}}}}"
doc_to_target: ""
generation_kwargs: {{until: ["the"], max_gen_toks: 2}}
process_results: !function unsafe_utils.process_results
metric_list:
  - {{metric: code_eval_allowed, aggregation: mean, higher_is_better: true}}
"""
# the metric HumanEval's code_eval would refuse to compute without HF_ALLOW_CODE_EVAL=1
UNSAFE_UTILS = """import os


def process_results(doc, results):
    return {"code_eval_allowed": float(os.environ.get("HF_ALLOW_CODE_EVAL") == "1")}
"""


def test_a_task_that_runs_code_needs_the_flag_and_the_flag_is_all_it_needs(setup, tmp_path,
                                                                           monkeypatch):
    """lm-eval refuses an `unsafe_code` task without confirmation: one line naming the flag.
    With `--confirm-run-unsafe-code` it runs, and the `evaluate` library's code_eval (which
    HumanEval and MBPP score with) finds HF_ALLOW_CODE_EVAL=1 set for it."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)  # restored (removed) afterwards
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "docs.jsonl").write_text(json.dumps({"text": DOCS[0]}) + "\n")
    (tasks / "t_unsafe.yaml").write_text(UNSAFE_TASK.format(docs=tasks / "docs.jsonl"))
    (tasks / "unsafe_utils.py").write_text(UNSAFE_UTILS)
    common = ["lm-eval", "-c", str(setup / "ar"), "--tasks", "t_unsafe", "--include-path",
              str(tasks), "--device", "cpu", "--bootstrap-iters", "10"]
    out = run(*common, code=1)
    error = out.strip().splitlines()[-1]  # after the harness's data-loading progress
    assert error.startswith("error: task t_unsafe") and "--confirm-run-unsafe-code" in error
    assert "Traceback" not in out
    run(*common, "--confirm-run-unsafe-code", "--json", str(tmp_path / "r.json"))
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert results["t_unsafe"]["code_eval_allowed,none"] == 1.0
