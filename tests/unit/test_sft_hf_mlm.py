"""`train.init_from` of an hf-mlm checkpoint (an mdlm run of the hf-mlm backbone, and its
`mdlm export`) into prompt/response fine-tuning (data.packing=sft): the run starts from its
weights, trains on the responses only and saves an sft model (tiny random BERT, offline)."""

import io
import json

import pytest
import torch
from rich.console import Console

from mdlm_cli.build import config_from_dict
from mdlm_cli.checkpoints.export import export_folder
from mdlm_cli.checkpoints.folder import load_run_folder
from mdlm_cli.checkpoints.save import CheckpointContents, save_checkpoint
from mdlm_cli.data.store import prepare
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.models import build_model
from mdlm_cli.train.loop import train

from ..hf_models import save_tiny_mlm

EXAMPLES = [
    {"prompt": "it was the best of", "response": "times."},
    {"prompt": "it was the age of", "response": "wisdom, it was the age of foolishness."},
    {"prompt": "he had", "response": "the epoch of belief."},
    {"prompt": "to", "response": "and that is his."},
]
STEPS = 2


def model_section(folder) -> dict:
    return {"backbone": "hf-mlm", "hf_model": str(folder)}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """An hf-mlm run whose head bias no fresh model has (the BERT folder's is zero), and its
    export as a Hugging Face folder."""
    root = tmp_path_factory.mktemp("hf-sft")
    folder = save_tiny_mlm(root / "bert")
    cfg = config_from_dict({"name": "tiny", "model": model_section(folder),
                            "data": {"tokenizer": str(folder), "length": 32},
                            "train": {"out_dir": str(root / "run")}})
    tok = load_tokenizer(str(folder))
    model = build_model(cfg.model, tok.vocab_size)
    with torch.no_grad():
        model.hf.cls.predictions.bias.normal_()
    save_checkpoint(root / "run", 5,
        CheckpointContents(model=model, ema_model=None, optimizer=None, cfg=cfg, state={"step": 5},
                           tokenizer=tok, data_meta={"length": 32, "packing": "wrap"}))
    export_folder(load_run_folder(root / "run"), root / "export", weights="raw")
    return root, folder, model.hf.cls.predictions.bias.detach().clone()


@pytest.mark.parametrize("which", ["run", "export"])
def test_init_from_an_hf_mlm_checkpoint_into_sft_training(source, which, tmp_path):
    root, folder, start = source
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES * 10))
    cfg = config_from_dict({
        "name": "tiny-sft", "model": model_section(folder), "diffusion": {"objective": "mdlm"},
        "data": {"dataset": str(data), "tokenizer": str(folder), "length": 32, "packing": "sft",
                 "cache_dir": str(tmp_path)},
        "train": {"global_batch_size": 4, "micro_batch_size": 4, "max_steps": STEPS, "ema": 0,
                  "precision": "fp32", "init_from": str(root / which),
                  "out_dir": str(tmp_path / "sft")}})
    log = io.StringIO()
    result = train(cfg, console=Console(file=log, width=300))
    assert f"Initialised from {root / which}" in log.getvalue()
    tuned = load_run_folder(tmp_path / "sft")
    bias = tuned.model.hf.cls.predictions.bias.detach()
    # Adam moves a weight by about the learning rate per step at most: the run started from
    # the checkpoint's weights, not from the BERT folder's
    assert (bias - start).abs().max() <= 2 * STEPS * cfg.optim.lr
    fresh = build_model(cfg.model, tuned.tokenizer.vocab_size).hf.cls.predictions.bias.detach()
    assert (fresh - start).abs().mean() > 0.5
    assert tuned.data_meta["packing"] == "sft" and tuned.data_meta["pad_as_eos"]
    valid = prepare(cfg.data).meta["splits"]["valid"]
    assert valid["rows"] > 0
    assert result.final_valid.tokens == valid["target_tokens"] < valid["tokens"]
    assert all(torch.isfinite(torch.tensor(loss)) for loss in result.losses)
