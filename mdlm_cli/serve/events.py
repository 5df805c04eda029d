"""What a request's work hands the route while it runs: its events, one frozen dataclass each.

The request's thread emits them (`generation.run_plan`: text as it is decided, and the
decoder's `Revealed` states, generation/decode.py, as snapshots; the job's `done`); `app.py`
reads them off an asyncio queue and matches them by type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TextDelta:
    """New text of one choice, as soon as it is decided."""

    index: int
    text: str


@dataclass(frozen=True)
class StateSnapshot:
    """A denoising state (what `state_pieces` makes of z_t), for a client that asked for them."""

    pieces: Any


@dataclass(frozen=True)
class Done:
    """The job ended: its outcome, or the error that ended it."""

    outcome: Any
    error: BaseException | None


Event = TextDelta | StateSnapshot | Done
Emit = Callable[[Event], None]
