"""The processes one training run spans: one process per device under torchrun, or this process alone.

Data parallelism over the drafter only: every process holds the frozen target and a replica of the drafter,
trains on its share of each global batch and averages gradients (DistributedDataParallel), so a step updates the
same weights whatever the world size. Rank 0 alone writes checkpoints, metrics and reports; the others wait for it
at barriers. gloo on the CPU, NCCL on CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

# Rank 0 evaluates, fits the heads and merges files while the others wait at a barrier: longer than gloo's and
# NCCL's default 30 minutes on a large target.
BARRIER_TIMEOUT = timedelta(hours=6)


@dataclass(frozen=True)
class World:
    """This process's place in the run: `rank` of `size` processes (`size` 1 without torchrun)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """The one process that writes files and prints progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1 and dist.is_initialized()

    def barrier(self) -> None:
        """Wait until every process got here (a no-op alone)."""
        if self.distributed:
            dist.barrier()

    def mean(self, value: float, device: torch.device) -> float:
        """The mean of one number over the processes."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return float(t.item()) / self.size

    def share(self, count: int) -> range:
        """This process's contiguous share of `count` items (`count` divisible by the world size)."""
        per = count // self.size
        return range(self.rank * per, (self.rank + 1) * per)

    def wrap(self, module: nn.Module) -> nn.Module:
        """`module` under DistributedDataParallel when there are several processes (its buffers, constant, are
        synchronised once, not every forward), else itself."""
        if not self.distributed:
            return module
        device = next(module.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(module, device_ids=ids, forward_sync_buffers=False)


SINGLE = World()


def no_sync(model: nn.Module, keep: bool) -> AbstractContextManager:
    """Gradient accumulation without an all-reduce on every micro-step: `keep` skips the synchronisation (all but
    the last micro-step of a batch)."""
    if keep and isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return nullcontext()


def world_from_env() -> World:
    """The world torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK), or this process alone."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    return World(int(os.environ.get("RANK", "0")), size, int(os.environ.get("LOCAL_RANK", "0")))


@contextmanager
def process_group(world: World, device: torch.device) -> Iterator[World]:
    """Join the run's process group for the duration (NCCL for CUDA, gloo otherwise); alone, nothing to join."""
    if world.size == 1:
        yield world
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=world.rank, world_size=world.size,
                            timeout=BARRIER_TIMEOUT)
    try:
        yield world
    finally:
        dist.destroy_process_group()
