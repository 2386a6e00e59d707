"""The per-slot key/value cache of a model's attention layers, owned by whoever schedules sequences.

The target keeps its KV cache in one, the drafter the projected context of every layer: same
shape, same bookkeeping. A model never holds a cache; the engine or the served model passes
its own, so a model can be trained, measured and served without ordering traps.
"""

from __future__ import annotations

from typing import Protocol

import torch

from adaflash.models.placement import Placement


class AttentionShape(Protocol):
    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int


class KVCache:
    """N slots x max_len positions per layer, allocated once; `lengths[slot]` says how many are valid.

    Truncating a slot only lowers its length: rejected positions are overwritten later.
    """

    def __init__(self, shape: AttentionShape, num_slots: int, max_len: int, place: Placement) -> None:
        size = (shape.num_hidden_layers, num_slots, shape.num_key_value_heads, max_len, shape.head_dim)
        self.k = torch.zeros(size, dtype=place.dtype, device=place.device)
        self.v = torch.zeros(size, dtype=place.dtype, device=place.device)
        self.lengths = [0] * num_slots
        self.max_len = max_len

    def truncate(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length
