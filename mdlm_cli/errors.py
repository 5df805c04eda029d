"""User-facing errors: one line that says what is wrong and what to do."""

from __future__ import annotations


class MdlmError(ValueError):
    """A mistake the user can fix (bad option, missing file, no network...).

    The CLI prints it as a single line and exits with code 1; set MDLM_DEBUG=1
    for the traceback.
    """
