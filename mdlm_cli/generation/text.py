"""A choice's text as its tokens arrive, for every surface that streams an answer (the
server's completions, chat and bd3lm blocks): cut at the answer's length, at the end of text
or of the turn, and at a stop string, handed out as deltas. The joined deltas are the final
text, so a streamed answer and an unstreamed one are the same."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ChoiceText:
    """A choice's text as its tokens arrive: cut at max_tokens, end of text and stop strings."""

    decode: Callable[[list[int]], str]
    max_tokens: int
    stop: list[str]
    eos_id: int | None  # the end-of-text token (BOS-started rows), None where rows have none
    prefix: str = ""  # echo: the prompt's text comes first
    end_ids: tuple[int, ...] = ()  # more tokens that end the answer (chat: the end of the turn)
    tokens: list[int] = field(default_factory=list)
    text: str = ""  # handed out so far, prefix included
    finish_reason: str | None = None
    ended: bool = False  # the model ended its answer with EOS (nothing from it on is kept)

    def feed(self, new: list[int]) -> str:
        """The text the new tokens decide; held back: what a stop string or a split character
        may still change."""
        if self.finish_reason is not None:
            return ""
        new = new[: self.max_tokens - len(self.tokens)]
        ends = [k for k, i in enumerate(new) if i == self.eos_id or i in self.end_ids]
        if ends:
            new, self.finish_reason, self.ended = new[: ends[0]], "stop", True
        self.tokens += new
        body = self.decode(self.tokens)
        hits = [i for i in (body.find(s) for s in self.stop) if i >= 0]
        if hits:
            body, self.finish_reason = body[: min(hits)], "stop"
            self.tokens = self._tokens_of(body)
        elif len(self.tokens) >= self.max_tokens:
            self.finish_reason = "length"
        full = self.prefix + body
        if self.finish_reason is None:
            hold = max((len(s) - 1 for s in self.stop), default=0)
            full = full[: len(full) - hold] if hold else full
            # a character split across tokens waits for its next byte
            full = full.rstrip("\ufffd")
        return self._hand_out(full)

    def finish(self) -> str:
        """The rest of the text once no more tokens come."""
        self.finish_reason = self.finish_reason or "length"
        return self._hand_out(self.prefix + self.decode(self.tokens))

    def _hand_out(self, full: str) -> str:
        if not full.startswith(self.text) or len(full) <= len(self.text):
            return ""
        delta, self.text = full[len(self.text) :], full
        return delta

    def _tokens_of(self, body: str) -> list[int]:
        """The fewest leading tokens whose text holds `body` (what usage counts after a stop)."""
        for k in range(len(self.tokens) + 1):
            if len(self.decode(self.tokens[:k])) >= len(body):
                return self.tokens[:k]
        return self.tokens
