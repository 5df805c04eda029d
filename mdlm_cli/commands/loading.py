"""Loading the model a command runs (`--checkpoint`, `--device`, `--raw-weights`, `--threads`,
the network's `--precision`)."""

from __future__ import annotations

from .console import note


def load_for_command(checkpoint: str, device: str | None, raw_weights: bool,
                     threads: int | None = None, precision: str = "auto"):
    from ..checkpoints.load import load_on_device

    loaded, rt = load_on_device(checkpoint, device=device, raw_weights=raw_weights,
                                threads=threads, precision=precision)
    for text in loaded.state.get("notes") or []:  # e.g. an encoder's freshly initialised MLM head
        note(text)
    return loaded, rt
