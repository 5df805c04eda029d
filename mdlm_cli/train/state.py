"""The training state a checkpoint's state.json holds, as a typed record.

The file is the dict it always was: `to_dict()` writes the same keys in the same order (a key
read from an older file keeps its place, one that is new goes after), optional keys only once
set, and keys this version does not know (an imported checkpoint's "source", "notes") are
kept as they were, so every existing checkpoint resumes and is re-saved unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

# written once set
_OPTIONAL = ("threads", "valid_nats", "final_step", "budget_steps", "objective_state")
_NOT_KEYS = ("extra", "order")  # fields that are not keys of the file


@dataclass
class TrainState:
    step: int = 0  # optimisation steps done
    samples_seen: int = 0  # rows consumed: the data order's position
    tokens_seen: int = 0
    best_valid_nats: float | None = None
    train_seconds: float = 0.0  # time in training so far, over every resume
    threads: int | None = None  # CPU threads of the run (a resumed run keeps them)
    valid_nats: float | None = None  # the last validation
    final_step: int | None = None  # set by the final validation: the run is finished there
    budget_steps: int | None = None  # max_steps fitted to train.time_budget (train/budget.py)
    # what the objective chose during training (Objective.training_state: bd3lm's interval)
    objective_state: dict | None = None
    extra: dict = field(default_factory=dict, repr=False)  # keys this version does not know
    order: tuple[str, ...] = field(default=(), repr=False, compare=False)  # the file's key order

    def advance(self, samples: int, tokens: int) -> None:
        """One optimisation step done, over `samples` rows holding `tokens` tokens."""
        self.step += 1
        self.samples_seen += samples
        self.tokens_seen += tokens

    def record_validation(self, nats: float) -> bool:
        """Note a validation result (nats per token); whether it is the best so far."""
        best = self.best_valid_nats is None or nats < self.best_valid_nats
        if best:
            self.best_valid_nats = nats
        self.valid_nats = nats
        return best

    @classmethod
    def from_dict(cls, data: dict) -> TrainState:
        """From state.json's content; missing keys take the defaults of a fresh run."""
        known = {f.name for f in fields(cls)} - set(_NOT_KEYS)
        return cls(**{k: v for k, v in data.items() if k in known},
                   extra={k: v for k, v in data.items() if k not in known}, order=tuple(data))

    def to_dict(self) -> dict:
        """state.json's content."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_KEYS}
        values = {k: v for k, v in values.items()
                  if k not in _OPTIONAL or v is not None or k in self.order}
        values.update(self.extra)
        first = {k: values[k] for k in self.order if k in values}
        return {**first, **{k: v for k, v in values.items() if k not in first}}
