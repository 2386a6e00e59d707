"""Hugging Face style checkpoint folders: config.json beside *.safetensors, loaded with a strict key check.

Tensors of our own beyond a published format (the drafter's `position_head.*`) are written to `EXTENSION`,
a file in a subfolder, so that the top level holds exactly the published tensors: vLLM, SGLang,
TensorRT-LLM and z-lab's MLX loader read every top-level *.safetensors (vLLM and MLX refuse names they do
not know), llama.cpp's converter reads model*.safetensors and Transformers model.safetensors; none looks
into a subfolder. `load_weights` reads both, so our models load as one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn


EXTENSION = Path("adaflash") / "heads.safetensors"


def read_config(path: str | Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def tensor_files(path: Path) -> list[Path]:
    """The published files (top level) and, when present, ours (`EXTENSION`)."""
    return sorted(path.glob("*.safetensors")) + ([path / EXTENSION] if (path / EXTENSION).exists() else [])


def load_weights(model: nn.Module, path: str | Path, optional: frozenset[str] = frozenset(), part: bool = False) -> None:
    """Copy every tensor file of `path` (`tensor_files`) into `model`'s parameters, tensor by tensor, cast to
    each parameter's dtype and device (so a large checkpoint is never held twice); any key missing or unexpected
    is an error, except the `optional` ones (a tied LM head), because a silently half-loaded model still
    generates text. `part`: the model is a part of the checkpoint's (the target's embedding and head): only its
    tensors are read, the others stay on disk."""
    path = Path(path)
    files = tensor_files(path)
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    params = model.state_dict(keep_vars=True)
    loaded, unexpected = set(), []
    with torch.no_grad():
        for f in files:
            with safe_open(f, framework="pt") as tensors:
                for key in tensors.keys():
                    if key in optional or (part and key not in params):
                        continue
                    if key not in params:
                        unexpected.append(key)
                        continue
                    _copy_into(params[key], tensors.get_tensor(key), key, path)
                    loaded.add(key)
    missing = [k for k in params if k not in loaded and k not in optional]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path}: missing {missing}, unexpected {unexpected}")
    model.eval()


def _copy_into(param: torch.Tensor, tensor: torch.Tensor, key: str, path: Path) -> None:
    if param.shape != tensor.shape:
        raise ValueError(f"checkpoint {path}: {key} has shape {list(tensor.shape)}, the model expects {list(param.shape)}")
    param.copy_(tensor)


def save_checkpoint(model: nn.Module, path: str | Path, config: dict, dtype: torch.dtype,
                    skip: frozenset[str] = frozenset(), extension: tuple[str, ...] = ()) -> None:
    """Write config.json and model.safetensors (without the `skip` keys: a tied LM head); tensors whose names
    start with an `extension` prefix go to `EXTENSION` instead (a stale one is removed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items() if k not in skip}
    ours = {k: v for k, v in state.items() if k.startswith(extension)} if extension else {}
    save_file({k: v for k, v in state.items() if k not in ours}, path / "model.safetensors", metadata={"format": "pt"})
    (path / EXTENSION).unlink(missing_ok=True)
    if ours:
        (path / EXTENSION).parent.mkdir(exist_ok=True)
        save_file(ours, path / EXTENSION, metadata={"format": "pt"})
