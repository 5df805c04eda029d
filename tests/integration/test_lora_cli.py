"""LoRA from the CLI (docs/finetuning.md): `mdlm train --set train.init_from=BASE --set
lora.rank=R` trains adapters only, saves them in peft's folder format, resumes exactly; the run
and `--adapter FOLDER` on its base load in every command with the same numbers; bad input is
one line with nothing written."""

import json

import pytest
from safetensors.torch import load_file

from tests.open_model_folders import write_dream, write_llada

from .conftest import invoke, one_line_error

pytest.importorskip("peft")

# the base's data (the test preset's), checkpoints every 2 steps
TRAIN = ["train", "--preset", "test", "--no-print-config", "--set", "train.save_every=2",
         "--set", "train.eval_rows=16", "--set", "train.log_every=1"]
LORA = ["--set", "lora.rank=4", "--set", "lora.alpha=8", "--set", "optim.lr=1e-2",
        "--set", "optim.warmup_steps=1"]


def losses(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], round(r["loss"], 6)) for r in lines if "loss" in r]


@pytest.fixture(scope="module")
def lora_run(trained_runs, tmp_path_factory):
    _, base = trained_runs
    run = tmp_path_factory.mktemp("lora") / "run"
    invoke(*TRAIN, "--out", run, "--max-steps", "4", "--set", f"train.init_from={base}",
           *LORA)
    return base, run


def test_a_lora_run_saves_the_adapter_only_and_resumes_exactly(lora_run, tmp_path):
    base, run = lora_run
    step = run / "checkpoints" / "step-00000004"
    assert not (step / "model.safetensors").exists() and not (step / "ema.safetensors").exists()
    for name in ("adapter", "adapter-ema"):
        assert (step / name / "adapter_config.json").is_file()
        keys = list(load_file(step / name / "adapter_model.safetensors"))
        assert keys and all(k.startswith("base_model.model.blocks.") and ".lora_" in k
                            for k in keys)
    meta = json.loads((step / "model.json").read_text())
    assert meta["adapter"] and meta["trainable_parameters"] < meta["parameters"] / 5
    split = tmp_path / "split"
    args = [*TRAIN, "--out", split, "--set", f"train.init_from={base}", *LORA]
    invoke(*args, "--max-steps", "2")
    assert "Resumed from" in invoke(*args, "--max-steps", "4", "--resume")
    assert losses(split) == losses(run)  # the adapter, its EMA and the optimizer came back


def test_the_run_and_adapter_on_its_base_evaluate_the_same(lora_run, tmp_path):
    base, run = lora_run
    ema = run / "checkpoints" / "step-00000004" / "adapter-ema"
    bounds = {}
    for name, args in {"run": ["-c", run], "adapter": ["-c", base, "--adapter", ema],
                       "base": ["-c", base]}.items():
        out = tmp_path / f"{name}.json"
        invoke("eval-ppl", *args, "--split", "valid", "--rows", "16", "--json", out)
        bounds[name] = [{k: v for k, v in r.items() if k != "seconds"}
                        for r in json.loads(out.read_text())["results"]]
    assert bounds["run"] == bounds["adapter"]
    assert bounds["run"] != bounds["base"]  # the adapter was trained


@pytest.mark.parametrize("command", [
    ["sample", "--num-samples", "1", "--steps", "4"],
    ["semi-ar", "--num-samples", "1", "--steps", "4", "--length", "48", "--stride", "16"],
    ["gen-ppl", "--sample-first", "--num-samples", "1", "--steps", "4", "--judge", "AR"],
    ["bench-sampler", "--num-samples", "1", "--steps", "4", "--repeats", "1"],
])
def test_every_command_takes_the_adapter(lora_run, trained_runs, command):
    base, run = lora_run
    ema = run / "checkpoints" / "step-00000004" / "adapter-ema"
    args = [str(trained_runs[0]) if a == "AR" else a for a in command]  # the AR run judges
    invoke(*args, "-c", base, "--adapter", ema)


def test_bad_lora_input_is_one_line_and_writes_nothing(lora_run, trained_runs, tmp_path,
                                                       train_args):
    base, run = lora_run
    ar, _ = trained_runs
    ema = run / "checkpoints" / "step-00000004" / "adapter-ema"
    out = tmp_path / "never"
    assert "set train.init_from" in one_line_error(*train_args, "--out", out, *LORA)
    assert "needs a CUDA GPU" in one_line_error(
        *train_args, "--out", out, "--set", f"train.init_from={base}", *LORA,
        "--set", "lora.quantize=4bit")
    assert "applies to LoRA runs only" in one_line_error(
        *train_args, "--out", out, "--set", "lora.targets=[attn_qkv]")
    assert not out.exists()
    assert "adapter for another base" in one_line_error("eval-ppl", "-c", ar, "--adapter", ema)
    assert "pass it as --adapter" in one_line_error("eval-ppl", "-c", ema)
    assert "not a LoRA adapter folder" in one_line_error("eval-ppl", "-c", base,
                                                         "--adapter", base)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_lora_fine_tunes_an_open_model_folder_and_the_run_chats(tmp_path, family):
    folder = (write_llada if family == "llada" else write_dream)(tmp_path / family)
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"prompt": "w1 w2", "response": f"w{i} w3"}) + "\n"
                          for i in range(4, 12)) * 3)
    run = tmp_path / "run"
    text = invoke("train", "--preset", "open-sft", "--no-print-config", "--set",
                  f"train.init_from={folder}", "--set", f"data.dataset={qa}",
                  "--set", f"data.cache_dir={tmp_path / 'cache'}", "--max-steps", "2",
                  "--out", run, "--set", "lora.rank=2", "--set", "train.ema=0.9")
    assert "LoRA: rank 2" in text
    step = run / "checkpoints" / "step-00000002"
    assert (step / "adapter-ema" / "adapter_model.safetensors").is_file()
    assert not (step / "model.safetensors").exists()
    invoke("sample", "-c", run, "--chat", "hi", "--max-new-tokens", "4", "--steps", "4",
           "-n", "1")
    invoke("sample", "-c", folder, "--adapter", step / "adapter", "--chat", "hi",
           "--max-new-tokens", "4", "--steps", "4", "-n", "1")


def test_export_merges_the_adapter_and_checks_it_against_the_unmerged_model(lora_run, tmp_path):
    base, run = lora_run
    text = " ".join(invoke("export", "-c", run, "--out", tmp_path / "merged").split())
    assert "the merged adapter gives the unmerged model's logits" in text
    adapter = run / "checkpoints" / "step-00000004" / "adapter"
    invoke("export", "-c", base, "--merge-adapter", adapter, "--out", tmp_path / "given")
    bounds = []
    for folder in (tmp_path / "merged", run):
        out = tmp_path / f"{folder.name}.json"
        invoke("eval-ppl", "-c", folder, "--split", "valid", "--rows", "16", "--json", out)
        bounds.append(json.loads(out.read_text())["results"][0]["nats_per_token"])
    assert bounds[0] == pytest.approx(bounds[1], abs=1e-5)  # the export is the run's model


@pytest.mark.parametrize("objective", [
    ["--set", "diffusion.objective=bd3lm", "--set", "diffusion.block_size=8"],
    ["--set", "diffusion.objective=sedd", "--set", "model.time_conditioning=true"],
    ["--set", "diffusion.objective=ar"],
])
def test_lora_trains_every_objective_of_the_dit(tmp_path, objective):
    """BD3-LM's x_t ⊕ x_0 pass, SEDD's scores and the AR baseline train through the same
    adapters; the LoRA run evaluates and samples from its own folder."""
    base, run = tmp_path / "base", tmp_path / "lora"
    short = [*TRAIN, "--max-steps", "2", *objective]
    invoke(*short, "--out", base)
    invoke(*short, "--out", run, "--set", f"train.init_from={base}", *LORA)
    assert (run / "checkpoints" / "step-00000002" / "adapter" / "adapter_config.json").is_file()
    invoke("eval-ppl", "-c", run, "--split", "valid", "--rows", "8")
    invoke("sample", "-c", run, "--num-samples", "1", "--steps", "4")


@pytest.mark.slow
def test_the_server_serves_an_adapter_as_the_run_it_came_from(lora_run, tmp_path):
    """`mdlm serve -c BASE --adapter A` answers a seeded completion with the tokens the LoRA run
    itself gives (`-c RUN`), and unlike the base alone."""
    from .test_serve import free_port, request, start_server, stop_server, wait_healthy

    base, run = lora_run
    ema = run / "checkpoints" / "step-00000004" / "adapter-ema"
    body = json.dumps({"prompt": "the ", "max_tokens": 12, "seed": 3, "steps": 12,
                       "sampler": "ancestral"}).encode()
    texts = {}
    for name, args in {"adapter": [base, "--adapter", str(ema)], "run": [run],
                       "base": [base]}.items():
        port, log = free_port(), tmp_path / f"{name}.log"
        proc = start_server(args[0], port, *args[1:], "--precision", "fp32", log=log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, log)
            status, out = request(f"{url}/v1/completions", body, key=None)
            assert status == 200, out
            texts[name] = out["choices"][0]["text"]
        finally:
            stop_server(proc)
    assert texts["adapter"] == texts["run"]
    assert texts["adapter"] != texts["base"]


@pytest.mark.slow
def test_lm_eval_takes_the_adapter_as_a_model_arg_and_a_flag(lora_run, tmp_path, monkeypatch):
    """lm-eval's registered model with `adapter=` scores as the LoRA run does, and so does
    `mdlm lm-eval --adapter`; the base alone scores otherwise."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    import mdlm_cli.eval.lm_eval.adapter  # noqa: F401 - registers `mdlm`

    from .test_lm_eval import DOCS, TASKS

    base, run = lora_run
    ema = run / "checkpoints" / "step-00000004" / "adapter-ema"
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    (tasks / "t_last_word.yaml").write_text(
        f"task: t_last_word\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tasks / 'docs.jsonl'}\ntest_split: test\n{TASKS['t_last_word']}")
    manager = TaskManager(include_path=str(tasks), include_defaults=False)

    def scores(model_args: str) -> list[float]:
        out = lm_eval.simple_evaluate(model="mdlm", model_args=model_args, device="cpu",
                                      tasks=["t_last_word"], bootstrap_iters=0, log_samples=True,
                                      task_manager=manager)
        return [s["resps"][0][0][0] for s in out["samples"]["t_last_word"]]

    common = "mc_samples=2,batch_size=2,seed=0"
    adapted = scores(f"checkpoint={base},adapter={ema},{common}")
    assert adapted == scores(f"checkpoint={run},{common}")
    assert adapted != scores(f"checkpoint={base},{common}")
    flags = ["--tasks", "t_last_word", "--include-path", tasks, "-k", "2", "--batch-size", "2",
             "--device", "cpu", "--bootstrap-iters", "0"]
    for name, args in {"adapter": ["-c", base, "--adapter", ema], "run": ["-c", run]}.items():
        invoke("lm-eval", *args, *flags, "--json", tmp_path / f"{name}.json")
    perplexity = {name: json.loads((tmp_path / f"{name}.json").read_text())["results"]
                  ["t_last_word"]["perplexity,none"] for name in ("adapter", "run")}
    assert perplexity["adapter"] == perplexity["run"]
