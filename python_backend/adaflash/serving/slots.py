"""The target and the drafter with per-sequence state keyed by a sequence id, for servers that route calls
per sequence.

A Triton model (or any other server) receives batches of calls from different sequences;
these classes own the caches and keep each sequence's slot in them (and its sampling
generator) under its key, and run one batched forward per call batch. Slots idle for longer than
`idle_timeout_s` are reclaimed, so a client that vanishes without releasing cannot leak them.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

import torch

from adaflash.decoding.planner import Load, Planner
from adaflash.decoding.policy import LengthController
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.steps import StepResult, prefill_batch, verify_batch
from adaflash.models.cache import KVCache
from adaflash.models.drafter import DFlashDrafter
from adaflash.models.target import Transformer
from adaflash.serving.protocol import DraftCall


class SlotTable:
    """Which cache slot each live sequence holds; free slots are handed out lowest first."""

    def __init__(self, num_slots: int, idle_timeout_s: float) -> None:
        self.free = list(range(num_slots - 1, -1, -1))
        self.slot_of: dict[Hashable, int] = {}
        self.last_used: dict[Hashable, float] = {}
        self.idle_timeout_s = idle_timeout_s

    def acquire(self, key: Hashable) -> int:
        if key in self.slot_of:
            raise ValueError(f"sequence {key} is already open")
        if not self.free:
            raise RuntimeError("no free sequence slot")
        self.slot_of[key] = self.free.pop()
        self.touch(key)
        return self.slot_of[key]

    def get(self, key: Hashable) -> int:
        if key not in self.slot_of:
            raise KeyError(f"sequence {key} is not open")
        self.touch(key)
        return self.slot_of[key]

    def touch(self, key: Hashable) -> None:
        self.last_used[key] = time.monotonic()

    def release(self, key: Hashable) -> int | None:
        slot = self.slot_of.pop(key, None)
        self.last_used.pop(key, None)
        if slot is not None:
            self.free.append(slot)
        return slot

    def stale(self) -> list[Hashable]:
        now = time.monotonic()
        return [k for k, t in self.last_used.items() if now - t > self.idle_timeout_s]

    def __len__(self) -> int:
        return len(self.slot_of)


class CacheSlots:
    """A cache and which of its slots each live sequence holds; releasing a sequence empties its slot."""

    def __init__(self, cache: KVCache, idle_timeout_s: float) -> None:
        self.cache = cache
        self.slots = SlotTable(len(cache.lengths), idle_timeout_s)

    def release(self, key: Hashable) -> None:
        slot = self.slots.release(key)
        if slot is not None:
            self.cache.truncate(slot, 0)

    def release_stale(self) -> list[Hashable]:
        stale = self.slots.stale()
        for key in stale:
            self.release(key)
        return stale


class TargetSlots(CacheSlots):
    def __init__(self, target: Transformer, num_slots: int, max_len: int, capture: list[int] | None,
                 idle_timeout_s: float = 600.0) -> None:
        super().__init__(target.new_cache(num_slots, max_len), idle_timeout_s)
        self.target, self.capture, self.max_len = target, capture, max_len
        self.sampling: dict[Hashable, tuple[SamplingParams, torch.Generator]] = {}

    def open(self, key: Hashable, prompt: list[int], sampling: SamplingParams) -> None:
        """Claim a slot for a new sequence (raises if none is free or the prompt cannot fit)."""
        if len(prompt) >= self.max_len:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit the context of {self.max_len}")
        self.slots.acquire(key)
        self.sampling[key] = (sampling, torch.Generator().manual_seed(sampling.seed))

    def prefill(self, items: list[tuple[Hashable, list[int]]]) -> list[StepResult]:
        keys = [k for k, _ in items]
        return prefill_batch(self.target, self.cache, [self.slots.get(k) for k in keys], [p for _, p in items],
                             [self.sampling[k][0] for k in keys], [self.sampling[k][1] for k in keys], self.capture)

    def check_verify(self, key: Hashable, feed: list[int]) -> None:
        slot = self.slots.get(key)
        if self.cache.lengths[slot] + len(feed) > self.max_len:
            raise ValueError(f"sequence {key} would exceed the context of {self.max_len} tokens")

    def verify(self, items: list[tuple[Hashable, list[int]]]) -> list[StepResult]:
        keys = [k for k, _ in items]
        return verify_batch(self.target, self.cache, [self.slots.get(k) for k in keys], [f for _, f in items],
                            [self.sampling[k][0] for k in keys], [self.sampling[k][1] for k in keys], self.capture)

    def release(self, key: Hashable) -> None:
        self.sampling.pop(key, None)
        super().release(key)


class DrafterSlots(CacheSlots):
    def __init__(self, drafter: DFlashDrafter, target: Transformer, num_slots: int, max_len: int,
                 controller: LengthController, idle_timeout_s: float = 600.0) -> None:
        drafter.check_target(target)
        super().__init__(drafter.new_cache(num_slots, max_len), idle_timeout_s)
        self.drafter, self.target = drafter, target
        self.planner = Planner(controller)

    def draft(self, calls: list[DraftCall], batch: int) -> list[list[int]]:
        """Draft for every call in one forward and cut each draft to the length the planner chooses.

        `batch` is how many sequences the next verify is expected to carry (for the cost model).
        """
        for c in calls:
            if c.key not in self.slots.slot_of:
                self.slots.acquire(c.key)
        slots = [self.slots.get(c.key) for c in calls]
        fresh = [(s, c.features) for s, c in zip(slots, calls) if c.features.shape[0]]
        if fresh:
            self.drafter.append_context(self.cache, [s for s, _ in fresh], torch.cat([f for _, f in fresh]),
                                        [f.shape[0] for _, f in fresh])
        draft = self.drafter.draft(self.target, self.cache, slots, [c.anchor for c in calls],
                                   self.planner.draft_block_length(calls))
        ks = self.planner.cut(calls, draft, Load.peers(max(0, batch - len(calls))))
        return [tokens[:k] for tokens, k in zip(draft.tokens.tolist(), ks)]
