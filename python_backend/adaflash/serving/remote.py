"""The scheduler's backend when the drafter is a model of its own (Triton's `drafter`), and the target either
one too (`target`) or in the caller's process: per step, one call to the target for every sequence, at most one
call to each drafter model.

Transport-free: a server supplies `call(model, tensors) -> tensors`, which raises BackendError when the
model fails or does not answer. Payloads are protocol.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Protocol

import torch

from adaflash.decoding.costs import CostModel
from adaflash.decoding.backend import BackendError, Timed
from adaflash.decoding.sequence import Sequence
from adaflash.decoding.steps import StepResult, StopEarly
from adaflash.models.drafter import Draft
from adaflash.serving import protocol
from adaflash.serving.protocol import DraftCall, Op, TargetCall, Tensors
from adaflash.serving.slots import DrafterSlots, TargetSlots

Call = Callable[[str, Tensors], Awaitable[Tensors]]


class Target(Protocol):
    async def run(self, call: TargetCall, stop_early: StopEarly | None = None) -> Timed[list[StepResult]]:
        """A step or a release (`TargetSlots.run`); BackendError when the target fails or does not answer.
        `stop_early`: asked between the steps of a plain decoding run, where the target can be asked."""


class TargetModel:
    """The `target` model of its own, through `call`."""

    def __init__(self, call: Call) -> None:
        self.call = call

    async def run(self, call: TargetCall, stop_early: StopEarly | None = None) -> Timed[list[StepResult]]:
        """A run is not cut here: the model could not ask the loop while it runs."""
        if call.op is Op.RELEASE:
            await self.call(protocol.TARGET, protocol.encode_release(call.keys))
            return Timed([], 0.0)
        results, ms = protocol.decode_target_result(await self.call(protocol.TARGET, protocol.encode_target_call(call)))
        return Timed(results, ms)


class TargetInProcess:
    """The target in the caller's process: the same calls without a round trip, tensors or a second process
    (why: docs/history.md, round 14).

    `load` and every call run on one thread of their own. libgomp throttles its threads' spinning once two
    threads of a process have run parallel regions: every region then puts its workers to sleep and wakes them,
    and a forward took 3x as long. So the caller leaves the cores to this thread (`torch.set_num_threads(1)`
    after this is built: a thread takes the count when it first uses torch) and its event loop stays free."""

    def __init__(self, load: Callable[[], tuple[TargetSlots, CostModel | None]]) -> None:
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="target")
        self.slots, self.cost = self.thread.submit(load).result()

    async def run(self, call: TargetCall, stop_early: StopEarly | None = None) -> Timed[list[StepResult]]:
        return await self.on_thread(partial(self.slots.run, call, stop_early), protocol.TARGET)

    async def on_thread(self, job: Callable, model: str):
        """`job()` on the target's thread; BackendError naming `model` when it raises, as a failed call of that
        model: a failed target call ends its sequences, a failed draft makes its sequences decode plainly."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.thread, job)
        except Exception as exc:  # noqa: BLE001 - reported as the model's failure, not raised through the loop
            raise BackendError(f"{model}: {exc}") from exc

    def close(self) -> None:
        self.thread.shutdown()


class DrafterInProcess:
    """The drafter in the caller's process, beside the target in it (`TargetInProcess`): its forwards on the target's
    thread (the cores are that thread's, `TargetInProcess`), the target's embedding and LM head shared, and no round
    trip, tensors or process of its own. Named `protocol.DRAFTER` like the model it stands for."""

    def __init__(self, target: TargetInProcess, load: Callable[[], DrafterSlots]) -> None:
        self.target = target
        self.slots = target.thread.submit(load).result()

    async def run(self, call: DraftCall) -> Timed[Draft]:
        return await self.target.on_thread(partial(self.slots.run, call), protocol.DRAFTER)

    async def release(self, keys: list[int]) -> None:
        await self.target.on_thread(partial(self.slots.release_all, keys), protocol.DRAFTER)


class RemoteBackend:
    """`newest_drafter()` names the drafter model a new sequence uses (None: none is ready): a sequence keeps
    it to the end, because its context lives in that model, so a hot swap never moves a running sequence.
    `target`: where the target runs (None: the `target` model, through `call`). `called(model, op, sequences)` is
    told of every call to a model, wherever the target runs, before it is made. `drafter`: the drafter in this
    process (`DrafterInProcess`, the model `protocol.DRAFTER`), None when it is a model of its own."""

    def __init__(self, call: Call, newest_drafter: Callable[[], str | None],
                 log: Callable[[str], None] = lambda message: None, target: Target | None = None,
                 called: Callable[[str, Op, int], None] = lambda model, op, n: None,
                 drafter: DrafterInProcess | None = None) -> None:
        self.call, self.newest_drafter, self.log, self.called = call, newest_drafter, log, called
        self.target = target or TargetModel(call)
        self.here = drafter
        self.drafter_of: dict[int, str] = {}  # sequence -> the drafter model it started with
        self.releasing: dict[str, list[int]] = {}  # model -> sequences ended since its last call

    async def forward(self, prefill: list[Sequence], verify: list[Sequence], feeds: list[list[int]],
                      runs: list[int] | None = None, stop_early: StopEarly | None = None
                      ) -> Timed[tuple[list[StepResult], list[StepResult]]]:
        """One `target` call: new sequences first (prompts and sampling settings), then the verifying ones."""
        drafter = self.newest_drafter() if any(s.can_draft for s in prefill) else None
        if drafter is not None:
            self.drafter_of.update((s.id, drafter) for s in prefill if s.can_draft)
        seqs = [*prefill, *verify]
        call = TargetCall(Op.STEP, [s.id for s in seqs], [s.tokens for s in prefill] + feeds,
                          [s.sampling for s in prefill], self.releasing.pop(protocol.TARGET, []),
                          [s.can_draft for s in seqs], runs)
        self.called(protocol.TARGET, Op.STEP, len(seqs))
        done = await self.target.run(call, stop_early)
        return Timed((done.value[:len(prefill)], done.value[len(prefill):]), done.ms)

    async def draft(self, seqs: list[Sequence], block_length: int) -> Timed[Draft]:
        """One call per drafter model the sequences use (one, except while a newer drafter takes over)."""
        by_model: dict[str, list[int]] = {}
        for i, seq in enumerate(seqs):
            if seq.id not in self.drafter_of:
                raise BackendError("no drafter model was ready when the sequence started")
            by_model.setdefault(self.drafter_of[seq.id], []).append(i)
        parts, total_ms = {}, 0.0
        for model, rows in by_model.items():
            group = [seqs[i] for i in rows]
            call = DraftCall([s.id for s in group], [s.tokens[-1] for s in group],
                             [torch.cat(s.pending_context) if s.pending_context else None for s in group], block_length,
                             self.releasing.pop(model, []))
            self.called(model, Op.DRAFT, len(group))
            if self.here is not None and model == protocol.DRAFTER:
                timed = await self.here.run(call)
                draft, ms = timed.value, timed.ms
            else:
                draft, ms = protocol.decode_draft(await self.call(model, protocol.encode_draft_call(call)))
            for s in group:
                s.pending_context.clear()
            parts[model], total_ms = draft, total_ms + ms
        return Timed(_in_order([(rows, parts[m]) for m, rows in by_model.items()]), total_ms)

    async def release(self, seqs: list[Sequence]) -> None:
        """Free the sequences in the target and in their drafter models, with each model's next call (a call
        frees them before it claims slots for new sequences), or when the loop idles."""
        self.releasing.setdefault(protocol.TARGET, []).extend(s.id for s in seqs)
        for seq in seqs:
            model = self.drafter_of.pop(seq.id, None)
            if model is not None:
                self.releasing.setdefault(model, []).append(seq.id)

    async def idle(self) -> None:
        """Nothing runs: free what is still owed in a call of its own per model. A failure is logged, not
        raised: the models reclaim slots left idle themselves."""
        owed, self.releasing = self.releasing, {}
        for model, keys in owed.items():
            self.called(model, Op.RELEASE, len(keys))
            try:
                if model == protocol.TARGET:
                    await self.target.run(TargetCall(Op.RELEASE, keys, []))
                elif self.here is not None and model == protocol.DRAFTER:
                    await self.here.release(keys)
                else:
                    await self.call(model, protocol.encode_release(keys))
            except BackendError as exc:
                self.log(f"releasing {len(keys)} sequences in {model} failed: {exc}")


def _in_order(parts: list[tuple[list[int], Draft]]) -> Draft:
    """Drafts of several models as one, rows back in the order of the sequences asked."""
    if len(parts) == 1:
        return parts[0][1]
    order = torch.tensor([i for rows, _ in parts for i in rows]).argsort()

    def joined(field: str) -> torch.Tensor | None:
        values = [getattr(d, field) for _, d in parts]
        return None if any(v is None for v in values) else torch.cat(values)[order]

    return Draft(tokens=joined("tokens"), hidden=None, accept_ratio=joined("accept_ratio"),
                 accept_rates=joined("accept_rates"))
