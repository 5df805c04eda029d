"""The sections of the configuration as typed dataclasses (the truth: presets only set
values), the choices some of their keys take, and `SECTIONS`, the name of each section.

Loading (presets, `--set`, flags: loading.py) and the checks each section makes alone
(checks.py) sit beside this module; `mdlm_cli.config` re-exports them all.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

PACKINGS = ("wrap", "pad", "chunk", "chunk-eos", "window", "sft", "sft-pack")
SFT_PACKINGS = ("sft", "sft-pack")  # prompt/response rows: the loss on the responses only
LR_SCHEDULES = ("constant", "cosine")
PRECISIONS = ("auto", "bf16", "fp32")
PARALLELS = ("ddp", "fsdp")
QUANTIZE = ("none", "4bit")  # lora.quantize: the frozen base as stored, or nf4 (bitsandbytes)


@dataclass
class DataConfig:
    # a registry name (`mdlm prepare-data --help`) or a local text/jsonl path
    dataset: str = "bigtxt"
    tokenizer: str = "gpt2"  # gpt2 | bert-base-uncased | char | local tokenizer folder | hub id
    length: int = 128  # tokens per row (L)
    # wrap (BOS/EOS, OWT) | pad (one doc per row, LM1B) | chunk (text8) | chunk-eos (BD3-LM:
    # documents joined by EOS, nothing per row) | window (DNA)
    # | sft (prompt/response examples, one per row, loss on the response: data/sft.py)
    # | sft-pack (several examples per row, attention within each: data/sft_pack.py)
    packing: str = "wrap"
    # sft*: fill with EOS, learnt (the model picks the length); false: pad
    pad_as_eos: bool = True
    cache_dir: str = ""  # "" = $MDLM_CACHE or ~/.cache/mdlm
    rc_augment: bool = False  # DNA: each training row reverse-complemented with probability 1/2
    max_rows: int = 0  # rows of the train split to prepare, 0 = all (a stream stops there)
    max_eval_rows: int = 0  # rows of each evaluation split (valid, test), 0 = all


@dataclass
class ModelConfig:
    """The backbone's hyper-parameters: the one model config of training, loading and export.
    The vocabulary comes from the tokeniser and causal attention from the objective. Each
    backbone reads only its own keys (`config_keys` of its class in models.BACKBONES); giving
    one it does not read is an error, and only its own keys are saved (both in build.py)."""

    backbone: str = "dit"  # models.BACKBONES
    # hf-mlm: a Hugging Face masked LM (hub id, folder, or a pip-packaged model)
    hf_model: str = ""
    hidden_size: int = 768
    n_blocks: int = 12
    n_heads: int = 12
    cond_dim: int = 128
    mlp_ratio: int = 4
    dropout: float = 0.1
    time_conditioning: bool = False  # reference default; the paper's 23.21 used it on
    # dit: position i's logits from the output at i - 1, as the AR head of an mdlm AR run that
    # `mdlm convert --shift` made a diffusion model was trained (docs/conversion.md); the
    # converted llada / dream / gpt2 folders record it in their config.json instead
    shift: bool = False
    # Mamba-based DNA backbones (caduceus, mamba; models.caduceus.MambaConfig): hidden_size is
    # d_model, n_blocks the number of layers; the DiT does not take these
    mixer: str = "auto"  # selective scan: auto | cuda (mamba-ssm) | torch (mambapy)
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    rcps: bool = False  # caduceus: Caduceus-PS (reverse-complement equivariant) instead of Ph
    # caduceus PS layout: true = the released checkpoints' (halves swapped per block)
    fused_add_norm: bool = True
    bidirectional_strategy: str = "add"  # caduceus: add | ew_multiply
    # caduceus: mamba_rev shares mamba_fwd's in/out projections
    bidirectional_weight_tie: bool = True
    rms_norm: bool = True  # RMSNorm (else LayerNorm)
    norm_epsilon: float = 1e-5


@dataclass
class DiffusionConfig:
    # objectives.OBJECTIVES: mdlm | sedd | d3pm | ar (autoregressive baseline)
    objective: str = "mdlm"
    schedule: str = "loglinear"  # loglinear | cosine | cosine-squared | linear | geometric
    eps: float = 1e-3
    antithetic: bool = True  # low-discrepancy t over the global batch
    T: int = 0  # 0 = continuous time; T > 0 = discrete-time bound (Table 8); d3pm needs T > 0
    # The two halves of SUBS (§3.2.3), switches of the Table 8 ablation (mdlm, d3pm):
    # the model gives the mask token probability 0 (d3pm: the reference's subs_masking)
    zero_masking: bool = True
    carry_over: bool = True  # unmasked tokens are copied; off adds the t = 0 reconstruction term
    # mdlm's training loss (docs/conversion.md#loss-weighting; evaluation keeps the bound):
    # nelbo (each masked token weighted -alpha'/(1 - alpha), 1/t under the linear schedule) |
    # cart (Dream's token-level weights: a geometric distribution, parameter cart_p, over the
    # distance to each clean token)
    loss_weighting: str = "nelbo"
    cart_p: float = 0.3
    # bd3lm (docs/bd3lm.md): L' per block, training's t ~ U[clip_min, clip_max], its search
    block_size: int = 0
    clip_min: float = 0.0
    clip_max: float = 1.0
    clip_search_widths: tuple[float, ...] = ()  # empty: no search
    clip_search_delta: float = 0.05  # the searched intervals' starts are this far apart


@dataclass
class OptimConfig:
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 2500
    schedule: str = "constant"  # constant | cosine (after warmup)
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of lr
    grad_clip: float = 1.0  # 0 = off


@dataclass
class TrainConfig:
    global_batch_size: int = 512
    micro_batch_size: int = 16
    max_steps: int = 1_000_000
    # minutes of training to fit the schedule to, 0 = off: max_steps becomes what the budget
    # holds at the run's measured speed, at most the max_steps above (train/budget.py)
    time_budget: float = 0.0
    ema: float = 0.9999  # 0 = off; warmup min(ema, (1 + n) / (10 + n))
    seed: int = 1
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:1 | mps
    # auto (bf16 on CUDA and on CPUs with bf16 units: runtime.py) | bf16 | fp32
    precision: str = "auto"
    compile: bool = False
    # gradient checkpointing: blocks' activations recomputed in the backward pass (LLaDA, Dream)
    checkpointing: bool = False
    # DiffuLLaMA's attention annealing, 0 = off: training step s attends causally plus a random
    # share min(1, (s + 1) / steps) of the other (query, key) pairs (models/anneal.py)
    attention_anneal_steps: int = 0
    threads: int = 0  # CPU threads, 0 = torch default
    # under torchrun: ddp (replicated) | fsdp (FSDP2 fully_shard: sharded weights/optimizer)
    parallel: str = "ddp"
    log_every: int = 10
    eval_every: int = 10_000
    eval_rows: int = 0  # validation rows per periodic evaluation, 0 = all
    save_every: int = 10_000
    keep_last: int = 2
    out_dir: str = "runs/{name}"
    # start from these weights: an mdlm checkpoint, or a Caduceus hub id / folder
    init_from: str = ""


@dataclass
class LoraConfig:
    """LoRA (Hu et al., 2021) through peft: the base (train.init_from) frozen, low-rank
    adapters trained beside the chosen linear layers (models/lora.py; docs/finetuning.md)."""

    rank: int = 0  # r; 0 = off (every weight trained)
    alpha: float = 16.0  # the update is scaled by alpha / r
    dropout: float = 0.0  # on the adapters' input
    # module names (peft's target_modules, matched as name suffixes); empty: the backbone's
    # attention and MLP projections (`lora_targets` of its class)
    targets: tuple[str, ...] = ()
    # also train the embedding and output layer whole (peft's modules_to_save): needed where
    # a token was added to the vocabulary
    train_embeddings: bool = False
    quantize: str = "none"  # none | 4bit (QLoRA: nf4 base through bitsandbytes, CUDA only)


@dataclass
class Config:
    name: str = "custom"
    description: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def to_dict(self) -> dict:
        """Every key of every section; `build.config_dict` keeps only the backbone's model keys
        (what checkpoints save)."""
        d = dataclasses.asdict(self)
        d["optim"]["betas"] = list(d["optim"]["betas"])
        d["diffusion"]["clip_search_widths"] = list(d["diffusion"]["clip_search_widths"])
        d["lora"]["targets"] = list(d["lora"]["targets"])
        return d

    @property
    def out_dir(self) -> Path:
        return Path(self.train.out_dir.format(name=self.name))


SECTIONS = {name: typ for name, typ in typing.get_type_hints(Config).items()
            if name not in ("name", "description")}
