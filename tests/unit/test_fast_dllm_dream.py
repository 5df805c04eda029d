"""Fast-dLLM's prefix and dual block caches for Dream, token for token (issue 42).

The expected tokens come from a line-by-line transcription of NVlabs/Fast-dLLM's
dream/model/generation_utils_block.py (`DreamGenerationMixin._sample`, batch of one,
temperature 0), written as test code, run over `FastDllmDream`: the tiny random Dream
folder's weights called as Fast-dLLM's modeling_dream.py calls them with `past_key_values`
(keys and values kept before rotary; prefix: the call's after the cached ones; dual: the
call's written over the block's entries; rotary applied at every call), not through mdlm's
block cache. mdlm's `confidence --k-schedule dream --order entropy --cache prefix|dual` (the
branch without a threshold ranks by negative entropy) and `threshold --cache prefix|dual`
(alg="confidence_threshold") must give its tokens and its network calls.
"""

import functools

import pytest
import torch
import torch.nn.functional as F

from mdlm_cli import engine
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.engine.schedules import LogLinear
from mdlm_cli.engine.settings import SamplingSettings
from mdlm_cli.models import DiffusionDenoiser
from mdlm_cli.models.decoder_layers import apply_rotary, rotary_tables
from tests.open_model_folders import write_dream

from .test_generation_schedules import cli_sample, dream_sample_tokens


@pytest.fixture(scope="module")
def dream(tmp_path_factory):
    folder = write_dream(tmp_path_factory.mktemp("dream-cache") / "dream")
    loaded = load_checkpoint(str(folder))
    return folder, loaded.model.eval(), loaded.mask_id


class FastDllmDream:
    """DreamModel(x, past_key_values=..., dual_cache=..., replace_position=...) of Fast-dLLM's
    modeling_dream.py over mdlm's module's weights: (logits unshifted, past_key_values), the
    mask token's logit -inf (a trained model never predicts it; mdlm's SUBS removes it)."""

    def __init__(self, net, mask_id):
        self.net, self.mask_id = net, mask_id

    @torch.no_grad()
    def __call__(self, x, past_key_values=None, dual_cache=False, replace_position=None):
        s, net = self.net.config, self.net
        d = s.hidden_size // s.n_heads
        B, n = x.shape
        seen = past_key_values[0][0].shape[1] if past_key_values is not None else 0
        positions = seen if dual_cache and past_key_values is not None else seen + n
        cos, sin = rotary_tables(positions, d, s.rope_theta, x.device)
        h, present = net.model.embed_tokens(x), []
        for i, layer in enumerate(net.model.layers):
            a, hn = layer.self_attn, layer.input_layernorm(h)
            q, k, v = a.q_proj(hn), a.k_proj(hn), a.v_proj(hn)
            if past_key_values is not None:
                past_k, past_v = past_key_values[i]
                if dual_cache:  # in place, as theirs
                    where = replace_position.nonzero(as_tuple=True)[1]
                    past_k[:, where], past_v[:, where] = k, v
                    k, v = past_k, past_v
                else:
                    k, v = torch.cat([past_k, k], dim=1), torch.cat([past_v, v], dim=1)
            present.append((k, v))
            q = q.view(B, n, s.n_heads, d).transpose(1, 2)
            k = k.view(B, -1, s.n_kv_heads, d).transpose(1, 2)
            v = v.view(B, -1, s.n_kv_heads, d).transpose(1, 2)
            end = int(where.max()) + 1 if dual_cache and past_key_values is not None else k.shape[2]
            q = apply_rotary(q, cos[end - n:end], sin[end - n:end], full_precision=False)
            k = apply_rotary(k, cos, sin, full_precision=False)
            k = k.repeat_interleave(s.n_heads // s.n_kv_heads, dim=1)
            v = v.repeat_interleave(s.n_heads // s.n_kv_heads, dim=1)
            att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, n, -1)
            h = h + a.o_proj(att)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = (net.model.norm(h) @ net.lm_head.weight.T)[..., : net.vocab_size].float()
        logits[..., self.mask_id] = float("-inf")
        return logits, present


# ------------------------------------------------------------------ Fast-dLLM, transcribed

# Fast-dLLM's generation_utils_block.py keeps Dream's sample_tokens as it is: the one
# transcription of test_generation_schedules serves (used at temperature 0 here)
sample_tokens = dream_sample_tokens


@torch.no_grad()
def fast_dllm_dream(model, input_ids, gen_length, steps, block_length, dual_cache, alg,
                    threshold=0.9, top_k=None):
    """_sample(input_ids, generation_config(max_new_tokens=gen_length, steps, alg,
    temperature=0, alg_temp=None), threshold, block_length, dual_cache): (x, NFE)."""
    mask_token_id, nfe = model.mask_id, 0
    x = F.pad(input_ids, (0, gen_length), value=mask_token_id)
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps_per_block = steps // num_blocks
    timesteps = torch.linspace(1, 1e-3, steps_per_block + 1)
    for num_block in range(num_blocks):
        current_block_start = input_ids.shape[1] + num_block * block_length
        current_block_end = current_block_start + block_length
        logits, past_key_values = model(x)
        nfe += 1
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        confidence, x0 = sample_tokens(logits, top_k=top_k)
        x[:, current_block_start] = x0[:, current_block_start]
        if not dual_cache:
            past_key_values = [tuple(t[:, :current_block_start, :] for t in layer)
                               for layer in past_key_values]
        else:
            replace_position = torch.zeros_like(x, dtype=torch.bool)
            replace_position[:, current_block_start:current_block_end] = 1
        i = 1
        while True:
            if dual_cache:
                mask_index = x[:, current_block_start:current_block_end] == mask_token_id
                logits, _ = model(x[:, current_block_start:current_block_end], past_key_values,
                                  dual_cache=True, replace_position=replace_position)
            else:
                mask_index = x[:, current_block_start:] == mask_token_id
                logits, _ = model(x[:, current_block_start:], past_key_values)
            nfe += 1
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
            span = x[:, current_block_start:current_block_end if dual_cache else None]
            if alg == "confidence_threshold":
                mask_logits = logits[mask_index]
                confidence, x0 = sample_tokens(mask_logits, top_k=top_k)
                x_ = torch.zeros_like(span) + mask_token_id
                full_confidence = torch.full_like(span, -torch.inf, dtype=logits.dtype)
                x_[mask_index] = x0.clone()
                full_confidence[mask_index] = confidence
                full_confidence[:, block_length:] = -torch.inf
                current_transfer_tokens = (
                    x[:, current_block_start:current_block_end] == mask_token_id).sum()
                selected_confidence, select_index = torch.topk(full_confidence,
                                                               int(current_transfer_tokens))
                transfer_index = torch.zeros_like(x_, dtype=torch.bool)
                transfer_index[0, select_index[0]] = True
                for k in range(1, int(current_transfer_tokens)):
                    if selected_confidence[0, k] < threshold:
                        transfer_index[0, select_index[0, k]] = False
                span[transfer_index] = x_[transfer_index]
            else:
                if i == steps_per_block:
                    break
                t = timesteps[i]
                s = timesteps[i + 1]
                mask_index[:, block_length:] = False
                mask_logits = logits[mask_index]
                confidence, x0 = sample_tokens(mask_logits, neg_entropy=True, top_k=top_k)
                num_mask_token = mask_index.sum() / mask_index.shape[0]
                number_transfer_tokens = (int(num_mask_token * (1 - s / t))
                                          if i < steps_per_block - 1 else int(num_mask_token))
                full_confidence = torch.full_like(span, -torch.inf, dtype=logits.dtype)
                full_confidence[mask_index] = confidence
                full_confidence[:, block_length:] = -torch.inf
                if number_transfer_tokens > 0:
                    _, transfer_index = torch.topk(full_confidence, number_transfer_tokens)
                    x_ = torch.zeros_like(span) + mask_token_id
                    x_[mask_index] = x0.clone()
                    row_indices = torch.arange(x.size(0)).unsqueeze(1).expand_as(transfer_index)
                    span[row_indices, transfer_index] = x_[row_indices, transfer_index]
                i += 1
            if (x[:, current_block_start:current_block_end] == mask_token_id).sum() == 0:
                break
    return x, nfe


# ------------------------------------------------------------------ mdlm's side

def mdlm_sample(net, template, steps, cache, block_length, mask_id, threshold=None,
                order="entropy", k_schedule="dream"):
    """mdlm's sampler over `template` (B, L), masks at the free positions: (tokens, NFE)."""
    if threshold is None:
        how = SamplingSettings("confidence", steps, temperature=0.0, options={
            "k_schedule": k_schedule, "block_length": block_length, "cache": cache,
            "order": order})
    else:
        how = SamplingSettings("threshold", steps, temperature=0.0, options={
            "threshold": threshold, "block_length": block_length, "cache": cache})
    tokens, stats = engine.sample(
        DiffusionDenoiser(net, LogLinear()), how, num_samples=len(template),
        length=template.shape[1], mask_id=mask_id, prompt=template, return_stats=True)
    return tokens, stats.nfe


def template_of(prompt, gen_length, mask_id):
    return F.pad(prompt, (0, gen_length), value=mask_id)


def prompts(batch, n, seed=1):
    return torch.randint(0, 80, (batch, n), generator=torch.Generator().manual_seed(seed))


# (gen_length, block_length, steps): 2 steps per block; 4 with a call that reveals nothing
# (3 masked after the full pass, int(3 * 0.333) = 0); 4 in blocks of 8; blocks of one token
CASES = [(16, 4, 8), (12, 4, 12), (24, 8, 12), (6, 1, 6)]


@pytest.mark.parametrize("threshold", [None, 0.5])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("gen_length, block_length, steps", CASES)
def test_dream_caches_token_for_token_at_temperature_0(dream, gen_length, block_length, steps,
                                                       cache, threshold):
    _, net, mask = dream
    model, prompt = FastDllmDream(net, mask), prompts(2, 5)
    alg = "entropy" if threshold is None else "confidence_threshold"
    expected = [fast_dllm_dream(model, row[None], gen_length, steps, block_length,
                                cache == "dual", alg, threshold) for row in prompt]
    tokens, nfe = mdlm_sample(net, template_of(prompt, gen_length, mask), steps, cache,
                              block_length, mask, threshold)
    assert torch.equal(tokens, torch.cat([x for x, _ in expected]))
    assert nfe == sum(n for _, n in expected) / len(expected)
    assert len(set(tokens[0, 5:].tolist())) > 2  # not one token repeated: the test can fail


def test_the_caches_and_the_order_change_the_answer_on_this_model(dream):
    """The equalities above are worth something: no cache, prefix and dual differ here, and
    so do Fast-dLLM's entropy ranking and the likeliest-first one (8 steps per block)."""
    _, net, mask = dream
    template = template_of(prompts(1, 5), 24, mask)
    answers = {c: mdlm_sample(net, template, 16, c, 12, mask)[0]
               for c in ("none", "prefix", "dual")}
    assert not torch.equal(answers["none"], answers["prefix"])
    assert not torch.equal(answers["none"], answers["dual"])
    assert not torch.equal(answers["prefix"], answers["dual"])
    likeliest = mdlm_sample(net, template, 16, "dual", 12, mask, order="maskgit_plus")[0]
    assert not torch.equal(likeliest, answers["dual"])


@torch.no_grad()
def test_a_cached_slice_is_shifted_within_the_slice(dream):
    """Right after a full pass nothing changed: a slice [s, e)'s logits at s + 1.. are the full
    pass's (read from s..), and at s its own output's (Fast-dLLM's shift of the call's logits),
    not the full pass's (read from s - 1)."""
    _, net, mask = dream
    x = prompts(2, 20, seed=4)
    full, cache = net.block_cache(x, net.new_block_cache(*x.shape))
    assert torch.equal(full, net(x))
    raw, _ = FastDllmDream(net, -1)(x)  # unshifted (no column set to -inf: index -1 is real)
    for s, e in [(8, 12), (8, 20), (3, 20)]:
        sliced = net.from_cache(x[:, s:e], cache, s)
        torch.testing.assert_close(sliced[:, 1:], full[:, s + 1:e], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sliced[:, 0, :-1], raw[:, s, :-1], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(sliced[:, 0], full[:, s], atol=1e-3)


def test_rows_progress_independently(dream):
    """Prompts of different lengths (blocks at different starts), under a threshold each row
    its own number of calls per block: a row's tokens and calls are what it gets alone; the
    confidence rule too, with steps that each row's blocks divide (2, 3 and 4 per block). At
    temperature 0: the engine takes one generator for the batch, so a row's draws at
    temperature > 0 depend on the others'."""
    _, net, mask = dream
    template = torch.full((3, 26), mask, dtype=torch.long)
    for b, n in enumerate((2, 10, 14)):  # 24, 16 and 12 tokens after it: 6, 4 and 3 blocks of 4
        template[b, :n] = prompts(1, n, seed=b)[0]
    for cache in ("prefix", "dual"):
        for threshold in (None, 0.5):
            alone = [mdlm_sample(net, template[b:b + 1], 12, cache, 4, mask, threshold)
                     for b in range(3)]
            together, nfe = mdlm_sample(net, template, 12, cache, 4, mask, threshold)
            assert torch.equal(together, torch.cat([x for x, _ in alone]))
            assert nfe == pytest.approx(sum(n for _, n in alone) / 3)
            if threshold is not None:  # (the confidence rule: `steps` calls in every row)
                assert len({n for _, n in alone}) > 1  # the rows did progress differently


@pytest.mark.parametrize("options, message", [
    ({"k_schedule": "llada"}, "--cache dual on Dream follows Fast-dLLM's Dream loop and its "
                              "timestep grid: use --k-schedule dream"),
    ({"steps": 4}, "--cache dual on Dream needs at least 2 steps per block"),
    ({"block_length": 0}, "cache dual needs block_length"),
])
def test_what_the_dream_loop_cannot_run_is_refused(dream, options, message):
    _, net, mask = dream
    template = template_of(prompts(1, 4), 16, mask)
    args = {"steps": 8, "block_length": 4, "k_schedule": "dream", **options}
    with pytest.raises(engine.EngineError, match=message):
        mdlm_sample(net, template, args["steps"], "dual", args["block_length"], mask,
                    k_schedule=args["k_schedule"])


def test_mdlm_sample_dream_cache_dual_through_the_cli(dream, tmp_path):
    """`mdlm sample -c DREAM --prompt-ids 5,17,3,9 --max-new-tokens 16 --sampler confidence
    --steps 8 --block-length 4 --temperature 0 --cache dual -n 1`: Fast-dLLM's tokens and NFE
    (2 steps per block: the full pass reveals the block's first token, the cached call the
    rest, so the order does not matter); with --order entropy at 4 steps per block, and the
    threshold sampler with --cache prefix, too."""
    folder, net, mask = dream
    model, ids = FastDllmDream(net, mask), [5, 17, 3, 9]
    # the CLI samples a Dream folder with its release's top_k 50 (the generation config that
    # Fast-dLLM's Dream loop reads too); the engine-level tests above run without it
    released = functools.partial(fast_dllm_dream, top_k=50)
    expected, calls = released(model, torch.tensor([ids]), 16, 8, 4, True, "entropy")
    record = cli_sample(folder, tmp_path, ids, "--max-new-tokens", "16", "--steps", "8",
                        "--block-length", "4", "--cache", "dual")
    assert record["tokens"] == expected[0].tolist() and record["nfe"] == calls == 8
    assert record["k_schedule"] == "dream" and record["cache"] == "dual"
    expected, calls = released(model, torch.tensor([ids]), 16, 16, 4, True, "entropy")
    record = cli_sample(folder, tmp_path, ids, "--max-new-tokens", "16", "--steps", "16",
                        "--block-length", "4", "--cache", "dual", "--order", "entropy")
    assert record["tokens"] == expected[0].tolist() and record["nfe"] == calls
    expected, calls = released(model, torch.tensor([ids]), 16, 8, 4, False,
                                      "confidence_threshold", 0.5)
    record = cli_sample(folder, tmp_path, ids, "--max-new-tokens", "16", "--sampler",
                        "threshold", "--threshold", "0.5", "--block-length", "4", "--cache",
                        "prefix")
    assert record["tokens"] == expected[0].tolist() and record["nfe"] == calls


@pytest.mark.parametrize("sampler, options", [
    ("confidence", {"k_schedule": "dream", "order": "entropy", "order_temperature": 0.5}),
    ("threshold", {"threshold": 0.5}),
])
def test_at_temperature_above_0_a_seed_gives_one_answer_and_no_mask(dream, sampler, options):
    _, net, mask = dream
    template = template_of(prompts(3, 4), 16, mask)

    def draw(seed):
        how = SamplingSettings(sampler, 8, temperature=0.8, top_p=0.95,
                               options={**options, "block_length": 4, "cache": "dual"})
        return engine.sample(DiffusionDenoiser(net, LogLinear()), how, num_samples=3,
                             length=20, mask_id=mask, prompt=template,
                             generator=torch.Generator().manual_seed(seed))

    a, b, c = draw(0), draw(0), draw(1)
    assert torch.equal(a, b) and not torch.equal(a, c) and not (a == mask).any()
    assert torch.equal(a[:, :4], template[:, :4])

