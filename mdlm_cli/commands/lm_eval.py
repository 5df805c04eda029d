"""`mdlm lm-eval`: EleutherAI's lm-evaluation-harness on an mdlm checkpoint (the run is
`eval.lm_eval.run`), and `mdlm lm-eval-tasks`: local tasks from a data set."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from .app import app
from .console import console, say, user_errors, warn
from .loading import ModelLoading, loading_command, loading_from
from .options import CheckpointOpt, DatasetOpt, JsonOpt, SeedOpt, float_in
from .sampling_args import SamplingCommand, sampling_from

# metrics computed from log-likelihoods: for a bound on -log p they are upper bounds
LIKELIHOOD_METRICS = ("perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte")

LmEvalTasksOpt = Annotated[str, typer.Option(
    help="Comma-separated lm-eval tasks, e.g. lambada_openai,wikitext.")]
LmEvalMcSamplesOpt = Annotated[int | None, typer.Option(
    "--mc-samples", "-k",
    help="Monte-Carlo passes per request for a bound (default 4), times stratified per request; "
         "K >= 2 gives a standard error. Exact likelihoods take one pass.")]
LmEvalBatchSizeOpt = Annotated[int, typer.Option(help="Rows per forward pass when scoring.")]
LimitOpt = Annotated[float | None, typer.Option(
    help="Documents per task: a count, or a fraction below 1 (lm-eval's --limit).",
    callback=float_in(0, low_in=False))]
FewshotOpt = Annotated[int | None, typer.Option(help="Few-shot examples in each context.")]
IncludePathOpt = Annotated[str | None, typer.Option(
    help="A folder of task YAML files (local tasks) to add to lm-eval's own.")]
LmEvalStrideOpt = Annotated[int | None, typer.Option(
    help="generate_until past the model length: new tokens per semi-AR block (default: half the "
         "window).")]
GenLengthOpt = Annotated[int | None, typer.Option(
    help="New tokens of every generate_until request, whatever the task's max_gen_toks (as "
         "LLaDA's and Dream's lm-eval runs fix gen_length, with --steps and --block-length); "
         "default: the task's.", min=1)]
EstimatorOpt = Annotated[str | None, typer.Option(
    help="How a diffusion model's bound is estimated: t (K times stratified over [0, 1)) or l "
         "(K masked counts stratified over 1..n, LLaDA's get_log_likelihood: exact in one pass "
         "for a one-token continuation). Default: the model family's (l for LLaDA, else t).")]
AppendEosOpt = Annotated[bool | None, typer.Option(
    "--append-eos/--no-append-eos",
    help="Score each continuation with a clean EOS after it (attended, never masked nor "
         "scored), as Dream's evaluation does. Default: the model family's (on for Dream).")]
TokenizerBosOpt = Annotated[bool | None, typer.Option(
    "--tokenizer-bos/--no-tokenizer-bos",
    help="Put the tokeniser's own bos_token text before each context instead of the row start "
         "(Dream's evaluation). Default: the model family's (on for Dream).")]
GreedyCheckOpt = Annotated[str, typer.Option(
    help="is_greedy (LAMBADA's accuracy) of a diffusion model: one-call (the argmax at every "
         "position with the whole continuation masked) or by-confidence (one token a call, "
         "the most confident first: LLaDA's suffix_greedy_prediction).")]
TaskMcSamplesOpt = Annotated[str, typer.Option(
    help="The Monte-Carlo passes of the tasks that take another K than --mc-samples, as "
         "task=K,task=K (e.g. mmlu=1,cmmlu=1 beside --mc-samples 128, as LLaDA's runs).")]
ChatTemplateOpt = Annotated[bool, typer.Option(
    "--apply-chat-template",
    help="Render each context with the tokenizer's chat template (lm-eval's "
         "--apply_chat_template); generations also stop at its end-of-turn token.")]
OwnSamplingOpt = Annotated[bool, typer.Option(
    "--own-sampling",
    help="Draw every generation with the sampling flags (--temperature, --top-p, --top-k), a "
         "task's do_sample and sampling kwargs ignored, as Dream's evaluation samples.")]
UnsafeCodeOpt = Annotated[bool, typer.Option(
    "--confirm-run-unsafe-code",
    help="Let tasks that execute the model's code run (HumanEval, MBPP: lm-eval's "
         "confirm_run_unsafe_code, and HF_ALLOW_CODE_EVAL=1 for code_eval); run them in a "
         "sandbox.")]
BootstrapOpt = Annotated[int, typer.Option(
    help="lm-eval's bootstrap resamples for metric stderrs.")]
OutFolderOpt = Annotated[str, typer.Option(
    help="Folder to write the task YAML and JSONL files into.")]
LmEvalSplitOpt = Annotated[str, typer.Option(help="test | valid | train.")]
WordsOpt = Annotated[int, typer.Option(
    help="Words per last-word passage (about; it ends on a real word).")]
PassagesOpt = Annotated[int, typer.Option(
    help="Last-word passages to keep (0 = all of the split).")]


@app.command("lm-eval", cls=loading_command(SamplingCommand))
def lm_eval_cmd(
    *,
    tasks: LmEvalTasksOpt,
    mc_samples: LmEvalMcSamplesOpt = None,
    batch_size: LmEvalBatchSizeOpt = 16,
    limit: LimitOpt = None,
    num_fewshot: FewshotOpt = None,
    include_path: IncludePathOpt = None,
    json_out: JsonOpt = None,
    seed: SeedOpt = 0,
    ctx: typer.Context,
    stride: LmEvalStrideOpt = None,
    gen_length: GenLengthOpt = None,
    estimator: EstimatorOpt = None,
    append_eos: AppendEosOpt = None,
    tokenizer_bos: TokenizerBosOpt = None,
    greedy_check: GreedyCheckOpt = "one-call",
    task_mc_samples: TaskMcSamplesOpt = "",
    bootstrap_iters: BootstrapOpt = 100000,
    apply_chat_template: ChatTemplateOpt = False,
    own_sampling: OwnSamplingOpt = False,
    confirm_run_unsafe_code: UnsafeCodeOpt = False,
) -> None:
    """Run lm-evaluation-harness tasks: multiple choice, LAMBADA, and the perplexity tasks.

    loglikelihood is exact for AR checkpoints and the conditional NELBO for diffusion ones
    (continuation masked, context clean; K passes); loglikelihood_rolling is the whole
    document's bound over rolling windows of the model length, so word/byte perplexities
    are upper bounds (≤); generate_until samples after the context with the sampling flags
    (--sampler, --steps, the sampler's options; a task's own temperature, top-p and top-k
    win unless --own-sampling). Contexts longer than the model length are truncated from the
    left.

    [dim]Examples:[/]
      mdlm lm-eval --checkpoint runs/owt --tasks lambada_openai --mc-samples 8
      mdlm lm-eval --checkpoint runs/owt --tasks wikitext,lambada_openai --json zs.json
      mdlm lm-eval --checkpoint runs/demo --tasks my_task --include-path my_tasks/ --limit 100
      mdlm lm-eval -c GSAI-ML/LLaDA-8B-Instruct --tasks gsm8k --apply-chat-template --steps 256
      mdlm lm-eval -c GSAI-ML/LLaDA-8B-Base --tasks gsm8k --gen-length 256 --block-length 32
    """
    from ..eval.lm_eval.run import check_options, require_lm_eval, run_lm_eval

    sampling, loading = sampling_from(ctx), loading_from(ctx)
    with user_errors():
        require_lm_eval()
        options = _options(ctx.params, sampling)
        check_options(options)
        loaded, _ = loading.load()
        run = run_lm_eval(loaded, loading.checkpoint, options, device=loading.device, warn=warn,
                          on_start=say)
        _print(run.results["results"], run.summary, run.lm)
        if json_out:
            _write_json(json_out, loaded, run, options, loading.raw_weights)


def _options(params: dict, sampling):
    """LmEvalOptions from the command's own values (the loading and sampling groups are taken
    out before): the fields of the same name, the task list split."""
    import dataclasses

    from ..eval.lm_eval.run import LmEvalOptions

    same = {f.name for f in dataclasses.fields(LmEvalOptions)} & set(params)
    tasks = [t.strip() for t in params["tasks"].split(",") if t.strip()]
    return LmEvalOptions(**{k: params[k] for k in same - {"tasks", "sampling"}}, tasks=tasks,
                         sampling=sampling)


def _write_json(path: str, loaded, run, options, raw_weights: bool) -> None:
    from pathlib import Path

    from ..eval.lm_eval.run import lm_eval_record

    record = lm_eval_record(loaded, run, options, raw_weights=raw_weights)
    Path(path).write_text(json.dumps(record, indent=2, default=str))
    console.print(f"Wrote {path}", markup=False)


def _print(results: dict, summary: dict, lm) -> None:
    exact = lm.loaded.objective.exact
    rel = "=" if exact else "≤"
    table = Table("task", "metric", "value", "stderr (docs)", box=None)
    for task, metrics in results.items():
        for key, value in metrics.items():
            metric, comma, _filter = key.partition(",")  # "acc,none": metric, filter
            if not comma or metric.endswith("_stderr") or not isinstance(value, float | int):
                continue
            stderr = metrics.get(f"{metric}_stderr,{_filter}")
            shown = f"{rel} {value:.4f}" if metric in LIKELIHOOD_METRICS else f"{value:.4f}"
            shown_se = f"{stderr:.4f}" if isinstance(stderr, float) else ""
            table.add_row(Text(task), metric, shown, shown_se)
    console.print(table)
    mc = Table("task", "requests", "tokens", "nats/token", "MC SE", "K", box=None)
    for task, kinds in summary.items():
        for kind, s in kinds.items():
            se = s["nats_per_token_se"]
            se = "exact" if exact else ("n/a" if se is None else f"{se:.4f}")
            mc.add_row(Text(f"{task} ({kind})"), str(s["requests"]), f"{s['tokens']:,}",
                       f"{rel} {s['nats_per_token']:.4f}", se,
                       "-" if exact else str(lm.mc_samples))
    if summary:
        console.print(mc)
    if exact:
        console.print(f"[dim]= exact likelihoods of the {lm.loaded.objective.name} model[/]")
    else:
        console.print("[dim]≤ the diffusion model's log-likelihoods are NELBO bounds (K "
                      "passes per request, times stratified); MC SE = the Monte-Carlo "
                      "standard error of nats/token (sd of a request's passes / sqrt(K), "
                      "summed over requests as variances); is_greedy and acc: the argmax at "
                      "the fully masked continuation[/]")


@app.command("lm-eval-tasks")
def lm_eval_tasks_cmd(
    out: OutFolderOpt,
    checkpoint: CheckpointOpt = "runs/demo",
    dataset: DatasetOpt = None,
    split: LmEvalSplitOpt = "test",
    words: WordsOpt = 40,
    passages: PassagesOpt = 0,
) -> None:
    """Write two local lm-eval tasks from a data set, offline for the embedded corpus.

    NAME_lastword: LAMBADA's recipe (lm-eval's lambada_openai: accuracy and perplexity of
    each passage's last word given the rest). NAME_rolling: whole documents, word/byte
    perplexity (lm-eval's wikitext recipe). Text is written as the checkpoint's tokeniser
    reads it (text8 characters for a character-level model).

    [dim]Examples:[/]
      mdlm lm-eval-tasks --checkpoint runs/demo --out tasks/
      mdlm lm-eval --checkpoint runs/demo --tasks bigtxt_lastword,bigtxt_rolling \\
          --include-path tasks/
    """
    from ..eval.lm_eval.tasks import write_tasks

    with user_errors():
        loaded, _ = ModelLoading(checkpoint, device="cpu").load()  # its config and tokeniser
        rows = write_tasks(out, dataset=dataset or loaded.config.data.dataset, split=split,
                           char_level=loaded.tokenizer.is_character_level, words=words,
                           passages=passages)
        for name, n in rows.items():
            console.print(f"{name}: {n} rows", markup=False)
        console.print(f"Wrote {len(rows)} tasks to {out}; run them with --include-path {out}",
                      markup=False)
