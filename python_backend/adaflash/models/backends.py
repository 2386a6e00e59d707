"""What runs a drafter's block forward (`--drafter-backend`): PyTorch as it is, or ONNX Runtime (`onnx_drafter.py`,
the optional `onnx` extra, imported only when asked for, so the core runs without it). A module of its own, apart
from drafter.py, which onnx_drafter.py builds on: neither of those two imports the other."""

from __future__ import annotations

import importlib.util

import torch

from adaflash.models.drafter import DFlashDrafter
from adaflash.models.placement import Placement, place_of
from adaflash.models.target import Transformer

DRAFTER_BACKENDS = ("torch", "onnx")  # what runs the block forward (`on_backend`)


def check_backend(backend: str, place: Placement) -> None:
    """Raise ValueError naming what keeps `backend` from running a drafter placed at `place`; the repository builder
    asks too, so that a wrong choice stops the build instead of the server's drafter model when it loads."""
    if backend not in DRAFTER_BACKENDS:
        raise ValueError(f"drafter_backend: {backend!r} is not one of {', '.join(DRAFTER_BACKENDS)}")
    if backend == "onnx" and (place.device.type != "cpu" or place.dtype != torch.float32):
        raise ValueError(f"drafter_backend: onnx runs ONNX Runtime's CPU package on float32 weights, not on "
                         f"{place.device.type} in {place.dtype_name} (use torch there)")
    if backend == "onnx" and importlib.util.find_spec("onnxruntime") is None:
        raise ValueError("drafter_backend: onnx needs onnxruntime, the onnx extra (pip install -e '.[onnx]')")


def on_backend(drafter: DFlashDrafter, target: Transformer, backend: str) -> DFlashDrafter:
    """`drafter` with its block forward run by `backend`, one of DRAFTER_BACKENDS: PyTorch as it is, or ONNX Runtime
    (`onnx_drafter.py`, the optional `onnx` extra: imported only when asked for, so the core runs without it)."""
    check_backend(backend, place_of(drafter))
    if backend == "torch":
        return drafter
    from adaflash.models.onnx_drafter import OnnxDrafter

    return OnnxDrafter.of(drafter, target)
