"""bd3lm requests gathered into shared batches: the requests that can share a batch of block
sampling (serve/blocks.py) are put in one job of the worker, which runs it alone on the model
(its blocks' key/value cache is the batch's own).

Requests share a batch when their rows have one length (generation/layout.py rounds a bd3lm
row to whole blocks), their prompts one length, and their sampling settings are the same but
for the seed and n; a request of several prompts, or of as many rows as a batch may hold,
runs by itself. The first such request opens a group and queues its job; later ones join it
until it starts and `max_wait_s` has passed since it opened, while its rows fit in
`max_batch` (fewer where that many rows do not fit in the memory the server has for
requests: serve/admission.py). Each request keeps its own `Job` (its time limit, its
client's disconnect, its answer); a request that stops leaves the others running.

Why answers do not change with batching: each request's rows draw from its own generator
what they draw alone (`BlockDraw.groups`), and every batch, alone or shared, runs at a row
count the probe of serve/shapes.py keeps (padded with rows of their own), so a row's logits
are the same bits in either.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .blocks import Part, choice_texts, finished, run_blocks, sample_parts
from .events import Emit
from .jobs import Cancelled, Job
from .schema import Plan
from .served import Served
from .shapes import Network, Shapes, fixed_shapes, probe
from .worker import Worker


def batch_key(plan: Plan, most: int) -> tuple | None:
    """What requests sharing a batch have in common; None: it runs by itself."""
    if len(plan.rows) != 1 or plan.num_rows >= most:
        return None
    row, how = plan.rows[0], plan.settings
    return (row.length, len(row.prefix), how.sampler, how.steps, how.precision,
            how.temperature, how.top_p, how.top_k, how.cfg_scale,
            repr(sorted(how.options.items())))


@dataclass(eq=False)
class _Member:
    plan: Plan
    job: Job  # the request's own: its time limit, its client, its answer
    emit: Emit
    answered: bool = False

    def answer(self, outcome, error: BaseException | None = None) -> None:
        if not self.answered:
            self.answered = True
            self.job.done(outcome, error)


@dataclass(eq=False)
class _Group:
    """Requests sharing one job. `lock` guards `open` and `members` and is taken last of all
    locks (never while taking another): the group closes both when its job starts and when
    the worker answers the job without running it, under the worker's own lock."""

    key: tuple
    length: int
    members: list[_Member]
    job: Job | None = None  # the worker's
    opened: float = field(default_factory=time.monotonic)
    open: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def rows(self) -> int:
        return sum(m.plan.n for m in self.members)

    def join(self, member: _Member, most: int, memory) -> bool:
        """`member` in the group, if it is open and the rows fit in `most`."""
        with self.lock:
            if not self.open or self.rows + member.plan.n > most:
                return False
            self.members.append(member)
            job = self.job
            job.rows = self.rows
            if memory is not None:
                job.bytes = memory.need(self.rows, self.length)
            job.timeout_s = max(job.timeout_s, member.job.deadline - job.submitted)
            return True

    def close(self) -> list[_Member]:
        """No more members; the ones it has."""
        with self.lock:
            self.open = False
            return list(self.members)


@dataclass(eq=False, kw_only=True)
class _GroupJob(Job):
    """A group's job on the worker: found expired and closed to newcomers in one step, so no
    request joins it (extending its deadline) after the worker has judged it out of time."""

    group: _Group

    def expired(self) -> bool:
        with self.group.lock:
            if not super().expired():
                return False
            self.group.open = False
            return True


def block_network(served: Served) -> Network:
    """The probe's network (serve/shapes.py) for a block model: rows (B, L) sampled as
    `BD3LM.sample` runs them, the logits of the first block (no context) and of the last
    (after the others committed to the cache), (B, 2 L', V)."""
    loaded, size = served.loaded, served.block_size

    def network(z: Tensor, t: Tensor, wanted: Tensor | None) -> Tensor:
        blocks = loaded.objective.block_model(loaded.model, True, served.dtype)
        with torch.no_grad():
            blocks.start(len(z), z.shape[1], z.device)
            first = blocks.logits(z[:, :size])
            for start in range(0, z.shape[1] - size, size):
                blocks.commit(z[:, start:start + size])
            return torch.cat([first, blocks.logits(z[:, -size:])], dim=1)

    return network


class BlockGatherer:
    """Gathers the served bd3lm requests into the worker's jobs (see the module's text)."""

    def __init__(self, worker: Worker, served: Served):
        self.worker, self.served = worker, served
        self._lock, self._probe_lock = threading.Lock(), threading.Lock()
        self._open: dict[tuple, _Group] = {}
        self._shapes: dict[int, Shapes] = {}

    def most(self, length: int) -> int:
        """The rows a batch at `length` may hold: `max_batch`, fewer where they do not fit."""
        memory, most = self.worker.memory, self.worker.max_batch
        return most if memory is None else max(1, memory.rows_at(length, most))

    def submit(self, plan: Plan, job: Job, emit: Emit) -> None:
        """The request's job (its `run` unused but by itself) into a group, or queued alone;
        `QueueFull` where the worker's queue is full."""
        length = plan.rows[0].length
        key = batch_key(plan, min(self.worker.max_batch, self.most(length)))
        if key is None:
            job.alone = True
            job.run = lambda d: run_blocks(plan, self.served, d, emit, self.size_for)
            self.worker.submit(job)
            return
        member = _Member(plan, job, emit)
        with self._lock:  # a group is queued before anyone may join it
            group = self._open.get(key)
            if group is not None and group.join(member, self.most(length), self.worker.memory):
                return
            # the groups answered without running (`_end` cannot take this lock)
            self._open = {k: g for k, g in self._open.items() if g.open}
            group = _Group(key, length, [member])
            group.job = _GroupJob(rows=plan.n, run=lambda d: self._run(group, d),
                                  done=lambda _, error: self._end(group, error),
                                  timeout_s=job.timeout_s, alone=True, bytes=job.bytes,
                                  group=group)
            self.worker.submit(group.job)
            self._open[key] = group

    def _end(self, group: _Group, error: BaseException | None) -> None:
        """The group's job is over, run or not (its time ran out in the queue, the server
        stopped): closed to newcomers (who open a group of their own; `_open` forgets it
        then), and the members not answered yet get its error."""
        for member in group.close():
            member.answer(None, error or Cancelled("shutdown"))

    def _close(self, group: _Group) -> list[_Member]:
        wait = group.opened + self.worker.max_wait_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # the requests that come meanwhile join
        with self._lock:
            if self._open.get(group.key) is group:
                del self._open[group.key]
        return group.close()

    def _run(self, group: _Group, denoiser) -> None:
        """The group's job: its members' rows in one batch; each member answered with its own
        text, or the error that stopped it."""
        members = self._close(group)
        started = time.monotonic()
        parts = []
        for m in members:
            m.job.started = started
            texts = choice_texts(m.plan, self.served)
            gen = torch.Generator(device=self.served.device).manual_seed(m.plan.seed)
            parts.append(Part(m.plan, m.plan.rows[0], gen, texts, m.emit))
        rows = sum(m.plan.n for m in members)
        size, t0, error = self.size_for(rows, group.length), time.perf_counter(), None
        try:
            calls = sample_parts(parts, self.served, self._check(denoiser, members, parts),
                                 size)
        except Exception as e:  # noqa: BLE001 - the members that had ended keep their answers
            calls, error = None, e
        batch = {"requests": len(members), "rows": rows, "padded_to": size,
                 "network_calls": calls, "batches": 1}
        seconds, told = time.perf_counter() - t0, False
        for m, part in zip(members, parts, strict=True):
            if part.dropped is not None or (error is not None and not part.ended):
                m.answer(None, part.dropped or error)
                told = told or part.dropped is None
            else:
                m.answer(finished(m.plan, part.texts, m.emit, part.stats(), seconds, batch))
        if error is not None and not told and not isinstance(error, Cancelled):
            # after every member had ended: no answer carries it, so the log does
            traceback.print_exception(error, file=sys.stderr)

    @staticmethod
    def _check(denoiser, members: list[_Member], parts: list[Part]):
        """Before each network call: the group's job (its time limit, the server stopping)
        and each member's (a member whose client left or whose time ran out is answered so
        and dropped; its rows go on); once every member has ended or stopped, Cancelled."""

        def check() -> None:
            denoiser.check()
            for m, part in zip(members, parts, strict=True):
                if not part.done:
                    try:
                        m.job.check()
                    except Cancelled as e:
                        part.dropped = e
                        m.answer(None, e)
            if all(p.done for p in parts):
                raise next(p.dropped for p in parts if p.dropped is not None)

        return check

    def size_for(self, rows: int, length: int) -> int:
        """The rows a batch of `rows` rows at `length` runs at: a size the probe keeps (its
        own rows past the largest)."""
        shapes = self.shapes(length)
        return shapes.size_for(rows) if rows <= shapes.sizes[-1] else rows

    def shapes(self, length: int) -> Shapes:
        """The shapes block batches at `length` run at, probed at the first batch of that
        length (serve/shapes.py: `--batch-padding`), from inside a job that runs alone."""
        with self._probe_lock:
            if length not in self._shapes:
                most, worker = self.most(length), self.worker
                self._shapes[length] = fixed_shapes(worker.padding, most, False) or probe(
                    block_network(self.served), max_batch=most, length=length,
                    mask_id=self.served.loaded.mask_id, masks=False, device=self.served.device)
            return self._shapes[length]

    def batching(self) -> str:
        """How bd3lm requests batch, in words, and the shapes probed so far (/health)."""
        worker = self.worker
        if worker.max_batch == 1:
            return "none: --max-batch 1, each bd3lm request runs alone"
        head = (f"bd3lm requests of one row length, prompt length and sampling settings share "
                f"their calls (up to {worker.max_batch} rows, gathered for "
                f"{worker.max_wait_s * 1000:g} ms)")
        probed = sorted(list(self._shapes.items()))  # not under the lock a probe holds
        if not probed:
            return head + "; shapes probed at each row length when its first request comes"
        return head + "; " + "; ".join(f"{n} positions: {s.why}" for n, s in probed)
