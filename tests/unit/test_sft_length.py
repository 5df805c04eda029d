"""Padding as EOS teaches the answer's length: a tiny model fine-tuned on a toy task whose answer
length depends on the prompt (prompt letter i, answer i + 1 copies of "a") ends where it should."""

import json

import torch
from rich.console import Console

from mdlm_cli.build import resolve_config
from mdlm_cli.checkpoints.folder import load_run_folder
from mdlm_cli.sample.generate import generate, stops_at_eos, template
from mdlm_cli.train.loop import train

PROMPTS = "bcdefg"  # prompt i -> i + 1 letters "a", then EOS
TOY = ["data.tokenizer=char", "data.length=10", "data.packing=sft", "model.hidden_size=64", "model.n_blocks=2",
       "model.n_heads=2", "model.cond_dim=32", "train.global_batch_size=16", "train.micro_batch_size=16",
       "train.max_steps=250", "train.log_every=50", "train.eval_every=1000", "train.save_every=1000",
       "train.precision=fp32", "optim.lr=3e-3", "optim.warmup_steps=10", "train.ema=0"]


def toy_examples(path, repeats: int = 10):
    lines = [json.dumps({"prompt": p, "response": "a" * (i + 1)}) for _ in range(repeats)
             for i, p in enumerate(PROMPTS)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_pad_as_eos_model_learns_where_the_answer_ends(tmp_path):
    data = toy_examples(tmp_path / "toy.jsonl")
    cfg = resolve_config("test", [*TOY, f"data.dataset={data}", f"train.out_dir={tmp_path / 'run'}"])
    result = train(cfg, console=Console(quiet=True))
    assert result.losses[-1] < 0.2 * result.losses[0]
    loaded = load_run_folder(tmp_path / "run")
    assert stops_at_eos(loaded)  # trained with padding as EOS: samples end at their EOS by default
    right = 0
    for i, p in enumerate(PROMPTS):
        records, _, _ = generate(loaded, sampler="first-hitting", num_samples=4, batch_size=4, steps=None, seed=i,
                                 device=torch.device("cpu"), dtype=None, prompt=template(loaded, 10, prompt=p),
                                 stop_at_eos=True)
        for r in records:
            assert loaded.tokenizer.eos_id not in r.tokens  # nothing from the EOS on is returned
            right += r.ended and r.length == i + 1 and r.text == p + "a" * (i + 1)
    assert right >= 22  # of 24 (measured: 24)
