"""Stand-ins for what a recipe takes from the Hugging Face Hub (`mdlm reproduce --model`,
`--task`): a local folder for a published model (a local copy of its weights, or a tiny folder in
its layout) and local lm-eval tasks for the hub's, so that the recipe's own commands run where
the Hub cannot be reached. Rows, their outputs and the paper's numbers stay the recipe's; the
plan and the report say what stood in for what."""

from __future__ import annotations

import dataclasses

from ..errors import MdlmError
from .schema import Model, Recipe, Row, Step


def parse_pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    """`--flag KEY=VALUE` given any number of times, as a mapping (a key given twice refused)."""
    pairs: dict[str, str] = {}
    for value in values or []:
        key, sep, target = value.partition("=")
        if not (sep and key.strip() and target.strip()):
            raise MdlmError(f"{flag} takes KEY=VALUE (got {value!r})")
        if key.strip() in pairs:
            raise MdlmError(f"{flag} {key.strip()} is given twice")
        pairs[key.strip()] = target.strip()
    return pairs


def stand_in(recipe: Recipe, *, models: dict[str, str], tasks: dict[str, str],
             include_path: str | None) -> Recipe:
    """The recipe with `models` (key -> folder) in place of its published checkpoints and
    `tasks` (hub task -> local task of `include_path`) in its lm-eval steps and picks."""
    if include_path is not None and not tasks:
        raise MdlmError("--include-path goes with --task (the local tasks standing in for the "
                        "recipe's)")
    if not (models or tasks):
        return recipe
    stand_ins = [_model_stand_in(recipe, key, folder) for key, folder in models.items()]
    known = sorted({t for row in recipe.rows for step in row.steps for t in _tasks_of(step)})
    for task, local in tasks.items():
        if task not in known:
            raise MdlmError(f"--task {task}={local}: {recipe.name} runs no lm-eval task "
                            f"{task!r}; its tasks: {', '.join(known) or 'none'}")
        stand_ins.append(f"lm-eval task {local} (from {include_path or 'lm-eval'}) for {task}")
    rows = [_swap_tasks(row, tasks, include_path) for row in recipe.rows]
    return dataclasses.replace(recipe, models=_swap_models(recipe, models), rows=rows,
                               stand_ins=recipe.stand_ins + stand_ins)


def _model_stand_in(recipe: Recipe, key: str, folder: str) -> str:
    model = recipe.models.get(key)
    if model is None:
        raise MdlmError(f"--model {key}={folder}: {recipe.name} has no model {key!r}; its "
                        f"models: {', '.join(recipe.models)}")
    if model.checkpoint is None:
        raise MdlmError(f"--model {key}={folder}: {key} is a training run of {recipe.name} "
                        f"(preset {model.preset}); --model stands in for published "
                        "checkpoints only")
    return f"model {key}: {folder} for {model.checkpoint}"


def _swap_models(recipe: Recipe, models: dict[str, str]) -> dict[str, Model]:
    """Copies of the recipe's models, `models`' folders in place of their checkpoints, each
    fine-tune linked to the copy of its base (whatever stands in for it)."""
    copies = {key: dataclasses.replace(m) for key, m in recipe.models.items()}
    for key, folder in models.items():
        copies[key].stands_in_for, copies[key].checkpoint = copies[key].checkpoint, folder
    for model in copies.values():
        model.base = None if model.init_from is None else copies[model.init_from]
    return copies


def _tasks_of(step: Step) -> list[str]:
    if step.command != "lm-eval":
        return []
    return [t.strip() for t in str(step.args.get("tasks", "")).split(",") if t.strip()]


def _swap_tasks(row: Row, tasks: dict[str, str], include_path: str | None) -> Row:
    """The row with its lm-eval steps' tasks (and their per-task K) and its pick mapped."""
    if not tasks:
        return row
    steps = []
    for step in row.steps:
        names = _tasks_of(step)
        if not any(t in tasks for t in names):
            steps.append(step)
            continue
        args = {**step.args, "tasks": ",".join(tasks.get(t, t) for t in names)}
        if "task-mc-samples" in args:  # task=K,task=K: the keys are task names too
            pairs = [p.partition("=") for p in str(args["task-mc-samples"]).split(",")]
            args["task-mc-samples"] = ",".join(f"{tasks.get(t.strip(), t.strip())}={k}"
                                               for t, _, k in pairs)
        if include_path is not None:
            if "include-path" in step.args:
                raise MdlmError(f"row {row.name} already names an --include-path; --task cannot "
                                "add another")
            args["include-path"] = include_path
        steps.append(Step(step.command, args))
    pick = dict(row.pick)
    if "task" in pick:
        pick["task"] = tasks.get(str(pick["task"]), pick["task"])
    return dataclasses.replace(row, steps=steps, pick=pick)
