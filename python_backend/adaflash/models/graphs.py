"""The target's decode and verify steps, the drafter's drafts and its context projections, replayed as CUDA
graphs.

Why: on a GPU a small model's eager step is bound by the host issuing its kernels, a few hundred a forward,
while the device computes for a fraction of that time (docs/history.md, "GPU, round 22" and "round 23"). A
graph replays a whole step's kernels in one launch. A graph fixes every shape and address, so a step is padded
to a bucket: sequences and new tokens per sequence each to a power of two, the keys attended to a power of two
(at least MIN_CONTEXT, at most the cache's length). The step's integers (tokens, positions, where keys and
values go, the slots' pages) are copied into one device buffer the graphs read; padding writes to the cache's
scratch page and reads nothing a real query sees, because every query attends only to keys at or before its
position in its own slot's pages. The target's graph covers the layers; the final norm and the LM head run
eagerly on the real rows only, so that no graph holds a [tokens, vocab] output. A draft is padded alike (its
sequences, and the context it reads); its graph covers the whole draft, the drafter's heads too, whose outputs
are small; so is projecting committed features into the drafter's context (its positions padded).

On a CPU (`step_graphs = True` on the model, for tests) the same padded step runs eagerly: the graph's math
without its capture.
"""

from __future__ import annotations

import gc
import os
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from adaflash.models.cache import Gather, KVCache
from adaflash.models.layers import Ragged
from adaflash.models.shapes import bucket

MAX_NEW = 16  # new tokens per sequence any graphed step takes: decodes and verifies
# Padded tokens (sequences x tokens per sequence) a graphed step of longer feeds takes: prefills. An eager prefill on a
# GPU host took several verifies' time, and where sequences end one by one (prompt lookup's and adaflash's do) each
# admission paid one (docs/history.md, GPU round 25). Larger prefills run eagerly: every prefill shape keeps its
# outputs in the graphs' pool, so this bounds that memory too.
PREFILL_TOKENS = 1024
MIN_CONTEXT = 64
MIN_POSITIONS = 16  # a context projection's smallest bucket
ENV = "ADAFLASH_CUDA_GRAPHS"  # "0" turns graphed steps off on CUDA (the eager path, for comparison)


def wanted(choice: bool | None, device: torch.device) -> bool:
    """Whether a model on `device` replays its steps as graphs: `choice` when set, else on CUDA unless ENV is 0."""
    if choice is not None:
        return choice
    return device.type == "cuda" and os.environ.get(ENV, "1") != "0"


def recordings() -> int:
    """Shapes met for the first time in this process (recorded on CUDA): a step that met one also paid its capture,
    tens of milliseconds against a replay's one, so whoever learns from a step's time leaves that step out (the
    scheduler's gate does)."""
    return Recorder.recorded


@dataclass(frozen=True)
class StepShape:
    sequences: int
    tokens: int  # per sequence
    context: int  # keys attended per sequence
    capture: tuple[int, ...]  # target layers whose outputs the step returns (the drafter's context)


@dataclass(frozen=True)
class ContextShape:
    positions: int  # projected into the drafter's context


@dataclass(frozen=True)
class DraftShape:
    sequences: int
    block: int  # the block's length, the anchor included
    context: int


@dataclass
class Replay:
    graph: torch.cuda.CUDAGraph | None  # None on a CPU: `run` is called each step instead
    run: Callable[[KVCache], tuple]  # the padded step over a cache: what the graph records
    outputs: tuple | None  # the graph's outputs, rewritten by every replay


@dataclass
class StepOutput:
    x: Tensor  # [T_real, D], the real tokens' last hidden state, packed
    hidden: Tensor | None


class Recorder:
    """What the target's and the drafter's graphs share: the input buffer (one long tensor on the device, filled
    from a pinned twin in one copy a step), the graphs by shape, a memory pool for all of them, and the weights
    they were recorded with. One per (model, cache), kept by the model's `Recorders`; it holds no reference to
    the cache (the cache is passed to each call)."""

    recorded = 0  # shapes met for the first time, by every recorder of the process (`recordings`)

    def __init__(self, models: list[torch.nn.Module], cache: KVCache, size: int) -> None:
        if cache.scratch is None:
            raise ValueError("graphed steps need a cache with a scratch page (KVCache(..., scratch=True))")
        self.watch(models)
        self.page, self.paged, self.scratch, self.max_context = cache.page, cache.paged, cache.scratch, cache.max_len
        self.device = cache.k.device
        self.capture = self.device.type == "cuda"
        self.inputs = torch.zeros(size, dtype=torch.long, device=self.device)
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=self.capture)
        self.copied = torch.cuda.Event() if self.capture else None  # the last copy out of `host`
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.replays: dict[object, Replay] = {}
        self.failures: list[str] = []  # captures CUDA refused (their shapes run eagerly)

    def watch(self, models: list[torch.nn.Module]) -> None:
        """The models whose weights the graphs read: where each weight lives is resolved once (walking the modules
        for their parameters every step cost more host time than a replay; docs/history.md, round 23), and a
        replaced or updated parameter is still seen by `replay`, which then drops every graph."""
        self.weights = [(m._parameters, n) for model in models for m in model.modules()
                        for n, p in m._parameters.items() if p is not None]
        self.weights_key: list[tuple[int, int]] | None = None

    def context_bucket(self, need: int) -> int:
        return min(max(bucket(need), MIN_CONTEXT), self.max_context)

    def host_buffer(self) -> Tensor:
        """The pinned buffer, once the previous step's copy has read it."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.host

    def copy_in(self, used: int) -> None:
        self.inputs[:used].copy_(self.host[:used], non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def fill_table(self, table: np.ndarray, row: int, held: list[int]) -> None:
        """Row `row` of a page table: a slot's pages, the scratch page past them."""
        p = table.shape[1]
        table[row, : min(p, len(held))] = held[:p]

    def context(self, table: Tensor, length: int) -> Gather:
        return Gather(table if self.paged else table[:, 0], length)

    def replay(self, cache: KVCache, shape: object, make: Callable[[], Callable[[KVCache], tuple]]) -> tuple:
        """The outputs of the step of `shape` on the inputs just copied in: replayed, or recorded first (`make`
        builds the step)."""
        key = [(held[n].data_ptr(), held[n]._version) for held, n in self.weights]
        if key != self.weights_key:  # a graph reads the weights it was recorded with: a load or an update drops all
            self.replays.clear()
            self.weights_key = key
        replay = self.replays.get(shape)
        if replay is None:
            Recorder.recorded += 1
            replay = self.replays[shape] = self._record(cache, make())
        elif replay.graph is not None:
            replay.graph.replay()
        return replay.outputs if replay.graph is not None else replay.run(cache)

    def _record(self, cache: KVCache, step: Callable[[KVCache], tuple]) -> Replay:
        """The first step of a shape: run once eagerly (on a side stream, as CUDA asks before a capture; it writes
        what the replay then writes again), record, replay."""
        if not self.capture:
            return Replay(None, step, None)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            step(cache)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        collecting = gc.isenabled()
        gc.disable()  # a collection while capturing could free a dropped cache's graphs, which CUDA refuses then
        try:
            # thread_local: a served target records on a thread of its own while the server's other threads may copy
            # tensors; only this thread's calls may not break the capture (and theirs are not refused meanwhile).
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                outputs = step(cache)
        except RuntimeError as exc:  # this shape runs eagerly from now on: slower, never wrong
            self.failures.append(str(exc).splitlines()[0])
            warnings.warn(f"adaflash: a step could not be recorded as a CUDA graph, it runs eagerly: {exc}",
                          RuntimeWarning, stacklevel=2)
            return Replay(None, step, None)
        finally:
            if collecting:
                gc.enable()
        graph.replay()
        return Replay(graph, step, outputs)


class Recorders:
    """A model's recorders, one per cache it runs over, made on first use. Keyed weakly by the cache (a recorder
    holds no cache), so a dropped cache frees its graphs; a copied model starts with none."""

    def __init__(self, kind: type[Recorder]) -> None:
        self.kind = kind
        self.by_cache: weakref.WeakKeyDictionary[KVCache, Recorder] = weakref.WeakKeyDictionary()

    def of(self, model: torch.nn.Module, cache: KVCache) -> Recorder | None:
        """`model`'s recorder over `cache`; None where its steps run eagerly (`wanted`, and a cache made for it)."""
        if cache.scratch is None or not wanted(model.step_graphs, cache.k.device):
            return None
        recorder = self.by_cache.get(cache)
        if recorder is None:
            recorder = self.by_cache[cache] = self.kind(model, cache)
        return recorder

    def get(self, cache: KVCache) -> Recorder | None:
        return self.by_cache.get(cache)

    def __len__(self) -> int:
        return len(self.by_cache)

    def __reduce__(self) -> tuple:
        """A copied or pickled model's recorders start empty: graphs belong to this process's caches."""
        return Recorders, (self.kind,)


class StepGraphs(Recorder):
    """The target's graphed steps over one cache. The input buffer holds, for a shape of T padded tokens: ids,
    positions, pages, offsets and the real tokens' rows ([T] each), then the page table ([sequences, pages])."""

    def __init__(self, target: torch.nn.Module, cache: KVCache) -> None:
        most = bucket(len(cache.lengths))
        tokens = max(most * MAX_NEW, PREFILL_TOKENS)
        super().__init__([target], cache, 5 * tokens + most * -(-cache.max_len // cache.page))
        self.target = target
        self.key_index = torch.arange(cache.max_len, device=self.device)

    def fits(self, counts: list[int]) -> bool:
        """Whether a step feeding `counts` new tokens to its sequences is graphed: every decode and verify (at most
        MAX_NEW a sequence), and prefills within PREFILL_TOKENS padded."""
        longest = max(counts)
        return 0 < longest and (longest <= MAX_NEW or bucket(len(counts)) * bucket(longest) <= PREFILL_TOKENS)

    def run(self, cache: KVCache, slots: list[int], starts: list[int], counts: list[int], tokens: list[list[int]],
            capture_layers: list[int] | None) -> StepOutput:
        """Write the new tokens' keys and values to their slots and return their last hidden states (the caller
        reserved their positions; lengths are the caller's too)."""
        shape = StepShape(bucket(len(slots)), bucket(max(counts)),
                          self.context_bucket(max(s + c for s, c in zip(starts, counts))), tuple(capture_layers or ()))
        rows = self._fill(cache, shape, slots, starts, counts, tokens)
        x, hidden = self.replay(cache, shape, lambda: self._step(shape))
        return StepOutput(x.index_select(0, rows), None if hidden is None else hidden.index_select(0, rows))

    def _views(self, buffer: Tensor, shape: StepShape) -> tuple[Tensor, ...]:
        t, p = shape.sequences * shape.tokens, -(-shape.context // self.page)
        ids, positions, pages, offsets, rows = (buffer[i * t : (i + 1) * t] for i in range(5))
        table = buffer[5 * t : 5 * t + shape.sequences * p].view(shape.sequences, p)
        return ids, positions, pages, offsets, rows, table

    def _fill(self, cache: KVCache, shape: StepShape, slots: list[int], starts: list[int], counts: list[int],
              tokens: list[list[int]]) -> Tensor:
        """Write the step's integers into the pinned buffer and copy them over; returns the real tokens' rows in the
        padded step (on the device)."""
        n = shape.tokens
        host = self.host_buffer()
        ids, positions, pages, offsets, rows, table = (v.numpy() for v in self._views(host, shape))
        ids[:], positions[:], pages[:], offsets[:], rows[:], table[:] = 0, 0, self.scratch, 0, 0, self.scratch
        real = 0
        for b, (slot, start, count, feed) in enumerate(zip(slots, starts, counts, tokens)):
            at = slice(b * n, b * n + count)
            ids[at] = feed
            positions[at], pages[at], offsets[at] = cache.where([slot], [start], [count])
            rows[real : real + count] = np.arange(b * n, b * n + count)
            self.fill_table(table, b, cache.tables[slot])
            real += count
        self.copy_in(5 * len(ids) + table.size)
        return self._views(self.inputs, shape)[4][:real]

    def _step(self, shape: StepShape) -> Callable[[KVCache], tuple[Tensor, Tensor | None]]:
        ids, positions, pages, offsets, _, table = self._views(self.inputs, shape)
        b, n, length = shape.sequences, shape.tokens, shape.context
        ragged = Ragged.build([n] * b, self.device)
        context = self.context(table, length)
        capture = list(shape.capture) or None

        def step(cache: KVCache) -> tuple[Tensor, Tensor | None]:
            mask = (self.key_index[:length][None, None, :] <= positions.view(b, n, 1))[:, None]
            return self.target.uniform_layers(ids, positions, pages, offsets, context, ragged, mask, cache, capture)

        return step


class DraftGraphs(Recorder):
    """The drafter's graphed drafts and context projections over its context cache. For a draft of n padded
    sequences the input buffer holds anchors and context lengths ([n] each), then the page table ([n, pages]); a
    padded sequence has no context (its block attends to itself). For a projection of T padded positions it holds
    their positions, pages and offsets ([T] each), and the features go to a buffer of their own; padded positions
    project zeros into the scratch page. A projection of more positions than a step's (sequences x MAX_NEW, a
    prompt's) runs eagerly."""

    def __init__(self, drafter: torch.nn.Module, cache: KVCache) -> None:
        most = bucket(len(cache.lengths))
        self.max_positions = most * MAX_NEW
        table = most * -(-cache.max_len // cache.page)
        super().__init__([drafter], cache, max(2 * most + table, 3 * self.max_positions))
        self.drafter, self.target = drafter, None
        self.features = torch.zeros(self.max_positions, drafter.fc.weight.shape[1], dtype=drafter.fc.weight.dtype,
                                    device=self.device)

    def run(self, cache: KVCache, target: torch.nn.Module, slots: list[int], anchors: list[int],
            block: int) -> tuple[Tensor | None, ...]:
        """The fields of the drafter's `Draft` for `slots` (see `DFlashDrafter.draft`), each a tensor of its own."""
        if target is not self.target:  # the drafts read the target's embedding and LM head: record them again
            self.target = target
            self.watch([self.drafter, target])
        shape = DraftShape(bucket(len(slots)), block, self.context_bucket(max(cache.lengths[s] for s in slots)))
        host = self.host_buffer()
        anchor_ids, lengths, table = (v.numpy() for v in self._draft_views(host, shape))
        anchor_ids[:], lengths[:], table[:] = 0, 0, self.scratch
        for b, (slot, anchor) in enumerate(zip(slots, anchors)):
            anchor_ids[b], lengths[b] = anchor, cache.lengths[slot]
            self.fill_table(table, b, cache.tables[slot])
        self.copy_in(2 * shape.sequences + table.size)
        outputs = self.replay(cache, shape, lambda: self._draft(shape))
        return tuple(None if t is None else t[: len(slots)].clone() for t in outputs)

    def fits(self, positions: int) -> bool:
        return positions <= self.max_positions

    def append(self, cache: KVCache, slots: list[int], starts: list[int], counts: list[int], features: Tensor) -> None:
        """Project `features` (packed, counts[b] positions of slots[b] from starts[b], on the device in the
        drafter's dtype) into the cache; the caller reserved the positions and keeps the lengths."""
        total = sum(counts)
        shape = ContextShape(max(bucket(total), MIN_POSITIONS))
        host = self.host_buffer()
        positions, pages, offsets = (v.numpy() for v in self._context_views(host, shape))
        positions[:], pages[:], offsets[:] = 0, self.scratch, 0
        positions[:total], pages[:total], offsets[:total] = cache.where(slots, starts, counts)
        self.copy_in(3 * shape.positions)
        self.features[:total].copy_(features)
        self.features[total : shape.positions].zero_()
        self.replay(cache, shape, lambda: self._append(shape))

    def _draft_views(self, buffer: Tensor, shape: DraftShape) -> tuple[Tensor, Tensor, Tensor]:
        n, p = shape.sequences, -(-shape.context // self.page)
        return buffer[:n], buffer[n : 2 * n], buffer[2 * n : 2 * n + n * p].view(n, p)

    def _context_views(self, buffer: Tensor, shape: ContextShape) -> tuple[Tensor, Tensor, Tensor]:
        t = shape.positions
        return buffer[:t], buffer[t : 2 * t], buffer[2 * t : 3 * t]

    def _draft(self, shape: DraftShape) -> Callable[[KVCache], tuple[Tensor | None, ...]]:
        anchors, lengths, table = self._draft_views(self.inputs, shape)
        context = self.context(table, shape.context)

        def draft(cache: KVCache) -> tuple[Tensor | None, ...]:
            d = self.drafter.draft_gathered(self.target, cache, anchors, lengths, context, shape.block)
            return d.tokens, d.hidden, d.accept_ratio, d.accept_rates

        return draft

    def _append(self, shape: ContextShape) -> Callable[[KVCache], tuple]:
        positions, pages, offsets = self._context_views(self.inputs, shape)
        features = self.features[: shape.positions]

        def append(cache: KVCache) -> tuple:
            self.drafter.project_context(cache, positions, pages, offsets, features)
            return ()

        return append
