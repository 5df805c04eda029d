"""The batching worker: one thread owns the model; each request samples in its own thread
with its own `torch.Generator`, and its network calls are gathered with those of the other
running requests into one call of the model.

Why answers do not change with batching: a request's random draws come only from its own
generator, in the order its sampler makes them, whoever else is running; and the network
always runs at one shape, `max_batch` rows (unused rows are padding), because a matrix
product's rounding depends on the number of rows it multiplies (a row's float32 logits
differ in the last bits between a call of 1 row and of 8), not on what the other rows hold.
So a row's logits are the same bits in every batch, and a seeded request the same tokens.
`max_batch = 1` turns batching off (every call one row, no padding).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..engine.protocols import is_time_agnostic


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
    on_call: Callable[[Tensor], None] | None = None  # sees z_t at each of its network calls
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    reason: str | None = None  # why it was cancelled

    @property
    def deadline(self) -> float:
        return self.submitted + self.timeout_s

    def cancel(self, reason: str) -> None:
        self.reason = self.reason or reason

    def check(self) -> None:
        if self.reason is None and time.monotonic() > self.deadline:
            self.reason = "timeout"
        if self.reason is not None:
            raise Cancelled(self.reason)


@dataclass(eq=False)
class _Call:
    job: Job
    kind: str  # logits | log_score
    z: Tensor  # (B, L)
    t: Tensor  # (B,)
    made: float = field(default_factory=time.monotonic)
    result: Tensor | None = None
    error: BaseException | None = None
    ready: threading.Event = field(default_factory=threading.Event)


class JobDenoiser:
    """What a request's sampler calls in place of the model: its calls go to the worker."""

    supports_output_mask = True

    def __init__(self, worker: Worker, job: Job):
        self._worker, self._job = worker, job
        self.calls = self.sequence_evals = 0  # this request's network calls and the rows they held
        base = worker.denoiser
        self.time_agnostic = is_time_agnostic(base)
        if hasattr(base, "log_score"):  # a score model (SEDD): the engine asks for its log-scores
            self.log_score = self._log_score

    def __call__(self, z_t: Tensor, t: Tensor, *, output_mask: Tensor | None = None) -> Tensor:
        logits = self._call("logits", z_t, t)  # (B, L, V)
        return logits if output_mask is None else logits[output_mask]

    def _log_score(self, z_t: Tensor, t: Tensor, *, output_mask: Tensor,
                   attention_mask: Tensor | None = None) -> Tensor:
        if attention_mask is not None:  # score rows are never padded (score.py)
            raise ValueError("the batching worker's calls take no attention mask")
        return self._call("log_score", z_t, t)[output_mask]

    def _call(self, kind: str, z_t: Tensor, t: Tensor) -> Tensor:
        self.calls += 1
        self.sequence_evals += len(z_t)
        return self._worker.call(self._job, kind, z_t, t)


class Worker:
    """Admits queued jobs while their rows fit in `max_batch` (one job larger than that runs
    alone) and runs their network calls in batches: a batch runs once every running job has a
    call waiting, or the oldest call has waited `max_wait_s`. `exclusive`: one job at a time,
    calling the model directly (left-to-right models, whose KV-cache calls do not batch)."""

    def __init__(
        self,
        denoiser,
        *,
        mask_id: int,
        max_batch: int = 8,
        max_wait_s: float = 0.005,
        queue_size: int = 64,
        exclusive: bool = False,
        metrics=None,
    ):
        self.denoiser, self.mask_id = denoiser, mask_id
        self.max_batch, self.max_wait_s, self.queue_size = max_batch, max_wait_s, queue_size
        self.exclusive, self.metrics = exclusive, metrics
        self._cond = threading.Condition()
        self._queue: deque[Job] = deque()
        self._running: dict[Job, int] = {}
        self._pending: list[_Call] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="mdlm-worker", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ requests' side
    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopped or len(self._queue) >= self.queue_size:
                raise QueueFull
            self._queue.append(job)
            self._gauge()
            self._cond.notify_all()

    def depth(self) -> tuple[int, int]:
        """(queued, running) requests."""
        with self._cond:
            return len(self._queue), len(self._running)

    def call(self, job: Job, kind: str, z: Tensor, t: Tensor) -> Tensor:
        """One network call of `job` (from its thread): waits for the batch it runs in."""
        job.check()
        if job.on_call is not None:
            job.on_call(z)
        call = _Call(job, kind, z, t.expand(len(z)) if t.dim() == 0 else t)
        with self._cond:
            if self._stopped:
                raise Cancelled("shutdown")
            self._pending.append(call)
            self._cond.notify_all()
        call.ready.wait()
        if call.error is not None:
            raise call.error
        job.check()
        return call.result

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            for job in self._queue:
                job.cancel("shutdown")
            self._cond.notify_all()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ the worker thread
    def _loop(self) -> None:
        while True:
            with self._cond:
                self._admit()
                while not self._stopped and not self._due():
                    self._cond.wait(timeout=self._wait())
                    self._admit()
                if self._stopped:
                    self._fail_pending(Cancelled("shutdown"))
                    self._queue_drained()
                    return
                calls = self._take()
            self._run(calls)

    def _admit(self) -> None:
        while self._queue:
            job = self._queue[0]
            rows = sum(self._running.values())
            if self._running and (self.exclusive or rows + job.rows > self.max_batch):
                return
            self._queue.popleft()
            self._gauge()
            if job.reason is not None or time.monotonic() > job.deadline:
                job.cancel("timeout")
                job.done(None, Cancelled(job.reason))
                continue
            self._running[job] = job.rows
            job.started = time.monotonic()
            threading.Thread(
                target=self._work, args=(job,), name="mdlm-request", daemon=True
            ).start()

    def _work(self, job: Job) -> None:
        result, error = None, None
        try:
            with torch.no_grad():
                result = job.run(self.denoiser if self.exclusive else JobDenoiser(self, job))
        except BaseException as e:  # the request's answer, whatever went wrong
            error = e
        with self._cond:
            self._running.pop(job, None)
            self._cond.notify_all()
        job.done(result, error)

    def _due(self) -> bool:
        if not self._pending:
            return False
        waiting = {c.job for c in self._pending}
        rows = sum(len(c.z) for c in self._pending)
        return (
            len(waiting) >= len(self._running)
            or rows >= self.max_batch
            or time.monotonic() - self._pending[0].made >= self.max_wait_s
        )

    def _wait(self) -> float | None:
        if not self._pending:
            return None
        return max(self._pending[0].made + self.max_wait_s - time.monotonic(), 0.0) + 1e-4

    def _take(self) -> list[_Call]:
        """The waiting calls of the oldest call's kind and shape, in order."""
        first = self._pending[0]
        key = (first.kind, first.z.shape[1])
        calls = [c for c in self._pending if (c.kind, c.z.shape[1]) == key]
        self._pending = [c for c in self._pending if (c.kind, c.z.shape[1]) != key]
        return calls

    def _fail_pending(self, error: BaseException) -> None:
        for call in self._pending:
            call.error = error
            call.ready.set()
        self._pending = []

    def _queue_drained(self) -> None:
        while self._queue:
            job = self._queue.popleft()
            job.done(None, Cancelled("shutdown"))

    def _run(self, calls: list[_Call]) -> None:
        """The calls' rows through the network in chunks of exactly `max_batch` rows."""
        try:
            z = torch.cat([c.z for c in calls])
            t = torch.cat([c.t.to(z.device, torch.float32) for c in calls])
            outputs = [
                self._network(calls[0].kind, z[i : i + self.max_batch], t[i : i + self.max_batch])
                for i in range(0, len(z), self.max_batch)
            ]
            out = torch.cat(outputs)
        except BaseException as e:  # every caller gets the failure; the worker goes on
            for call in calls:
                call.error = e
                call.ready.set()
            return
        start = 0
        for call in calls:
            call.result = out[start : start + len(call.z)]
            start += len(call.z)
            call.ready.set()

    def _network(self, kind: str, z: Tensor, t: Tensor) -> Tensor:
        """One call of the model at the fixed shape (max_batch, L): logits or log-scores
        (n, L, V)."""
        n = len(z)
        if n < self.max_batch:  # padding rows: all masks at t = 1
            z = torch.cat(
                [
                    z,
                    torch.full(
                        (self.max_batch - n, z.shape[1]),
                        self.mask_id,
                        dtype=z.dtype,
                        device=z.device,
                    ),
                ]
            )
            t = torch.cat([t, torch.ones(self.max_batch - n, dtype=t.dtype, device=t.device)])
        t0 = time.perf_counter()
        with torch.no_grad():
            if kind == "log_score":
                every = torch.ones_like(z, dtype=torch.bool)
                out = self.denoiser.log_score(z, t, output_mask=every).view(*z.shape, -1)
            else:
                out = self.denoiser(z, t)
        if self.metrics is not None:
            self.metrics.network_call(n, time.perf_counter() - t0)
        return out[:n]

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth(len(self._queue))
