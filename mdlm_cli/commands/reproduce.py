"""`mdlm reproduce`: a paper table as a recipe that runs, and a report beside the paper's numbers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import MdlmError
from .common import app, command_flags, console, err_console, user_errors

A100_BF16_FLOPS, ASSUMED_MFU = 312e12, 0.4  # NVIDIA A100 data sheet, dense bf16; an assumed utilisation
KNOWN_VOCABS = {"gpt2": 50258, "bert-base-uncased": 30522, "char": 35}

TableArg = Annotated[str | None, typer.Argument(help="Table name (see --list), or a recipe .yaml file.")]
OutOpt = Annotated[str | None, typer.Option(help="Folder of this table's outputs (default reproduce/TABLE).")]
RunsOpt = Annotated[str, typer.Option(help="Folder of the training runs, shared by tables that train the same "
                                           "model.")]
RowsOpt = Annotated[str | None, typer.Option(help="Comma-separated rows to run or report (default: all).")]
ScaleOpt = Annotated[str, typer.Option(
    help="paper (the paper's steps), a factor in (0, 1] on the training steps, or tiny (test-size model, a few "
         "steps: a smoke run). Anything but paper is labelled as not the paper's setting.")]
LauncherOpt = Annotated[str, typer.Option(
    help="What runs training commands, e.g. 'torchrun --nproc-per-node 8 -m mdlm_cli' on a GPU node.")]


@app.command("reproduce")
def reproduce_cmd(
    table: TableArg = None,
    list_tables: Annotated[bool, typer.Option("--list", help="List the tables and what each needs.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Print the commands in order; run nothing.")] = False,
    report: Annotated[bool, typer.Option(help="Write OUT/report.md (and a PNG for curves) from the "
                                              "outputs so far.")] = False,
    out: OutOpt = None, runs: RunsOpt = "reproduce/runs", rows: RowsOpt = None, scale: ScaleOpt = "paper",
    launcher: LauncherOpt = "mdlm",
    emit: Annotated[str | None, typer.Option(help="slurm: write job scripts (OUT/slurm) instead of running.")] = None,
    gpus: Annotated[int, typer.Option(help="--emit slurm: GPUs per node.")] = 8,
    nodes: Annotated[int, typer.Option(help="--emit slurm: nodes per training job.")] = 1,
) -> None:
    """Run a paper table: train its models, evaluate its rows, report ours beside the paper's.

    Re-running skips every job whose output exists (training resumes).

    [dim]Examples:[/]
      mdlm reproduce --list
      mdlm reproduce table2 --dry-run                               # the exact commands, in order
      mdlm reproduce demo                                           # the four objectives + AR on this CPU
      mdlm reproduce demo --report                                  # reproduce/demo/report.md
      mdlm reproduce table8 --emit slurm --gpus 8                   # job scripts for a cluster
      mdlm reproduce demo --scale tiny --out /tmp/smoke             # plumbing check in a minute
    """
    from ..recipes import list_recipes, load_recipe, plan

    with user_errors():
        if list_tables:
            return _print_list(list_recipes(command_flags))
        if table is None:
            raise MdlmError("give a table (mdlm reproduce --list shows them)")
        recipe = load_recipe(table, command_flags)
        out_dir = Path(out or f"reproduce/{recipe.name}" + ("" if scale == "paper" else f"@{scale}"))
        runs_dir = Path(runs)
        selected = [r.strip() for r in rows.split(",") if r.strip()] if rows else None
        jobs = plan(recipe, out=out_dir, runs=runs_dir, scale=scale, rows=selected)
        if report:
            return _report(recipe, out_dir, runs_dir, scale)
        if dry_run:
            chosen = [r for r in recipe.rows if selected is None or r.name in selected]
            return _print_plan(jobs, launcher, scale, chosen)
        if emit is not None:
            if emit != "slurm":
                raise MdlmError(f"--emit supports slurm (got {emit!r})")
            from ..recipes.slurm import emit as emit_slurm

            console.print(f"Wrote {emit_slurm(jobs, out_dir / 'slurm', nodes=nodes, gpus=gpus)}", markup=False)
            return
        _claim(out_dir, scale)
        _run(jobs, out_dir, launcher)
        _report(recipe, out_dir, runs_dir, scale)


def _claim(out: Path, scale: str) -> None:
    """One scale per output folder: a smoke run's results never stand in for the paper's."""
    marker = out / "scale.txt"
    if marker.is_file() and marker.read_text().strip() != scale:
        raise MdlmError(f"{out} holds results at scale {marker.read_text().strip()}; give another --out for "
                        f"--scale {scale}")
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text(scale + "\n")


def _print_list(recipes) -> None:
    table = Table("table", "rows", "models", "est. A100-days", "title", "needs", box=None)
    for name, recipe in recipes.items():
        run = [r for r in recipe.rows if not r.paper_only]
        table.add_row(name, f"{len(run)} (+{len(recipe.rows) - len(run)} quoted)" if len(run) < len(recipe.rows)
                      else str(len(run)), str(len(recipe.models)), _gpu_days(recipe), escape(recipe.title),
                      escape(recipe.needs))
    console.print(table)
    console.print(f"[dim]A100-days: 6 x parameters x training tokens at {ASSUMED_MFU:.0%} of an A100's "
                  f"{A100_BF16_FLOPS / 1e12:.0f} TFLOP/s (bf16 dense), summed over the table's training runs; an "
                  "estimate, not a measurement[/]")


def _gpu_days(recipe) -> str:
    import torch

    from ..build import resolve_config
    from ..models import build_model

    flops = 0.0
    for model in recipe.models.values():
        if model.preset is None:
            continue
        cfg = resolve_config(model.preset, model.overrides)
        vocab = KNOWN_VOCABS.get(cfg.data.tokenizer)
        if vocab is None or cfg.model.backbone != "dit":
            return "?"
        with torch.device("meta"):
            params = sum(p.numel() for p in build_model(cfg.model, vocab).parameters())
        steps = model.max_steps or cfg.train.max_steps
        flops += 6 * params * steps * cfg.train.global_batch_size * cfg.data.length
    return f"{flops / (A100_BF16_FLOPS * ASSUMED_MFU) / 86400:,.1f}" if flops else "-"


def _print_plan(jobs, launcher: str, scale: str, rows) -> None:
    from ..recipes.plan import scale_label

    sys.stdout.write(f"# {len(jobs)} jobs, {scale_label(scale)}; in order, each skipped when its output exists\n")
    for job in jobs:
        sys.stdout.write(("# done: " if job.done() else "") + job.command(launcher) + "\n")
    sys.stdout.write("# rows (the paper's value and where it comes from):\n")
    for row in rows:
        value = row.paper.get("value")
        quoted = ", quoted, not run" if row.paper_only else ""
        shown = "-" if value is None else value
        source = row.paper.get("source", "")
        sys.stdout.write(f"#   {row.name} ({row.label}{quoted}): {shown}; {source}\n")


def _run(jobs, out: Path, launcher: str) -> None:
    """Run the jobs not done yet, each logged to OUT/logs and recorded in OUT/jobs.jsonl. A first
    SIGTERM or Ctrl-C is handed to the running job (a training saves and stops) and no further
    job starts; a second stops the job and this command at once."""

    from ..runtime import pick_device
    from ..sample.bench import environment
    from ..signals import StopSignals

    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = environment(pick_device("auto"), None)
    device = env["device_name"] + (f" ({env['threads']} threads)" if env["device"] == "cpu" else "")
    todo = [j for j in jobs if not j.done()]
    err_console.print(f"{len(jobs) - len(todo)} of {len(jobs)} jobs already done; running {len(todo)}",
                      highlight=False)
    stop = StopSignals(first="stopping: the running job is asked to stop, and no other job starts",
                       kept="checkpoints and finished results stay as they are", forward=_forward,
                       flag_both=True)
    with stop:
        for i, job in enumerate(todo, 1):
            code, log = _run_job(job, i, len(todo), out, launcher, device)
            if stop.requested:
                raise MdlmError(f"stopped by {stop.received} in job {job.kind} {job.name} (exit "
                                f"{code}); run the same command again to continue (finished jobs "
                                "are skipped)")
            if code != 0:
                raise MdlmError(f"job {job.kind} {job.name} failed (exit {code}); its output is in "
                                f"{log}; fix it and run the same command again (finished jobs are "
                                "skipped)")


def _run_job(
    job,
    i: int,
    n: int,
    out: Path,
    launcher: str,
    device: str,
) -> tuple[int, Path]:
    """Run job i of n, logged and recorded: its exit code and its log."""
    import shlex

    program = shlex.split(launcher) if job.kind == "train" and launcher != "mdlm" else [sys.executable, "-m",
                                                                                           "mdlm_cli"]
    err_console.print(f"[bold]({i}/{n})[/] {escape(job.command(launcher))}", highlight=False)
    log = out / "logs" / f"{job.kind}-{job.name}.log"
    t0 = time.perf_counter()
    code = _tee([*program, *job.argv], log)
    record = {"kind": job.kind, "name": job.name, "argv": job.argv, "returncode": code, "device": device,
              "seconds": time.perf_counter() - t0, "log": str(log)}
    with open(out / "jobs.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return code, log


def _tee(argv: list[str], log: Path) -> int:
    """Run a command, its output shown as it comes and kept in `log`. It runs in its own session,
    so a terminal's Ctrl-C reaches this command only, which hands it on (`_forward`): once."""
    with open(log, "w") as f, subprocess.Popen(argv, stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True, bufsize=1,
                                               start_new_session=True) as proc:
        RUNNING[:] = [proc]
        for line in proc.stdout:
            f.write(line)
            err_console.print("  " + line.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
        code = proc.wait()
        RUNNING.clear()
        return code


RUNNING: list[subprocess.Popen] = []  # the job running now (the signal watcher reads it)


def _forward(signum: int) -> None:
    """A signal to reproduce, handed to its running job as SIGTERM (a first: stop gracefully;
    a second: at once)."""
    for proc in list(RUNNING):
        try:
            proc.send_signal(signal.SIGTERM)
        except OSError:
            pass


def _report(recipe, out: Path, runs: Path, scale: str) -> None:
    from ..recipes.plan import scale_label
    from ..recipes.report import fmt, markdown, plot, report_rows

    rows = report_rows(recipe, out=out, runs=runs, scale=scale)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(recipe, rows, scale_label(scale)))
    table = Table("row", "paper", "ours", "diff", "", "training", "status", title=recipe.title)
    for r in rows:
        table.add_row(escape(r.label), fmt(r.paper), fmt(r.ours, r.ours_se),
                      "" if r.difference is None else f"{r.difference:+.3g}", escape(r.extra), escape(r.steps),
                      r.status)
    console.print(table)
    console.print(f"Wrote {out / 'report.md'} ({scale_label(scale)})", markup=False)
    try:
        if plot(recipe, rows, out / "report.png", runs=runs, scale=scale):
            console.print(f"Wrote {out / 'report.png'}", markup=False)
    except ImportError:
        err_console.print(f"[yellow]note:[/] {recipe.name} is a curve; its PNG needs matplotlib: "
                          "pip install 'mdlm\\[plot]'")
