"""The commands on the tiny random LLaDA and Dream folders (tests/open_model_folders.py), each
through the CLI: eval-ppl on a local text file, gen-ppl of sample records, bench-sampler,
lm-eval (loglikelihood, multiple choice, generate_until, the chat template)."""

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


def write_tasks(folder, docs: list[str]):
    """Local lm-eval tasks over `docs` (tests/integration/test_lm_eval.py's way, offline): the
    last word scored, picked among three, generated (plain and for the chat template)."""
    folder.mkdir()
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    head = ("dataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {folder / 'docs.jsonl'}\ntest_split: test\n")
    context = "doc_to_text: \"{{text.split(' ')[:-1]|join(' ')}}\"\n"
    bodies = {
        "o_last": context + """output_type: loglikelihood
doc_to_target: "{{' '+text.split(' ')[-1]}}"
metric_list:
  - {metric: perplexity, aggregation: perplexity, higher_is_better: false}
  - {metric: acc, aggregation: mean, higher_is_better: true}
""",
        "o_choice": context + """output_type: multiple_choice
doc_to_choice: "{{[' ' + text.split(' ')[-1], ' w1', ' w2']}}"
doc_to_target: 0
metric_list:
  - {metric: acc, aggregation: mean, higher_is_better: true}
""",
        "o_generate": context + """output_type: generate_until
doc_to_target: "{{text.split(' ')[-1]}}"
generation_kwargs: {until: ["w3"], max_gen_toks: 6}
metric_list:
  - {metric: exact_match, aggregation: mean, higher_is_better: true}
""",
        "o_long": context + """output_type: generate_until
doc_to_target: "{{text.split(' ')[-1]}}"
generation_kwargs: {until: ["\\n\\n"]}
metric_list:
  - {metric: exact_match, aggregation: mean, higher_is_better: true}
"""}
    for name, body in bodies.items():
        (folder / f"{name}.yaml").write_text(f"task: {name}\n{head}{body}")
    return folder


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    rng = random.Random(1)
    docs = [" ".join(f"w{rng.randint(4, 78)}" for _ in range(rng.randint(4, 9))) for _ in range(3)]
    return docs, write_tasks(tmp_path_factory.mktemp("open-tasks") / "tasks", docs)


@pytest.mark.parametrize("family", FAMILIES)
def test_lm_eval_scores_picks_and_generates(folders, tasks, tmp_path, family, monkeypatch):
    """Every request type on the folder; o_long's default 256 new tokens run past the model's
    64 positions (semi-AR). lm-eval's bootstrap forks a pool of workers: the run must end."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    docs, folder = tasks
    out = tmp_path / "r.json"
    invoke("lm-eval", "-c", folders[family], "--tasks", "o_last,o_choice,o_generate,o_long",
           "--include-path", folder, "-k", "2", "--batch-size", "4", "--device", "cpu",
           "--steps", "4", "--sampler", "confidence", "--bootstrap-iters", "10", "--json", out)
    record = json.loads(out.read_text())
    results, summary = record["results"], record["mdlm"]
    assert record["kind"] == "bound" and record["mc_samples"] == 2
    assert results["o_last"]["perplexity,none"] > 1
    assert 0 <= results["o_last"]["acc,none"] <= 1 and 0 <= results["o_choice"]["acc,none"] <= 1
    assert summary["o_last"]["loglikelihood"]["requests"] == len(docs)
    assert summary["o_last"]["loglikelihood"]["tokens"] == len(docs)  # one word each
    assert summary["o_choice"]["loglikelihood"]["requests"] == 3 * len(docs)
    assert math.isfinite(summary["o_choice"]["loglikelihood"]["nats_per_token"])
    for task in ("o_generate", "o_long"):
        assert results[task]["exact_match,none"] in (0.0, 1 / 3, 2 / 3, 1.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_lm_eval_applies_the_chat_template_and_stops_at_end_of_turn(folders, tasks, tmp_path,
                                                                    family, monkeypatch):
    """With --apply-chat-template each context reaches the sampler as the template renders it
    (nothing before it) and the answer ends at the family's end-of-turn token: a generation of
    [answer, end of turn, w3 ...] is exactly the answer; without the flag the context is the
    row start and the plain text, and the end-of-turn token does not end the answer."""
    pytest.importorskip("lm_eval")
    from mdlm_cli.checkpoints.load import load_checkpoint
    from mdlm_cli.eval.lm_eval import adapter

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    docs, folder = tasks
    tok = load_checkpoint(str(folders[family])).tokenizer
    turn_end = tok.hf.convert_tokens_to_ids({"llada": "<|eot_id|>", "dream": "<|im_end|>"}[family])
    answers = {" ".join(d.split()[:-1]): tok.encode(d.split()[-1]) for d in docs}
    seen = []

    def generate(loaded, context, *, start=None, **kwargs):
        seen.append((start, context))
        text = tok.decode(context)
        question = next(q for q in answers if q in text)
        return answers[question] + [turn_end] + tok.encode("w1 w2")

    monkeypatch.setattr(adapter, "generate_after", generate)
    for chat, expected in ((True, 1.0), (False, 0.0)):
        out, seen[:] = tmp_path / f"{chat}.json", []
        flag = ["--apply-chat-template"] if chat else []
        invoke("lm-eval", "-c", folders[family], "--tasks", "o_generate", "--include-path", folder,
               "--device", "cpu", "--bootstrap-iters", "0", "--json", out, *flag)
        record = json.loads(out.read_text())
        assert record["chat_template"] is chat
        assert record["results"]["o_generate"]["exact_match,none"] == expected
        for start, context in seen:
            question = next(q for q in answers if q in tok.decode(context))
            if chat:
                rendered = tok.hf.apply_chat_template([{"role": "user", "content": question}],
                                                      tokenize=False, add_generation_prompt=True)
                assert (start, context) == ([], tok.encode(rendered))
            else:
                assert (start, context) == ([tok.bos_id], tok.encode(question))  # row start
        assert len(seen) == len(docs)


def test_lm_eval_refuses_a_chat_template_the_tokenizer_lacks(tasks, tmp_path):
    pytest.importorskip("lm_eval")
    from .conftest import one_line_error

    folder = write_llada(tmp_path / "llada")
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    del settings["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    error = one_line_error("lm-eval", "-c", folder, "--tasks", "o_generate", "--include-path",
                           tasks[1], "--apply-chat-template", "--device", "cpu")
    assert "--apply-chat-template needs a tokenizer with a chat template" in error


@pytest.fixture(scope="module")
def qa_file(tmp_path_factory):
    """40 prompt/response examples of the folders' words (data/sft.py's format)."""
    rng = random.Random(2)

    def words(n):
        return " ".join(f"w{rng.randint(1, 78)}" for _ in range(n))

    path = tmp_path_factory.mktemp("qa") / "qa.jsonl"
    path.write_text("".join(json.dumps({"prompt": words(rng.randint(3, 9)),
                                        "response": words(rng.randint(1, 6))}) + "\n"
                            for _ in range(40)))
    return path


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_ppl_on_prompt_response_rows_is_conditional(folders, qa_file, tmp_path, family):
    """The bound of the responses given the prompts (tests/unit/test_conditional_ppl.py checks
    its value): per response token, fewer tokens than the whole rows, said in the output."""
    out = tmp_path / "ppl.json"
    text = invoke("eval-ppl", "-c", folders[family], "--dataset", qa_file, "-k", "2",
                  "--split", "train", "--json", out)
    (result,) = json.loads(out.read_text())["results"]
    assert result["conditional"] is True and result["kind"] == "bound"
    assert "qa (conditional)" in text and "-log p(response | prompt)" in text
    examples = [json.loads(line) for line in qa_file.read_text().splitlines()]
    words = sum(len(e["prompt"].split()) + len(e["response"].split()) for e in examples)
    assert 0 < result["tokens"] < words  # responses + EOS of the train split only
    assert math.isfinite(result["nats_per_token"]) and result["nats_per_token"] > 0


def test_a_dit_trained_on_prompt_response_rows_reports_its_conditional_bound(tmp_path):
    """The DiT's own sft data (the embedded corpus' sentence pairs) goes the same way."""
    run = tmp_path / "sft"
    invoke("train", "--preset", "test", "--no-print-config", "--max-steps", "2", "--out", run,
           "--set", "data.dataset=bigtxt-next", "--set", "data.packing=sft",
           "--set", "train.eval_rows=8", "--set", f"data.cache_dir={tmp_path / 'cache'}")
    out = tmp_path / "ppl.json"
    text = invoke("eval-ppl", "-c", run, "--rows", "8", "-k", "2", "--json", out)
    (result,) = json.loads(out.read_text())["results"]
    assert result["conditional"] is True and "conditional, -log p(response | prompt)" in text
    assert math.isfinite(result["nats_per_token"])
