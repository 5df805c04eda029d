"""Golden numbers (issue 26): exact outputs of seeded test-size models, recorded in
tests/golden.json, so that a refactor that changes any number fails here.

Pinned, on random weights from a fixed torch seed (the `test` preset's 2x64 DiT):
  tokens/<sampler>  every sampler of engine.SAMPLERS: the token ids of 2 x 16 draws
                    (few steps) on a model of the first objective it serves;
  loss/<objective>  every objective of OBJECTIVES: loss_terms of one fixed batch (a
                    padded row included) at times and masks from fixed generators, and
                    mdlm again with T > 0, carry_over=false and time conditioning;
  bound/...         engine.nelbo of a fixed batch, every objective's `evaluate` on a
                    tiny split, and the AR model's exact sequence NLL.
Token ids are compared exactly, floats to a relative 1e-6 (CPU float32, one thread:
deterministic run to run; another CPU's kernels may differ in the last bits).

An entry is missing for a new sampler or objective, and a stale one fails
`test_golden_file_has_no_stale_entries`. After an intended change of numbers, rewrite
the file and review its diff:
    MDLM_GOLDEN_UPDATE=1 PYTHONPATH=$PWD python -m pytest -q tests/unit/test_golden.py
(in that mode every test records its value and is skipped; the file is written at the
end, keeping the entries of tests not run and dropping stale ones).
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

# ---- mdlm_cli imports: the only place this file names the package's modules ----------------
from mdlm_cli import engine
from mdlm_cli.build import resolve_config
from mdlm_cli.data.store import TokenSplit
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.models import build_model
from mdlm_cli.objectives import OBJECTIVES, SplitSweep, get_objective, objectives_served_by
from mdlm_cli.objectives.ar import sequence_nll

# ---- end of the mdlm_cli imports; the tests' own helpers -------------------------------------
from ..objective_configs import overrides as objective_overrides

GOLDEN = Path(__file__).resolve().parents[1] / "golden.json"
UPDATE = os.environ.get("MDLM_GOLDEN_UPDATE") == "1"
REL = 1e-6
TOK = load_tokenizer("char")
CPU = torch.device("cpu")
MDLM_VARIANTS = {"T=10": ["diffusion.T=10"], "carry_over=false": ["diffusion.carry_over=false"],
                 "time_conditioning": ["model.time_conditioning=true"]}


class Golden:
    """The recorded entries; in update mode, also the ones recorded in this run."""

    def __init__(self):
        self.entries = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        self.recorded = {}

    def check(self, key: str, tokens: list | None = None, floats: list | None = None) -> None:
        value = {k: v for k, v in (("tokens", tokens), ("floats", floats)) if v is not None}
        if UPDATE:
            self.recorded[key] = value
            pytest.skip(f"recorded {key}")
        assert key in self.entries, f"no golden entry {key!r}: regenerate (this module's docstring)"
        want = self.entries[key]
        assert set(value) == set(want), key
        if tokens is not None:
            assert tokens == want["tokens"], f"{key}: token ids changed"
        if floats is not None:
            want_floats = pytest.approx(want["floats"], rel=REL, abs=1e-9)
            assert floats == want_floats, f"{key}: values changed"


@pytest.fixture(scope="module")
def golden():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one summation order, whatever the machine's cores
    book = Golden()
    yield book
    torch.set_num_threads(threads)
    if UPDATE and book.recorded:
        merged = {**book.entries, **book.recorded}  # keeps the tests not run, drops stale entries
        kept = {k: merged[k] for k in sorted(merged) if k in expected_keys()}
        lines = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in kept.items())
        GOLDEN.write_text("{\n" + lines + "\n}\n")  # an entry a line: a readable diff


def expected_keys() -> set[str]:
    """The entries the tests below check."""
    keys = {f"tokens/{s}" for s in engine.SAMPLERS} | {f"loss/{n}" for n in OBJECTIVES}
    keys |= {f"loss/mdlm[{v}]" for v in MDLM_VARIANTS} | {f"bound/evaluate/{n}" for n in OBJECTIVES}
    return keys | {"bound/engine.nelbo[T=0]", "bound/engine.nelbo[T=10]",
                   "bound/ar.sequence_nll"}


def setup(name: str, *extra: str):
    """Objective `name` on the test preset and its model, weights from fixed seeds (every
    parameter moved off its initialisation, so zero-initialised gates and the output layer
    take part)."""
    cfg = resolve_config("test", [*objective_overrides(name), *extra])
    objective = get_objective(cfg, TOK)
    torch.manual_seed(0)
    model = build_model(cfg.model, TOK.vocab_size, causal=objective.causal)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
        model.output_layer.linear.weight.normal_(0, 0.05, generator=gen)  # logits of std ~0.5
    return cfg, objective, model.eval()


def fixed_batch(B: int = 3, L: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Real characters (ids 8..34), the last row padded after 20 tokens."""
    x0 = torch.randint(8, 35, (B, L), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones(B, L, dtype=torch.bool)
    attention_mask[-1, 20:] = False
    return x0, attention_mask


def tiny_split() -> TokenSplit:
    x0 = torch.randint(8, 35, (5, 32), generator=torch.Generator().manual_seed(4))
    return TokenSplit(x0.numpy(), np.array([32, 32, 32, 32, 20], dtype=np.int32))


def floats(x) -> list[float]:
    return [float(v) for v in torch.as_tensor(x).double().flatten()]


@pytest.mark.parametrize("sampler", list(engine.SAMPLERS))
def test_sampler_tokens(golden, sampler):
    _, objective, model = setup(objectives_served_by(sampler)[0])
    with torch.no_grad():
        tokens = engine.sample(objective.denoiser(model), sampler=sampler, num_samples=2, length=16,
                               mask_id=TOK.mask_id, steps=4, schedule=objective.schedule,
                               generator=torch.Generator().manual_seed(0))
    golden.check(f"tokens/{sampler}", tokens=tokens.tolist())


def loss_of(name: str, *extra: str) -> list[float]:
    cfg, objective, model = setup(name, *extra)
    x0, attention_mask = fixed_batch()
    draw = objective.draw_times(cfg.diffusion.T, cfg.diffusion.antithetic)
    t = None if draw is None else draw(len(x0), torch.Generator().manual_seed(0))
    with torch.no_grad():
        terms = objective.loss_terms(objective.denoiser(model), x0, t,
                                     generator=torch.Generator().manual_seed(2),
                                     attention_mask=attention_mask)
    return floats(terms)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_objective_loss(golden, name):
    golden.check(f"loss/{name}", floats=loss_of(name))


@pytest.mark.parametrize("variant", list(MDLM_VARIANTS))
def test_mdlm_ablation_loss(golden, variant):
    golden.check(f"loss/mdlm[{variant}]", floats=loss_of("mdlm", *MDLM_VARIANTS[variant]))


@pytest.mark.parametrize("T", [0, 10])
def test_engine_nelbo(golden, T):
    _, objective, model = setup("mdlm")
    x0, attention_mask = fixed_batch()
    with torch.no_grad():
        nats = engine.nelbo(objective.denoiser(model), x0, mask_id=TOK.mask_id,
                            schedule=objective.schedule, num_samples=2, T=T,
                            masking=engine.Masking(generator=torch.Generator().manual_seed(5),
                                                   attention_mask=attention_mask))
    golden.check(f"bound/engine.nelbo[T={T}]", floats=floats(nats))


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_objective_evaluate(golden, name):
    _, objective, model = setup(name)
    results = objective.evaluate(objective.denoiser(model), tiny_split(),
                                 SplitSweep(2, CPU, per_sequence=True), seeds=[0, 1])
    values = [v for r in results for v in floats(r.per_sequence)]  # one pass for an exact objective
    golden.check(f"bound/evaluate/{name}", floats=values)


def test_ar_sequence_nll(golden):
    _, _, model = setup("ar")
    x0, attention_mask = fixed_batch()
    with torch.no_grad():
        nll = sequence_nll(model, x0, bos_id=TOK.bos_id, mask_id=TOK.mask_id,
                           attention_mask=attention_mask)
    golden.check("bound/ar.sequence_nll", floats=floats(nll))


def test_golden_file_has_no_stale_entries():
    """Every recorded entry belongs to a test here (a removed sampler or objective leaves none)."""
    if UPDATE:
        pytest.skip("update mode: the file is being rewritten")
    assert set(json.loads(GOLDEN.read_text())) == expected_keys()
