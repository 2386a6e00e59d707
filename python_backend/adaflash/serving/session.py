"""One request's speculative loop with the target and the drafter behind async calls.

A server runs one of these per request (an asyncio task) and supplies the calls: in Triton
they are BLS requests to the `target` and `drafter` models, which batch the calls of all
concurrent sequences into one forward each. The decisions are the engine's: the same draft
caps, the same LengthController, the same commit rules, so served output equals the
engine's. If the drafter fails, the request goes on as plain decoding, which is still exact.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable

import torch

from adaflash.decoding import ngram
from adaflash.decoding.engine import DRAFTER_MODES, Request, Sequence, StepRecord, draft_cap
from adaflash.decoding.policy import LengthController
from adaflash.serving.hosts import DraftCall
from adaflash.decoding.steps import StepResult

Prefill = Callable[[list[int]], Awaitable[StepResult]]
Verify = Callable[[list[int]], Awaitable[StepResult]]
Draft = Callable[[DraftCall], Awaitable[list[int]]]
Emit = Callable[[Sequence, int, int], Awaitable[None]]  # (sequence, new output tokens from, new steps from)


async def run_request(
    key: Hashable,
    request: Request,
    stop_ids: frozenset[int],
    controller: LengthController,
    max_len: int,
    prefill: Prefill,
    verify: Verify,
    draft: Draft | None,
    emit: Emit,
    cancelled: Callable[[], bool],
    active: Callable[[], int],
) -> Sequence:
    """Run to a stop token, max_tokens or cancellation; `emit` is awaited after every step."""
    seq = Sequence(id=key, request=request, tokens=list(request.prompt_ids), generator=None, stop_ids=stop_ids,
                   policy=controller.new_sequence())
    uses_drafter = request.mode in DRAFTER_MODES and draft is not None
    first = await prefill(seq.tokens)
    pending = [first.features] if uses_drafter else []
    seq.commit(first.committed)
    await emit(seq, 0, 0)
    while not seq.finished:
        if cancelled():
            seq.finish_reason = "cancelled"
            break
        out_from, steps_from = len(seq.output), len(seq.steps)
        proposal: list[int] = []
        cap = draft_cap(request, len(seq.output), len(seq.tokens), controller.block_size, max_len)
        copy, matched = ngram.lookup(seq.tokens, cap) if request.mode in ("ngram", "adaflash") else ([], 0)
        copied = request.mode == "adaflash" and controller.prefers_copy([seq.policy], [matched], [len(copy)], [cap])[0]
        if request.mode == "ngram":
            proposal = copy
        elif not copied and uses_drafter and cap > 0 and (length := _draft_length(controller, seq, cap, active())):
            call = DraftCall(key, torch.cat(pending), seq.tokens[-1], request.mode, min(cap, length - 1),
                             controller.estimated_rates([seq.policy])[0])
            try:
                proposal = await draft(call)
                pending.clear()
            except Exception:  # noqa: BLE001 - any drafter failure: continue without it, output unchanged
                uses_drafter = False
        elif request.mode == "adaflash" and copy:  # copying is preferred, or drafting does not pay this step
            n = max(active(), 1)
            proposal = copy[:controller.copy_lengths([seq.policy], [matched], [len(copy)], n, n - 1)[0][0]]
            copied = bool(proposal)
        res = await verify([seq.tokens[-1]] + proposal)
        if uses_drafter:
            pending.append(res.features)
        controller.observe(seq.policy, len(proposal), res.accepted, matched=matched if copied else 0)
        seq.steps.append(StepRecord(len(proposal), res.accepted, seq.commit(res.committed), res.expected_accepted,
                                    copied=copied))
        await emit(seq, out_from, steps_from)
    return seq


def _draft_length(controller: LengthController, seq: Sequence, cap: int, active: int) -> int:
    """Block length to draft, 0 for none: adaflash asks the controller whether drafting pays this step
    and how long a block; the other drafter modes always draft full blocks."""
    if seq.request.mode != "adaflash":
        return controller.block_size
    chosen, length = controller.choose_drafters([seq.policy], [cap], max(active, 1), max(active - 1, 0),
                                                max(active, 1))
    return length if chosen[0] else 0
