"""The target and the drafter with per-sequence state keyed by a sequence id, for a server whose models live
in processes of their own.

The orchestrator calls each model once per step for every sequence in it; these classes own
the caches and keep each sequence's slot in them (and its sampling generator) under its key,
and run one batched forward per call. Slots idle for longer than
`idle_timeout_s` are reclaimed, so a client that vanishes without releasing cannot leak them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from adaflash.decoding.costs import CostModel, load_or_measure_costs
from adaflash.decoding.sampling import History, SamplingParams
from adaflash.decoding.backend import Timed
from adaflash.decoding.steps import StepResult, StopEarly, ms_since, step_batch
from adaflash.models.backends import on_backend
from adaflash.models.cache import KVCache, Paging
from adaflash.models.drafter import DFlashDrafter, Draft, DrafterConfig
from adaflash.models.host import keep_freed_memory
from adaflash.models.placement import Placement, place_of
from adaflash.models.target import TokenHeads, Transformer
from adaflash.serving.protocol import DraftCall, Op, TargetCall, model_paging


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


@dataclass(frozen=True)
class CacheUsage:
    """A model's cache as operators read it (vLLM's and TensorRT-LLM's KV cache series). A block is a page of
    `tokens_per_block` positions; an unpaged cache is one block of max_len positions per slot."""

    open_slots: int  # sequences holding a slot (the leak check: back to 0 when idle)
    max_blocks: int
    used_blocks: int
    tokens_per_block: int
    block_bytes: int
    total_bytes: int  # the cache's memory, a graphed step's scratch page included

    @property
    def free_blocks(self) -> int:
        return self.max_blocks - self.used_blocks

    @property
    def used_bytes(self) -> int:
        return self.used_blocks * self.block_bytes

    @property
    def usage(self) -> float:
        """The fraction of blocks held (vLLM's kv_cache_usage_perc is a fraction too)."""
        return self.used_blocks / self.max_blocks if self.max_blocks else 0.0


class CacheSlots:
    """A cache and which of its slots each live sequence holds; releasing a sequence empties its slot. The process
    that holds one steps a model on it, so its allocator keeps freed memory for the next call (`host`)."""

    def __init__(self, cache: KVCache, idle_timeout_s: float) -> None:
        keep_freed_memory()
        self.cache = cache
        self.slots = SlotTable(len(cache.lengths), idle_timeout_s)

    def release(self, key: Hashable) -> None:
        slot = self.slots.release(key)
        if slot is not None:
            self.cache.truncate(slot, 0)

    def release_all(self, keys: list[Hashable]) -> None:
        """What a call or an idle loop frees: each key's slot emptied (a key without one is skipped)."""
        for key in keys:
            self.release(key)

    def release_stale(self) -> list[Hashable]:
        stale = self.slots.stale()
        for key in stale:
            self.release(key)
        return stale

    def usage(self) -> CacheUsage:
        """The slots held and the cache's blocks, read without a lock from any thread (a reading may be one step
        old; the next one catches up)."""
        cache = self.cache
        return CacheUsage(len(self.slots), cache.num_pages, cache.used_pages, cache.page, cache.page_bytes,
                          cache.nbytes)


class OccupancyReporter(threading.Thread):
    """Reports `slots.usage()` (`write`: the slots held and the cache's blocks and bytes) every `interval_s` when
    it changed.

    A leak check for operators (with no request running the slots held come back to 0) and the cache's fill, as
    operators of vLLM and TensorRT-LLM read it. Sampled on a thread of its own because a metric update is a round
    trip to the server process, which the model's forward should not wait for; the writer sets only the gauges
    whose value changed.
    """

    def __init__(self, slots: CacheSlots, write: Callable[[CacheUsage], None], interval_s: float = 0.5) -> None:
        super().__init__(name="adaflash-occupancy", daemon=True)
        self.slots, self.write, self.interval_s = slots, write, interval_s
        self.stopped = threading.Event()

    def run(self) -> None:
        last = self.report(None)  # the constant gauges (max blocks, tokens per block, bytes) from the start
        while not self.stopped.wait(self.interval_s):
            last = self.report(last)

    def report(self, last: CacheUsage | None) -> CacheUsage:
        """Write the usage when it differs from `last`; returns it."""
        now = self.slots.usage()
        if now != last:
            self.write(now)
        return now

    def stop(self) -> None:
        self.stopped.set()
        self.join()


class TargetSlots(CacheSlots):
    def __init__(self, target: Transformer, num_slots: int, max_len: int, capture: list[int] | None,
                 idle_timeout_s: float = 600.0, paging: Paging | None = None) -> None:
        super().__init__(target.new_cache(num_slots, max_len, paging), idle_timeout_s)
        self.target, self.capture, self.max_len = target, capture, max_len
        self.sampling: dict[Hashable, tuple[SamplingParams, torch.Generator]] = {}
        self.histories: dict[Hashable, History] = {}  # the committed tokens of sequences with logits processors

    def run(self, call: TargetCall, stop_early: StopEarly | None = None) -> Timed[list[StepResult]]:
        """Prefill the call's new sequences and verify the others (the time is the verify forward's), or release
        them; `stop_early` may end a call's plain decoding run sooner (`steps.decode_run`). Raises ValueError or
        KeyError for a call that does not fit its sequences (nothing changes then, beyond the releases it carries),
        RuntimeError when no slot is free."""
        self.release_stale()
        self.release_all(call.keys if call.op is Op.RELEASE else call.release)
        if call.op is Op.RELEASE:
            return Timed([], 0.0)
        new = len(call.sampling)
        for key, fed in zip(call.keys[new:], call.runs or map(len, call.feeds[new:])):
            if self.cache.lengths[self.slots.get(key)] + fed > self.max_len:
                raise ValueError(f"sequence {key} would exceed the context of {self.max_len} tokens")
        self._open(call)
        slots = [self.slots.get(k) for k in call.keys]
        results, ms = step_batch(self.target, self.cache, new, slots, call.feeds,
                                 [self.sampling[k][0] for k in call.keys], [self.sampling[k][1] for k in call.keys],
                                 self.capture, call.capture, [self.histories.get(k) for k in call.keys], call.runs,
                                 stop_early)
        for key, result in zip(call.keys, results):
            if key in self.histories:
                self.histories[key].tokens.extend(result.committed)
        return Timed(results, ms)

    def _open(self, call: TargetCall) -> None:
        """Claim a slot per new sequence, all or none."""
        opened = []
        try:
            for key, prompt, sampling in zip(call.keys, call.feeds, call.sampling):
                if len(prompt) >= self.max_len:
                    raise ValueError(f"prompt of {len(prompt)} tokens does not fit the context of {self.max_len}")
                self.slots.acquire(key)
                opened.append(key)
                self.sampling[key] = (sampling, torch.Generator().manual_seed(sampling.seed))
                if sampling.processes:
                    self.histories[key] = History(list(prompt), len(prompt))
        except (ValueError, RuntimeError):
            for key in opened:
                self.release(key)
            raise

    def release(self, key: Hashable) -> None:
        self.sampling.pop(key, None)
        self.histories.pop(key, None)
        super().release(key)


def load_target(params: dict[str, str], place: Placement) -> tuple[TargetSlots, CostModel | None]:
    """The served target from a model's parameters (the repository builder's fields), with the cost table the
    planner needs when there is a drafter: loaded by whichever process runs the target's forwards (the `target`
    model, or the orchestrator when the target runs in its process)."""
    capture = None
    if params["drafter_dir"]:
        with open(f"{params['drafter_dir']}/config.json") as f:
            capture = DrafterConfig.from_hf(json.load(f)).target_layer_ids
    target = Transformer.from_pretrained(params["target_dir"], place)
    cost = None
    if params["drafter_dir"]:
        cost = load_or_measure_costs(params["cost_table"], target, params["drafter_dir"], int(params["max_active"]),
                                     params["drafter_backend"])
    slots = TargetSlots(target, int(params["max_active"]), int(params["max_len"]), capture,
                        float(params["idle_timeout_s"]), model_paging(params))
    return slots, cost


def load_drafter(params: dict[str, str], place: Placement, weights: str, target: Transformer | None = None
                 ) -> DrafterSlots:
    """The served drafter of `weights` from a model's parameters: beside `target` when the target runs in the same
    process (its embedding and LM head are shared, not copied), else with the target's token heads alone."""
    heads = target if target is not None else TokenHeads.from_pretrained(params["target_dir"], place)
    drafter = on_backend(DFlashDrafter.from_pretrained(weights, place), heads, params["drafter_backend"])
    return DrafterSlots(drafter, heads, int(params["max_active"]), int(params["max_len"]),
                        float(params["idle_timeout_s"]), model_paging(params))


class DrafterSlots(CacheSlots):
    def __init__(self, drafter: DFlashDrafter, target: Transformer | TokenHeads, num_slots: int, max_len: int,
                 idle_timeout_s: float = 600.0, paging: Paging | None = None) -> None:
        drafter.check_target(target)
        super().__init__(drafter.new_cache(num_slots, max_len, paging), idle_timeout_s)
        self.drafter, self.target = drafter, target

    def run(self, call: DraftCall) -> Timed[Draft]:
        """Append each sequence's new features to its context (a new sequence takes a slot), then draft every
        block in one forward; the caller cuts the drafts. The sequences the call releases are freed first."""
        self.release_stale()
        self.release_all(call.release)
        for key in call.keys:
            if key not in self.slots.slot_of:
                self.slots.acquire(key)
        slots = [self.slots.get(k) for k in call.keys]
        t0 = time.perf_counter()
        fresh = [(s, f) for s, f in zip(slots, call.features) if f is not None]
        if fresh:
            self.drafter.append_context(self.cache, [s for s, _ in fresh], torch.cat([f for _, f in fresh]),
                                        [f.shape[0] for _, f in fresh])
        draft = self.drafter.draft(self.target, self.cache, slots, call.anchors, call.block_length)
        place_of(self.drafter).synchronize()
        return Timed(draft, ms_since(t0))
