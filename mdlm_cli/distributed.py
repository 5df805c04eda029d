"""Data-parallel training on torch.distributed: process group, DDP / FSDP2, sharding,
reductions, preemption.

`torchrun` (alone, with --nnodes/--rdzv-endpoint, or under SLURM's srun) sets RANK,
WORLD_SIZE and LOCAL_RANK; `session()` then joins the process group (NCCL on GPUs, gloo
on CPU) and gives each process one device. Without those variables, or with one process,
every helper here is a no-op and mdlm runs as a single process.

Conventions that make a run independent of the number of ranks:
- every rank holds the same global batch of row indices (a stateless order) and takes
  its contiguous share of it; the diffusion times are drawn once for the global batch;
- the loss is normalised by the token count of the GLOBAL batch, and gradients are
  SUMMED over micro-batches and ranks (not averaged), exactly as one process accumulates;
- checkpoints hold full (consolidated) tensors, written by rank 0, so a run can resume
  on any number of ranks and single-process commands load them as they are.
"""

from __future__ import annotations

import inspect
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as tdist
from torch import nn

from .errors import MdlmError
from .runtime import pick_device
from .signals import StopSignals  # noqa: F401 - preemption; train.loop imports it from here


def env_rank() -> int:
    """This process's global rank as set by torchrun (0 when not launched by it)."""
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    """True on rank 0 (and in a plain single-process run); usable before `session()`."""
    return env_rank() == 0


def current_rank() -> int:
    return tdist.get_rank() if tdist.is_available() and tdist.is_initialized() else 0


def barrier() -> None:
    if tdist.is_available() and tdist.is_initialized():
        tdist.barrier()


@dataclass
class Dist:
    """Where this process sits in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def describe(self, parallel: str) -> str:
        if not self.enabled:
            return "1 process"
        name = "FSDP2" if parallel == "fsdp" else "DDP"
        return f"{self.world_size} ranks ({name}, {self.backend})"

    # ------------------------------------------------------------------ the global batch

    def accumulation_steps(self, global_batch: int, micro_batch: int) -> int:
        """Micro-batches per rank per step: global = micro x accumulation x world size."""
        per_rank, rest = divmod(global_batch, self.world_size)
        if rest:
            raise MdlmError(f"train.global_batch_size ({global_batch}) cannot be split evenly "
                            f"over {self.world_size} ranks; choose a multiple of "
                            f"{self.world_size} or another number of processes")
        if per_rank % micro_batch:
            fits = max(d for d in range(1, min(micro_batch, per_rank) + 1) if per_rank % d == 0)
            raise MdlmError(f"train.global_batch_size ({global_batch}) over {self.world_size} "
                            f"ranks is {per_rank} sequences per rank, not a multiple of "
                            f"train.micro_batch_size ({micro_batch}); use --set "
                            f"train.micro_batch_size={fits}")
        return per_rank // micro_batch

    def batch_shard(self, global_batch: int) -> slice:
        """This rank's contiguous share of every global batch: ranks are disjoint and
        together cover the batch, so the data stream is the same for any world size."""
        per_rank = global_batch // self.world_size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    # ------------------------------------------------------------------ reductions

    def all_sum(self, *values: float) -> list[float]:
        """Sum scalars over ranks (one collective; float64)."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        tdist.all_reduce(t)
        return t.tolist()

    # ------------------------------------------------------------------ the model

    def wrap(self, model: nn.Module, ema_model: nn.Module | None, parallel: str = "ddp",
             dtype: torch.dtype | None = None) -> nn.Module:
        """Move `model` (and its EMA copy) to this rank's device and wrap it for data
        parallelism; returns the module to call in training.

        - one process: the model itself;
        - `ddp`: DistributedDataParallel, gradients all-reduced with a SUM hook;
        - `fsdp`: FSDP2 `fully_shard` on every block, then the root (parameters, gradients
          and optimizer state sharded over ranks; bf16 compute with fp32 reduction where
          `dtype` is bf16); the EMA copy is sharded the same way. `model` itself becomes
          the sharded module.
        """
        if not self.enabled:
            self._to_device(model, ema_model)
            return model
        if parallel == "fsdp":
            self._shard(model, ema_model, dtype)
            return model
        return self._replicate(model, ema_model)

    def _to_device(self, model: nn.Module, ema_model: nn.Module | None) -> None:
        model.to(self.device)
        if ema_model is not None:
            ema_model.to(self.device)

    def _shard(self, model: nn.Module, ema_model: nn.Module | None,
               dtype: torch.dtype | None) -> None:
        """FSDP2 in place: every block, then the root, of the model and of its EMA copy."""
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

            FSDPModule.set_force_sum_reduction_for_comms  # noqa: B018 - newest API used below
        except (ImportError, AttributeError):
            raise MdlmError(f"train.parallel=fsdp needs a newer torch than {torch.__version__} "
                            "(FSDP2 fully_shard with set_force_sum_reduction_for_comms); "
                            "upgrade torch or use train.parallel=ddp") from None
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if dtype == torch.bfloat16 else MixedPrecisionPolicy())
        for m in (model, ema_model):
            if m is None:
                continue
            for block in getattr(m, "blocks", []):
                fully_shard(block, mesh=mesh, mp_policy=policy)
            fully_shard(m, mesh=mesh, mp_policy=policy)
        for sub in model.modules():
            if isinstance(sub, FSDPModule):  # sum, not mean, over ranks (see module docstring)
                sub.set_gradient_divide_factor(1.0)
                sub.set_force_sum_reduction_for_comms(True)

    def _replicate(self, model: nn.Module, ema_model: nn.Module | None) -> nn.Module:
        """DDP around the model on this rank's device, its gradients summed over ranks."""
        from torch.nn.parallel import DistributedDataParallel

        self._to_device(model, ema_model)
        # the only buffers are constant (rotary frequencies): no broadcast before every forward
        ddp_options = inspect.signature(DistributedDataParallel).parameters
        no_buffer_sync = ({"forward_sync_buffers": False}
                          if "forward_sync_buffers" in ddp_options
                          else {"broadcast_buffers": False})
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, **no_buffer_sync)
        ddp.register_comm_hook(None, _allreduce_sum_hook)
        return ddp


def unwrap(model: nn.Module, *, data_parallel: bool = True) -> nn.Module:
    """The module under its wrappers: torch.compile's (`_orig_mod`) and, unless
    `data_parallel=False`, DistributedDataParallel's (`.module`). FSDP2 shards a module in
    place, so there is nothing to unwrap there. Also `models.unwrap`."""
    from torch.nn.parallel import DistributedDataParallel

    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif data_parallel and isinstance(model, DistributedDataParallel):
            model = model.module
        else:
            return model


# no annotations: DDP compares them to real types
def _allreduce_sum_hook(process_group, bucket):
    """DDP gradient hook: sum over ranks (DDP's default divides by the world size)."""
    work = tdist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def set_gradient_sync(net: nn.Module, enabled: bool) -> None:
    """DDP's `no_sync()` as a switch, for gradient accumulation: skip the all-reduce on
    all but the last micro-batch of a step. FSDP2 keeps reducing every micro-batch (its
    unsharded gradients are what it saves memory on); one process has nothing to sync."""
    from torch.nn.parallel import DistributedDataParallel

    net = unwrap(net, data_parallel=False)  # under torch.compile
    if isinstance(net, DistributedDataParallel):
        net.require_backward_grad_sync = enabled  # what no_sync() toggles


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """`clip_grad_norm_` that also returns a plain tensor for FSDP2's sharded gradients."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


# ---------------------------------------------------------------------- full state dicts

def _is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Complete CPU weights on rank 0 ({} elsewhere). Collective for FSDP2 (gathers
    the shards with torch.distributed.checkpoint); a plain copy otherwise."""
    model = unwrap(model)
    if _is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(model, options=_full_options())
    if current_rank() != 0:
        return {}
    return {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}


def load_full_model_state(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load complete weights; FSDP2 keeps only this rank's shard."""
    model = unwrap(model)
    if _is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(weights)


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's numbering (the order of its param groups)."""
    name_of = {id(p): n for n, p in unwrap(model).named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _renumbered(state: dict, key) -> dict:
    """An optimizer state dict with its parameters' keys mapped through `key` (indices to
    names or back), in its state and in its param groups."""
    return {
        "state": {key[k]: v for k, v in state["state"].items()},
        "param_groups": [dict(g, params=[key[k] for k in g["params"]])
                         for g in state["param_groups"]],
    }


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state as one process's `optimizer.state_dict()` would hold it
    (parameters numbered in order, full tensors) on rank 0; {} elsewhere. Collective
    for FSDP2."""
    if _is_fsdp(unwrap(model)):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        by_name = get_optimizer_state_dict(unwrap(model), optimizer, options=_full_options())
        if not by_name:
            return {}
        index = {name: i for i, name in enumerate(_param_names(model, optimizer))}
        return _renumbered(by_name, index)
    return optimizer.state_dict() if current_rank() == 0 else {}


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                              state: dict) -> None:
    """Inverse of `full_optimizer_state`; FSDP2 keeps only this rank's shard."""
    if _is_fsdp(unwrap(model)):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        by_name = _renumbered(state, _param_names(model, optimizer))
        set_optimizer_state_dict(unwrap(model), optimizer, by_name,
                                 options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state)


# ---------------------------------------------------------------------- process group

def wait_for_file(path: Path, poll_s: float = 2.0) -> None:
    """Block until another process (local rank 0 preparing data) has written `path`.
    torchrun stops every rank if that process fails, so this cannot wait forever."""
    while not path.is_file():
        time.sleep(poll_s)


@contextmanager
def session(device_name: str = "auto"):
    """Join the torchrun job, if any, for the duration of the block; yields a `Dist`.

    Each process uses cuda:LOCAL_RANK on GPUs (NCCL), or the CPU (gloo).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name)
    if world <= 1:
        if device.type == "cuda" and device.index is None and "LOCAL_RANK" in os.environ:
            device = torch.device("cuda", local_rank)
        yield Dist(device=device)
        return
    if device.type == "mps":
        raise MdlmError("multi-process training is not supported on MPS; use --device cpu or "
                        "CUDA GPUs")
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise MdlmError(f"LOCAL_RANK {local_rank} but only "
                            f"{torch.cuda.device_count()} GPU(s) are visible; "
                            "use --nproc-per-node <= the number of GPUs per node")
        device = torch.device("cuda", local_rank)  # one GPU per process, whatever --device said
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    owns = not tdist.is_initialized()
    if owns:
        tdist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    try:
        yield Dist(rank=tdist.get_rank(), world_size=tdist.get_world_size(),
                   local_rank=local_rank, device=device, backend=tdist.get_backend())
    finally:
        if owns and tdist.is_initialized():
            tdist.destroy_process_group()
