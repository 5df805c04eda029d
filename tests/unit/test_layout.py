"""The one rule of a row (generation/layout.py) and the capabilities it reads
(generation/capabilities.py), on hand-made records and on the tiny LLaDA and Dream folders."""

import pytest
import torch

from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.generation.capabilities import Capabilities, capabilities_of
from mdlm_cli.generation.layout import LayoutError, lay_out
from tests.open_model_folders import write_dream, write_llada

DIT = Capabilities(mask_id=9, attention="bidirectional", window=32, row_start=(1,),
                   answer_tokens=None)
LLADA = Capabilities(mask_id=9, attention="bidirectional", window=4096, row_start=(1,),
                     answer_tokens=128)


def test_a_row_is_start_prompt_answer_suffix_and_nothing_after():
    row = lay_out(DIT, [5, 6], answer=4, suffix=[7])
    assert row.length == 1 + 2 + 4 + 1 and row.answer_start == 3
    assert row.template(9).tolist() == [1, 5, 6, 9, 9, 9, 9, 7]
    assert lay_out(DIT, [5, 6], answer=4, start=[]).template(9).tolist() == [5, 6, 9, 9, 9, 9]


def test_an_answer_not_asked_for_is_the_familys_default_else_the_rest_of_the_window():
    assert lay_out(DIT, [5, 6]).answer == 32 - 3  # a DiT trained at L: the window
    assert lay_out(LLADA, [5] * 10).length == 1 + 10 + 128  # LLaDA: gen_length 128, not 4096
    near_the_end = lay_out(LLADA, [5] * 4000)
    assert near_the_end.answer == 4096 - 4001 and near_the_end.length == 4096


@pytest.mark.parametrize("caps, prompt, answer", [(DIT, [5] * 20, 12), (DIT, [5] * 32, None),
                                                  (LLADA, [5] * 4096, None)])
def test_a_row_past_the_window_is_refused_with_its_parts(caps, prompt, answer):
    with pytest.raises(LayoutError, match=f"exceeds the window of {caps.window} tokens"):
        lay_out(caps, prompt, answer=answer)


BLOCKS = Capabilities(mask_id=9, attention="block-causal", window=32, row_start=(1,),
                      answer_tokens=None, block_size=4)


def test_block_by_block_and_allowed_longer_rows_pass_the_window():
    assert lay_out(BLOCKS, [5] * 30, answer=41).length == 72  # 72 = 18 blocks of 4
    assert lay_out(DIT, [5] * 30, answer=40, longer=True).length == 71


def test_a_block_row_is_rounded_up_to_whole_blocks_its_rounding_drawn_after_the_answer():
    row = lay_out(BLOCKS, [5, 6], answer=3)  # 1 + 2 + 3 = 6 positions: 2 blocks of 4
    assert (row.asked, row.length, row.rounded, row.answer) == (6, 8, True, 3)
    assert row.template(9).tolist() == [1, 5, 6, 9, 9, 9, 9, 9]
    exact = lay_out(BLOCKS, [5, 6, 7], answer=4)
    assert exact.length == 8 and not exact.rounded
    with pytest.raises(LayoutError, match="no suffix"):
        lay_out(BLOCKS, [5], answer=3, suffix=[7])


@pytest.mark.parametrize("prompt, answer, length", [
    (3, 28, 32),  # the rest of the window: 1 + 3 + 28 = 32, whole blocks already
    (29, 4, 36),  # two positions left: one block at least, then rounded (34 -> 36)
    (40, 4, 48),  # a prompt past the window: one block after it, the row past the window
])
def test_a_block_models_default_answer_is_the_rest_of_the_window_one_block_at_least(
        prompt, answer, length):
    row = lay_out(BLOCKS, [5] * prompt)
    assert (row.answer, row.length) == (answer, length)


def test_a_rows_whole_length_may_be_asked_instead_of_an_answer():
    row = lay_out(BLOCKS, [5, 6], length=10)  # --length 10: the answer is 10 - 3, rounded 12
    assert (row.answer, row.asked, row.length) == (7, 10, 12)
    assert lay_out(DIT, [5, 6], length=20).template(9).tolist() == [1, 5, 6] + [9] * 17
    with pytest.raises(LayoutError, match="the row's length is 3"):
        lay_out(BLOCKS, [5, 6], length=3)
    with pytest.raises(LayoutError, match="not both"):
        lay_out(DIT, [5], answer=2, length=8)
    with pytest.raises(LayoutError, match="exceeds the window of 32"):
        lay_out(DIT, [5], length=40)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("caps")
    return {"llada": load_checkpoint(str(write_llada(base / "llada"))),
            "dream": load_checkpoint(str(write_dream(base / "dream")))}


def test_the_released_folders_declare_what_their_releases_do(folders):
    llada, dream = (capabilities_of(folders[name]) for name in ("llada", "dream"))
    assert llada.answer_tokens == 128 and dream.answer_tokens == 512
    assert llada.attention == dream.attention == "bidirectional"
    assert llada.caches == dream.caches == ("prefix", "dual")
    assert not llada.shifted_logits and dream.shifted_logits
    assert llada.chat and set(llada.end_of_turn) == {81, 84}  # <|endoftext|>, <|eot_id|>
    assert dream.chat and set(dream.end_of_turn) == {80, 82}  # <|endoftext|>, <|im_end|>
    assert dream.generation_defaults["top_k"] == 50
    assert "top_k" not in llada.generation_defaults
    assert llada.window == 64 and torch.equal(
        lay_out(llada, [5, 6]).template(llada.mask_id)[:3], torch.tensor([80, 5, 6]))


@pytest.mark.parametrize("fields, message", [
    ({"prompt": "a", "chat": "b"}, "give --prompt or --chat, not both"),
    ({"prompt_ids": (1,), "infill": "<mask>"}, "give --prompt-ids or --infill, not both"),
    ({"length": 8, "max_new_tokens": 4}, "give --length or --max-new-tokens, not both"),
    ({"max_new_tokens": 0}, "--max-new-tokens must be at least 1"),
    ({"num_samples": 0}, "--num-samples must be at least 1"),
])
def test_a_request_is_checked_once_across_its_fields(fields, message):
    from mdlm_cli.errors import MdlmError
    from mdlm_cli.generation.request import GenerationRequest

    with pytest.raises(MdlmError, match=message):
        GenerationRequest(**fields).validate()
    ok = GenerationRequest(num_samples=5, batch_size=2, prompt_ids=(3, 4), chat=None).validate()
    assert ok.rows_per_call == 2 and ok.conditioned and ok.record()["prompt_ids"] == [3, 4]


def test_a_semi_ar_row_is_the_window_then_stride_sized_extensions():
    from mdlm_cli.generation.layout import lay_out_semi_ar

    row = lay_out_semi_ar(DIT, [5] * 3, answer=60)  # 1 + 3 + 60 = 64: the window, 2 x 16 more
    assert (row.length, row.stride, row.window, row.extensions) == (64, 16, 32, 2)
    odd = lay_out_semi_ar(DIT, [5] * 3, stride=8, answer=61)  # 65: 5 extensions, the last cut
    assert (odd.length, odd.extensions) == (65, 5)
    short = lay_out_semi_ar(LLADA, [5] * 3)  # not asked: the rest of the window, not 128
    assert (short.answer, short.length, short.extensions) == (4096 - 4, 4096, 0)
    assert lay_out_semi_ar(DIT, [], start=[], length=64).answer == 64  # the row in all
    with pytest.raises(LayoutError, match="shorter than the window: 32 tokens"):
        lay_out_semi_ar(DIT, [5] * 31)


def test_an_infill_template_is_a_prompt_then_an_answer_the_template_lies_over():
    from mdlm_cli.generation.layout import lay_out_infill

    row = lay_out_infill(DIT, [5, 9, 9, 6, 9])  # "a<mask:2>b<mask>": 5 before the first span
    assert (row.prompt, row.answer, row.length) == ((5,), 30, 32)  # the window, all after free
    assert row.template(9).tolist() == [1, 5, 9, 9, 6] + [9] * 27
    assert lay_out_infill(DIT, [9, 6], length=8).template(9).tolist() == [1, 9, 6] + [9] * 5
    with pytest.raises(LayoutError, match="exceeds the window"):
        lay_out_infill(DIT, [5, 9] + [6] * 30)
