"""The engine's own error type: a bad argument to an engine function. A ValueError, so
Python callers can catch it as one; the CLI prints it as its one-line user error."""


class EngineError(ValueError):
    """An engine function was called with arguments it cannot serve."""


class ProbabilityError(EngineError):
    """A categorical draw was given rows it cannot draw from: a non-finite weight (a nan or inf
    logit, an overflowing temperature) or no weight at all (every class but the mask at -inf)."""
