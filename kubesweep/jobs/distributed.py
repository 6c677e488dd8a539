"""Process group set-up under torchrun (RANK/WORLD_SIZE/LOCAL_RANK): NCCL on GPUs, gloo on the CPU."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as td


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"  # torch device string, e.g. "cuda:0"

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def all_sum(self, values: list[float]) -> list[float]:
        """Sum a few numbers over ranks (one collective); identity when not distributed."""
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        td.all_reduce(tensor)
        return [float(v) for v in tensor.tolist()]

    def all_max(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        td.all_reduce(tensor, op=td.ReduceOp.MAX)
        return [float(v) for v in tensor.tolist()]

    def gather_objects(self, obj: Any) -> list[Any]:
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        td.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            td.barrier()


def identity() -> Dist:
    """This process's ranks from torchrun's environment, before any device is set up (device: cpu)."""
    return Dist(rank=int(os.environ.get("RANK", "0")), world_size=int(os.environ.get("WORLD_SIZE", "1")),
                local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def init() -> Dist:
    """Join the torchrun process group if there is one; pick this process's device."""
    ident = identity()
    world, rank, local = ident.world_size, ident.rank, ident.local_rank
    cuda = torch.cuda.is_available()
    device = f"cuda:{local % torch.cuda.device_count()}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not td.is_initialized():
        td.init_process_group(
            backend="nccl" if cuda else "gloo",
            timeout=dt.timedelta(minutes=30),
            device_id=torch.device(device) if cuda else None,
        )
    return Dist(rank=rank, world_size=world, local_rank=local, device=device)


def shutdown(dist: Dist) -> None:
    if dist.enabled and td.is_initialized():
        td.destroy_process_group()
