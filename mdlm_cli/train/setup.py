"""What a training run holds (`Run`) and how it is set up: the prepared data, the objective,
the model and its wrappers, the EMA and optimiser, the state of a resumed run, and the run
folder's config. The loop itself is loop.py."""

from __future__ import annotations

import math
import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape

from ..build import config_yaml
from ..checkpoints.folder import load_training_state
from ..config import Config
from ..data.order import DataOrder
from ..data.store import PreparedData, TokenSplit, prepare
from ..data.tokenizers import Tokenizer
from ..distributed import Dist, wait_for_file
from ..errors import MdlmError
from ..io.files import write_text_atomic
from ..models import build_model, check_data
from ..models.lora import is_adapted
from ..models.speed import compile_trunk, compile_unavailable, model_flops, model_width
from ..objectives import Objective, get_objective
from ..perf import device_peak
from ..runtime import Runtime
from .log import Speed, nats_text
from .lora import adapt, restore_lora_run
from .optim import EMA, AdapterEMA
from .run_folder import ResumePoint, log_config_change, truncate_metrics
from .state import TrainState


@dataclass
class Run:
    """What a training run holds while it runs (one per process)."""

    cfg: Config
    dist: Dist
    rt: Runtime
    console: Console
    data: PreparedData
    tokenizer: Tokenizer
    train_split: TokenSplit
    valid_split: TokenSplit
    objective: Objective
    model: torch.nn.Module  # the module whose weights are saved (FSDP2: sharded in place)
    net: torch.nn.Module  # what the loss calls: DDP / compiled wrappers around `model`
    ema: EMA | None
    optimizer: torch.optim.Optimizer
    state: TrainState
    accum: int  # micro-batches per rank per step
    mine: slice  # this rank's share of every global batch
    order: DataOrder
    denoiser: object  # the objective's callable around `net` (what the loss calls)
    speed: Speed  # what turns tokens/s into MFU
    losses: list[float] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.cfg.out_dir

    @contextmanager
    def evaluation_weights(self):
        """The module to evaluate, in eval mode: the EMA's weights where the run has one (a
        LoRA run's averages swapped into the model for the duration), else the model's."""
        held = self.ema.swapped(self.model) if self.ema is not None else nullcontext(self.model)
        try:
            with held as model:
                yield model.eval()
        finally:
            self.model.train()


def prepare_data(cfg: Config, console: Console, load_dataset=None,
                 wait: bool = False) -> PreparedData:
    from ..data.store import prepared_folder

    folder, _, _ = prepared_folder(cfg.data)
    if wait:  # another process on this node (local rank 0) prepares it
        wait_for_file(folder / "meta.json")
    if (folder / "meta.json").is_file():
        return PreparedData(folder)
    data = cfg.data
    console.print(f"[bold]Preparing data[/] {escape(data.dataset)} ({escape(data.tokenizer)}, "
                  f"{data.packing}, L={data.length}) ...")
    return prepare(cfg.data, load_dataset=load_dataset)


def set_up(cfg: Config, dist: Dist, console: Console, start: ResumePoint, *,
           load_dataset) -> Run:
    """Data, objective, model, EMA, optimizer; the checkpoint to resume; the run folder."""
    # a resumed run keeps the CPU threads it chose (gradients can round differently with
    # another count)
    inherited = 0 if os.environ.get("OMP_NUM_THREADS") else start.state.threads or 0
    rt = Runtime.create(str(dist.device), cfg.train.precision, cfg.train.threads or inherited)
    check_data(cfg)  # the backbone's checks of the data config, before any data is prepared
    lora = cfg.lora.rank > 0
    reads_init = cfg.train.init_from and (start.step_dir is None or lora)
    if reads_init:
        from .init_from import check_source

        check_source(cfg.train.init_from)
    data = prepare_data(cfg, console, load_dataset, wait=dist.local_rank != 0)
    tokenizer = data.tokenizer()
    train_split, valid_split = data.split("train"), data.split("valid")
    if len(train_split) == 0:
        raise MdlmError(f"the training split of {data.folder.name} is empty")
    tc = cfg.train
    accum = dist.accumulation_steps(tc.global_batch_size, tc.micro_batch_size)
    objective = get_objective(cfg, tokenizer)
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, tokenizer.vocab_size, causal=objective.causal)
    rt = rt.for_model(tc.precision, model_width(model))
    if cfg.data.rc_augment and tokenizer.complement is None:
        raise MdlmError("data.rc_augment needs a DNA tokenizer (data.tokenizer=dna); "
                        f"{tokenizer.name} has none")
    if tc.checkpointing:
        _checkpointing(model)
    # a fresh run only, or a LoRA run (its base is frozen and not saved: read again on resume)
    if reads_init:
        from .init_from import initialise_from

        console.print(f"Initialised from {initialise_from(model, tc.init_from, tokenizer)}")
    if lora:
        model = adapt(model, cfg, rt, console)
    ema = (AdapterEMA if lora else EMA)(model, tc.ema) if tc.ema > 0 else None
    net = _wrap(cfg, dist, rt, model, ema, console)
    optimizer = _optimizer(cfg, model, rt)
    state = _restore(model, ema, optimizer, console, start.step_dir)
    objective.load_training_state(state.objective_state or {})  # e.g. bd3lm's chosen interval
    state.threads = torch.get_num_threads()
    run = Run(cfg, dist, rt, console, data, tokenizer, train_split, valid_split, objective,
              model, net, ema, optimizer, state, accum, dist.batch_shard(tc.global_batch_size),
              DataOrder(len(train_split), tc.seed), objective.denoiser(net, rt.dtype),
              _speed(cfg, model, rt, dist, objective.pass_factor))
    if dist.is_main:
        _write_run_folder(run, start)
    _describe(run)
    return run


def _checkpointing(model: torch.nn.Module) -> None:
    """train.checkpointing on a backbone that recomputes its blocks (`checkpointing`, models/
    open_weights.py), or one line."""
    if not hasattr(type(model), "checkpointing"):
        raise MdlmError(f"train.checkpointing: {model.describe()} does not recompute its blocks "
                        "(the llada and dream backbones do); set it false")
    model.checkpointing = True


def _wrap(cfg: Config, dist: Dist, rt: Runtime, model: torch.nn.Module,
          ema: EMA | None, console: Console) -> torch.nn.Module:
    """The module the loss calls: on the device, DDP / FSDP2, and compiled where asked (and
    where it can be: eager with a warning otherwise)."""
    tc = cfg.train
    net = dist.wrap(model, ema.model if isinstance(ema, EMA) else None, tc.parallel, rt.dtype)
    unavailable = compile_unavailable(rt.device) if tc.compile else None
    if unavailable:
        console.print(f"[yellow]Warning[/]: {unavailable}")
        return net
    if tc.compile and not compile_trunk(model):  # the DiT's trunk; other backbones whole
        net = torch.compile(net)
    return net


def _optimizer(cfg: Config, model: torch.nn.Module, rt: Runtime) -> torch.optim.Optimizer:
    optim = cfg.optim
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],  # a LoRA run's adapters only
        lr=optim.lr,
        betas=optim.betas,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        fused=(rt.device.type == "cuda") or None,
    )


def _write_run_folder(run: Run, start: ResumePoint) -> None:
    """The run's config.yaml, its metrics cut back to the resumed step, and any allowed
    config change on the record (rank 0 only)."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run.run_dir / "config.yaml", config_yaml(run.cfg))
    truncate_metrics(run.run_dir / "metrics.jsonl", run.state.step)
    if start.changes:  # allowed by --override-resume-config: on the record
        log_config_change(run.run_dir, run.state.step, start.changes, run.console)


def _speed(cfg: Config, model: torch.nn.Module, rt: Runtime, dist: Dist, factor: int) -> Speed:
    """Model FLOPs per training token at the run's row length (a pass of `factor` positions
    per token: bd3lm's x_t ⊕ x_0 is 2), and the device's peak at its precision (a CPU's
    matmul probe is timed once and cached: perf.py)."""
    peak = device_peak(rt.device, rt.dtype)
    flops = factor * model_flops(model).per_token(factor * cfg.data.length)
    return Speed(flops, peak, dist.world_size)


def _restore(model, ema: EMA | AdapterEMA | None, optimizer, console: Console,
             step_dir: Path | None) -> TrainState:
    """The training state: fresh, or the checkpoint's (weights restored in place)."""
    if step_dir is None:
        return TrainState()
    if is_adapted(model):  # the adapters and their EMA; the base was read from init_from
        state = TrainState.from_dict(restore_lora_run(step_dir, model, ema, optimizer))
    else:
        ema_model = ema.model if ema else None
        state = TrainState.from_dict(load_training_state(step_dir, model, ema_model, optimizer))
    if ema is not None:
        ema.updates = state.step
    console.print(f"Resumed from {step_dir} at step {state.step}", markup=False, highlight=False)
    return state


def _describe(run: Run) -> None:
    tc, dist, model = run.cfg.train, run.dist, run.model
    rows = f"{len(run.train_split)} train rows, {len(run.valid_split)} valid rows"
    data = f"{escape(run.data.folder.name)} ({rows})"
    batch = (f"global batch {tc.global_batch_size} = {tc.micro_batch_size} x {run.accum} "
             f"accumulation x {dist.world_size} rank(s)")
    millions = model.num_parameters() / 1e6
    run.console.print(f"Model: {model.describe()}, {millions:.1f}M parameters, "
                      f"objective {run.objective.name}; data: {data}; "
                      f"device: {run.rt.describe()}; "
                      f"{dist.describe(tc.parallel)}, {batch}; {run.speed.describe()}")
    for note in run.model.notes:  # a trait (models/traits.py): none on most backbones
        run.console.print(f"[yellow]note:[/] {note}", highlight=False)
    unigram = run.data.meta.get("unigram_valid_nats")
    if unigram is not None:
        baseline = nats_text(unigram, run.tokenizer.is_character_level)
        run.console.print(f"Unigram baseline on valid: {baseline} (PPL {math.exp(unigram):.1f})")
