"""`mdlm reproduce`: a paper table as a recipe that runs, and a report beside the paper's
numbers (the planning, running and reporting are `recipes/`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Column, Table

from ..errors import MdlmError
from .app import app, command_flags
from .console import console, err_console, user_errors

TableArg = Annotated[str | None, typer.Argument(
    help="Table name (see --list), or a recipe .yaml file.")]
ListOpt = Annotated[bool, typer.Option("--list", help="List the tables and what each needs.")]
DryRunOpt = Annotated[bool, typer.Option(help="Print the commands in order; run nothing.")]
ReportOpt = Annotated[bool, typer.Option(
    help="Write OUT/report.md (and a PNG for curves) from the outputs so far.")]
ReproduceOutOpt = Annotated[str | None, typer.Option(
    help="Folder of this table's outputs (default reproduce/TABLE).")]
RunsOpt = Annotated[str, typer.Option(
    help="Folder of the training runs, shared by tables that train the same model.")]
ReproduceRowsOpt = Annotated[str | None, typer.Option(
    help="Comma-separated rows to run or report (default: all).")]
ScaleOpt = Annotated[str, typer.Option(
    help="paper (the paper's steps), a factor in (0, 1] on the training steps, or tiny "
         "(test-size model, a few steps: a smoke run). Anything but paper is labelled as "
         "not the paper's setting.")]
LauncherOpt = Annotated[str, typer.Option(
    help="What runs training commands, e.g. 'torchrun --nproc-per-node 8 -m mdlm_cli' on a GPU "
         "node.")]
EmitOpt = Annotated[str | None, typer.Option(
    help="slurm: write job scripts (OUT/slurm) instead of running.")]
StandInModelOpt = Annotated[list[str] | None, typer.Option(
    "--model", help="KEY=FOLDER: run the recipe's published model KEY from a local folder (a "
    "local copy of its weights; at --scale tiny a tiny folder in its layout). Repeatable.")]
StandInTaskOpt = Annotated[list[str] | None, typer.Option(
    "--task", help="TASK=LOCAL: run the recipe's lm-eval task TASK as the local task LOCAL of "
    "--include-path (a stand-in for a hub data set; --scale tiny only). Repeatable.")]
StandInPathOpt = Annotated[str | None, typer.Option(
    "--include-path", help="--task: the folder of the local lm-eval task YAML files.")]
GpusOpt = Annotated[int, typer.Option(help="--emit slurm: GPUs per node.")]
NodesOpt = Annotated[int, typer.Option(help="--emit slurm: nodes per training job.")]


@app.command("reproduce")
def reproduce_cmd(
    table: TableArg = None,
    list_tables: ListOpt = False,
    dry_run: DryRunOpt = False,
    report: ReportOpt = False,
    out: ReproduceOutOpt = None,
    runs: RunsOpt = "reproduce/runs",
    rows: ReproduceRowsOpt = None,
    scale: ScaleOpt = "paper",
    launcher: LauncherOpt = "mdlm",
    emit: EmitOpt = None,
    gpus: GpusOpt = 8,
    nodes: NodesOpt = 1,
    model: StandInModelOpt = None,
    task: StandInTaskOpt = None,
    include_path: StandInPathOpt = None,
) -> None:
    """Run a paper table: train its models, evaluate its rows, report ours beside the paper's.

    Re-running skips every job whose output exists (training resumes).

    [dim]Examples:[/]
      mdlm reproduce --list
      mdlm reproduce table2 --dry-run                    # the exact commands, in order
      mdlm reproduce demo                                # the four objectives + AR on this CPU
      mdlm reproduce demo --report                       # reproduce/demo/report.md
      mdlm reproduce table8 --emit slurm --gpus 8        # job scripts for a cluster
      mdlm reproduce demo --scale tiny --out /tmp/smoke  # plumbing check in a minute
      mdlm reproduce llada-base-gen --model llada=/data/LLaDA-8B-Base  # local weights
      mdlm reproduce llada-base-gen --scale tiny --rows gsm8k --model llada=tiny/ \\
          --task gsm8k=my_gsm8k --include-path my_tasks/   # stand-ins: the plumbing offline
    """
    from ..recipes import list_recipes, plan

    with user_errors():
        if list_tables:
            return _print_list(list_recipes(command_flags))
        if table is None:
            raise MdlmError("give a table (mdlm reproduce --list shows them)")
        recipe = _load(table, scale, model, task, include_path)
        out_dir, runs_dir = _out_dir(out, recipe.name, scale), Path(runs)
        selected = [r.strip() for r in rows.split(",") if r.strip()] if rows else None
        jobs = plan(recipe, out=out_dir, runs=runs_dir, scale=scale, rows=selected)
        if report:
            return _report(recipe, out_dir, runs_dir, scale)
        if dry_run:
            chosen = [r for r in recipe.rows if selected is None or r.name in selected]
            return _print_plan(jobs, launcher, scale, chosen, recipe.stand_ins)
        if emit is not None:
            return _emit(emit, jobs, out_dir, nodes=nodes, gpus=gpus)
        _run(jobs, out_dir, launcher, scale)
        _report(recipe, out_dir, runs_dir, scale)


def _load(table: str, scale: str, models: list[str] | None, tasks: list[str] | None,
          include_path: str | None):
    """The recipe, with --model / --task stand-ins for its published models and hub tasks."""
    from ..recipes import load_recipe, parse_pairs, stand_in

    pairs = parse_pairs(tasks, "--task")
    if pairs and scale != "tiny":
        raise MdlmError("--task runs stand-in tasks, not the paper's: give --scale tiny")
    return stand_in(load_recipe(table, command_flags), models=parse_pairs(models, "--model"),
                    tasks=pairs, include_path=include_path)


def _out_dir(out: str | None, name: str, scale: str) -> Path:
    """--out, else reproduce/TABLE (TABLE@SCALE at any scale but the paper's)."""
    return Path(out or f"reproduce/{name}" + ("" if scale == "paper" else f"@{scale}"))


def _emit(kind: str, jobs, out: Path, *, nodes: int, gpus: int) -> None:
    from ..recipes.slurm import emit as emit_slurm

    if kind != "slurm":
        raise MdlmError(f"--emit supports slurm (got {kind!r})")
    folder = emit_slurm(jobs, out / "slurm", nodes=nodes, gpus=gpus)
    console.print(f"Wrote {folder}", markup=False)


def _run(jobs, out: Path, launcher: str, scale: str) -> None:
    """Claim OUT for this scale, then run the jobs not done yet, their output shown."""
    from ..recipes.run import claim, run_jobs

    claim(out, scale)
    done = sum(job.done() for job in jobs)
    err_console.print(f"{done} of {len(jobs)} jobs already done; running {len(jobs) - done}",
                      highlight=False)

    def on_start(i: int, n: int, job) -> None:
        err_console.print(f"[bold]({i}/{n})[/] {escape(job.command(launcher))}", highlight=False)

    def on_line(line: str) -> None:
        err_console.print("  " + line, markup=False, highlight=False, soft_wrap=True)

    run_jobs(jobs, out, launcher, on_start=on_start, on_line=on_line)


def _print_list(recipes) -> None:
    from ..recipes.cost import A100_BF16_FLOPS, ASSUMED_MFU, gpu_days

    # a table's name is typed back: never cut, whatever the terminal's width
    table = Table(Column("table", no_wrap=True), "rows", "models", "est. A100-days", "title",
                  "needs", box=None)
    for name, recipe in recipes.items():
        run = [r for r in recipe.rows if not r.paper_only]
        quoted = len(recipe.rows) - len(run)
        counts = f"{len(run)} (+{quoted} quoted)" if quoted else str(len(run))
        table.add_row(name, counts, str(len(recipe.models)), gpu_days(recipe),
                      escape(recipe.title), escape(recipe.needs))
    console.print(table)
    console.print(f"[dim]A100-days: 6 x parameters x training tokens at {ASSUMED_MFU:.0%} of an "
                  f"A100's {A100_BF16_FLOPS / 1e12:.0f} TFLOP/s (bf16 dense), summed over the "
                  "table's training runs; an estimate, not a measurement[/]")


def _print_plan(jobs, launcher: str, scale: str, rows, stand_ins: list[str]) -> None:
    from ..recipes.plan import scale_label

    sys.stdout.write(f"# {len(jobs)} jobs, {scale_label(scale)}; in order, each skipped when "
                     "its output exists\n")
    for line in stand_ins:
        sys.stdout.write(f"# stand-in: {line}\n")
    for job in jobs:
        sys.stdout.write(("# done: " if job.done() else "") + job.command(launcher) + "\n")
    sys.stdout.write("# rows (the paper's value and where it comes from):\n")
    for row in rows:
        value = row.paper.get("value")
        quoted = ", quoted, not run" if row.paper_only else ""
        shown = "-" if value is None else value
        source = row.paper.get("source", "")
        sys.stdout.write(f"#   {row.name} ({row.label}{quoted}): {shown}; {source}\n")


def _report(recipe, out: Path, runs: Path, scale: str) -> None:
    """OUT/report.md (and a PNG for a curve), and the table of ours beside the paper's."""
    from ..recipes.plan import scale_label
    from ..recipes.report import fmt, plot, write_report

    rows = write_report(recipe, out=out, runs=runs, scale=scale)
    table = Table("row", "paper", "ours", "diff", "", "training", "status", title=recipe.title)
    for r in rows:
        diff = "" if r.difference is None else f"{r.difference:+.3g}"
        table.add_row(escape(r.label), fmt(r.paper), fmt(r.ours, r.ours_se), diff,
                      escape(r.extra), escape(r.steps), r.status)
    console.print(table)
    console.print(f"Wrote {out / 'report.md'} ({scale_label(scale)})", markup=False)
    try:
        if plot(recipe, rows, out / "report.png", runs=runs, scale=scale):
            console.print(f"Wrote {out / 'report.png'}", markup=False)
    except ImportError:
        err_console.print(f"[yellow]note:[/] {recipe.name} is a curve; its PNG needs "
                          "matplotlib: pip install 'mdlm\\[plot]'")
