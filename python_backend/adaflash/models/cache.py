"""The per-slot key/value cache of a model's attention layers, owned by whoever schedules sequences.

The target keeps its KV cache in one, the drafter the projected context of every layer: same
shape, same bookkeeping. A model never holds a cache; the engine or the served model passes
its own, so a model can be trained, measured and served without ordering traps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from adaflash.models.placement import Placement, indices


class AttentionShape(Protocol):
    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int


@dataclass(frozen=True)
class Paging:
    """A paged cache: `pages` pages of `page` positions per layer, shared by the slots (from a memory budget)."""

    page: int
    pages: int

    def __post_init__(self) -> None:
        if self.page < 1 or self.pages < 1:
            raise ValueError(f"paging: page and pages must be >= 1, got {self.page} and {self.pages}")


class CacheFull(RuntimeError):
    """No free page: the scheduler admits sequences only while their reserved positions fit, so this is a defect
    (or a caller that skipped admission)."""


class KVCache:
    """Per layer, pages of `page` positions; each slot (a running sequence) holds a table of pages and
    `lengths[slot]` valid positions.

    Two layouts, one interface. Unpaged (no `paging`): slot s owns page s of max_len positions for good, the
    layout is [slots, KV, max_len, hd] as a contiguous cache, and consecutive slots gather as a view. Paged: a slot takes pages from the free list as it grows and returns
    them when truncated below them, so long and short sequences share the memory without each reserving
    max_len; attention then gathers a slot's pages (a copy). Truncating only lowers a length: rejected
    positions are overwritten later.

    `scratch`: one more page that no slot ever holds, where a step padded to a fixed shape (a CUDA graph's,
    `adaflash.models.graphs`) writes the keys and values of its padding.
    """

    def __init__(self, shape: AttentionShape, num_slots: int, max_len: int, place: Placement,
                 paging: Paging | None = None, scratch: bool = False) -> None:
        self.page = max_len if paging is None else min(paging.page, max_len)
        self.paged = self.page < max_len
        num_pages = num_slots if not self.paged else paging.pages
        self.scratch = num_pages if scratch else None
        size = (shape.num_hidden_layers, num_pages + scratch, shape.num_key_value_heads, self.page, shape.head_dim)
        self.k = torch.zeros(size, dtype=place.dtype, device=place.device)
        self.v = torch.zeros(size, dtype=place.dtype, device=place.device)
        self.lengths = [0] * num_slots
        self.max_len = max_len
        self.tables: list[list[int]] = [[] if self.paged else [s] for s in range(num_slots)]
        self.free = list(range(num_pages - 1, -1, -1)) if self.paged else []

    def reserve(self, slot: int, length: int) -> None:
        """Make positions 0..length-1 of `slot` writable, taking pages from the free list."""
        if length > self.max_len:
            raise ValueError(f"slot {slot}: {length} tokens exceed the cache length {self.max_len}")
        need = -(-length // self.page) - len(self.tables[slot])
        if need > len(self.free):
            raise CacheFull(f"slot {slot} needs {need} more pages of {self.page} positions, {len(self.free)} are free")
        for _ in range(max(need, 0)):
            self.tables[slot].append(self.free.pop())

    def truncate(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length
        if self.paged:
            keep = -(-length // self.page)
            self.free.extend(reversed(self.tables[slot][keep:]))
            del self.tables[slot][keep:]

    def locate(self, slots: list[int], starts: list[int], counts: list[int],
               device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """`where`'s three on `device`, [T] each (one copy for the three)."""
        found = indices(list(self.where(slots, starts, counts)), device)
        return found[0], found[1], found[2]

    def where(self, slots: list[int], starts: list[int], counts: list[int]) -> tuple[list[int], list[int], list[int]]:
        """The `counts[b]` new positions from `starts[b]` of `slots[b]`, packed, and where they go: their pages and
        offsets (the caller reserved them)."""
        positions = [st + j for st, c in zip(starts, counts) for j in range(c)]
        owners = [s for s, c in zip(slots, counts) for _ in range(c)]
        pages = [self.tables[s][p // self.page] for s, p in zip(owners, positions)]
        return positions, pages, [p % self.page for p in positions]

    def gather(self, slots: list[int], length: int) -> "Gather":
        """What attention reads of `slots`: their first `length` positions, found once for every layer of a
        forward; positions past a slot's own length are whatever its pages (or page 0) hold: the caller masks
        them."""
        if not self.paged:
            first = self.tables[slots[0]][0]
            pages = [self.tables[s][0] for s in slots]
            if pages == list(range(first, first + len(pages))):
                return Gather(slice(first, first + len(pages)), length)
            return Gather(indices(pages, self.k.device), length)
        n = -(-length // self.page)
        return Gather(indices([(self.tables[s] + [0] * n)[:n] for s in slots], self.k.device), length)


@dataclass(frozen=True)
class Gather:
    """Pages of a layer's cache to read for some slots: a slice (consecutive unpaged slots: a view), their pages
    [B] (unpaged: a copy of their first `length` positions), or their page tables [B, n] (paged: a copy)."""

    pages: Tensor | slice
    length: int

    def __call__(self, store: Tensor) -> Tensor:
        """One layer's keys or values `store` [pages, KV, page, hd] -> [B, KV, length, hd]."""
        if isinstance(self.pages, slice) or self.pages.dim() == 1:
            return store[:, :, : self.length][self.pages]
        picked = store[self.pages]
        b, n, kv, page, hd = picked.shape
        return picked.permute(0, 2, 1, 3, 4).reshape(b, kv, n * page, hd)[:, :, : self.length]
