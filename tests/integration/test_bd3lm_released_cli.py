"""A folder in the released BD3-LM layout from the command line: `mdlm sample` block by block
past its length and `mdlm eval-ppl` on a local text file, with GPT-2's tokenizer; a folder
mdlm cannot honour is one line."""

import json

from ..bd3lm_released import GPT2_VOCAB, released_config, save_released_folder
from .conftest import invoke, one_line_error


def test_sample_and_eval_ppl_of_a_released_folder(small_corpus, tmp_path):
    folder = save_released_folder(tmp_path / "bd3lm-owt-block_size4")
    out = tmp_path / "s.jsonl"
    text = invoke("sample", "-c", folder, "--length", "64", "-n", "1", "--seed", "0",
                  "--out", out, "--quiet")
    assert "first-hitting" in text
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["length"] <= len(record["tokens"]) <= 64 and record["max_length"] == 64
    assert all(0 <= t < GPT2_VOCAB - 1 for t in record["tokens"])  # never the mask
    invoke("sample", "-c", folder, "--length", "128", "-n", "1", "--sampler", "ancestral",
           "--steps", "2", "--no-stop-at-eos", "--out", tmp_path / "long.jsonl", "--quiet")
    [long] = [json.loads(line) for line in (tmp_path / "long.jsonl").read_text().splitlines()]
    assert len(long["tokens"]) == 128  # past the folder's model_length of 64
    report = invoke("eval-ppl", "-c", folder, "--dataset", small_corpus, "--rows", "4", "-k", "2",
                    "--json", tmp_path / "e.json")
    assert "bd3lm" in report
    [result] = json.loads((tmp_path / "e.json").read_text())["results"]
    assert result["kind"] == "bound" and result["mc_samples"] == 2
    # random weights over GPT-2's 50258 ids: about log(50258) nats a token, a finite bound
    assert 5.0 < result["nats_per_token"] < 30.0 and result["tokens"] > 0


def test_a_folder_mdlm_cannot_honour_is_one_line(tmp_path):
    folder = save_released_folder(tmp_path / "f", released_config(cross_attn=False))
    assert "cross_attn=false" in one_line_error("sample", "-c", folder, "-n", "1")
