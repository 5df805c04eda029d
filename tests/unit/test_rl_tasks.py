"""The generated addition task: the same seed gives the same files, the splits share no
problem, every answer is right, the files are what data/sft.py reads, and the text8 alphabet
goes through the character tokeniser unchanged."""

import pytest

from mdlm_cli.data.sft import read_examples
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.errors import MdlmError
from mdlm_cli.rl import AdditionTask, addition_splits, exact_match, load_reward, write_addition_task
from mdlm_cli.rl.tasks import read_text


def test_same_seed_same_problems_another_seed_others():
    task = AdditionTask(train=300, held_out=50, seed=3)
    assert addition_splits(task) == addition_splits(task)
    assert addition_splits(AdditionTask(train=300, held_out=50, seed=4)) != addition_splits(task)


@pytest.mark.parametrize("alphabet", ["text8", "digits"])
def test_splits_are_disjoint_sized_and_correct(alphabet):
    task = AdditionTask(max_digits=2, train=2000, held_out=200, seed=0, alphabet=alphabet)
    train, held_out = addition_splits(task)
    assert len(train) == 2000 and len(held_out) == 200
    prompts = [r["prompt"] for r in train], [r["prompt"] for r in held_out]
    assert len(set(prompts[0])) == 2000 and not set(prompts[0]) & set(prompts[1])
    for record in train + held_out:
        a, b = read_text(record["prompt"], alphabet).removesuffix("=").split("+")
        assert int(read_text(record["response"], alphabet)) == int(a) + int(b)
        assert int(a) < 100 and int(b) < 100


def test_files_are_prompt_response_jsonl_that_sft_reads(tmp_path):
    task = AdditionTask(train=40, held_out=10, seed=1)
    paths = write_addition_task(task, tmp_path / "add")
    train, held_out = addition_splits(task)
    assert read_examples(paths["train"]) == train
    assert read_examples(paths["held_out"]) == held_out


def test_text8_alphabet_is_one_character_token_each():
    tok = load_tokenizer("char")
    for record in addition_splits(AdditionTask(train=50, held_out=0, seed=2))[0]:
        for text in record.values():
            ids = tok.encode(text)
            assert len(ids) == len(text) and tok.decode(ids) == text
    assert read_text("bcpdefq", "text8") == "12+345="


def test_exact_match_and_the_exact_reward_agree():
    completions, refs = ["dfh", " dfh ", "dfg"], ["dfh", "dfh", "dfh"]
    assert exact_match(completions, refs) == pytest.approx(2 / 3)
    assert load_reward("exact")(["p"] * 3, completions, response=refs) == [1.0, 1.0, 0.0]
    with pytest.raises(MdlmError):
        exact_match(["a"], [])


def test_bad_sizes_are_one_line_errors():
    with pytest.raises(MdlmError, match="has only 100: raise max_digits"):
        addition_splits(AdditionTask(max_digits=1, train=90, held_out=20))
    with pytest.raises(MdlmError, match="alphabet must be one of: text8, digits"):
        addition_splits(AdditionTask(alphabet="roman"))
