"""Files written so that nothing is lost: atomic writes, crash-safe folder swaps, clean-up
of what a killed process left behind, and one-line messages for I/O failures.

Temporaries sit next to their target as `.NAME.tmp-PID` (being written) or `.NAME.old-PID`
(the previous version, set aside for the instant of a swap). A process killed at any point
leaves the target or its `.old` copy intact; `remove_stale_temporaries` deletes the
`.tmp` leftovers of dead processes and puts an orphaned `.old` back in place.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

from ..errors import MdlmError

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def temporary(path: Path, kind: str = "tmp") -> Path:
    """This process's temporary sibling of `path`."""
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}")


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` in one rename: a reader sees the old or the new file, never
    half."""
    tmp = temporary(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def swap_folder(new: Path, final: Path) -> None:
    """Move the complete folder `new` to `final`, replacing any folder there, so that a
    kill at any instant leaves either version intact: the old one is renamed aside
    before the new one takes its name, and deleted only after."""
    if not final.exists():
        os.replace(new, final)
        return
    old = temporary(final, "old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(
        final, old
    )  # killed here: `final` is missing, `old` is whole (restored on the next clean-up)
    os.replace(new, final)
    shutil.rmtree(old, ignore_errors=True)


def remove_stale_temporaries(folder: Path, name: str | None = None) -> list[str]:
    """Delete the `.tmp` leftovers of processes that no longer run, and move an orphaned
    `.old` folder back to its name when nothing replaced it (only those of `name` if given);
    returns what was done."""
    done: list[str] = []
    if not folder.is_dir():
        return done
    for path in sorted(folder.iterdir()):
        m = _TEMPORARY.match(path.name)
        if (
            m is None
            or int(m["pid"]) == os.getpid()
            or pid_alive(int(m["pid"]))
            or name not in (None, m["name"])
        ):
            continue
        target = folder / m["name"]
        if m["kind"] == "old" and not target.exists():
            os.replace(path, target)
            done.append(f"restored {target.name} from an interrupted replacement")
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        done.append(f"removed {path.name}")
    return done


def stale_old_folders(folder: Path) -> list[tuple[str, Path]]:
    """(name, path) of `.NAME.old-PID` folders whose NAME is missing and whose writer is
    gone: whole copies that an interrupted swap left aside."""
    out = []
    if folder.is_dir():
        for path in folder.iterdir():
            m = _TEMPORARY.match(path.name)
            if (
                m is not None
                and m["kind"] == "old"
                and path.is_dir()
                and not (folder / m["name"]).exists()
                and not pid_alive(int(m["pid"]))
            ):
                out.append((m["name"], path))
    return out


def no_space(e: BaseException) -> bool:
    """Whether a write failed for lack of space (OSError, or torch's and safetensors' own
    errors)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    return "No space left" in text or "StorageFull" in text or "file write failed" in text


def os_error_message(e: OSError) -> str:
    """One line for an operating-system error, naming the file."""
    where = e.filename if e.filename is not None else "a file"
    if e.errno == errno.EPIPE:
        return "the output was closed before everything was written (broken pipe)"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device holding {where}"
    if e.errno == errno.EROFS:
        return f"cannot write {where}: it is on a read-only file system"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied: {where}"
    if e.errno == errno.ENOENT:
        return f"no such file or folder: {where}"
    return f"{e.strerror or type(e).__name__}: {where}"


def write_failure(e: BaseException, folder: Path, what: str) -> MdlmError:
    """The one-line error for a failed write of `what` into `folder` (nothing lost: the
    caller has discarded its temporaries and not touched what was there)."""
    if no_space(e):
        return MdlmError(
            f"no space left on the device holding {folder}; nothing was lost ({what} was not "
            "written, everything already there is intact): free some space and run the command "
            "again"
        )
    detail = os_error_message(e) if isinstance(e, OSError) else str(e).strip().splitlines()[0]
    return MdlmError(f"could not write {what} in {folder} ({detail}); nothing was lost")


def check_writable(path: str | Path) -> Path:
    """Fail at once (before any long work) when the file `path` cannot be written."""
    path = Path(path)
    if path.is_dir():
        raise MdlmError(f"{path} is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = temporary(path)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise MdlmError(os_error_message(e)) from None
    return path


def check_all_writable(*paths: str | Path | None) -> None:
    """`check_writable` for each path given (None or "": an output not asked for)."""
    for path in paths:
        if path:
            check_writable(path)


def read_json_object(path: Path) -> dict:
    """A JSON file holding an object (a checkpoint's config.json), or a one-line MdlmError."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        text = str(e).strip()
        why = text.splitlines()[0] if text else type(e).__name__
        raise MdlmError(
            f"{path} is not readable JSON ({why}); the checkpoint is corrupted"
        ) from None
    if not isinstance(raw, dict):
        raise MdlmError(f"{path} must hold a JSON object")
    return raw
