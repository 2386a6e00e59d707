"""The admission queue: bounded FIFO in front of the sequence slots, nothing held after a refusal."""

from __future__ import annotations

import asyncio

import pytest

from adaflash.serving.admission import Admission, AdmissionCancelled, AdmissionRefused


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def test_requests_beyond_capacity_wait_their_turn_in_order():
    async def main():
        gate = Admission(max_active=2, max_queued=4, max_wait_s=10, poll_s=0.01)
        order = []

        async def request(i, hold_s):
            waited = await gate.enter()
            order.append(i)
            await asyncio.sleep(hold_s)
            gate.leave()
            return waited

        waits = await asyncio.gather(*(request(i, 0.05) for i in range(6)))
        return gate, order, waits

    gate, order, waits = run(main())
    assert order == list(range(6))  # first come, first served
    assert waits[:2] == [0.0, 0.0] and all(w > 0 for w in waits[2:])
    assert gate.active == 0 and gate.queued == 0


def test_a_full_queue_refuses_naming_the_limit():
    async def main():
        gate = Admission(max_active=1, max_queued=1, max_wait_s=10, poll_s=0.01)
        await gate.enter()
        waiter = asyncio.create_task(gate.enter())
        await asyncio.sleep(0.02)
        with pytest.raises(AdmissionRefused, match="max_queued 1"):
            await gate.enter()
        gate.leave()
        await waiter
        gate.leave()
        return gate

    gate = run(main())
    assert gate.active == 0 and gate.queued == 0


def test_a_wait_past_the_limit_is_refused_and_leaves_no_trace():
    async def main():
        gate = Admission(max_active=1, max_queued=4, max_wait_s=0.1, poll_s=0.01)
        await gate.enter()
        with pytest.raises(AdmissionRefused, match="max_queue_wait_s 0.1"):
            await gate.enter()
        assert gate.queued == 0
        gate.leave()
        return gate

    gate = run(main())
    assert gate.active == 0


def test_cancelled_while_queued_frees_its_place():
    async def main():
        gate = Admission(max_active=1, max_queued=4, max_wait_s=10, poll_s=0.01)
        await gate.enter()
        gone = {"flag": False}
        waiter = asyncio.create_task(gate.enter(cancelled=lambda: gone["flag"]))
        killed = asyncio.create_task(gate.enter())
        await asyncio.sleep(0.03)
        assert gate.queued == 2
        gone["flag"] = True
        with pytest.raises(AdmissionCancelled):
            await waiter
        killed.cancel()  # the waiting task itself cancelled (its client's stream closed)
        with pytest.raises(asyncio.CancelledError):
            await killed
        assert gate.queued == 0 and gate.active == 1
        gate.leave()
        return gate

    gate = run(main())
    assert gate.active == 0 and gate.queued == 0
