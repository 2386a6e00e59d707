"""The per-request loop that servers run (adaflash.serving.session) over the keyed services equals the engine."""

from __future__ import annotations

import asyncio

import pytest
from helpers import clone_target, fixed_costs, random_prompts

from adaflash.decoding.engine import Engine
from adaflash.decoding.modes import MODE_NAMES
from adaflash.decoding.planner import Planner
from adaflash.decoding.policy import LengthController
from adaflash.decoding.sequence import Request
from adaflash.serving.session import run_request
from adaflash.serving.slots import DrafterSlots, TargetSlots

MAX_TOKENS = 32
MAX_LEN = 30 + MAX_TOKENS + 16 + 10


def serve_all(bundle, requests: list[Request], drafter_fails: bool = False):
    """Run every request as its own asyncio task against in-process services, as a server would."""
    target = clone_target(bundle.target)
    controller = LengthController(fixed_costs(), bundle.drafter.config.block_size)
    tsvc = TargetSlots(target, num_slots=len(requests), max_len=MAX_LEN, capture=bundle.drafter.config.target_layer_ids)
    dsvc = DrafterSlots(bundle.drafter, target, len(requests), MAX_LEN, controller)
    emitted: dict[int, list[int]] = {}

    async def one(key: int, req: Request):
        tsvc.open(key, req.prompt_ids, req.sampling)

        async def prefill(tokens):
            return tsvc.prefill([(key, tokens)])[0]

        async def verify(feed):
            return tsvc.verify([(key, feed)])[0]

        async def draft(call):
            if drafter_fails:
                raise RuntimeError("drafter down")
            return dsvc.draft([call], batch=len(requests))[0]

        async def emit(seq, out_from, steps_from):
            emitted.setdefault(key, []).extend(seq.output[out_from:])
            await asyncio.sleep(0)

        try:
            return await run_request(key, req, frozenset(), Planner(controller), MAX_LEN, prefill, verify, draft, emit,
                                     cancelled=lambda: False, active=lambda: len(requests))
        finally:
            tsvc.release(key)
            dsvc.release(key)

    async def main():
        return await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))

    seqs = asyncio.run(main())
    assert len(tsvc.slots) == 0 and len(dsvc.slots) == 0
    return seqs, emitted


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_served_loop_equals_engine(trained_tiny, mode):
    prompts = random_prompts(12, seed=11)
    engine = Engine(clone_target(trained_tiny.target), trained_tiny.drafter, num_slots=12, max_len=MAX_LEN,
                    cost_model=fixed_costs())
    reference = [s.output for s in engine.generate([Request(p, MAX_TOKENS, mode="ar", stop_ids=()) for p in prompts])]
    seqs, emitted = serve_all(trained_tiny, [Request(p, MAX_TOKENS, mode=mode, stop_ids=()) for p in prompts])
    for i, (seq, ref) in enumerate(zip(seqs, reference)):
        assert seq.output == ref
        assert emitted[i] == ref  # what was streamed, in order, is the output
    if mode in ("dflash", "adaflash-published"):
        assert any(st.accepted > 0 for s in seqs for st in s.steps)
    if mode == "adaflash":
        assert any(st.accepted > 0 and st.copied for s in seqs for st in s.steps)


def test_drafter_failure_falls_back_to_plain_decoding(trained_tiny):
    prompts = random_prompts(4, seed=12)
    engine = Engine(clone_target(trained_tiny.target), None, num_slots=4, max_len=MAX_LEN)
    reference = [s.output for s in engine.generate([Request(p, MAX_TOKENS, stop_ids=()) for p in prompts])]
    seqs, _ = serve_all(trained_tiny, [Request(p, MAX_TOKENS, mode="dflash", stop_ids=()) for p in prompts],
                        drafter_fails=True)
    assert [s.output for s in seqs] == reference
    assert all(st.draft_len == 0 for s in seqs for st in s.steps)
