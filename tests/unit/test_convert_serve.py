"""Converted folders (issue 54) served and sampled with the block caches: a tiny random LLaMA
and Qwen2 converted by `mdlm convert` (the shift on) answer `mdlm serve`'s /v1/completions with
the engine's own greedy tokens, with and without Fast-dLLM's dual cache; the converted Qwen2 (a
Dream folder) gives Fast-dLLM's Dream loop token for token; the converted LLaMA's cached calls
read their logits one to the left within the slice, as the full pass does; and
`mdlm sample --sampler confidence --cache dual --block-length K` samples both."""

import json

import pytest
import torch

pytest.importorskip("starlette")

from mdlm_cli.checkpoints.convert import ConvertRequest, convert  # noqa: E402
from mdlm_cli.checkpoints.load import load_checkpoint  # noqa: E402
from mdlm_cli.engine.settings import SamplingSettings  # noqa: E402
from mdlm_cli.serve.served import Served  # noqa: E402
from tests.causal_lm_folders import write_causal_lm  # noqa: E402

from .test_fast_dllm_dream import (  # noqa: E402
    FastDllmDream,
    fast_dllm_dream,
    mdlm_sample,
    prompts,
    template_of,
)
from .test_generation_schedules import cli_sample  # noqa: E402
from .test_open_models_serve import client_of, greedy  # noqa: E402

ARCHS = ("llama", "qwen2")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    base = tmp_path_factory.mktemp("convert-serve")
    for arch in ARCHS:
        convert(ConvertRequest(str(write_causal_lm(base / arch, arch)), base / f"{arch}-mdlm"))
    return {arch: base / f"{arch}-mdlm" for arch in ARCHS}


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_converted_folder_serves_completions(converted, arch, cache):
    loaded = load_checkpoint(str(converted[arch]))
    assert loaded.model.shifted_logits
    # the shifted cache runs Fast-dLLM's Dream loop, on Dream's grid: a converted LLaMA keeps
    # LLaDA's default k-schedule, which that loop refuses, so the request names Dream's
    options = ({} if cache == "none"
               else {"block_length": 4, "cache": "dual", "k_schedule": "dream"})
    http = client_of(Served(loaded, torch.device("cpu"), None, arch))
    body = {"model": arch, "prompt": "w1 w2 w3", "max_tokens": 8, "temperature": 0,
            "sampler": "confidence", "steps": 8, **options}
    try:
        out = http.post("/v1/completions", json=body)
    finally:
        http.__exit__(None, None, None)
    assert out.status_code == 200, out.text
    prefix = loaded.row_start() + loaded.tokenizer.encode("w1 w2 w3")
    tokens = greedy(loaded, prefix, 8, SamplingSettings("confidence", 8, temperature=0.0,
                                                        options=options)).tolist()
    stop = next((i for i, t in enumerate(tokens) if t == loaded.tokenizer.eos_id), 8)
    assert out.json()["choices"][0]["text"] == loaded.tokenizer.decode(tokens[:stop])
    assert out.json()["usage"]["prompt_tokens"] == len(prefix) - len(loaded.row_start())


@pytest.mark.parametrize("threshold", [None, 0.5])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_converted_qwen2_gives_fast_dllms_dream_loop_token_for_token(converted, cache,
                                                                        threshold):
    loaded = load_checkpoint(str(converted["qwen2"]))
    net, mask = loaded.model.eval(), loaded.mask_id
    prompt, alg = prompts(2, 5), "entropy" if threshold is None else "confidence_threshold"
    expected = [fast_dllm_dream(FastDllmDream(net, mask), row[None], 16, 8, 4, cache == "dual",
                                alg, threshold) for row in prompt]
    tokens, nfe = mdlm_sample(net, template_of(prompt, 16, mask), 8, cache, 4, mask, threshold)
    assert torch.equal(tokens, torch.cat([x for x, _ in expected]))
    assert nfe == sum(n for _, n in expected) / len(expected)
    assert len(set(tokens[0, 5:].tolist())) > 2  # not one token repeated: the test can fail


@torch.no_grad()
def test_a_converted_llamas_cached_slices_read_one_to_the_left(converted):
    """The shifted LLaDA backbone's cache: a full pass equals the plain one, and a slice [s, e)
    right after it gives the full pass's logits at s + 1.. (read from s..) and, at s, those of
    its own first output (Fast-dLLM's shift within the call), not the full pass's."""
    net = load_checkpoint(str(converted["llama"])).model.eval()
    x = prompts(2, 20, seed=4)
    full, cache = net.block_cache(x, net.new_block_cache(*x.shape))
    torch.testing.assert_close(full, net(x), atol=1e-5, rtol=1e-5)
    for s, e in [(8, 12), (8, 20), (3, 20)]:
        sliced = net.from_cache(x[:, s:e], cache, s)
        torch.testing.assert_close(sliced[:, 1:], full[:, s + 1:e], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(sliced[:, 0], full[:, s], atol=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
def test_mdlm_sample_a_converted_folder_with_the_dual_cache(converted, tmp_path, arch):
    ids = [5, 17, 3, 9]
    record = cli_sample(converted[arch], tmp_path, ids, "--max-new-tokens", "16", "--steps",
                        "8", "--block-length", "4", "--cache", "dual", "--k-schedule", "dream")
    mask = json.loads((converted[arch] / "config.json").read_text())["mask_token_id"]
    assert record["tokens"][:4] == ids and len(record["tokens"]) == 20
    assert mask not in record["tokens"] and record["nfe"] == 8
