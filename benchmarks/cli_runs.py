"""What the CPU table scripts share: running `mdlm` as a user would, in the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mdlm(*args) -> str:
    """`python -m mdlm_cli ARGS` in the repository root; its output, or the script stops with
    the command and the end of its stderr."""
    out = subprocess.run([sys.executable, "-m", "mdlm_cli", *map(str, args)], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"mdlm {' '.join(map(str, args[:2]))} failed:\n{out.stderr[-2000:]}")
    return out.stdout + out.stderr
