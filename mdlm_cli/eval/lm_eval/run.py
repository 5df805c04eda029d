"""lm-evaluation-harness tasks on a loaded mdlm model (`mdlm lm-eval`): the checks, the
harness's task index, the run, the Monte-Carlo summary per task and the JSON record.

Importing this module does not need lm-eval; `require_lm_eval` says how to install it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ...engine.settings import SamplingSettings
from ...errors import MdlmError

INSTALL_HINT = ('lm-eval is not installed; install it with: pip install "mdlm[eval]" '
                "(or pip install lm-eval)")
DEFAULT_MC_SAMPLES = 4  # a bound's passes per request, where --mc-samples is not given


@dataclass
class LmEvalOptions:
    """What `mdlm lm-eval` asks of the harness and of the mdlm model."""

    tasks: list[str]
    mc_samples: int | None = None  # None: DEFAULT_MC_SAMPLES (an exact likelihood takes one)
    batch_size: int = 16  # rows per forward pass when scoring
    limit: float | None = None  # documents per task: a count, or a fraction below 1
    num_fewshot: int | None = None
    include_path: str | None = None  # a folder of local task YAML files
    seed: int = 0
    sampling: SamplingSettings = field(default_factory=SamplingSettings)  # generate_until's
    stride: int | None = None  # generate_until past the model length: new tokens per block
    # every generation's new tokens (None: the task's max_gen_toks)
    gen_length: int | None = None
    estimator: str | None = None  # the bound's: t or l (None: the model family's own)
    append_eos: bool | None = None  # Dream's clean EOS after each continuation (None: family's)
    tokenizer_bos: bool | None = None  # Dream's bos_token text before each context
    greedy_check: str = "one-call"  # is_greedy: one-call | by-confidence (LLaDA's)
    task_mc_samples: str = ""  # "task=K,...": the tasks whose K is another
    bootstrap_iters: int = 100000
    apply_chat_template: bool = False  # contexts rendered with the tokeniser's chat template
    # the sampling flags for every generation, whatever a task's do_sample and sampling kwargs
    # (Dream's eval.py samples at its own temperature and top_p)
    own_sampling: bool = False
    confirm_run_unsafe_code: bool = False  # lm-eval's: tasks that run generated code (HumanEval)


@dataclass
class LmEvalRun:
    lm: object  # adapter.MdlmLM: its `scores` and settings
    results: dict  # the harness's simple_evaluate output
    summary: dict  # task -> request kind -> scoring.summarise


def require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise MdlmError(INSTALL_HINT) from None


def lm_eval_version() -> str:
    import lm_eval

    return lm_eval.__version__


def check_options(options: LmEvalOptions) -> None:
    """The mistakes found before a model loads."""
    if not options.tasks:
        raise MdlmError("--tasks needs at least one task name")
    if options.limit is not None and options.limit <= 0:
        raise MdlmError(f"--limit must be a positive count or fraction (got {options.limit})")


def unused_flags(objective, options: LmEvalOptions) -> list[str]:
    """Warnings for the flags the model does not read."""
    out = []
    if objective.exact and options.mc_samples is not None:
        out.append(f"--mc-samples {options.mc_samples} does not apply: the {objective.name} "
                   "model's likelihood is exact")
    if objective.causal and options.stride is not None:
        out.append(f"--stride {options.stride} does not apply: the {objective.name} model "
                   "generates left to right")
    return out


def task_manager(names: list[str], include_path: str | None):
    """lm-eval's task index, with the local folder's tasks; every name must be in it."""
    from pathlib import Path

    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        raise MdlmError(f"--include-path {include_path} is not a folder of task YAML files")
    # indexing lm-eval's own ~15k task files takes seconds: skipped when the local folder has
    # every task
    manager = (TaskManager(include_path=include_path, include_defaults=False)
               if include_path else None)
    if manager is None or not set(names) <= set(manager.all_tasks):
        manager = TaskManager(include_path=include_path)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        listing = " --include_path " + include_path if include_path else ""
        raise MdlmError(f"unknown lm-eval task(s): {', '.join(unknown)} (list them with: "
                        f"lm-eval ls tasks{listing})")
    return manager


def run_lm_eval(
    loaded,
    checkpoint: str,
    options: LmEvalOptions,
    *,
    device: str | None,
    warn: Callable[[str], None],
    on_start: Callable[[str], None],
) -> LmEvalRun:
    """Run the tasks on the loaded model: `warn` for each flag it does not read (and the
    adapter's warnings), `on_start` with the line that names the harness and the tasks."""
    import logging

    from .adapter import MdlmLM
    from .model_args import ModelArgs

    for message in unused_flags(loaded.objective, options):
        warn(message)
    mc_samples = DEFAULT_MC_SAMPLES if options.mc_samples is None else options.mc_samples
    args = ModelArgs(checkpoint, mc_samples=mc_samples, batch_size=options.batch_size,
                     device=device, seed=options.seed, stride=options.stride,
                     gen_length=options.gen_length, estimator=options.estimator,
                     append_eos=options.append_eos, tokenizer_bos=options.tokenizer_bos,
                     greedy_check=options.greedy_check, task_mc_samples=options.task_mc_samples,
                     own_sampling=options.own_sampling)
    lm = MdlmLM(args, loaded=loaded, warn=warn, sampling=options.sampling)
    if options.apply_chat_template:
        lm.chat_template(True)  # a tokeniser without a template is refused here, in one line
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    manager = task_manager(options.tasks, options.include_path)
    limit = options.limit
    limit = None if limit is None else (int(limit) if limit >= 1 else limit)
    on_start(f"lm-eval {lm_eval_version()}: {', '.join(options.tasks)}")
    results = evaluate_tasks(lm, options, manager, limit)
    summary = {task: task_summary(scores) for task, scores in lm.scores.items()}
    return LmEvalRun(lm, results, summary)


def evaluate_tasks(lm, options: LmEvalOptions, manager, limit):
    """lm-eval's simple_evaluate, its refusals said in one line. A task that runs the model's
    code (HumanEval, MBPP) needs lm-eval's confirmation and, for the `evaluate` library's
    code_eval metric that scores it, HF_ALLOW_CODE_EVAL=1: the flag gives both."""
    from lm_eval import simple_evaluate

    if options.confirm_run_unsafe_code:
        os.environ.setdefault("HF_ALLOW_CODE_EVAL", "1")
    try:  # the model's progress bars show the work
        return simple_evaluate(model=lm, tasks=options.tasks, num_fewshot=options.num_fewshot,
                               limit=limit, task_manager=manager,
                               bootstrap_iters=options.bootstrap_iters, log_samples=False,
                               confirm_run_unsafe_code=options.confirm_run_unsafe_code,
                               apply_chat_template=options.apply_chat_template)
    except (ConnectionError, OSError) as e:
        raise MdlmError(f"lm-eval could not load a task's data ({type(e).__name__}: {e}); "
                        "the Hub data sets need the network the first time, local tasks "
                        "need their files") from None
    except ValueError as e:
        if "marked as unsafe" not in str(e):
            raise
        task = str(e).split("task: ")[-1].split(" ")[0]  # lm-eval's "...run task: NAME which..."
        raise MdlmError(f"task {task} runs the model's code; add --confirm-run-unsafe-code to "
                        "run it (in a sandbox)") from None


def task_summary(scores) -> dict:
    """One task's Monte-Carlo summary per request kind (loglikelihood, rolling, ...)."""
    from .scoring import summarise

    kinds = sorted({kind for kind, _ in scores})
    return {kind: summarise([s for k, s in scores if k == kind]) for kind in kinds}


def lm_eval_record(loaded, run: LmEvalRun, options: LmEvalOptions, *, raw_weights: bool) -> dict:
    """The JSON record of a run: the checkpoint, how it was scored, the harness's results and
    mdlm's per-task summary."""
    objective, results = loaded.objective, run.results
    return {"checkpoint": str(loaded.path), "objective": objective.name,
            "exact": objective.exact, "kind": "exact" if objective.exact else "bound",
            "weights": "raw" if raw_weights else "ema", "mc_samples": run.lm.mc_samples,
            "batch_size": options.batch_size, "seed": options.seed,
            "sampler": run.lm.generation.sampler, "chat_template": options.apply_chat_template,
            "results": results["results"],
            "mdlm": run.summary, "n-samples": results.get("n-samples"),
            "versions": results.get("versions"), "lm_eval_version": lm_eval_version()}
