"""A request's work as the batching worker runs it: the `Job` (its rows, its run, its time
limit and the memory its calls need), and why one did not run: the queue was full
(`QueueFull`) or it was stopped (`Cancelled`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class QueueFull(Exception):
    """The waiting queue holds `queue_size` requests."""


class Cancelled(Exception):
    """A request's work stopped: its client went away ("disconnect"), its time ran out
    ("timeout") or the server stops ("shutdown")."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(eq=False, kw_only=True)  # by keyword: four of its fields are callables or floats
class Job:
    """A request's work: `run(denoiser)` in its own thread, then `done(result, error)`."""

    rows: int
    run: Callable[[Any], Any]
    done: Callable[[Any, BaseException | None], None]
    timeout_s: float
    alone: bool = False  # runs by itself on the model (a block cache's calls do not batch)
    bytes: int = 0  # the memory its network calls need beyond the weights (memory.ForwardCost)
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    reason: str | None = None  # why it was cancelled

    @property
    def deadline(self) -> float:
        return self.submitted + self.timeout_s

    def expired(self) -> bool:
        """Past its deadline, as the worker is about to start it (a job that others may join
        decides this and closes to them in one step: serve/gather.py)."""
        return time.monotonic() > self.deadline

    def cancel(self, reason: str) -> None:
        self.reason = self.reason or reason

    def check(self) -> None:
        if self.reason is None and time.monotonic() > self.deadline:
            self.reason = "timeout"
        if self.reason is not None:
            raise Cancelled(self.reason)
