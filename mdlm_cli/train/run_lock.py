"""One trainer per run folder: `runs/NAME/lock` holds the trainer's pid and host.

The holder keeps an exclusive `flock` on the file while it trains, which the kernel drops
when the process dies however it dies; a file nobody holds is stale (its pid is reported
and the lock is taken over). Where the file system has no flock, the recorded pid decides:
stale when that pid no longer runs on this host; a lock recorded by another host is only
released by deleting the file. Under torchrun only rank 0 holds it (`train.train`).
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from pathlib import Path

from ..errors import MdlmError, MdlmWarning
from ..io.files import os_error_message, pid_alive

LOCK_FILE = "lock"

try:
    import fcntl
except ImportError:  # not on Windows: the recorded pid decides alone
    fcntl = None


class RunLock:
    """An exclusive lock on a run folder, as a context manager; refuses in one line."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.path = Path(run_dir), Path(run_dir) / LOCK_FILE
        self.fd: int | None = None
        self.created_folder = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        try:
            self.created_folder = not self.run_dir.exists()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            for _ in range(3):  # retried only when the file was replaced under us
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                holder = self._take(fd)
                if holder is None:
                    return
                os.close(fd)
                if holder != "replaced":
                    raise MdlmError(holder)
        except OSError as e:
            self._remove_if_created()
            raise MdlmError(f"cannot lock the run folder {self.run_dir}: {os_error_message(e)}; "
                            "choose a writable --out") from None
        raise MdlmError(
            f"could not lock {self.path}: it keeps changing; is another trainer starting?"
        )

    def _take(self, fd: int) -> str | None:
        """None once this process holds the lock on `fd`; else why not (or 'replaced')."""
        recorded = _read(fd)
        flocked = _flock(fd)
        if flocked is False:
            return self._refusal(recorded)
        if os.fstat(fd).st_ino != os.stat(self.path).st_ino:  # released and deleted meanwhile
            return "replaced"
        if (
            flocked is None and recorded and _alive(recorded)
        ):  # no flock here: trust the recorded pid
            return self._refusal(recorded)
        if recorded:
            warnings.warn(
                f"took over a stale lock on {self.run_dir}: process {recorded.get('pid')} on "
                f"{recorded.get('host')} no longer runs",
                MdlmWarning,
                stacklevel=3,
            )
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return None

    def _refusal(self, recorded: dict) -> str:
        who = "another process"
        if recorded:
            since = recorded.get("started")
            who = f"process {recorded.get('pid')} on {recorded.get('host')} (since {since})"
        return (
            f"{self.run_dir} is being trained by {who}; wait for it to finish or stop it, or "
            f"choose another --out (if that process is gone, delete {self.path})"
        )

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if _read(self.fd).get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self.fd)  # drops the flock
            self.fd = None
        self._remove_if_created()

    def _remove_if_created(self) -> None:
        if self.created_folder and self.run_dir.is_dir() and not any(self.run_dir.iterdir()):
            self.run_dir.rmdir()  # nothing was trained: leave no empty run folder behind


def _read(fd: int) -> dict:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _flock(fd: int) -> bool | None:
    """True: now held; False: another process holds it; None: this file system has no flock."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def _alive(recorded: dict) -> bool:
    """Whether the recorded holder may still run: its pid runs here, or it is on another host."""
    pid = recorded.get("pid")
    if recorded.get("host") != socket.gethostname():
        return True
    return isinstance(pid, int) and pid != os.getpid() and pid_alive(pid)
