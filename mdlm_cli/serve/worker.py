"""The batching worker: one thread owns the model; each request samples in its own thread
with its own `torch.Generator`, and its network calls are gathered with those of the other
running requests into one call of the model.

Why answers do not change with batching: a request's random draws come only from its own
generator, in the order its sampler makes them, whoever else is running; and the network
runs only at the shapes where a row's logits are the same bits whatever its batch
(serve/shapes.py: found by a probe at the first call of each row length, or every call
padded to `max_batch` rows), not
depending on what the other rows hold. So a seeded request gets the same tokens in every
batch. `max_batch = 1` turns batching off (every call one row).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..engine.protocols import is_time_agnostic, supports_output_mask
from .jobs import Cancelled, Job, QueueFull
from .shapes import Shapes, fixed_shapes, probe

if TYPE_CHECKING:
    from .admission import Memory

# the jobs' types too, where callers look for them
__all__ = ["Batching", "Cancelled", "Job", "QueueFull", "Worker"]


@dataclass(frozen=True)
class Batching:
    """How the worker gathers calls: at most `max_batch` rows a call, a call waiting at most
    `max_wait_s` for the other running requests', `queue_size` requests waiting, and the
    shapes calls run at (`padding`: serve/shapes.py's auto | always | never)."""

    max_batch: int = 8
    max_wait_s: float = 0.005
    queue_size: int = 64
    padding: str = "auto"


@dataclass(eq=False)
class _Call:
    job: Job
    kind: str  # logits | log_score
    z: Tensor  # (B, L)
    t: Tensor  # (B,)
    wanted: Tensor | None = None  # (B, L) bool: the positions whose logits it needs (None: all)
    made: float = field(default_factory=time.monotonic)
    result: Tensor | None = None
    error: BaseException | None = None
    ready: threading.Event = field(default_factory=threading.Event)


class JobDenoiser:
    """What a request's sampler calls in place of the model: its calls go to the worker."""

    supports_output_mask = True

    def __init__(self, worker: Worker, job: Job):
        self._worker, self._job = worker, job
        # this request's network calls and the rows they held
        self.calls = self.sequence_evals = 0
        base = worker.denoiser
        self.time_agnostic = is_time_agnostic(base)
        # a score model (SEDD): the engine asks for its log-scores
        if hasattr(base, "log_score"):
            self.log_score = self._log_score

    def __call__(self, z_t: Tensor, t: Tensor, *, output_mask: Tensor | None = None) -> Tensor:
        """Logits (B, L, V), or (N, V) at the N True positions of `output_mask`."""
        return self._call("logits", z_t, t, output_mask)

    def _log_score(self, z_t: Tensor, t: Tensor, *, output_mask: Tensor,
                   attention_mask: Tensor | None = None) -> Tensor:
        if attention_mask is not None:  # score rows are never padded (score.py)
            raise ValueError("the batching worker's calls take no attention mask")
        return self._call("log_score", z_t, t, output_mask)

    def _call(self, kind: str, z_t: Tensor, t: Tensor, wanted: Tensor | None = None) -> Tensor:
        self.calls += 1
        self.sequence_evals += len(z_t)
        return self._worker.call(self._job, kind, z_t, t, wanted)


class _Direct:
    """The model itself for a job that runs alone: every method it has (the block cache's
    too), each call first checking the job's time limit and client."""

    def __init__(self, denoiser, job: Job):
        self._denoiser, self._job = denoiser, job

    def check(self) -> None:
        """The job's time limit and client, for a caller that reaches the network past this
        wrapper (a bd3lm request's block sampler runs the backbone itself)."""
        self._job.check()

    def __call__(self, *args, **kwargs):
        self._job.check()
        return self._denoiser(*args, **kwargs)

    def __getattr__(self, name: str):
        value = getattr(self._denoiser, name)
        if not callable(value):
            return value

        def checked(*args, **kwargs):
            self._job.check()
            return value(*args, **kwargs)

        return checked


class Worker:
    """Admits queued jobs while their rows fit in `max_batch` (one job larger than that runs
    alone) and runs their network calls in batches: a batch runs once every running job has a
    call waiting, or the oldest call has waited `max_wait_s`. `exclusive`: one job at a time,
    calling the model directly (left-to-right models, whose KV-cache calls do not batch, and
    bd3lm models, whose jobs each hold one batch's blocks' cache: serve/gather.py puts the
    requests that can share a batch in one job); a job marked `alone` (a block cache) runs so
    too."""

    def __init__(self, denoiser, *, mask_id: int, batching: Batching | None = None,
                 exclusive: bool = False, metrics=None, device: torch.device | str = "cpu",
                 memory: Memory | None = None):
        batching = batching or Batching()
        self.denoiser, self.mask_id = denoiser, mask_id
        self.memory = memory
        self.padding, self.device = batching.padding, torch.device(device)
        self._shapes: dict[tuple[str, int], Shapes] = {}
        self._probe_lock = threading.Lock()
        self.max_batch, self.max_wait_s = batching.max_batch, batching.max_wait_s
        self.queue_size = batching.queue_size
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

    def call(self, job: Job, kind: str, z: Tensor, t: Tensor,
             wanted: Tensor | None = None) -> Tensor:
        """One network call of `job` (from its thread): waits for the batch it runs in.
        Logits (B, L, V), or (N, V) at the N True positions of `wanted`."""
        job.check()
        call = _Call(job, kind, z, t.expand(len(z)) if t.dim() == 0 else t, wanted)
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
            alone = self.exclusive or job.alone or any(j.alone for j in self._running)
            held = sum(j.bytes for j in self._running)
            if self._running and (alone or rows + job.rows > self.max_batch
                                  or self.memory is not None and not self.memory.fits(
                                      held + job.bytes)):
                return
            self._queue.popleft()
            self._gauge()
            if job.reason is not None or job.expired():
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
                if self.exclusive or job.alone:
                    result = job.run(_Direct(self.denoiser, job))
                else:
                    result = job.run(JobDenoiser(self, job))
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

    def shapes(self, kind: str, length: int) -> Shapes:
        """The shapes calls of this kind and length run at, probed at the first call of that
        length (serve/shapes.py), with at most the rows whose pass fits in memory."""
        key = (kind, length)
        with self._probe_lock:
            if key not in self._shapes:
                masks = kind == "log_score" or supports_output_mask(self.denoiser)
                most = self.max_batch if self.memory is None else max(
                    1, self.memory.rows_at(length, self.max_batch))
                self._shapes[key] = fixed_shapes(self.padding, most, masks) or probe(
                    lambda z, t, wanted: self._forward(kind, z, t, wanted),
                    max_batch=most, length=length, mask_id=self.mask_id,
                    masks=masks, device=self.device)
            return self._shapes[key]

    def batching(self) -> str:
        """How calls are batched, in words, at each row length probed so far (/health)."""
        # a copy, not under the lock a probe holds: /health answers while one runs
        probed = sorted(list(self._shapes.items()), key=lambda item: item[0][1])
        if not probed:
            return "probed at each row length when its first request comes"
        return "; ".join(f"{length} positions: {shapes.why}" for (_, length), shapes in probed)

    def _run(self, calls: list[_Call]) -> None:
        """The calls' rows through the network in chunks of at most `max_batch` rows, each at
        a shape of `shapes`; with output masks, only the positions the calls want."""
        first = calls[0]
        try:
            shapes = self.shapes(first.kind, first.z.shape[1])
            # with output masks every call asks for its positions (all of them where it gave
            # none): a row takes the same path whatever its batch, which the probe checked
            masked = shapes.masked
            z = torch.cat([c.z for c in calls])
            t = torch.cat([c.t.to(z.device, torch.float32) for c in calls])
            wanted = torch.cat([_all(c) if c.wanted is None else c.wanted for c in calls]
                               ) if masked else None
            most = shapes.sizes[-1]  # max_batch, or fewer where that many rows do not fit
            out = torch.cat([
                self._network(first.kind, z[i : i + most], t[i : i + most],
                              None if wanted is None else wanted[i : i + most], shapes)
                for i in range(0, len(z), most)
            ])
        except BaseException as e:  # every caller gets the failure; the worker goes on
            for call in calls:
                call.error = e
                call.ready.set()
            return
        start = 0  # rows of `out` (positions where masked) handed out so far
        for call in calls:
            if masked:
                n = int(_all(call).sum() if call.wanted is None else call.wanted.sum())
                piece = out[start : start + n]
                call.result = piece.view(*call.z.shape, -1) if call.wanted is None else piece
            else:
                n = len(call.z)
                piece = out[start : start + n]
                call.result = piece if call.wanted is None else piece[call.wanted]
            start += n
            call.ready.set()

    def _network(self, kind: str, z: Tensor, t: Tensor, wanted: Tensor | None,
                 shapes: Shapes) -> Tensor:
        """One call of the model, its n rows padded (all masks at t = 1, no position wanted)
        to the shape `shapes` gives n: logits (n, L, V), or (N, V) at `wanted`."""
        n, size = len(z), shapes.size_for(len(z))
        if size > n:
            z = torch.cat([z, z.new_full((size - n, z.shape[1]), self.mask_id)])
            t = torch.cat([t, t.new_ones(size - n)])
            if wanted is not None:
                wanted = torch.cat([wanted, wanted.new_zeros((size - n, z.shape[1]))])
        t0 = time.perf_counter()
        out = self._forward(kind, z, t, wanted)
        if self.metrics is not None:
            self.metrics.network_call(n, time.perf_counter() - t0)
        return out if wanted is not None else out[:n]

    def _forward(self, kind: str, z: Tensor, t: Tensor, wanted: Tensor | None) -> Tensor:
        """The model on (B, L) rows: logits or log-scores (B, L, V), or (N, V) at `wanted`."""
        with torch.no_grad():
            if kind == "log_score":
                mask = torch.ones_like(z, dtype=torch.bool) if wanted is None else wanted
                out = self.denoiser.log_score(z, t, output_mask=mask)
                return out.view(*z.shape, -1) if wanted is None else out
            if wanted is None:
                return self.denoiser(z, t)
            return self.denoiser(z, t, output_mask=wanted)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth(len(self._queue))


def _all(call: _Call) -> Tensor:
    return torch.ones_like(call.z, dtype=torch.bool)
