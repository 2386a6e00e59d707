"""Where a model's tensors live: one device and one floating dtype, chosen once and given to every model,
cache and timer of a process.

The dtype follows the device unless asked: bf16 on CUDA (what the published checkpoints are trained and
stored in), fp32 on CPU (bf16 matmuls on CPUs without AMX run two orders of magnitude slower).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def synchronize(self) -> None:
        """Wait for the device's queued work, so that a wall-clock timing covers the forward itself."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


CPU = Placement(torch.device("cpu"), torch.float32)


def indices(values: list | np.ndarray, device: torch.device) -> Tensor:
    """Host integers (a list, nested lists of equal length, or an array) as a long tensor on `device`.

    Why: a tensor made from host memory straight onto a GPU is copied from pageable memory, and CUDA first
    waits for every kernel already queued on the stream; a forward that builds its indices as it goes would run
    its launches and the device's work one after the other instead of overlapping them. From pinned memory the
    copy joins the queue (PyTorch keeps the pinned block until the copy has run). The values go into the pinned
    block through numpy, so the only host tensor made is that block."""
    if device.type != "cuda":
        return torch.as_tensor(values, dtype=torch.long, device=device)
    host = np.asarray(values, dtype=np.int64)
    pinned = torch.empty(host.shape, dtype=torch.long, pin_memory=True)
    pinned.numpy()[...] = host
    return pinned.to(device, non_blocking=True)


def placement(device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
              present: bool = True) -> Placement:
    """`device`: "auto" (None: CUDA when present), "cpu", "cuda" or "cuda:N"; `dtype`: a name in DTYPES,
    None for the device's default. `present=False` accepts a GPU this machine lacks (a model repository
    written here for a GPU host). Raises ValueError naming the argument."""
    dev = _device(device, present)
    if dtype is None:
        return Placement(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype: {dtype} is not one of {', '.join(DTYPES)}")
        return Placement(dev, dtype)
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    return Placement(dev, DTYPES[dtype])


def _device(device: str | torch.device | None, present: bool) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device: {device!r} is not a device ({', '.join(DEVICES)}, or cuda:N)") from e
    if dev.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"device: {device!r} is not supported ({', '.join(DEVICES)}, or cuda:N)")
    if present and dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asked for, but this PyTorch sees no CUDA device")
    return dev


def place_of(module: nn.Module) -> Placement:
    """A model's placement, read from its first floating parameter."""
    p = next(p for p in module.parameters() if p.is_floating_point())
    return Placement(p.device, p.dtype)


def empty_on(module: nn.Module, place: Placement) -> nn.Module:
    """Give a model built on the meta device uninitialised storage on `place` (floating parameters in its
    dtype), keeping tied parameters tied: a checkpoint then fills it, and no random initialisation nor fp32
    copy of a large model is ever made. Buffers are left to the model (`reset_buffers`), which computes them."""
    made: dict[int, nn.Parameter] = {}
    for mod in module.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            if id(p) not in made:
                dtype = place.dtype if p.is_floating_point() else p.dtype
                made[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=dtype, device=place.device),
                                           requires_grad=p.requires_grad)
            setattr(mod, name, made[id(p)])
    return module


def move_to(module: nn.Module, place: Placement) -> nn.Module:
    """Move a built model to `place`: floating parameters cast to its dtype, buffers (RoPE frequencies) kept
    in their own dtype."""
    module.to(place.device)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point() and p.dtype != place.dtype:
                p.data = p.data.to(place.dtype)
    return module
