"""The typed training state writes state.json as the dict it replaced did: same keys, same
order, unknown keys kept, so every existing checkpoint resumes and is re-saved unchanged."""

import json

import pytest

from mdlm_cli.train.state import TrainState


def test_a_fresh_run_writes_the_keys_in_the_order_of_the_old_dict():
    state = TrainState()
    state.threads = 2
    assert list(state.to_dict()) == ["step", "samples_seen", "tokens_seen", "best_valid_nats",
                                     "train_seconds", "threads"]
    state.advance(16, 512)
    assert state.record_validation(3.5) and not state.record_validation(3.6)
    state.final_step = state.step
    assert state.to_dict() == {"step": 1, "samples_seen": 16, "tokens_seen": 512,
                               "best_valid_nats": 3.5, "train_seconds": 0.0, "threads": 2,
                               "valid_nats": 3.6, "final_step": 1}


def test_a_saved_state_round_trips_to_the_same_bytes():
    text = json.dumps({"valid_nats": 2.0, "step": 7, "source": "hub:x", "samples_seen": 3,
                       "tokens_seen": 9, "best_valid_nats": None, "train_seconds": 1.5,
                       "notes": ["a"]}, indent=2)
    state = TrainState.from_dict(json.loads(text))
    assert state.step == 7 and state.valid_nats == 2.0
    assert state.extra == {"source": "hub:x", "notes": ["a"]}
    assert json.dumps(state.to_dict(), indent=2) == text
    state.threads = 4  # a key the file lacked goes after its own
    assert list(state.to_dict())[-1] == "threads"


def test_an_old_minimal_state_takes_the_defaults():
    state = TrainState.from_dict({"step": 5})
    defaults = (state.samples_seen, state.tokens_seen, state.best_valid_nats, state.threads)
    assert defaults == (0, 0, None, None)
    assert list(state.to_dict())[0] == "step" and "threads" not in state.to_dict()


@pytest.mark.parametrize("ema, weights", [(True, "EMA weights"), (False, "raw weights")])
def test_the_validation_line_names_the_weights_it_used(ema, weights):
    """With train.ema 0 there is no EMA: the line says the raw weights were evaluated."""
    import io

    from rich.console import Console

    from mdlm_cli.objectives.bound import BoundResult
    from mdlm_cli.train.log import record_eval

    console, log = Console(file=io.StringIO(), width=200), io.StringIO()
    record_eval(TrainState(), BoundResult(nats=20.0, tokens=10, sequences=1), 5, log, console,
                ema=ema)
    assert weights in console.file.getvalue() and '"step": 5' in log.getvalue()
