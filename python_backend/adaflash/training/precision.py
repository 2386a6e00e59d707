"""How a trained model uses a placement: fp32 master weights on its device, bf16 matmuls on CUDA.

The frozen target runs in the placement's dtype as it does when serving. The model being trained keeps
fp32 weights, because AdamW updates far smaller than a bf16 weight's last digit would be lost, and on
CUDA with a half placement its forward runs under bf16 autocast (fp16 autocast would also need loss
scaling). On CPU nothing changes: fp32 and no autocast, so a CPU run gives the same numbers as before
placements existed.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from adaflash.models.placement import Placement, place_of


def master_place(place: Placement) -> Placement:
    """Where the trained model's weights live: the placement's device, in fp32."""
    return Placement(place.device, torch.float32)


def autocast(place: Placement) -> AbstractContextManager:
    """The context a training forward runs in: bf16 autocast on CUDA with a half placement, else none."""
    if place.device.type == "cuda" and place.dtype != torch.float32:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def check_master(model: torch.nn.Module, place: Placement, what: str) -> None:
    """Refuse to train a model that is not in fp32 on the placement's device: half-precision master weights
    silently drop small updates, and a model on another device fails deep inside the forward."""
    have, want = place_of(model), master_place(place)
    if have != want:
        raise ValueError(f"{what}: trains in {want.dtype_name} on {want.device}, got {have.dtype_name} on {have.device}")
