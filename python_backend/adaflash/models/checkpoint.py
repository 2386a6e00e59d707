"""Hugging Face style checkpoint folders: config.json beside *.safetensors, loaded with a strict key check."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn


def read_config(path: str | Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def load_weights(model: nn.Module, path: str | Path, dtype: torch.dtype, optional: frozenset[str] = frozenset(),
                 part: bool = False) -> None:
    """Load every *.safetensors of `path` into `model` and cast it; any key missing or unexpected is an error,
    except the `optional` ones (a tied LM head), because a silently half-loaded model still generates text.
    `part`: the model is a part of the checkpoint's (the target's embedding and head): only its tensors are
    read, the others stay on disk."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    wanted = set(model.state_dict()) if part else None
    state: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(f, framework="pt") as tensors:
            state.update({k: tensors.get_tensor(k) for k in tensors.keys() if wanted is None or k in wanted})
    for name in optional:
        state.pop(name, None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m not in optional]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path}: missing {missing}, unexpected {unexpected}")
    model.to(dtype).eval()


def save_checkpoint(model: nn.Module, path: str | Path, config: dict, dtype: torch.dtype,
                    skip: frozenset[str] = frozenset()) -> None:
    """Write config.json and model.safetensors (without the `skip` keys: a tied LM head)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items() if k not in skip}
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
