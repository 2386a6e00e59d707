"""One request's speculative loop with the target and the drafter behind async calls.

A server runs one of these per request (an asyncio task) and supplies the calls: in Triton
they are BLS requests to the `target` and `drafter` models, which batch the calls of all
concurrent sequences into one forward each. The decisions are the engine's planner's, with
the other active requests counted as peers, and the commit rules are the engine's, so served
output equals the engine's. If the drafter fails, the request goes on without it (plain
decoding, or copies of its context), which is still exact.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable

import torch

from adaflash.decoding.modes import get_mode
from adaflash.decoding.planner import Candidate, Load, Planner
from adaflash.decoding.sequence import Request, Sequence, StepRecord, draft_cap
from adaflash.decoding.steps import StepResult
from adaflash.serving.protocol import DraftCall

PrefillFn = Callable[[list[int]], Awaitable[StepResult]]
VerifyFn = Callable[[list[int]], Awaitable[StepResult]]
DraftFn = Callable[[DraftCall], Awaitable[list[int]]]
EmitFn = Callable[[Sequence, int, int], Awaitable[None]]  # (sequence, new output tokens from, new steps from)


async def run_request(
    key: Hashable,
    request: Request,
    stop_ids: frozenset[int],
    planner: Planner,
    max_len: int,
    prefill: PrefillFn,
    verify: VerifyFn,
    draft: DraftFn | None,
    emit: EmitFn,
    cancelled: Callable[[], bool],
    active: Callable[[], int],
) -> Sequence:
    """Run to a stop token, max_tokens or cancellation; `emit` is awaited after every step."""
    controller = planner.controller
    seq = Sequence(id=key, request=request, tokens=list(request.prompt_ids), generator=None, stop_ids=stop_ids,
                   policy=controller.new_sequence())
    mode = get_mode(request.mode)
    can_draft = mode.drafter and draft is not None
    first = await prefill(seq.tokens)
    pending = [first.features] if can_draft else []
    seq.commit(first.committed)
    await emit(seq, 0, 0)
    while not seq.finished:
        if cancelled():
            seq.finish_reason = "cancelled"
            break
        out_from, steps_from = len(seq.output), len(seq.steps)
        cap = draft_cap(request, len(seq.output), len(seq.tokens), planner.block_size, max_len)
        plan = planner.plan([Candidate(key, mode, seq.tokens, cap, seq.policy, can_draft)],
                            Load.peers(max(active(), 1) - 1))
        proposal = plan.proposals[key]
        if plan.drafts:
            d = plan.drafts[0]
            call = DraftCall(d.key, d.mode, d.cap, d.block_length, d.rates, features=torch.cat(pending),
                             anchor=seq.tokens[-1])
            try:
                proposal = await draft(call)
                pending.clear()
            except Exception:  # noqa: BLE001 - any drafter failure: continue without it, output unchanged
                can_draft = False
        res = await verify([seq.tokens[-1]] + proposal)
        if can_draft:
            pending.append(res.features)
        matched = plan.copied.get(key, 0)
        controller.observe(seq.policy, len(proposal), res.accepted, matched=matched)
        seq.steps.append(StepRecord(len(proposal), res.accepted, seq.commit(res.committed), res.expected_accepted,
                                    copied=bool(matched)))
        await emit(seq, out_from, steps_from)
    return seq
