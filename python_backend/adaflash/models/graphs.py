"""The target's decode and verify steps replayed as CUDA graphs.

Why: on a GPU a small model's eager step is bound by the host issuing its kernels, a few hundred a forward,
while the device computes for a fraction of that time (docs/results.md, "GPU, round 22" and "round 23"). A
graph replays a whole step's kernels in one launch. A graph fixes every shape and address, so a step is padded
to a bucket: sequences and new tokens per sequence each to a power of two, the keys attended to a power of two
(at least MIN_CONTEXT, at most the cache's length). The step's integers (tokens, positions, where keys and
values go, the slots' pages) are copied into one device buffer the graphs read; padding writes to the cache's
scratch page and reads nothing a real query sees, because every query attends only to keys at or before its
position in its own slot's pages. The graph covers the layers; the final norm and the LM head run eagerly on
the real rows only, so that no graph holds a [tokens, vocab] output.

On a CPU (`Transformer.step_graphs = True`, for tests) the same padded step runs eagerly: the graph's math
without its capture.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from adaflash.models.cache import Gather, KVCache
from adaflash.models.layers import Ragged

MAX_NEW = 16  # new tokens per sequence a graphed step takes: decodes and verifies (prefills run eagerly)
MIN_CONTEXT = 64
ENV = "ADAFLASH_CUDA_GRAPHS"  # "0" turns graphed steps off on CUDA (the eager path, for comparison)


def wanted(choice: bool | None, device: torch.device) -> bool:
    """Whether a model on `device` replays its steps as graphs: `choice` when set, else on CUDA unless ENV is 0."""
    if choice is not None:
        return choice
    return device.type == "cuda" and os.environ.get(ENV, "1") != "0"


def bucket(n: int) -> int:
    """The power of two a count is padded to."""
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class StepShape:
    sequences: int
    tokens: int  # per sequence
    context: int  # keys attended per sequence
    capture: tuple[int, ...]  # target layers whose outputs the step returns (the drafter's context)


@dataclass
class Replay:
    graph: torch.cuda.CUDAGraph | None  # None on a CPU: `run` is called each step instead
    run: Callable[[KVCache], tuple[Tensor, Tensor | None]]  # the step: x [T, D] before the final norm, and the
    # captured layers' outputs [T, n * D] or None
    outputs: tuple[Tensor, Tensor | None] | None


@dataclass
class StepOutput:
    x: Tensor  # [T_real, D], the real tokens' last hidden state, packed
    hidden: Tensor | None


class StepGraphs:
    """One target's graphed steps over one cache. The graphs read the cache's storage and this object's input
    buffer; `Transformer.forward` keeps one per cache, keyed weakly, and this object holds no reference to the
    cache (it is passed to `run`), so that both are freed with the cache."""

    def __init__(self, target: torch.nn.Module, cache: KVCache) -> None:
        if cache.scratch is None:
            raise ValueError("graphed steps need a cache with a scratch page (KVCache(..., scratch=True))")
        self.target = target
        self.page, self.paged, self.scratch = cache.page, cache.paged, cache.scratch
        self.device = cache.k.device
        self.capture = self.device.type == "cuda"
        self.max_sequences = bucket(len(cache.lengths))
        self.max_context = cache.max_len
        pages_per_row = -(-cache.max_len // cache.page)
        size = 5 * self.max_sequences * MAX_NEW + self.max_sequences * pages_per_row
        self.inputs = torch.zeros(size, dtype=torch.long, device=self.device)
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=self.capture)
        self.copied = torch.cuda.Event() if self.capture else None  # the last copy out of `host`
        self.key_index = torch.arange(cache.max_len, device=self.device)
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.replays: dict[StepShape, Replay] = {}
        self.weights_key: list[tuple[int, int]] | None = None

    def fits(self, counts: list[int]) -> bool:
        return 0 < max(counts) <= MAX_NEW

    def run(self, cache: KVCache, slots: list[int], starts: list[int], counts: list[int], tokens: list[list[int]],
            capture_layers: list[int] | None) -> StepOutput:
        """Write the new tokens' keys and values to their slots and return their last hidden states (the caller
        reserved their positions; lengths are the caller's too)."""
        self._check_weights()
        need = max(s + c for s, c in zip(starts, counts))
        shape = StepShape(bucket(len(slots)), bucket(max(counts)), min(max(bucket(need), MIN_CONTEXT), self.max_context),
                          tuple(capture_layers or ()))
        rows = self._fill(cache, shape, slots, starts, counts, tokens)
        replay = self.replays.get(shape)
        if replay is None:
            replay = self.replays[shape] = self._record(cache, shape)
        elif replay.graph is not None:
            replay.graph.replay()
        x, hidden = replay.outputs if replay.graph is not None else replay.run(cache)
        return StepOutput(x.index_select(0, rows), None if hidden is None else hidden.index_select(0, rows))

    def _check_weights(self) -> None:
        """A graph reads the weights it was recorded with: a load or an in-place update drops every graph."""
        key = [(p.data_ptr(), p._version) for p in self.target.parameters()]
        if key != self.weights_key:
            self.replays.clear()
            self.weights_key = key

    def _layout(self, shape: StepShape) -> tuple[int, int]:
        """(tokens, pages per row) of a shape: the input buffer holds ids, positions, pages, offsets and rows
        ([tokens] each) then the page table ([sequences, pages per row])."""
        return shape.sequences * shape.tokens, -(-shape.context // self.page)

    def _views(self, buffer: Tensor, shape: StepShape) -> tuple[Tensor, ...]:
        t, p = self._layout(shape)
        ids, positions, pages, offsets, rows = (buffer[i * t : (i + 1) * t] for i in range(5))
        table = buffer[5 * t : 5 * t + shape.sequences * p].view(shape.sequences, p)
        return ids, positions, pages, offsets, rows, table

    def _fill(self, cache: KVCache, shape: StepShape, slots: list[int], starts: list[int], counts: list[int],
              tokens: list[list[int]]) -> Tensor:
        """Write the step's integers into the pinned host buffer and copy them over in one copy; returns the real
        tokens' rows in the padded step (on the device)."""
        if self.copied is not None:
            self.copied.synchronize()  # the previous step's copy has read the host buffer
        n = shape.tokens
        t, p = self._layout(shape)
        ids, positions, pages, offsets, rows, table = (v.numpy() for v in self._views(self.host, shape))
        ids[:], positions[:], pages[:], offsets[:], rows[:] = 0, 0, self.scratch, 0, 0
        table[:] = self.scratch
        real = 0
        for b, (slot, start, count, feed) in enumerate(zip(slots, starts, counts, tokens)):
            at = slice(b * n, b * n + count)
            where = np.arange(start, start + count)
            held = np.asarray(cache.tables[slot])
            ids[at] = feed
            positions[at] = where
            pages[at] = held[where // cache.page]
            offsets[at] = where % cache.page
            rows[real : real + count] = np.arange(b * n, b * n + count)
            table[b, : min(p, len(held))] = held[:p]
            real += count
        used = 5 * t + shape.sequences * p
        self.inputs[:used].copy_(self.host[:used], non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        return self._views(self.inputs, shape)[4][:real]

    def _step(self, shape: StepShape) -> Callable[[KVCache], tuple[Tensor, Tensor | None]]:
        """The padded step on the input buffer: what a graph records."""
        ids, positions, pages, offsets, _, table = self._views(self.inputs, shape)
        b, n, length = shape.sequences, shape.tokens, shape.context
        ragged = Ragged.build([n] * b, self.device)
        context = Gather(table if self.paged else table[:, 0], length)
        capture = list(shape.capture) or None

        def step(cache: KVCache) -> tuple[Tensor, Tensor | None]:
            mask = (self.key_index[:length][None, None, :] <= positions.view(b, n, 1))[:, None]
            return self.target.uniform_layers(ids, positions, pages, offsets, context, ragged, mask, cache, capture)

        return step

    def _record(self, cache: KVCache, shape: StepShape) -> Replay:
        """The first step of a shape: run once eagerly (on a side stream, as CUDA asks before a capture; it
        writes the same keys and values the replay then writes again), record, replay."""
        step = self._step(shape)
        if not self.capture:
            return Replay(None, step, None)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            step(cache)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = step(cache)
        graph.replay()
        return Replay(graph, step, outputs)
