"""Several prompt/response examples per row (data.packing=sft-pack): the packed rows and their
segment ids, attention kept within each example, the loss on the responses only, the backbones
that refuse the mode, and a short training run."""

import json

import numpy as np
import pytest
import torch
from rich.console import Console

from mdlm_cli.build import config_from_dict, resolve_config
from mdlm_cli.data.sft import encode_example
from mdlm_cli.data.sft_pack import sft_pack_rows
from mdlm_cli.data.store import TokenSplit, prepare
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import DiT
from mdlm_cli.models.dit import DiTConfig
from mdlm_cli.objectives.ar import sequence_nll
from mdlm_cli.train.loop import train

from ..hf_models import save_tiny_mlm
from .test_objectives import setup
from .test_sft import CONDITIONAL, EXAMPLES, TOK, noisy_half


def packed(pad_as_eos: bool, L: int = 24, repeats: int = 2):
    return list(sft_pack_rows([EXAMPLES * repeats], L, TOK, pad_as_eos=pad_as_eos))


@pytest.mark.parametrize("pad_as_eos", [True, False])
def test_rows_hold_several_examples_each_a_segment(pad_as_eos):
    (tokens, lengths, segments, targets, dropped), = packed(pad_as_eos)
    encoded = [encode_example(TOK, e) for e in EXAMPLES[:3]] * 2
    assert dropped == 2  # the too-long example, twice: dropped, never cut
    assert len(tokens) < len(encoded)  # examples share rows
    seen = []
    for row, seg, tgt, n in zip(tokens, segments, targets, lengths, strict=True):
        ids = [s for s in dict.fromkeys(seg.tolist()) if s]
        assert ids == list(range(1, len(ids) + 1))  # 1, 2, ... in order, each one contiguous
        for s in ids:
            at = np.flatnonzero(seg == s)
            assert (np.diff(at) == 1).all()
            p, r = encoded[len(seen)]
            seen.append(s)
            example = row[at[0]: at[0] + len(p) + len(r)].tolist()
            assert example == p + r and not tgt[at[0]: at[0] + len(p)].any()
            assert tgt[at[0] + len(p): at[0] + len(p) + len(r)].all()
        last = at[0] + len(p) + len(r)  # after the row's last example: the fill
        fill = TOK.eos_id if pad_as_eos else TOK.pad_id
        assert (row[last:] == fill).all()
        assert (seg[last:] == (ids[-1] if pad_as_eos else 0)).all()
        assert tgt[last:].all() if pad_as_eos else not tgt[last:].any()
        assert n == (len(row) if pad_as_eos else last)
    assert len(seen) == len(encoded)


def test_prepared_rows_give_segment_ids_and_targets(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in EXAMPLES * 10) + "\n")
    folders = {}
    for packing in ("sft", "sft-pack"):
        cfg = resolve_config("test", [f"data.dataset={path}", f"data.packing={packing}",
                                      "data.length=24", f"data.cache_dir={tmp_path}"])
        folders[packing] = prepare(cfg.data)
    one, pack = (folders[k].split("train") for k in ("sft", "sft-pack"))
    info = folders["sft-pack"].meta["splits"]["train"]
    assert info["examples"] == len(one) and len(pack) < len(one)
    rows = np.arange(len(pack))
    x0, attention_mask, targets = pack.batch_with_targets(rows)
    assert attention_mask.dtype == torch.long and int(attention_mask.max()) >= 2
    assert int(targets.sum()) == pack.count(rows) == info["target_tokens"]
    # the same responses as one example per row: the same number of target tokens minus the
    # EOS fill that packing saves
    assert folders["sft-pack"].meta["unigram_valid_nats"] is not None


def tiny_dit(causal: bool) -> DiT:
    torch.manual_seed(0)
    model = DiT(DiTConfig(hidden_size=32, n_blocks=2, n_heads=2, cond_dim=16, dropout=0.0),
                TOK.vocab_size, causal=causal).eval()
    with torch.no_grad():  # the zero-initialised gates would keep every position apart
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model


@pytest.mark.parametrize("causal", [False, True])
def test_a_position_never_sees_another_segment(causal):
    model = tiny_dit(causal)
    segments = torch.tensor([[1] * 5 + [2] * 7 + [3] * 4 + [0] * 4, [1] * 9 + [2] * 11])
    x = torch.randint(8, 35, segments.shape, generator=torch.Generator().manual_seed(1))
    other = x.clone()
    other[0, :5], other[0, 12:] = 9, 10  # segments 1, 3 and the padding of row 0
    other[1, 9:] = 11  # segment 2 of row 1
    with torch.no_grad():
        y, y_other = model(x, attention_mask=segments), model(other, attention_mask=segments)
        alone = model(x[:1, 5:12])  # segment 2 of row 0 as a row of its own
    assert torch.equal(y[0, 5:12], y_other[0, 5:12]) and torch.equal(y[1, :9], y_other[1, :9])
    assert not torch.allclose(y[0, :5], y_other[0, :5])  # a segment does see its own tokens
    torch.testing.assert_close(y[0, 5:12], alone[0], atol=1e-5, rtol=1e-5)
    plain = torch.tensor([[True] * 16 + [False] * 4, [True] * 20])
    with torch.no_grad():  # segment ids of one example mean what a bool mask means
        one = (segments > 0).long()
        torch.testing.assert_close(model(x, attention_mask=one), model(x, attention_mask=plain))


def test_ar_nll_of_a_packed_row_is_the_sum_of_its_examples():
    model = tiny_dit(causal=True)
    (tokens, _, segments, targets, _), = packed(True)
    x0, seg, tgt = (torch.from_numpy(a.astype(np.int64)) for a in (tokens, segments, targets))
    with torch.no_grad():
        row = sequence_nll(model, x0, bos_id=TOK.bos_id, mask_id=TOK.mask_id,
                           attention_mask=seg, targets=tgt.bool())
        for i in range(len(x0)):
            total = 0.0
            for s in seg[i].unique().tolist():
                at = (seg[i] == s).nonzero()[:, 0]
                piece = x0[i:i + 1, at]
                total += float(sequence_nll(model, piece, bos_id=TOK.bos_id, mask_id=TOK.mask_id,
                                            targets=tgt[i:i + 1, at].bool()))
            assert float(row[i]) == pytest.approx(total, rel=1e-4)


@pytest.mark.parametrize("name", CONDITIONAL)
def test_only_responses_are_masked_and_scored_in_packed_rows(name):
    cfg, objective, model = setup(name)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    (tokens, lengths, segments, target_map, _), = packed(False)
    split = TokenSplit(tokens, lengths, segments=segments, target_map=target_map)
    x0, seg, targets = split.batch_with_targets(np.arange(len(split)))
    den = objective.denoiser(model.eval())

    def terms(seed):
        gen = torch.Generator().manual_seed(seed)
        t = objective.draw_times(cfg.diffusion.T)(len(x0), gen) if objective.uses_time else None
        with torch.no_grad():
            return objective.loss_terms(den, x0, t, generator=torch.Generator().manual_seed(seed),
                                        attention_mask=seg, targets=targets)

    plain = [terms(seed) for seed in range(6)]
    seen: list = []
    hooks = spy_outside(model, ~targets, seen)
    try:
        spied = [terms(seed) for seed in range(6)]
    finally:
        for h in hooks:
            h.remove()
    assert seen
    for z, output_mask in seen:
        z, output_mask = noisy_half(z, output_mask, x0.shape[1])
        if not objective.causal:  # prompts (and padding): always clean, never an output
            assert torch.equal(z[~targets], x0[~targets])
            assert output_mask is not None and not output_mask[~targets].any()
    for a, b in zip(plain, spied, strict=True):  # what the model says off the targets is unused
        assert torch.isfinite(a).all() and (a >= 0).all() and a.sum() > 0
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def spy_outside(model, outside: torch.Tensor, seen: list):
    """Record each backbone call's input and output mask; add noise to any full (B, L, V)
    output at the `outside` positions (an AR model's predictions of the prompts)."""

    def pre(module, args, kwargs):
        seen.append((args[0].clone(), kwargs.get("output_mask")))

    def post(module, args, kwargs, out):
        if out.dim() != 3:
            return None
        noise = 30 * torch.randn(out.shape, generator=torch.Generator().manual_seed(len(seen)))
        return out + noise * outside[:, :, None]

    return (model.register_forward_pre_hook(pre, with_kwargs=True),
            model.register_forward_hook(post, with_kwargs=True))


def test_backbones_without_segment_attention_refuse_the_mode(tmp_path):
    folder = save_tiny_mlm(tmp_path / "bert")
    data = {"dataset": "x.jsonl", "tokenizer": str(folder), "length": 32, "packing": "sft-pack"}
    cases = [({"backbone": "hf-mlm", "hf_model": str(folder)}, "mdlm"),
             ({"backbone": "mamba", "hidden_size": 8, "n_blocks": 2}, "ar"),
             ({"backbone": "caduceus", "hidden_size": 8, "n_blocks": 2}, "mdlm")]
    for model, objective in cases:
        with pytest.raises(MdlmError, match=f"the {model['backbone']} backbone cannot do") as e:
            config_from_dict({"data": data, "model": model, "diffusion": {"objective": objective}})
        assert "\n" not in str(e.value)
    resolve_config("test", ["data.packing=sft-pack"])  # the DiT packs


@pytest.mark.parametrize("name", ["mdlm", "ar"])
def test_a_short_training_on_packed_rows_runs(tmp_path, name):
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in EXAMPLES[:3] * 40) + "\n")
    cfg = resolve_config("test", [f"diffusion.objective={name}", f"data.dataset={path}",
                                  "data.packing=sft-pack", "data.length=32",
                                  f"data.cache_dir={tmp_path}", "train.max_steps=6",
                                  "train.eval_every=6", "train.save_every=6",
                                  f"train.out_dir={tmp_path / 'run'}"])
    result = train(cfg, console=Console(quiet=True))
    assert all(np.isfinite(result.losses)) and result.losses[-1] < result.losses[0]
    valid = prepare(cfg.data).split("valid")
    rows = min(cfg.train.eval_rows, len(valid))
    assert result.final_valid.tokens == valid.count(slice(0, rows))  # the responses' tokens only
