"""Distributed data parallel set-up under torchrun: DDP (gloo on CPU, nccl on CUDA) or FSDP2.

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them everything runs in one process.
Each rank computes the loss on its slice of the global batch; DDP all-reduces (averages) the
gradients during backward, so the update equals one process on the whole batch. FSDP2
(`torch.distributed.fsdp.fully_shard`) additionally shards parameters, gradients and optimizer
moments across ranks (per transformer block, then the root).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """"auto" -> cuda:LOCAL_RANK when CUDA is available else cpu; "cuda" without CUDA is an error."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available here; use device=cpu or device=auto")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device_name: str) -> DistInfo:
    """Join the torchrun process group if WORLD_SIZE > 1 (gloo for CPU, nccl for CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name, local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistInfo(rank, world, local, device)


def wrap_model(model: nn.Module, info: DistInfo, fsdp: bool) -> nn.Module:
    """DDP (or FSDP2 when fsdp=True) around the model when running distributed; else the model itself."""
    if not info.enabled:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)


def all_reduce_mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Average a tensor over ranks (identity in one process)."""
    if info.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


def all_reduce_max(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """The elementwise maximum of a tensor over ranks (identity in one process)."""
    if info.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
