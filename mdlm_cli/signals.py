"""Stop signals: the first SIGTERM or SIGINT asks for a graceful stop, the second stops at
once."""

from __future__ import annotations

import os
import signal
import threading
import time

# signals this close to the first are the same request (tools often deliver one twice)
SAME_REQUEST_S = 1.0

_ACTIVE: list[StopSignals] = []  # the entered instances, undone in a forked child


class StopSignals:
    """Two signals, two stops. The first SIGTERM or SIGINT asks for a graceful one; the second
    stops at once (exit 128 + its number), leaving every file as it was: checkpoints are
    written to a temporary folder and renamed, so the last whole one stays the last.

    The first: in training (`dist`), SIGTERM (preemption, `scancel`, SLURM's --signal, torchrun
    shutting down) asks the loop to stop after the current step and save a checkpoint; under
    torchrun SIGINT (Ctrl-C) does the same, since ranks must stop at the same step, and a
    single process's SIGINT raises KeyboardInterrupt (the loop saves, then stops). Other
    commands (`dist` None) treat SIGTERM as Ctrl-C, unless `flag_both`: then both only set
    `received` (reproduce, which lets its running job stop first). The loop agrees on
    stopping across ranks with one reduction per step.

    The second (a second or more after the first: closer ones are the same request, sent to
    the process and its group) is seen by a watcher thread woken by the signal itself
    (`signal.set_wakeup_fd`), not by the main thread, which runs Python signal handlers only
    between bytecodes and so not during a long tensor operation. `forward(signum)` is called
    by the watcher for every signal (reproduce hands them to its running job)."""

    def __init__(
        self,
        dist=None,  # distributed.Dist of a training run; None for other commands
        *,
        first: str = "stopping after this step with a checkpoint",
        kept: str = "the last saved checkpoint stays as it was",
        forward=None,
        flag_both: bool = False,
    ):
        if flag_both:
            self.signals, self.interrupt = [signal.SIGTERM, signal.SIGINT], []
        elif dist is not None:
            self.signals = [signal.SIGTERM] + ([signal.SIGINT] if dist.enabled else [])
            self.interrupt = []
        else:
            self.signals, self.interrupt = [], [signal.SIGTERM]
        self.first, self.kept, self.forward = first, kept, forward
        self.received: str | None = None
        self.count = 0
        self._first_at = 0.0
        self._previous: dict[int, object] = {}
        self._pipe: tuple[int, int] | None = None
        self._old_fd = -1
        self._thread: threading.Thread | None = None

    @property
    def requested(self) -> bool:
        return self.received is not None

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def _interrupt(self, signum, frame) -> None:
        raise KeyboardInterrupt

    def _watch(self, fd: int) -> None:
        """The watcher: one byte per signal caught (its number); 0 ends it."""
        while data := os.read(fd, 64):
            for signum in data:
                if signum == 0:
                    return
                if signum in (signal.SIGINT, signal.SIGTERM):
                    self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        now = time.monotonic()
        if self.count and now - self._first_at < SAME_REQUEST_S:
            return  # one request delivered twice (GNU timeout signals the child, then its group)
        self.count += 1
        name = signal.Signals(signum).name
        if self.forward is not None:
            self.forward(signum)
        if self.count == 1:
            self._first_at = now
            again = "send it again (Ctrl-C or SIGTERM) to stop at once"
            _say(f"{name}: {self.first}; {again} ({self.kept})")
            return
        _say(f"second signal ({name}): stopped at once; {self.kept}")
        os._exit(128 + signum)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers are the main thread's
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)
        for s in self.interrupt:
            self._previous[s] = signal.signal(s, self._interrupt)
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._old_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._thread = threading.Thread(
            target=self._watch, args=(read,), name="mdlm-signals", daemon=True
        )
        self._thread.start()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if self._pipe is not None:
            signal.set_wakeup_fd(self._old_fd)
            os.write(self._pipe[1], b"\0")
            self._thread.join(timeout=5)
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None


def _undo_in_child() -> None:
    """A forked child (lm-eval's bootstrap pool, a data loader worker) gets the handlers that
    were there before: it shares the parent's wakeup pipe, so each signal sent to it (Pool
    stops its workers with SIGTERM) was read by the parent's watcher as the parent's own
    (a 'first' then a 'second' signal: the parent exited), and its SIGTERM raised
    KeyboardInterrupt in the worker instead of ending it, which could leave the pool waiting
    on a worker forever."""
    for stop in reversed(_ACTIVE):
        for s, handler in stop._previous.items():
            signal.signal(s, handler)
        if stop._pipe is not None:
            signal.set_wakeup_fd(stop._old_fd)
            for fd in stop._pipe:
                os.close(fd)
            stop._pipe, stop._thread = None, None  # the watcher thread is not in the child
    _ACTIVE.clear()


os.register_at_fork(after_in_child=_undo_in_child)


def _say(message: str) -> None:
    """One line on stderr from the watcher thread (no rich console: it may be mid-render)."""
    try:  # a progress bar may have hidden the cursor: show it again
        os.write(2, ("\x1b[?25h" if os.isatty(2) else "").encode() + f"\n{message}\n".encode())
    except OSError:
        pass
