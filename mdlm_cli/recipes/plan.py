"""From a recipe to the ordered commands that run it: one training job per model the selected
rows need, then each row's steps. A job is done when its output exists, so re-running resumes."""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..build import resolve_config
from ..errors import MdlmError
from .schema import Model, Recipe, Row, Step

# --scale tiny: the test-size model on short rows and few steps, a smoke run of the plumbing
TINY_MODEL = [
    "model.hidden_size=64",
    "model.n_blocks=2",
    "model.n_heads=2",
    "model.cond_dim=32",
    "data.length=32",
    "train.global_batch_size=16",
    "train.micro_batch_size=8",
    "train.eval_every=1000",
    "train.save_every=1000",
    "train.eval_rows=32",
    "data.max_eval_rows=256",  # the final validation of a smoke run: a moment, not 9,257 rows
    "optim.warmup_steps=2",
    "train.time_budget=0",  # the demo's: a tiny run takes its steps, not minutes
    "train.compile=false",
]
TINY_STEPS = 6
TINY_GEN_LENGTH = 8  # lm-eval's --gen-length at --scale tiny: a few tokens of a tiny window
TINY_ARGS = {
    "eval-ppl": {"rows": 32},
    "gen-ppl": {"num-samples": 2},
    "sample": {"num-samples": 2},
    "semi-ar": {"num-samples": 1},
    "bench-sampler": {"num-samples": 1, "repeats": 1, "batch-size": "1"},
    "classify": {"seeds": "1", "epochs": 1},
    "lm-eval": {"limit": 4},
    "glue": {"max-train-rows": 32, "max-eval-rows": 32, "epochs": 1},
}
OUTPUT_FLAG = {
    "eval-ppl": ("json", ".json"),
    "gen-ppl": ("json", ".json"),
    "bench-sampler": ("json", ".json"),
    "sample": ("out", ".jsonl"),
    "semi-ar": ("out", ".jsonl"),
    "classify": ("json", ".json"),
    "glue": ("json", ".json"),
    "lm-eval": ("json", ".json"),
}


@dataclass
class Job:
    kind: str  # "train" | "step"
    name: str  # model key, or row name / step index
    argv: list[str]  # mdlm's arguments (after the program name)
    output: Path  # exists = done (for training: the run folder, done at its max_steps)
    max_steps: int | None = None
    rows: list[str] = field(default_factory=list)  # the rows this job serves
    needs: list[str] = field(default_factory=list)  # run folders it starts from (init_from)

    def command(self, launcher: str = "mdlm") -> str:
        """The shell command; `launcher` replaces `mdlm` for training (e.g. torchrun on GPUs)."""
        program = launcher if self.kind == "train" else "mdlm"
        return " ".join([program, *map(shlex.quote, self.argv)])

    def done(self) -> bool:
        if self.kind == "step":
            return self.output.exists()
        latest = self.output / "latest"
        if not latest.is_file():
            return False
        state = self.output / "checkpoints" / latest.read_text().strip() / "state.json"
        try:
            return json.loads(state.read_text()).get("step", 0) >= (self.max_steps or 0)
        except (OSError, json.JSONDecodeError):
            return False


def scale_label(scale: str) -> str:
    return (
        "the paper's setting"
        if scale == "paper"
        else f"scale {scale} (a smoke run, NOT the paper's setting)"
    )


def run_dir(model: Model, runs: Path, scale: str) -> str:
    """Training runs live under `runs`, named by what defines them, so tables share identical
    models."""
    if model.checkpoint is not None:
        return model.checkpoint
    definition = [model.preset, model.overrides, model.max_steps, scale]
    if model.base is not None:  # a fine-tune is defined by the run it starts from too
        definition.append(run_dir(model.base, runs, scale))
    key = json.dumps(definition)
    return str(runs / f"{Path(model.preset).stem}-"
                      f"{hashlib.sha256(key.encode()).hexdigest()[:8]}")


def _train_job(model: Model, runs: Path, scale: str, rows: list[str]) -> Job:
    cfg = resolve_config(model.preset, model.overrides)
    max_steps = model.max_steps or cfg.train.max_steps
    overrides = list(model.overrides)
    if scale == "tiny":
        overrides, max_steps = overrides + TINY_MODEL, TINY_STEPS
    elif scale != "paper":
        max_steps = max(1, math.ceil(max_steps * float(scale)))
    needs = [] if model.base is None else [run_dir(model.base, runs, scale)]
    # the recipe's own base run, not the preset's init_from path (a run outside --runs)
    overrides += [f"train.init_from={folder}" for folder in needs]
    out = run_dir(model, runs, scale)
    argv = [
        "train",
        "--preset",
        model.preset,
        "--out",
        out,
        "--resume",
        "--no-print-config",
        "--max-steps",
        str(max_steps),
    ]
    for assignment in overrides:
        argv += ["--set", assignment]
    return Job("train", model.key, argv, Path(out), max_steps, rows, needs)


def _step_job(row: Row, index: int, step: Step, context: dict, scale: str) -> Job:
    args = dict(step.args)
    flag, suffix = OUTPUT_FLAG[step.command]
    args.setdefault(flag, f"{{out}}/{row.name}.{index}.{step.command}{suffix}")
    if step.command != "gen-ppl" or args.get("sample-first"):
        args.setdefault("checkpoint", "{run}")
    if scale == "tiny":
        args = _tiny(step.command, args)
    argv = [step.command]
    for key, value in args.items():
        argv += _flag(key, value, context)
    return Job(
        "step",
        f"{row.name}.{index}",
        argv,
        Path(str(args[flag]).format(**context)),
        rows=[row.name],
    )


def _tiny(command: str, args: dict) -> dict:
    """A step's arguments for --scale tiny: few samples and rows, at most 10 sampling steps."""
    # gen-ppl of a samples file draws nothing
    if command != "gen-ppl" or args.get("sample-first"):
        args = {**args, **TINY_ARGS.get(command, {})}
    if "steps" in args:
        args["steps"] = "5" if command == "bench-sampler" else min(int(args["steps"]), 10)
    if command == "semi-ar":
        args.update(length=64, stride=16)  # two 32-token windows of the tiny model
    if command == "sample":  # the tiny model's own L (a tiny AR refuses the paper's 1,024)
        args.pop("length", None)
    if command == "lm-eval":
        args = _tiny_lm_eval(args)
    return args


def _tiny_lm_eval(args: dict) -> dict:
    """lm-eval at --scale tiny: at most TINY_GEN_LENGTH new tokens in blocks that divide them,
    the steps a multiple of the blocks (LLaDA's rule), and at most 4 Monte-Carlo passes."""
    args = dict(args)
    if "mc-samples" in args:
        args["mc-samples"] = min(int(args["mc-samples"]), 4)
    if "gen-length" not in args:
        return args
    length = min(int(args["gen-length"]), TINY_GEN_LENGTH)
    block = min(int(args.get("block-length") or length), length)
    block = block if length % block == 0 else length  # one block where it would not divide
    blocks = length // block
    args["gen-length"] = length
    if "block-length" in args:
        args["block-length"] = block
    if "steps" in args:
        steps = max(blocks, min(int(args["steps"]), length))
        args["steps"] = steps - steps % blocks
    return args


def _flag(key: str, value, context: dict) -> list[str]:
    if value is True:
        return [f"--{key}"]
    if value is False:
        return [f"--no-{key}"]
    values = value if isinstance(value, list) else [value]
    return [part for v in values for part in (f"--{key}", str(v).format(**context))]


def plan(
    recipe: Recipe, *, out: Path, runs: Path, scale: str = "paper", rows: list[str] | None = None
) -> list[Job]:
    """Training jobs first (one per model the selected rows need), then every row's steps in
    order. Steps with the same command and output (a shared benchmark) run once."""
    if scale not in ("paper", "tiny") and not 0 < _factor(scale) <= 1:
        raise MdlmError(
            "--scale must be paper, tiny or a factor in (0, 1] on the training steps (got "
            f"{scale!r})"
        )
    chosen = [r for r in recipe.rows if rows is None or r.name in rows]
    unknown = set(rows or []) - {r.name for r in recipe.rows}
    if unknown:
        raise MdlmError(f"unknown row {sorted(unknown)[0]!r} of {recipe.name}; rows: "
                        f"{', '.join(r.name for r in recipe.rows)}")
    runnable = [r for r in chosen if not r.paper_only]
    served: dict[str, list[str]] = {}  # model key -> the rows its run serves, bases first
    for key in recipe.models:
        rows_of = [r.name for r in runnable if r.model == key]
        chain, model = [], recipe.models[key]
        while model is not None and rows_of:  # a fine-tune's base is trained before it
            chain.insert(0, model.key)
            model = model.base
        for k in chain:
            served.setdefault(k, [])
            served[k] += [r for r in rows_of if r not in served[k]]
    jobs = [_train_job(recipe.models[k], runs, scale, served[k]) for k in served
            if recipe.models[k].preset is not None]
    seen: dict[tuple, Job] = {}
    for row in runnable:
        context = _context(recipe, row, out, runs, scale)
        for i, step in enumerate(row.steps):
            job = _step_job(row, i, step, context, scale)
            key = (tuple(job.argv), str(job.output))
            if key in seen:
                seen[key].rows.append(row.name)
            else:
                seen[key] = job
                jobs.append(job)
    return jobs


def _factor(scale: str) -> float:
    try:
        return float(scale)
    except ValueError:
        return float("nan")  # fails every comparison: refused


def _context(recipe: Recipe, row: Row, out: Path, runs: Path, scale: str) -> dict:
    """What a step's arguments may name: {run} (its model), {runs[KEY]} (any model of the table),
    {out} and {row}."""
    folders = {key: run_dir(model, runs, scale) for key, model in recipe.models.items()}
    return {"run": folders[row.model], "runs": folders, "out": str(out), "row": row.name}


def result_file(recipe: Recipe, row: Row, *, out: Path, runs: Path, scale: str) -> Path:
    """The output of the row's last step: where the report reads its value."""
    context = _context(recipe, row, out, runs, scale)
    return _step_job(row, len(row.steps) - 1, row.steps[-1], context, scale).output
