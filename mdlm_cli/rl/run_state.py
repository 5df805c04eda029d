"""`mdlm rl --resume`: what a run folder keeps to continue where it stopped.

    OUT/resume/          written every --save-every steps and at the end, whole or not at all
      adapter/           the adapter as it was after that step (peft's format)
      optimizer.pt       AdamW's state (tensors and numbers; read with weights_only=True)
      state.json         the step, the tokens seen, the seconds run, the held-out curve, and
                         the run's settings

A resumed run takes the same settings (those in `MAY_CHANGE` aside) and goes on from the saved
step: the data order, each step's seeds and mask seeds follow from the seed and the step, so its
steps are those the run would have taken without the stop. metrics.jsonl keeps the records up
to the saved step. Without --resume a folder that holds a run (a saved state or rl.json) is
refused, not overwritten; the log of a run that stopped before its first save is started
again.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..errors import MdlmError
from ..io.files import swap_folder, temporary
from ..models.lora import put_adapter_tensors, write_adapter

RESUME = "resume"
# settings a resumed run may change: how long it runs, how often it reports, where it saves
MAY_CHANGE = ("max_steps", "minutes", "eval_every", "eval_rows", "save_every", "resume", "out")


@dataclass
class RunState:
    step: int = 0
    seen: int = 0  # rollout tokens scored
    elapsed_s: float = 0.0
    evals: list[dict] = field(default_factory=list)


def settings_record(settings) -> dict:
    """The settings as JSON values (tuples as lists, paths as text)."""
    return json.loads(json.dumps(asdict(settings), default=str))


def check_out(out: Path, resume: bool) -> None:
    """Refuse to overwrite a run without --resume, and --resume without a saved state."""
    saved = out / RESUME / "state.json"
    if resume and not saved.is_file():
        raise MdlmError(f"--resume: {out} holds no saved RL state ({saved} is missing); run "
                        "without --resume")
    if not resume and (saved.exists() or (out / "rl.json").exists()):
        raise MdlmError(f"{out} already holds an RL run; pass --resume to continue it, or "
                        "choose another --out")


def run_record(settings, checkpoint: str, sampling) -> dict:
    """What a resumed run must share with the saved one: its settings (`MAY_CHANGE` aside), the
    checkpoint it adapts and the rollouts' sampling settings."""
    return {**settings_record(settings), "checkpoint": str(checkpoint),
            "sampling": json.loads(json.dumps(asdict(sampling), default=str))}


def save_state(out: Path, model, optimizer: torch.optim.Optimizer, state: RunState,
               run: dict) -> None:
    """OUT/resume as the module says, written beside and swapped in."""
    final = out / RESUME
    tmp = temporary(final)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "adapter").mkdir(parents=True)
        write_adapter(model, tmp / "adapter")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        record = {"state": asdict(state), "settings": run}
        (tmp / "state.json").write_text(json.dumps(record, indent=2) + "\n")
        swap_folder(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def restore_state(out: Path, model, optimizer: torch.optim.Optimizer, run: dict,
                  eval_every: int) -> RunState:
    """The saved adapter and optimizer into `model` and `optimizer`; the state to go on from.
    A `run_record` that differs from the saved run's (but for `MAY_CHANGE`) is refused. The
    held-out score a session wrote as it stopped, off the `eval_every` cadence, is dropped:
    the uninterrupted run has none there."""
    folder = out / RESUME
    try:
        record = json.loads((folder / "state.json").read_text())
        state = RunState(**record["state"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MdlmError(f"--resume: {folder / 'state.json'} is unreadable ({e}); run without "
                        "--resume into another --out") from None
    saved, now = record.get("settings", {}), run
    changed = [k for k in now if k not in MAY_CHANGE and saved.get(k) != now[k]]
    if changed:
        k = changed[0]
        raise MdlmError(f"--resume: {k} was {saved.get(k)!r} in this run, now {now[k]!r}; "
                        "resume with the run's checkpoint, settings and sampling flags (only "
                        "--max-steps, --minutes, --eval-every, --eval-rows and --save-every "
                        "may change)")
    put_adapter_tensors(model, folder / "adapter")
    try:
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu",
                                             weights_only=True))
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise MdlmError(f"--resume: {folder / 'optimizer.pt'} cannot be restored "
                        f"({e})") from None
    final = bool(state.evals) and state.evals[-1]["step"] == state.step
    if final and state.step % eval_every:
        state.evals.pop()
    keep_log_until(out / "metrics.jsonl", state.step,
                   drop_eval=final and state.step % eval_every != 0)
    return state


def keep_log_until(log: Path, step: int, drop_eval: bool = False) -> None:
    """metrics.jsonl without the records of steps after `step` (those the resumed run takes
    again), and with `drop_eval` without the held-out score at `step`."""
    if not log.is_file():
        return
    kept = []
    for line in log.read_text().splitlines():
        record = json.loads(line) if line.strip() else None
        if record is None or record.get("step", 0) > step:
            continue
        if drop_eval and record.get("step") == step and "held_out_reward" in record:
            continue
        kept.append(line)
    log.write_text("".join(line + "\n" for line in kept))
