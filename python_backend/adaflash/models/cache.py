"""The per-slot key/value cache of a model's attention layers, owned by whoever schedules sequences.

The target keeps its KV cache in one, the drafter the projected context of every layer: same
shape, same bookkeeping. A model never holds a cache; the engine or the served model passes
its own, so a model can be trained, measured and served without ordering traps.
"""

from __future__ import annotations

import math
import mmap
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


def untouched_zeros(size: tuple[int, ...], place: Placement) -> Tensor:
    """Zeros of `size` on `place`; on the CPU, memory the kernel makes resident page by page as it is written.

    Why: a cache is allocated for the worst case, every slot at max_len, while a server's load writes only the
    lowest slots and pages (the free lists hand out the lowest first, and a page given back before any never
    written), so most of it is never written. `torch.zeros` writes it all, and all of it stays resident.
    Anonymous private memory is given on first write instead, and a read of a page never written maps the
    kernel's shared zero page: reads still see zeros, as attention needs where it reads positions past a slot's
    length and masks them (garbage there could be NaN, which no mask cancels). Elsewhere (CUDA) `torch.zeros`.
    """
    nbytes = math.prod(size) * place.dtype.itemsize
    if place.device.type != "cpu" or nbytes == 0:
        return torch.zeros(size, dtype=place.dtype, device=place.device)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # The tensor keeps `memory` alive (torch.frombuffer holds the buffer); unmapped when the tensor is freed.
    return torch.frombuffer(memory, dtype=torch.uint8).view(place.dtype).view(size)


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
        self.k = untouched_zeros(size, place)
        self.v = untouched_zeros(size, place)
        self.lengths = [0] * num_slots
        self.max_len = max_len
        self.tables: list[list[int]] = [[] if self.paged else [s] for s in range(num_slots)]
        self.free = list(range(num_pages - 1, -1, -1)) if self.paged else []

    # Read-only accounting for the operators' gauges (`serving/slots.CacheSlots.usage`), read from a reporter
    # thread while the model's thread steps: each reads one list's length or sums one list, never both in one go.
    @property
    def num_pages(self) -> int:
        """Pages the slots share (unpaged: one of max_len positions per slot); the scratch page is no slot's."""
        return self.k.shape[1] - (self.scratch is not None)

    @property
    def free_pages(self) -> int:
        """Pages no slot holds. Unpaged, a slot's page is its own for good, so a slot with no positions counts as
        free: what a new sequence could take."""
        return len(self.free) if self.paged else sum(1 for n in self.lengths if n == 0)

    @property
    def used_pages(self) -> int:
        return self.num_pages - self.free_pages

    @property
    def nbytes(self) -> int:
        """The keys' and values' memory, the scratch page included."""
        return self.k.nbytes + self.v.nbytes

    @property
    def page_bytes(self) -> int:
        """One page's keys and values over every layer."""
        return self.nbytes // self.k.shape[1]

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
