"""Data parallelism under torchrun: process group setup, DDP / FSDP2 wrapping and small collectives.

Parallelism stays out of the model code: this module only wraps a finished model.

FSDP2 (`fully_shard`) is applied per decoder layer, then to the root. The layers that run several
times per step keep their parameters gathered after forward (`reshard_after_forward=False`), because
re-gathering them before each run would multiply communication: T²MLR's middle block (blocks
l_start..l_end, d_forward + 1 runs on the Jacobi path) and a looped model's looped blocks (`loops` runs). FSDP2 cannot shard 0-dim parameters, and the fusion gates γ_cur, γ_rec are
scalars, so every scalar parameter is left replicated (`ignored_params`) and its gradient is
averaged by hand in `sync_replicated_grads`.

A command that trains several times (an experiment) joins the group once (`process_group`); rank 0 alone
writes what the ranks share (`computed_by_main`), and evaluation is shared out over the ranks and gathered
back in order (`shard_and_gather`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from t2mlr.utils import launched_by_torchrun, resolve_device

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class DistEnv:
    """Where this process sits in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(preference: str, local_rank: int = 0) -> torch.device:
    """`t2mlr.utils.resolve_device`, with this rank's CUDA device when that is CUDA."""
    device = resolve_device(preference)
    return torch.device("cuda", local_rank) if device.type == "cuda" else device


def init_distributed(parallel: str, device_preference: str = "auto", timeout_s: int = 1800) -> DistEnv:
    """Join the torchrun process group (nccl on CUDA, gloo on CPU), or return a single-process env.

    Asking for ddp/fsdp outside torchrun with one process is allowed (it degenerates to one rank), so
    the same config runs both ways; torchrun without --parallel is an error, since every rank would
    otherwise train its own copy of the model.
    """
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return DistEnv(device=pick_device(device_preference))
    if parallel == "none":
        raise RuntimeError("launched with torchrun but train.parallel=none; pass --parallel ddp or --parallel fsdp")
    device = pick_device(device_preference, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return current_env(device_preference)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def process_group(parallel: str, device_preference: str = "auto") -> Iterator[DistEnv]:
    """The process group of a command that trains and evaluates several times (an experiment): joined once,
    so every training inside finds it (the trainer leaves a group it did not create alone), and left at the
    end. A normal end waits at a barrier first, so no rank leaves while rank 0 still writes the results.
    Outside torchrun: one process, nothing joined."""
    owns = not (dist.is_available() and dist.is_initialized())
    env = init_distributed(parallel, device_preference)
    try:
        yield env
        barrier(env)
    finally:
        if owns:
            shutdown_distributed()


def current_env(device_preference: str = "auto") -> DistEnv:
    """This process's place in the process group it is in (one process when there is none), with its
    device: the local rank's CUDA device, or the CPU."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistEnv(device=pick_device(device_preference))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank,
                   device=pick_device(device_preference, local_rank))


# ---------------------------------------------------------------------------------------------
# Wrapping


def apply_fsdp(model: nn.Module, layers: list[nn.Module], middle: set[int]) -> nn.Module:
    """Shard each decoder layer, then the root (embeddings, head, fusion), in place.

    `layers` are the decoder layers in order; `middle` holds 0-based indices of the blocks that run
    several times per step (T²MLR's middle block, looped blocks), which are not resharded after forward.
    """
    ignored = {p for p in model.parameters() if p.ndim == 0}
    for index, layer in enumerate(layers):
        fully_shard(layer, reshard_after_forward=index not in middle, ignored_params=ignored & set(layer.parameters()))
    fully_shard(model, ignored_params=ignored)
    return model


def wrap_model(
    model: nn.Module, env: DistEnv, parallel: str, layers: list[nn.Module], middle: set[int],
    find_unused_parameters: bool = False,
) -> nn.Module:
    """The module the training loop calls: `model` itself (one process or FSDP, in place) or a DDP wrapper.

    `find_unused_parameters` is for DDP runs where part of the model gets no gradient (a T²MLR model
    trained with recurrence "off" never uses its fusion module).
    """
    if not env.distributed or parallel == "none":
        return model
    if parallel == "fsdp":
        return apply_fsdp(model, layers, middle)
    if parallel == "ddp":
        device_ids = [env.device.index] if env.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                   find_unused_parameters=find_unused_parameters)
    raise ValueError(f"unknown parallel mode {parallel!r}")


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model under a DDP wrapper (FSDP2 shards in place, so it needs no unwrapping)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


@contextlib.contextmanager
def grad_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip gradient all-reduce on accumulation micro-steps (DDP `no_sync`, FSDP2 requires_gradient_sync)."""
    if enabled:
        yield
    elif isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


# ---------------------------------------------------------------------------------------------
# Collectives


def is_sharded(model: nn.Module) -> bool:
    return hasattr(model, "set_requires_gradient_sync") and not isinstance(model, nn.parallel.DistributedDataParallel)


def sync_replicated_grads(model: nn.Module, env: DistEnv) -> None:
    """Average the gradients FSDP2 does not manage (the scalar parameters it had to ignore)."""
    if not env.distributed or not is_sharded(model):
        return
    # named_parameters() order is the same on every rank; one collective for all of them.
    params = [p for _, p in model.named_parameters() if p.ndim == 0 and p.grad is not None]
    if not params:
        return
    flat = torch.stack([p.grad.float() for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= env.world_size
    for param, value in zip(params, flat):
        param.grad.copy_(value)


def all_reduce(values: torch.Tensor, env: DistEnv, op: Literal["sum", "max"] = "sum") -> torch.Tensor:
    """The sum (or with op "max" the elementwise maximum) of a tensor over ranks; one process gets `values` back."""
    if env.distributed:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return values


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def broadcast_object(value: object, env: DistEnv) -> object:
    """Rank 0's value on every rank (used for decisions every rank must share, like the resume step)."""
    if not env.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def computed_by_main(compute: Callable[[], T], env: DistEnv | None) -> T:
    """`compute()` run by rank 0 alone (it writes whatever files it writes: data, run directories), its
    result handed to every rank. The hand-over is a collective: a rank gets it once rank 0 is done, so the
    files are there too. An error on rank 0 ends that rank; torchrun then stops the others."""
    if env is None or not env.distributed:
        return compute()
    return broadcast_object(compute() if env.is_main else None, env)  # type: ignore[return-value]


def shard_and_gather(items: Sequence[T], work: Callable[[T], R], env: DistEnv | None) -> list[R]:
    """`[work(item) for item in items]`, shared out over the ranks: item i runs on rank i mod world size, and
    the results are gathered once, in the order of `items`, on every rank. Evaluation and generation use it
    (each item a batch), so every rank ends with what one process would have computed. `env` None or one
    process: every item here, in order."""
    if env is None or not env.distributed:
        return [work(item) for item in items]
    mine = [(index, work(item)) for index, item in enumerate(items) if index % env.world_size == env.rank]
    gathered: list[list[tuple[int, R]] | None] = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    results: dict[int, R] = {index: value for part in gathered for index, value in part or []}
    if sorted(results) != list(range(len(items))):
        raise RuntimeError(f"shard_and_gather: {len(results)} results for {len(items)} items (ranks disagree on "
                           "the items)")
    return [results[index] for index in range(len(items))]


@torch.no_grad()
def clip_grad_norm(params: list[nn.Parameter], max_norm: float | None, env: DistEnv) -> torch.Tensor:
    """Global L2 gradient norm over sharded (DTensor) and replicated gradients, then clip to max_norm.

    One all-reduce for all sharded gradients: each rank sums the squares of its local shards.
    Returns the norm before clipping (float32, on the parameters' device).
    """
    sharded_sq, replicated_sq = _grad_square_sums(params)
    if env.distributed:
        dist.all_reduce(sharded_sq, op=dist.ReduceOp.SUM)
    total = torch.sqrt(sharded_sq + replicated_sq)
    if max_norm is not None and max_norm > 0:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for param in params:
            if param.grad is not None:
                _local(param.grad).mul_(coef.to(param.grad.dtype))
    return total


def _grad_square_sums(params: list[nn.Parameter]) -> tuple[torch.Tensor, torch.Tensor]:
    device = next((p.grad.device for p in params if p.grad is not None), torch.device("cpu"))
    sharded = torch.zeros((), dtype=torch.float32, device=device)
    replicated = torch.zeros((), dtype=torch.float32, device=device)
    for param in params:
        if param.grad is None:
            continue
        grad = _local(param.grad)
        sq = torch.linalg.vector_norm(grad.float(), 2).pow(2).to(device)
        if grad is param.grad:
            replicated = replicated + sq
        else:
            sharded = sharded + sq
    return sharded, replicated


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor, or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter's full value on every rank (a collective for DTensors: call on all ranks)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
