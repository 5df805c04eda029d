"""LLaDA's likelihood estimator (engine/counted.py) through mdlm's scorer: stratified counts,
a one-token continuation scored exactly in every pass and for every seed, the same bound as
the time estimator in expectation, LLaDA's folder scored with it by default."""

import pytest
import torch

from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.engine.counted import counted_terms, stratified_counts
from mdlm_cli.engine.diffusion import Masking, masked_nll
from mdlm_cli.engine.errors import EngineError
from mdlm_cli.errors import MdlmError
from mdlm_cli.eval.lm_eval.scoring import ConditionalScorer, build_row
from tests.open_model_folders import write_dream, write_llada


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("counted")
    return {"llada": load_checkpoint(str(write_llada(base / "llada"))),
            "dream": load_checkpoint(str(write_dream(base / "dream")))}


def test_the_counts_are_stratified_over_one_to_n():
    g = torch.Generator().manual_seed(0)
    n = torch.tensor([10, 1, 7, 3])
    counts = stratified_counts(n, 10, g)  # (K, B)
    assert sorted(counts[:, 0].tolist()) == list(range(1, 11))  # n / K = 1 apart: every count
    assert (counts[:, 1] == 1).all()
    assert ((counts >= 1) & (counts <= n[None])).all()
    assert len(set(counts[:, 2].tolist())) == 7  # 10 passes over 7 counts: each at least once


def exact_nll(loaded, row: list[int]) -> float:
    """-log p(last token | the rest) from one call with that token masked."""
    z = torch.tensor([row])
    z[0, -1] = loaded.mask_id
    with torch.no_grad():
        logits = loaded.denoiser()(z, torch.ones(1))
    return float(masked_nll(logits[0, -1:], torch.tensor(row[-1:]), loaded.mask_id))


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_one_token_continuation_is_exact_in_every_pass(folders, family):
    loaded = folders[family]
    context, answer = [5, 17, 3, 9, 22], [40]
    expected = exact_nll(loaded, build_row(loaded.row_start(), context, answer, loaded.length)[0])
    for seed in range(3):
        scorer = ConditionalScorer(loaded, mc_samples=4, estimator="l", seed=seed)
        scored = scorer.score([(context, answer)], greedy=False)[0]
        assert scored.passes == pytest.approx([expected] * 4, abs=1e-5)
    spread = ConditionalScorer(loaded, mc_samples=8, estimator="t").score(
        [(context, answer)], greedy=False)[0].passes
    assert max(spread) - min(spread) > 0.1  # the time estimator's terms do spread


def test_the_counted_and_the_time_estimators_agree_in_expectation(folders):
    loaded = folders["llada"]
    pair = ([5, 17, 3], [40, 41, 12, 8, 30, 2])
    means = {}
    for name in ("l", "t"):
        passes = ConditionalScorer(loaded, mc_samples=512, batch_size=1, estimator=name).score(
            [pair], greedy=False)[0].passes
        t = torch.tensor(passes, dtype=torch.float64)
        means[name] = (float(t.mean()), float(t.std() / len(t) ** 0.5))
    (ml, sl), (mt, st) = means["l"], means["t"]
    assert abs(ml - mt) < 4 * (sl**2 + st**2) ** 0.5, means


def test_the_family_default_and_the_refusals(folders):
    assert ConditionalScorer(folders["llada"]).estimator == "l"  # LLaDA's evaluation code
    assert ConditionalScorer(folders["dream"]).estimator == "t"
    with pytest.raises(MdlmError, match="--estimator must be one of: t, l"):
        ConditionalScorer(folders["llada"], estimator="k")

    def timed(z, t, output_mask=None):  # declares nothing: it may read t
        raise AssertionError("never called")

    x0 = torch.tensor([[1, 2, 3]])
    with pytest.raises(EngineError, match="needs a denoiser that ignores t"):
        counted_terms(timed, x0, torch.tensor([1]), mask_id=0, masking=Masking())


def dream_encode_pair(hf, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Dream's eval/eval.py `_encode_pair` with add_bos_token=True, transcribed (no cutoff)."""
    context = hf.bos_token + context
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole_enc = hf.encode(context + continuation) + [hf.eos_token_id]
    context_enc = hf.encode(context)
    return context_enc, whole_enc[len(context_enc):]


def test_dream_scoring_builds_the_released_evaluations_rows(folders):
    pytest.importorskip("lm_eval")
    from mdlm_cli.eval.lm_eval.adapter import MdlmLM, ModelArgs

    dream, llada = folders["dream"], folders["llada"]
    lm = MdlmLM(ModelArgs(mc_samples=2), loaded=dream)
    assert lm.append_eos and lm.tokenizer_bos and lm.scorer.start == []  # the family's
    for context, continuation in [("w1 w2 w3", " w4"), ("w5 w6 ", "w7 w8")]:
        released = dream_encode_pair(dream.tokenizer.hf, context, continuation)
        ours = lm.pair(context, continuation)
        row = build_row(lm.scorer.start, ours[0], ours[1] + [dream.tokenizer.eos_id],
                        dream.length)[0]
        assert row == released[0] + released[1]  # ids compared
        scored = lm.scorer.score([ours], greedy=False, suffix=[dream.tokenizer.eos_id])[0]
        assert scored.tokens == len(ours[1])  # the EOS is attended, never scored
    plain = MdlmLM(ModelArgs(mc_samples=2, append_eos=False, tokenizer_bos=False), loaded=dream)
    assert not plain.append_eos and plain.scorer.start == dream.row_start()
    assert not MdlmLM(ModelArgs(mc_samples=2), loaded=llada).append_eos  # LLaDA's: none


def test_the_servers_score_endpoint_takes_the_estimator(folders):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from mdlm_cli.serve.app import Settings, create_app
    from mdlm_cli.serve.served import Served

    loaded = folders["llada"]
    http = TestClient(create_app(lambda: Served(loaded, torch.device("cpu"), None, "llada"),
                                 Settings(max_batch=4)))
    http.__enter__()
    try:
        for _ in range(200):
            if http.get("/health").status_code == 200:
                break
        body = {"prompt": "w1 w2 w3", "continuations": [" w4", " w5"], "mc_samples": 4}
        default = http.post("/v1/mdlm/score", json=body).json()  # LLaDA's own: l
        timed = http.post("/v1/mdlm/score", json={**body, "estimator": "t"}).json()
        wrong = http.post("/v1/mdlm/score", json={**body, "estimator": "k"})
    finally:
        http.__exit__(None, None, None)
    assert default["estimator"] == "l" and timed["estimator"] == "t"
    for entry in default["data"]:  # one-token continuations: every pass exact, no spread
        assert entry["nats_se"] == pytest.approx(0.0, abs=1e-6)
    row = build_row(loaded.row_start(), loaded.tokenizer.encode("w1 w2 w3"),
                    loaded.tokenizer.encode(" w4"), loaded.length)[0]
    assert default["data"][0]["nats"] == pytest.approx(exact_nll(loaded, row), abs=1e-5)
    assert any(e["nats_se"] > 0 for e in timed["data"])
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "estimator"
