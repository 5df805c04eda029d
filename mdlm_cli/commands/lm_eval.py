"""`mdlm lm-eval`: EleutherAI's lm-evaluation-harness on an mdlm checkpoint."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ..errors import MdlmError
from .common import (
    CheckpointOpt,
    DeviceOpt,
    RawWeightsOpt,
    SamplerOpt,
    SeedOpt,
    StepsOpt,
    app,
    console,
    err_console,
    float_in,
    load_for_command,
    user_errors,
    warn,
)

INSTALL_HINT = 'lm-eval is not installed; install it with: pip install "mdlm[eval]" (or pip install lm-eval)'
# metrics computed from log-likelihoods: for a bound on -log p they are upper bounds
LIKELIHOOD_METRICS = ("perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte")


@app.command("lm-eval")
def lm_eval_cmd(
    tasks: Annotated[str, typer.Option(help="Comma-separated lm-eval tasks, e.g. lambada_openai,wikitext.")],
    checkpoint: CheckpointOpt = "runs/demo",
    mc_samples: Annotated[int | None, typer.Option(
        "--mc-samples", "-k", help="Monte-Carlo passes per request for a bound (default 4), times stratified "
        "per request; K >= 2 gives a standard error. Exact likelihoods take one pass.")] = None,
    batch_size: Annotated[int, typer.Option(help="Rows per forward pass when scoring.")] = 16,
    limit: Annotated[float | None, typer.Option(
        help="Documents per task: a count, or a fraction below 1 (lm-eval's --limit).",
        callback=float_in(0, low_in=False))] = None,
    num_fewshot: Annotated[int | None, typer.Option(help="Few-shot examples in each context.")] = None,
    include_path: Annotated[str | None, typer.Option(
        help="A folder of task YAML files (local tasks) to add to lm-eval's own.")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    device: DeviceOpt = None, seed: SeedOpt = 0,
    sampler: SamplerOpt = None, steps: StepsOpt = None,
    stride: Annotated[int | None, typer.Option(
        help="generate_until past the model length: new tokens per semi-AR block (default: half the window).")] = None,
    bootstrap_iters: Annotated[int, typer.Option(help="lm-eval's bootstrap resamples for metric stderrs.")] = 100000,
    raw_weights: RawWeightsOpt = False,
) -> None:
    """Run lm-evaluation-harness tasks: multiple choice, LAMBADA, and the perplexity tasks.

    loglikelihood is exact for AR checkpoints and the conditional NELBO for diffusion ones
    (continuation masked, context clean; K passes); loglikelihood_rolling is the whole
    document's bound over rolling windows of the model length, so word/byte perplexities
    are upper bounds (≤); generate_until samples after the context with --sampler.
    Contexts longer than the model length are truncated from the left.

    [dim]Examples:[/]
      mdlm lm-eval --checkpoint runs/owt --tasks lambada_openai --mc-samples 8
      mdlm lm-eval --checkpoint runs/owt --tasks wikitext,lambada_openai --json zs.json
      mdlm lm-eval --checkpoint runs/demo --tasks my_task --include-path my_tasks/ --limit 100
    """
    with user_errors():
        try:
            import lm_eval  # noqa: F401
        except ImportError:
            raise MdlmError(INSTALL_HINT) from None
        names = [t.strip() for t in tasks.split(",") if t.strip()]
        if not names:
            raise MdlmError("--tasks needs at least one task name")
        if limit is not None and limit <= 0:
            raise MdlmError(f"--limit must be a positive count or fraction (got {limit})")
        loaded, _ = load_for_command(checkpoint, device, raw_weights)
        objective = loaded.objective
        _warn_unused(objective, mc_samples, stride)
        lm = _model(loaded, checkpoint, 4 if mc_samples is None else mc_samples, batch_size, device, seed, sampler,
                    steps, stride)
        results = _evaluate(lm, names, include_path, num_fewshot, limit, bootstrap_iters)
        summary = {task: _task_summary(scores) for task, scores in lm.scores.items()}
        _print(results["results"], summary, lm)
        if json_out:
            _write_json(json_out, loaded, lm, results, summary, raw_weights=raw_weights, batch_size=batch_size,
                        seed=seed)


def _warn_unused(objective, mc_samples: int | None, stride: int | None) -> None:
    if objective.exact and mc_samples is not None:
        warn(f"--mc-samples {mc_samples} does not apply: the {objective.name} model's likelihood is exact")
    if objective.causal and stride is not None:
        warn(f"--stride {stride} does not apply: the {objective.name} model generates left to right")


def _write_json(path: str, loaded, lm, results: dict, summary: dict, *, raw_weights: bool, batch_size: int,
                seed: int) -> None:
    from pathlib import Path

    import lm_eval

    objective = loaded.objective
    record = {"checkpoint": str(loaded.path), "objective": objective.name, "exact": objective.exact,
              "kind": "exact" if objective.exact else "bound", "weights": "raw" if raw_weights else "ema",
              "mc_samples": lm.mc_samples, "batch_size": batch_size, "seed": seed, "sampler": lm.generation.sampler,
              "results": results["results"], "mdlm": summary, "n-samples": results.get("n-samples"),
              "versions": results.get("versions"), "lm_eval_version": lm_eval.__version__}
    Path(path).write_text(json.dumps(record, indent=2, default=str))
    console.print(f"Wrote {path}", markup=False)


def _model(loaded, checkpoint, mc_samples, batch_size, device, seed, sampler, steps, stride):
    from ..eval.lm_eval.adapter import MdlmLM

    return MdlmLM(checkpoint, mc_samples=mc_samples, batch_size=batch_size, device=device, seed=seed,
                  sampler=sampler, steps=steps, stride=stride, loaded=loaded, warn=warn)


def _evaluate(lm, names: list[str], include_path: str | None, num_fewshot: int | None, limit: float | None,
              bootstrap_iters: int) -> dict:
    import logging

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    if include_path is not None:
        from pathlib import Path

        if not Path(include_path).is_dir():
            raise MdlmError(f"--include-path {include_path} is not a folder of task YAML files")
    # indexing lm-eval's own ~15k task files takes seconds: skipped when the local folder has every task
    manager = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if manager is None or not set(names) <= set(manager.all_tasks):
        manager = TaskManager(include_path=include_path)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise MdlmError(f"unknown lm-eval task(s): {', '.join(unknown)} (list them with: lm-eval ls tasks"
                        f"{' --include_path ' + include_path if include_path else ''})")
    limit = None if limit is None else (int(limit) if limit >= 1 else limit)
    err_console.print(f"lm-eval {lm_eval_version()}: {', '.join(names)}", markup=False, highlight=False)
    try:  # the model's progress bars show the work
        return simple_evaluate(model=lm, tasks=names, num_fewshot=num_fewshot, limit=limit, task_manager=manager,
                               bootstrap_iters=bootstrap_iters, log_samples=False)
    except (ConnectionError, OSError) as e:
        raise MdlmError(f"lm-eval could not load a task's data ({type(e).__name__}: {e}); the Hub data sets "
                        "need the network the first time, local tasks need their files") from None


def lm_eval_version() -> str:
    import lm_eval

    return lm_eval.__version__


def _task_summary(scores) -> dict:
    from ..eval.lm_eval.scoring import summarise

    kinds = sorted({kind for kind, _ in scores})
    return {kind: summarise([s for k, s in scores if k == kind]) for kind in kinds}


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
            table.add_row(Text(task), metric, shown, "" if not isinstance(stderr, float) else f"{stderr:.4f}")
    console.print(table)
    mc = Table("task", "requests", "tokens", "nats/token", "MC SE", "K", box=None)
    for task, kinds in summary.items():
        for kind, s in kinds.items():
            se = "exact" if exact else ("n/a" if s["nats_per_token_se"] is None else f"{s['nats_per_token_se']:.4f}")
            mc.add_row(Text(f"{task} ({kind})"), str(s["requests"]), f"{s['tokens']:,}",
                       f"{rel} {s['nats_per_token']:.4f}", se, "-" if exact else str(lm.mc_samples))
    if summary:
        console.print(mc)
    if exact:
        console.print(f"[dim]= exact likelihoods of the {lm.loaded.objective.name} model[/]")
    else:
        console.print("[dim]≤ the diffusion model's log-likelihoods are NELBO bounds (K passes per request, times "
                      "stratified); MC SE = the Monte-Carlo standard error of nats/token (sd of a request's passes "
                      "/ sqrt(K), summed over requests as variances); is_greedy and acc: the argmax at the fully "
                      "masked continuation[/]")


@app.command("lm-eval-tasks")
def lm_eval_tasks_cmd(
    out: Annotated[str, typer.Option(help="Folder to write the task YAML and JSONL files into.")],
    checkpoint: CheckpointOpt = "runs/demo",
    dataset: Annotated[str | None, typer.Option(
        help="Data set name or local text path (default: the checkpoint's own data).")] = None,
    split: Annotated[str, typer.Option(help="test | valid | train.")] = "test",
    words: Annotated[int, typer.Option(help="Words per last-word passage (about; it ends on a real word).")] = 40,
    passages: Annotated[int, typer.Option(help="Last-word passages to keep (0 = all of the split).")] = 0,
) -> None:
    """Write two local lm-eval tasks from a data set, offline for the embedded corpus.

    NAME_lastword: LAMBADA's recipe (lm-eval's lambada_openai: accuracy and perplexity of
    each passage's last word given the rest). NAME_rolling: whole documents, word/byte
    perplexity (lm-eval's wikitext recipe). Text is written as the checkpoint's tokeniser
    reads it (text8 characters for a character-level model).

    [dim]Examples:[/]
      mdlm lm-eval-tasks --checkpoint runs/demo --out tasks/
      mdlm lm-eval --checkpoint runs/demo --tasks bigtxt_lastword,bigtxt_rolling --include-path tasks/
    """
    from ..eval.lm_eval.tasks import write_tasks

    with user_errors():
        loaded, _ = load_for_command(checkpoint, "cpu", False)
        rows = write_tasks(out, dataset=dataset or loaded.config.data.dataset, split=split,
                           char_level=loaded.tokenizer.is_character_level, words=words, passages=passages)
        for name, n in rows.items():
            console.print(f"{name}: {n} rows", markup=False)
        console.print(f"Wrote {len(rows)} tasks to {out}; run them with --include-path {out}", markup=False)
