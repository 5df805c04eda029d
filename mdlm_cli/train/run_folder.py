"""Where a training run starts and what it may change in its folder: the run lock, the
checkpoint `--resume` continues (after undoing what a killed save left), the config keys
that differ from the checkpoint's, a finished run, and the metrics log.

Guarantees (each tested): one trainer per run folder; `--resume` trains on with the data,
model, objective, optimisation and batch of the checkpoint unless told otherwise, and the
change is logged; `--resume` of a finished run writes nothing; a torn last log line (a kill
mid-write) is dropped, never a reason to fail.
"""

from __future__ import annotations

import json
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .. import distributed
from ..checkpoints.folder import is_whole, recover_run_folder, resolve_checkpoint, saved_config
from ..config import Config, resume_differences
from ..distributed import Dist
from ..errors import MdlmError, MdlmWarning
from ..io.files import write_text_atomic
from .run_lock import RunLock
from .state import TrainState


@dataclass
class ResumePoint:
    """Where a run starts: nothing (fresh), or a checkpoint, with the config keys that
    changed."""

    step_dir: Path | None = None
    state: TrainState = field(default_factory=TrainState)
    changes: dict = field(default_factory=dict)


@contextmanager
def locked(run_dir: Path, dist: Dist):
    """Rank 0 holds the run folder's lock; every rank stops if it could not be taken."""
    lock, refusal = RunLock(run_dir), None
    if dist.is_main:
        try:
            lock.acquire()
        except MdlmError as e:
            refusal = e
    if dist.all_sum(refusal is not None)[0]:
        raise refusal or MdlmError(f"rank 0 could not lock the run folder {run_dir}")
    try:
        yield lock
    finally:
        lock.release()


def resume_point(
    cfg: Config, dist: Dist, console: Console, resume: bool, override: bool
) -> ResumePoint:
    """The checkpoint --resume continues, and the config keys that differ from its own
    (refused unless `override`). Call with the run folder locked."""
    run_dir = cfg.out_dir
    if not resume:
        if (run_dir / "checkpoints").exists() and any((run_dir / "checkpoints").glob("step-*")):
            raise MdlmError(
                f"{run_dir} already holds checkpoints; continue it with --resume, or choose "
                "another --out"
            )
        return ResumePoint()
    if dist.is_main:
        for note in recover_run_folder(run_dir):
            console.print(f"[dim]{escape(str(run_dir))}: {escape(note)}[/]")
    distributed.barrier()  # the other ranks read the folder rank 0 has just tidied
    if not (run_dir / "latest").is_file() and not any(
        is_whole(p) for p in (run_dir / "checkpoints").glob("step-*")
    ):
        return ResumePoint()
    step_dir = resolve_checkpoint(run_dir)
    changes = resume_differences(saved_config(step_dir), cfg)
    if changes and not override:
        listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changes.items())
        raise MdlmError(
            f"--resume with a config that differs from the one {run_dir} was trained with "
            f"({listed}); resume with the run's own settings, start another --out, or pass "
            "--override-resume-config to continue with the new ones (recorded in metrics.jsonl)"
        )
    try:
        state = json.loads((step_dir / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise MdlmError(
            f"{step_dir}/state.json is unreadable ({type(e).__name__}); the checkpoint is "
            "corrupted"
        ) from None
    return ResumePoint(step_dir, TrainState.from_dict(state), changes)


def finished(cfg: Config, start: ResumePoint) -> bool:
    """At max_steps (or past it) with its final validation done: nothing left to run."""
    state = start.state
    if start.step_dir is None or state.step < cfg.train.max_steps:
        return False
    if state.final_step == state.step:
        return True
    metrics = cfg.out_dir / "metrics.jsonl"  # runs saved before `final_step` existed
    if not metrics.is_file():
        return False
    records = [json.loads(line) for line in read_metrics(metrics, warn_torn=False)[0]]
    return any(r.get("final") is True and r.get("step") == state.step for r in records)


def read_metrics(path: Path, *, warn_torn: bool = True) -> tuple[list[str], bool]:
    """(the log's JSON lines, whether a torn last line was left out). A kill mid-write can
    tear only the last line; a bad line elsewhere is an error naming it."""
    lines = [
        line
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
        if line.strip()
    ]
    for n, line in enumerate(lines):
        try:
            json.loads(line)
        except json.JSONDecodeError:
            if n < len(lines) - 1:
                raise MdlmError(
                    f"{path} line {n + 1} is not JSON ({line[:40]!r}); fix or delete that line"
                ) from None
            if warn_torn:
                warnings.warn(
                    f"{path}: dropped a torn last line (a run killed while writing it)",
                    MdlmWarning,
                    stacklevel=2,
                )
            return lines[:-1], True
    return lines, False


def truncate_metrics(path: Path, step: int) -> None:
    """Drop log lines past `step` (written by a run later resumed from `step`) and a torn
    last line; rewritten atomically, and only when something goes."""
    if not path.exists():
        return
    lines, torn = read_metrics(path)
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    if torn or kept != lines:
        write_text_atomic(path, "".join(line + "\n" for line in kept))


def log_config_change(run_dir: Path, step: int, changes: dict, console: Console) -> None:
    """What --override-resume-config let change, on the record in metrics.jsonl."""
    with open(run_dir / "metrics.jsonl", "a") as log:
        log.write(json.dumps({"step": step, "config_change": changes}) + "\n")
    console.print(
        f"[yellow]Resuming with a changed config[/] (--override-resume-config): "
        f"{escape(', '.join(f'{k}: {old!r} -> {new!r}' for k, (old, new) in changes.items()))}"
    )
