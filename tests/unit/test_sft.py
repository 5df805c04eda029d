"""Prompt/response data (data.packing=sft): rows, the stored boundary, the loss on the response
only for every objective, the empty prompt as the unconditional loss, and samples cut at EOS."""

import json

import numpy as np
import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.build import resolve_config
from mdlm_cli.data.sft import encode_example, example_source, sft_rows
from mdlm_cli.data.store import TokenSplit, prepare
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.errors import MdlmError
from mdlm_cli.objectives import OBJECTIVES, SplitSweep, get_objective
from mdlm_cli.sample.generate import cut_at_eos, stops_at_eos

from ..objective_configs import overrides as objective_overrides
from .test_objectives import setup

TOK = load_tokenizer("char")
CPU = torch.device("cpu")
EXAMPLES = [
    {"prompt": "the cat", "response": "sat on the mat"},
    {"prompt": "why", "response": "because"},
    {"prompt": "a", "response": "bb"},
    {"prompt": "x" * 30, "response": "too long for the rows"},
]
CONDITIONAL = [name for name, cls in OBJECTIVES.items() if cls.scores_targets]


def sft_split(pad_as_eos: bool, L: int = 24) -> TokenSplit:
    rows, lengths, prompts, dropped = next(
        sft_rows([EXAMPLES[:3] * 2], L, TOK, pad_as_eos=pad_as_eos)
    )
    return TokenSplit(rows, lengths, prompt=prompts)


@pytest.mark.parametrize("pad_as_eos", [True, False])
def test_rows_are_prompt_response_eos_then_fill(pad_as_eos):
    rows, lengths, prompts, dropped = next(sft_rows([EXAMPLES], 24, TOK, pad_as_eos=pad_as_eos))
    assert (
        dropped == 1 and len(rows) == 3
    )  # 1 + 30 + 21 + 1 tokens do not fit in 24: dropped, not cut
    p, r = encode_example(TOK, EXAMPLES[0])
    assert p[0] == TOK.bos_id and r[-1] == TOK.eos_id and prompts[0] == len(p) == 8
    assert rows[0, : len(p) + len(r)].tolist() == p + r
    fill = TOK.eos_id if pad_as_eos else TOK.pad_id
    assert (rows[0, len(p) + len(r) :] == fill).all()
    assert lengths[0] == (
        24 if pad_as_eos else len(p) + len(r)
    )  # padding as EOS is scored, pad is not
    split = TokenSplit(rows, lengths, prompt=prompts)
    x0, attention_mask, targets = split.batch_with_targets([0, 1, 2])
    assert (
        targets.sum(1).tolist()
        == (lengths - prompts).tolist()
        == [split.count([i]) for i in range(3)]
    )
    assert not targets[0, :8].any() and targets[0, 8 : lengths[0]].all()
    assert (attention_mask is None) == pad_as_eos


def test_prepared_jsonl_keeps_the_boundary_and_the_padding_choice(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in EXAMPLES * 10) + "\n")
    metas = {}
    for pad_as_eos in (True, False):
        cfg = resolve_config(
            "test",
            [
                f"data.dataset={path}",
                "data.packing=sft",
                "data.length=24",
                f"data.pad_as_eos={str(pad_as_eos).lower()}",
                f"data.cache_dir={tmp_path}",
            ],
        )
        data = prepare(cfg.data)
        train = data.split("train")
        assert data.meta["splits"]["train"]["dropped"] > 0 and data.meta["pad_as_eos"] is pad_as_eos
        assert train.prompt is not None and len(train.prompt) == len(train)
        metas[pad_as_eos] = data.folder
    assert metas[True] != metas[False]  # the padding convention is part of the cache key


def test_bad_examples_and_sources_fail_in_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "only a prompt"}\n')
    with pytest.raises(MdlmError, match="needs string 'prompt' and 'response'"):
        example_source(str(bad)).all_examples()
    with pytest.raises(MdlmError, match="needs prompt/response examples"):
        example_source("bigtxt")
    chat = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    }
    with pytest.raises(MdlmError, match="chat template; char has none"):
        encode_example(TOK, chat)
    with pytest.raises(MdlmError, match="mlm objective has no loss on the response"):
        resolve_config("test", ["diffusion.objective=mlm", "data.packing=sft"])


def test_messages_go_through_the_chat_template():
    gpt2 = load_tokenizer("gpt2")
    gpt2.hf.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    chat = {
        "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    }
    prompt, response = encode_example(gpt2, chat)
    # the template's rendering exactly, as `sample --chat` feeds it: this one writes no BOS and
    # no end-of-turn token, so none is added before the prompt and the answer ends at EOS
    assert prompt == gpt2.encode("<user>2+2?\n<assistant>")
    assert response == gpt2.encode("4\n") + [gpt2.eos_id]
    pair = encode_example(gpt2, {"prompt": "2+2?", "response": "4"})
    assert pair == (prompt, response)  # a prompt/response pair is the same user turn


def noisy_half(z, output_mask, length: int):
    """bd3lm's network reads x_t followed by x0 (2L positions): the first L are the noisy input."""
    if z.shape[1] == 2 * length:
        z = z[:, :length]
        if output_mask is not None and output_mask.shape[1] == 2 * length:
            output_mask = output_mask[:, :length]
    return z, output_mask


def spy_backbone(model, prompt: np.ndarray, seen: list):
    """Record each backbone call's input and output mask; perturb any full (B, L, V) output at the
    prompt positions (an AR model's predictions of the prompt tokens)."""

    def pre(module, args, kwargs):
        seen.append((args[0].clone(), kwargs.get("output_mask")))

    def post(module, args, kwargs, out):
        if out.dim() != 3:
            return None
        noise = 30 * torch.randn(out.shape, generator=torch.Generator().manual_seed(len(seen)))
        inside = (
            torch.arange(out.shape[1])[None, :, None]
            < torch.from_numpy(prompt.astype(np.int64))[:, None, None]
        )
        return out + noise * inside

    return model.register_forward_pre_hook(pre, with_kwargs=True), model.register_forward_hook(
        post, with_kwargs=True
    )


@pytest.mark.parametrize("pad_as_eos", [True, False])
@pytest.mark.parametrize("name", CONDITIONAL)
def test_prompt_positions_are_never_masked_nor_scored(name, pad_as_eos):
    cfg, objective, model = setup(name)
    with torch.no_grad():  # the zero-initialised adaLN gates would keep the positions apart
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    split = sft_split(pad_as_eos)
    x0, attention_mask, targets = split.batch_with_targets(np.arange(len(split)))
    before = np.arange(x0.shape[1])[None, :] < split.prompt[:, None]
    den = objective.denoiser(model.eval())

    def terms(x, seed):
        t = (
            objective.draw_times(cfg.diffusion.T)(len(x), torch.Generator().manual_seed(seed))
            if objective.uses_time
            else None
        )
        with torch.no_grad():
            return objective.loss_terms(
                den,
                x,
                t,
                generator=torch.Generator().manual_seed(seed),
                attention_mask=attention_mask,
                targets=targets,
            )

    plain = [terms(x0, seed) for seed in range(8)]
    seen: list = []
    hooks = spy_backbone(model, split.prompt, seen)
    try:
        spied = [terms(x0, seed) for seed in range(8)]
    finally:
        for h in hooks:
            h.remove()
    assert seen
    for z, output_mask in seen:
        z, output_mask = noisy_half(z, output_mask, x0.shape[1])
        if not objective.causal:  # a diffusion input: the prompt always clean, never an output
            assert torch.equal(z[torch.from_numpy(before)], x0[torch.from_numpy(before)])
            assert output_mask is not None and not output_mask[torch.from_numpy(before)].any()
    for a, b in zip(plain, spied, strict=True):  # what the model says at the prompt changes nothing
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    other = x0.clone()
    other[:, 1] = torch.where(
        x0[:, 1] == 10, 11, 10
    )  # another prompt: attended, so the terms change
    assert not torch.allclose(terms(other, 0), plain[0])


@pytest.mark.parametrize("name", CONDITIONAL)
def test_empty_prompt_gives_the_unconditional_loss(name):
    _, objective, model = setup(name)
    rows = torch.randint(8, 35, (5, 32), generator=torch.Generator().manual_seed(1)).numpy()
    lengths = np.array([32, 32, 20, 32, 9], dtype=np.int32)
    plain = TokenSplit(rows, lengths)
    empty = TokenSplit(rows, lengths, prompt=np.zeros(5, dtype=np.int32))
    den = objective.denoiser(model.eval())
    a, b = (
        objective.evaluate(den, s, SplitSweep(2, CPU), seeds=[0, 1]) for s in (plain, empty)
    )
    assert [r.nats for r in a] == [r.nats for r in b] and [r.tokens for r in a] == [
        r.tokens for r in b
    ]


def test_cut_at_eos_returns_nothing_after_it():
    eos = TOK.eos_id
    assert cut_at_eos([2, 9, 9, eos, 9, eos], 1, eos) == ([2, 9, 9], 2, True)
    assert cut_at_eos([2, eos, 9, 9], 2, eos) == (
        [2, eos, 9, 9],
        2,
        False,
    )  # an EOS in the prompt is not the end
    assert cut_at_eos([2, 9, eos], 1, eos) == ([2, 9], 1, True)


class EosDenoiser:
    """Every masked position's distribution: certain EOS (id `eos`)."""

    def __init__(self, vocab: int, eos: int):
        self.vocab, self.eos, self.calls = vocab, eos, 0

    def __call__(self, z_t, t, output_mask=None, attention_mask=None):
        self.calls += 1
        logits = torch.full((*z_t.shape, self.vocab), -1e4)
        logits[..., self.eos] = 0.0
        return logits if output_mask is None else logits[output_mask]


def test_semi_ar_stops_after_the_block_that_holds_eos():
    den, eos = EosDenoiser(TOK.vocab_size, TOK.eos_id), TOK.eos_id
    kwargs = dict(
        sampler="first-hitting",
        num_samples=2,
        window=8,
        stride=4,
        mask_id=TOK.mask_id,
        target_length=32,
        prompt=torch.tensor([2, 9]),
        generator=torch.Generator().manual_seed(0),
    )
    stopped = engine.semi_ar(den, stop_token=eos, **kwargs)
    assert stopped.tokens.shape == (2, 8)  # the first window already ends: no further block
    full = engine.semi_ar(den, **kwargs)
    assert full.tokens.shape == (2, 32)


def test_sft_config_refuses_rc_augment():
    with pytest.raises(MdlmError, match="rc_augment does not apply"):
        resolve_config("test", ["data.packing=sft", "data.rc_augment=true"])


def test_every_conditional_objective_trains_on_sft_rows():
    """One optimisation-shaped call per objective: finite terms, gradients, and the prompt's
    rows count only their targets."""
    split = sft_split(True)
    for name in CONDITIONAL:
        cfg = resolve_config("test", [*objective_overrides(name), "data.packing=sft"])
        objective = get_objective(cfg, TOK)
        _, _, model = setup(name)
        x0, attention_mask, targets = split.batch_with_targets(np.arange(len(split)))
        t = (
            objective.draw_times(cfg.diffusion.T)(len(split), torch.Generator().manual_seed(0))
            if objective.uses_time
            else None
        )
        terms = objective.loss_terms(
            objective.denoiser(model),
            x0,
            t,
            generator=torch.Generator().manual_seed(1),
            attention_mask=attention_mask,
            targets=targets,
        )
        assert torch.isfinite(terms).all() and (terms > 0).all()
        (terms.sum() / split.count(slice(None))).backward()


def test_hub_examples_go_through_the_loader(tmp_path):
    """`hub:ORG/NAME` reads prompt/response records with the data sets loader (a fake one here)."""
    calls = []

    def load_dataset(hub_id, config, split, revision=None):
        calls.append((hub_id, split))
        return [dict(e, extra=1) for e in EXAMPLES[:3] * 10]

    cfg = resolve_config("test", ["data.dataset=hub:me/qa", "data.packing=sft", "data.length=24",
                                  f"data.cache_dir={tmp_path}"])
    data = prepare(cfg.data, load_dataset=load_dataset)
    assert calls[0] == ("me/qa", "train") and data.meta["source"]["name"] == "me_qa"
    splits = data.meta["splits"]
    assert sum(info["rows"] for info in splits.values()) == 30 and splits["valid"]["rows"] > 0


def test_stopping_at_eos_is_the_default_only_after_padding_as_eos():
    from types import SimpleNamespace

    def model(**meta):
        return SimpleNamespace(data_meta=meta)

    assert stops_at_eos(model(packing="sft", pad_as_eos=True))
    assert not stops_at_eos(model(packing="sft", pad_as_eos=False))
    assert not stops_at_eos(model(packing="wrap"))
    assert stops_at_eos(model(packing="wrap"), asked=True)
    assert not stops_at_eos(model(packing="sft", pad_as_eos=True), asked=False)


@pytest.mark.parametrize("pad_as_eos", [True, False])
def test_exact_nll_of_held_out_responses_is_over_the_targets_given_the_prompt(pad_as_eos):
    """What eval-ppl reports for an AR model on sft rows: -log p(response, EOS[, fill] | BOS,
    prompt) per target token, here token by token from each prefix (not the loss's code)."""
    from mdlm_cli.objectives.ar import next_token_logits

    _, objective, model = setup("ar")
    split = sft_split(pad_as_eos)
    [result] = objective.evaluate(objective.denoiser(model.eval()), split, SplitSweep(4, CPU),
                                  seeds=[0])
    total, count = 0.0, 0
    for row, p, end in zip(split.tokens, split.prompt, split.lengths, strict=True):
        for pos in range(p, end):  # the targets: from the prompt's end to the row's length
            context = torch.tensor([TOK.bos_id, *row[:pos]])[None]
            with torch.no_grad():
                logits = next_token_logits(model(context), TOK.mask_id)[0, -1].double()
            total -= logits.log_softmax(-1)[row[pos]].item()
            count += 1
    assert result.exact and result.tokens == count == split.count(slice(None))
    assert result.nats == pytest.approx(total, rel=1e-5)


@pytest.mark.parametrize("packing", ["sft", "sft-pack"])
def test_held_out_prompts_and_responses_read_back_from_the_rows(packing):
    """gen-ppl --prompts SPLIT reads each example's prompt (BOS included) and its response
    (before its EOS) back from the stored boundary."""
    from mdlm_cli.data.sft_pack import sft_pack_rows
    from mdlm_cli.eval.responses import row_examples

    if packing == "sft":
        split = sft_split(True)
    else:
        tokens, lengths, segments, targets, _ = next(
            sft_pack_rows([EXAMPLES[:3] * 2], 24, TOK, pad_as_eos=True))
        split = TokenSplit(tokens, lengths, segments=segments, target_map=targets)
    read = [pair for r in range(len(split)) for pair in row_examples(split, r, TOK.eos_id)]
    expected = []
    for example in EXAMPLES[:3] * 2:
        prompt, response = encode_example(TOK, example)
        expected.append((prompt, response[:-1]))
    assert read == expected


def test_prompt_records_of_gen_ppl_prompts():
    """`gen-ppl --prompts FILE` records: a prompt (with its held-out response), or messages
    through the chat template, with or without the assistant's answer."""
    from mdlm_cli.eval.responses import prompt_of

    assert prompt_of({"prompt": "why", "response": "because"}, TOK, "f:1") == (
        "why", "because", False)
    assert prompt_of({"prompt": "why"}, TOK, "f:1") == ("why", None, False)
    gpt2 = load_tokenizer("gpt2")
    gpt2.hf.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    asked = [{"role": "user", "content": "2+2?"}]
    answered = {"messages": [*asked, {"role": "assistant", "content": "4"}]}
    rendered = "<user>2+2?\n<assistant>"  # the template's text: no row start is added to it
    assert prompt_of({"messages": asked}, gpt2, "f:1") == (rendered, None, True)
    assert prompt_of(answered, gpt2, "f:1") == (rendered, "4\n", True)
    # a model fine-tuned on pairs through the template reads a plain prompt as a user turn
    pair = {"prompt": "2+2?", "response": "4"}
    assert prompt_of(pair, gpt2, "f:1", chat_pairs=True) == (rendered, "4", True)
    assert prompt_of(pair, gpt2, "f:1") == ("2+2?", "4", False)
    with pytest.raises(MdlmError, match="chat template; char has none"):
        prompt_of({"messages": asked}, TOK, "f:1")
    with pytest.raises(MdlmError, match="f:2: no 'prompt' string"):
        prompt_of({"response": "4"}, TOK, "f:2")


def test_responses_of_a_left_to_right_model_are_drawn_by_prompt_length():
    from mdlm_cli.eval.responses import Prompt
    from mdlm_cli.sample.prompted import batches_of

    prompts = [Prompt([2] * n, "") for n in (3, 5, 3, 3, 5, 4)]
    assert batches_of(prompts, 2, same_length=False) == [[0, 1], [2, 3], [4, 5]]
    assert batches_of(prompts, 2, same_length=True) == [[0, 2], [3], [5], [1, 4]]


def test_gsm8k_reads_question_and_answer_and_keeps_the_hash_answer():
    """The named source `gsm8k` (openai/gsm8k, main, train): the question is the prompt, the
    worked solution the response, its text after #### the `answer` field (d1's reference), and
    every other field stays on the example (what `mdlm rl`'s rewards read)."""
    from mdlm_cli.data.sft import example_source

    calls = []

    def load_dataset(hub_id, config, split, revision=None):
        calls.append((hub_id, config, split))
        return [{"question": "2 + 3?", "answer": "2 + 3 = 5\n#### 5", "id": 7}]

    examples = example_source("gsm8k").all_examples(load_dataset)
    assert calls == [("openai/gsm8k", "main", "train")]
    assert examples == [{"id": 7, "answer": "5", "prompt": "2 + 3?",
                         "response": "2 + 3 = 5\n#### 5"}]
    example_source("gsm8k-test").all_examples(load_dataset)
    assert calls[-1] == ("openai/gsm8k", "main", "test")
    # a plain hub id keeps its fingerprint (data prepared from it stays valid)
    assert example_source("hub:org/qa").fingerprint == "hub-sft:org/qa:v1"
