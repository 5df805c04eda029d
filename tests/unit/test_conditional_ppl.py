"""`mdlm eval-ppl` on prompt/response examples (a .jsonl of {"prompt", "response"} records):
the conditional bound of each response (and its end-of-turn token) given its prompt (rendered
by the folder's chat template, as fine-tuning rows are), on the tiny LLaDA and Dream folders,
equal to a direct Monte-Carlo computation on the same draws; only response positions are ever
masked."""

import json
import random

import pytest
import torch
import torch.nn.functional as F

from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.engine.diffusion import sample_times, times_from_uniform
from mdlm_cli.errors import MdlmError
from mdlm_cli.eval.ppl import PplOptions, evaluate, evaluation_data
from mdlm_cli.runtime import derive_seed, generator
from tests.open_model_folders import write_dream, write_llada

WRITERS = {"llada": write_llada, "dream": write_dream}
END_OF_TURN = {"llada": "<|eot_id|>", "dream": "<|im_end|>"}


def words(rng, low, high):
    return " ".join(f"w{rng.randint(1, 78)}" for _ in range(rng.randint(low, high)))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("conditional")
    rng = random.Random(0)
    examples = [{"prompt": words(rng, 3, 9), "response": words(rng, 1, 6)} for _ in range(40)]
    qa = base / "qa.jsonl"
    qa.write_text("".join(json.dumps(e) + "\n" for e in examples))
    folders = {name: write(base / name) for name, write in WRITERS.items()}
    return folders, examples, qa, base


def loaded_for(setup, family, monkeypatch):
    folders, _, _, base = setup
    loaded = load_checkpoint(str(folders[family]))
    monkeypatch.setattr(loaded.config.data, "cache_dir", str(base / "cache"))
    return loaded


def response_positions(loaded, examples, split):
    """Each row's (prompt length, row length), found by matching the row with one example as
    the folder's template renders it: the prompt as a user turn with the generation prompt
    (its BOS the template's own), then the response and the end-of-turn token."""
    tok = loaded.tokenizer
    turn_end = tok.hf.convert_tokens_to_ids(END_OF_TURN[loaded.state["family"]])
    spans = {}
    for e in examples:
        prompt = tok.encode(tok.hf.apply_chat_template([{"role": "user", "content": e["prompt"]}],
                                                       tokenize=False, add_generation_prompt=True))
        row = prompt + tok.encode(e["response"]) + [turn_end]
        spans[tuple(row)] = (len(prompt), len(row))
    return [spans[tuple(split.tokens[i, :split.lengths[i]].tolist())] for i in range(len(split))]


def direct_bound(loaded, split, spans, seed: int) -> float:
    """The continuous-time NELBO of the responses given the prompts, written out: pass 0 of
    `evaluate(seed=seed)` draws t with derive_seed(seed, 'eval-ppl', 0) (one antithetic time
    per row) and the masks of its one batch with that seed's 'batch' 0 stream; each response
    position is masked with probability 1 - alpha_t, the model reads z_t (padding not
    attended), and -log p(x0) under SUBS (the mask never predicted) is weighted by
    -alpha'/(1 - alpha). Nats per response token."""
    schedule = loaded.objective.schedule
    seed_k = derive_seed(seed, "eval-ppl", 0)
    cpu = torch.device("cpu")
    n, L = len(split), split.tokens.shape[1]
    t = times_from_uniform(sample_times(n, generator=generator(cpu, seed_k)), schedule)
    x0 = torch.from_numpy(split.tokens[:n].astype("int64"))
    positions = torch.arange(L)[None]
    prompt = torch.tensor([s[0] for s in spans])[:, None]
    length = torch.tensor([s[1] for s in spans])[:, None]
    response, real = (positions >= prompt) & (positions < length), positions < length
    u = torch.rand(x0.shape, generator=generator(cpu, derive_seed(seed_k, "batch", 0)))
    masked = (u < schedule.mask_rate(t)[:, None]) & response
    z_t = x0.masked_fill(masked, loaded.mask_id)
    with torch.no_grad():
        logits = loaded.model(z_t, attention_mask=real).double()
    logits[..., loaded.mask_id] = -torch.inf
    nll = -F.log_softmax(logits, dim=-1).gather(-1, x0[..., None])[..., 0]
    per_row = (nll * masked).sum(dim=1) * schedule.loss_weight(t).double()
    return float(per_row.sum() / response.sum())


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_the_conditional_bound_is_the_direct_monte_carlo_value(setup, family, monkeypatch):
    _, examples, qa, _ = setup
    loaded = loaded_for(setup, family, monkeypatch)
    name, prepared = evaluation_data(loaded, dataset=str(qa))
    assert prepared.meta["packing"] == "sft"  # the checkpoint's own data is wrap-packed text
    split = prepared.split("train")
    spans = response_positions(loaded, examples, split)
    for seed in (0, 1):
        options = PplOptions(split="train", mc_samples=1, seed=seed, batch_size=len(split))
        result = evaluate(loaded, prepared, options, name=name, device=torch.device("cpu"))
        assert result.conditional and not result.exact
        assert result.tokens == sum(end - start for start, end in spans)  # + end of turn
        assert result.nats_per_token == pytest.approx(direct_bound(loaded, split, spans, seed),
                                                      rel=1e-6)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_only_response_positions_are_ever_masked(setup, family, monkeypatch):
    _, examples, qa, _ = setup
    loaded = loaded_for(setup, family, monkeypatch)
    name, prepared = evaluation_data(loaded, dataset=str(qa))
    split = prepared.split("train")
    spans = response_positions(loaded, examples, split)
    seen = []
    loaded.model.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    evaluate(loaded, prepared, PplOptions(split="train", mc_samples=8, batch_size=8), name=name,
             device=torch.device("cpu"))
    rows = torch.cat(seen)  # 8 passes of every row, in order
    x0 = torch.from_numpy(split.tokens.astype("int64")).repeat(8, 1)
    hit = rows == loaded.mask_id
    positions = torch.arange(x0.shape[1])[None]
    prompt = torch.tensor([s[0] for s in spans]).repeat(8)[:, None]
    length = torch.tensor([s[1] for s in spans]).repeat(8)[:, None]
    response = (positions >= prompt) & (positions < length)
    assert rows.shape == x0.shape
    assert not hit[~response].any()  # prompt and padding: never masked
    assert torch.equal(rows[~hit], x0[~hit])  # and clean
    assert hit.any(dim=1).float().mean() > 0.5  # most passes mask some of the response
    # about E[1 - alpha_t] of them overall (t uniform over the schedule's times)
    schedule = loaded.objective.schedule
    expected = schedule.mask_rate(times_from_uniform(torch.linspace(0, 1, 1001), schedule)).mean()
    assert float(hit[response].float().mean()) == pytest.approx(float(expected), abs=0.08)


def test_the_counted_estimator_is_the_same_bound_in_expectation(setup, monkeypatch):
    """`--estimator l` (LLaDA's masked counts, its folder's default through eval_options) and
    the time estimator give one mean over 64 passes of the prompt/response rows."""
    from mdlm_cli.eval.ppl import eval_options

    _, _, qa, _ = setup
    loaded = loaded_for(setup, "llada", monkeypatch)
    name, prepared = evaluation_data(loaded, dataset=str(qa))
    n = len(prepared.split("train"))
    flags = PplOptions(split="train", mc_samples=64, batch_size=n)
    resolved, _ = eval_options(loaded, torch.device("cpu"), flags)
    assert resolved.estimator == "l"  # the family's own
    means = {}
    for estimator in ("l", "t"):
        options = PplOptions(split="train", mc_samples=64, batch_size=n, estimator=estimator)
        passes = torch.tensor(evaluate(loaded, prepared, options, name=name,
                                       device=torch.device("cpu")).passes, dtype=torch.float64)
        means[estimator] = (float(passes.mean()), float(passes.std() / 8))
    (ml, sl), (mt, st) = means["l"], means["t"]
    assert abs(ml - mt) < 4 * (sl**2 + st**2) ** 0.5, means
    with pytest.raises(MdlmError, match="--estimator l counts masks"):
        eval_options(loaded, torch.device("cpu"), PplOptions(split="train", estimator="l", T=10))
