"""What a caller asks of a model in one `mdlm sample`-style call, one type from the command
line and the Python API to the samplers: how many rows and how they are batched and
seeded, what conditions them (a text prompt, raw prompt ids, a chat question or an infill
template), how long the answer is, where it stops, and how to draw (`SamplingSettings`,
top_k among them). `validate()` checks it once, the rules across its fields included,
before anything is loaded or drawn; its messages name the flags (`--prompt`, ...).

The server's requests are the same type (serve/schema.py's `Plan` holds one beside the
rows it laid out): `num_samples` is a prompt's `n` choices, `max_new_tokens` its answer
(`max_tokens`, resolved by the row rule), and the fields only the HTTP layer fills: stop
strings, the tokens that end an answer (a chat turn's end), echo, a semi-AR stride and a
suffix.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..engine.settings import SamplingSettings
from ..errors import MdlmError

PROMPT_FLAGS = {"prompt": "--prompt", "prompt_ids": "--prompt-ids", "infill": "--infill",
                "chat": "--chat"}


class RequestError(MdlmError):
    """A rule of the request broken; `param` names the field (the server's 400 says it)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class GenerationRequest:
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    num_samples: int = 1
    batch_size: int | None = None  # rows per network call (None: all at once)
    seed: int = 0
    prompt: str | None = None  # a text prefix (after the model's row start)
    prompt_ids: tuple[int, ...] | None = None  # raw ids: nothing added before them
    chat: str | None = None  # a question through the tokeniser's chat template
    infill: str | None = None  # text with <mask> / <mask:N> spans to fill
    max_new_tokens: int | None = None  # the answer's length (None: the model's default)
    length: int | None = None  # or the row's whole length (semi-ar: the total)
    stop_at_eos: bool | None = None  # None: as the model was trained (sample/generate.py)
    allow_longer: bool = False  # rows past the trained length
    stop: tuple[str, ...] = ()  # strings that end an answer (not included)
    end_ids: tuple[int, ...] = ()  # tokens that end an answer (chat: the end of the turn)
    echo: bool = False  # the prompt's text before the answer's
    stride: int | None = None  # semi-AR: new tokens per window after the first
    suffix_ids: tuple[int, ...] = ()  # fixed tokens after the answer (real infilling)

    def validate(self) -> GenerationRequest:
        given = [flag for name, flag in PROMPT_FLAGS.items() if getattr(self, name) is not None]
        if len(given) > 1:
            raise MdlmError(f"give {' or '.join(given)}, not both")
        if self.max_new_tokens is not None and self.length is not None:
            raise MdlmError("give --length or --max-new-tokens, not both")
        for name, value in (("--num-samples", self.num_samples),
                            ("--batch-size", self.batch_size),
                            ("--length", self.length),
                            ("--max-new-tokens", self.max_new_tokens)):
            if value is not None and value < 1:
                raise MdlmError(f"{name} must be at least 1 (got {value})")
        if not len(self.stop) <= 4 or not all(isinstance(s, str) and s for s in self.stop):
            raise RequestError("stop must be a non-empty string or a list of 1 to 4 of them",
                               "stop")
        if self.stride is not None and self.stride < 1:
            raise RequestError(f"stride must be at least 1 (got {self.stride})", "stride")
        return self

    @property
    def rows_per_call(self) -> int:
        return min(self.batch_size or self.num_samples, self.num_samples)

    @property
    def conditioned(self) -> bool:
        """Whether a prompt comes before the answer (records then carry the response)."""
        return any(v is not None for v in (self.prompt, self.prompt_ids, self.chat))

    def with_(self, **changes: Any) -> GenerationRequest:
        return replace(self, **changes)

    def record(self) -> dict[str, Any]:
        """What each JSONL record says of the conditioning (the prompt forms given)."""
        out: dict[str, Any] = {"prompt": self.prompt, "infill": self.infill}
        if self.prompt_ids is not None:
            out["prompt_ids"] = list(self.prompt_ids)
        if self.chat is not None:
            out["chat"] = self.chat
        return out
