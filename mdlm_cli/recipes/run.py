"""Running a recipe's jobs (`mdlm reproduce`): each one a subprocess of the mdlm CLI (training
through the launcher), its output shown as it comes and kept in OUT/logs, its exit code and
time recorded in OUT/jobs.jsonl."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import MdlmError
from .plan import Job

RUNNING: list[subprocess.Popen] = []  # the job running now (the signal watcher reads it)


def claim(out: Path, scale: str) -> None:
    """One scale per output folder: a smoke run's results never stand in for the paper's."""
    marker = out / "scale.txt"
    if marker.is_file() and marker.read_text().strip() != scale:
        raise MdlmError(f"{out} holds results at scale {marker.read_text().strip()}; give "
                        f"another --out for --scale {scale}")
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text(scale + "\n")


def device_text() -> str:
    """The machine the jobs run on, as jobs.jsonl records it."""
    from ..runtime import pick_device
    from ..sample.bench import environment

    env = environment(pick_device("auto"), None)
    return env["device_name"] + (f" ({env['threads']} threads)" if env["device"] == "cpu"
                                 else "")


def run_jobs(
    jobs: list[Job],
    out: Path,
    launcher: str,
    *,
    on_start: Callable[[int, int, Job], None],
    on_line: Callable[[str], None],
) -> None:
    """Run the jobs not done yet, in order: `on_start(i, n, job)` before job i of n, `on_line`
    for each line it prints. A first SIGTERM or Ctrl-C is handed to the running job (a training
    saves and stops) and no further job starts; a second stops the job and this one at once."""
    from ..signals import StopSignals

    (out / "logs").mkdir(parents=True, exist_ok=True)
    device = device_text()
    todo = [j for j in jobs if not j.done()]
    stop = StopSignals(first="stopping: the running job is asked to stop, and no other "
                             "job starts",
                       kept="checkpoints and finished results stay as they are",
                       forward=_forward, flag_both=True)
    with stop:
        for i, job in enumerate(todo, 1):
            on_start(i, len(todo), job)
            code, log = _run_job(job, out, launcher, device, on_line)
            if stop.requested:
                raise MdlmError(f"stopped by {stop.received} in job {job.kind} {job.name} (exit "
                                f"{code}); run the same command again to continue (finished "
                                "jobs are skipped)")
            if code != 0:
                raise MdlmError(f"job {job.kind} {job.name} failed (exit {code}); its output "
                                f"is in {log}; fix it and run the same command again "
                                "(finished jobs are skipped)")


def _program(job: Job, launcher: str) -> list[str]:
    """What runs the job: the launcher for a training (e.g. torchrun), else this Python's
    mdlm."""
    if job.kind == "train" and launcher != "mdlm":
        return shlex.split(launcher)
    return [sys.executable, "-m", "mdlm_cli"]


def _run_job(
    job: Job,
    out: Path,
    launcher: str,
    device: str,
    on_line: Callable[[str], None],
) -> tuple[int, Path]:
    """Run one job, logged and recorded: its exit code and its log."""
    log = out / "logs" / f"{job.kind}-{job.name}.log"
    t0 = time.perf_counter()
    code = _tee([*_program(job, launcher), *job.argv], log, on_line)
    record = {"kind": job.kind, "name": job.name, "argv": job.argv, "returncode": code,
              "device": device, "seconds": time.perf_counter() - t0, "log": str(log)}
    with open(out / "jobs.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return code, log


def _tee(argv: list[str], log: Path, on_line: Callable[[str], None]) -> int:
    """Run a command, each line of its output handed to `on_line` as it comes and kept in `log`.
    It runs in its own session, so a terminal's Ctrl-C reaches this process only, which hands it
    on (`_forward`): once."""
    with open(log, "w") as f, subprocess.Popen(argv, stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True, bufsize=1,
                                               start_new_session=True) as proc:
        RUNNING[:] = [proc]
        for line in proc.stdout:
            f.write(line)
            on_line(line.rstrip("\n"))
        code = proc.wait()
        RUNNING.clear()
        return code


def _forward(signum: int) -> None:
    """A signal to reproduce, handed to its running job as SIGTERM (a first: stop gracefully;
    a second: at once)."""
    for proc in list(RUNNING):
        try:
            proc.send_signal(signal.SIGTERM)
        except OSError:
            pass
