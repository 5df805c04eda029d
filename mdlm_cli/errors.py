"""User-facing errors: one line that says what is wrong and what to do."""

from __future__ import annotations


class MdlmError(ValueError):
    """A mistake the user can fix (bad option, missing file, no network...).

    The CLI prints it as a single line and exits with code 1; set MDLM_DEBUG=1
    for the traceback.
    """


class MdlmWarning(UserWarning):
    """Something the user should know that does not stop the command (the CLI prints it as
    one yellow line): e.g. a checkpoint pointer that had to fall back to an older step."""
