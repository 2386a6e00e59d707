"""Round 37: in a closed batch's drain (nobody waits: `generate` submitted every request at the start), only the
sequences furthest from their end propose on the plan arm (`laggard`); those nearer their end than the furthest one by
more than SLACK tokens decode plainly in the call. Why: the caller of `generate` waits for the last sequence, so a
token committed early by a sequence that ends first saves only its row in a later call, while each row it verifies
costs one now. Against the gate as it is (`gate`); and `credit`: the laggards' rule with the gate told, in a drain,
how much nearer the batch's end each call brought (its sequences times the fall of the most tokens any has left, each
sequence's stop tokens aside) instead of the tokens committed. Each side with a gate of its own kept from run to run,
each over `ar` of the same round, in the order ar, gate, laggard, credit, reversed every other round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round37/laggard_ab.py math 64 8

`SIDES=gate,credit` runs those sides only; `SLACK=n` lets sequences within n tokens of the furthest propose too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare  # noqa: E402

from adaflash.decoding import scheduler as scheduler_module  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.modes import REFERENCE_MODE, get_mode  # noqa: E402
from adaflash.decoding.planner import Candidate  # noqa: E402

SLACK = int(os.environ.get("SLACK", "0"))


def patch(side: str, engine: Engine):
    scheduler = engine.scheduler
    propose = scheduler._propose

    def left_of(s):
        """Tokens a sequence may still commit: what its max_tokens and the context leave (as `Scheduler._runs`)."""
        return min(s.request.max_tokens - len(s.output), scheduler.max_len - len(s.tokens) + 1)

    async def laggards_propose(active, arm):
        if arm is not Arm.PLAN or scheduler.waiting or not active:
            return await propose(active, arm)
        left = {s.id: left_of(s) for s in active}
        horizon = max(left.values())
        plain = get_mode(REFERENCE_MODE)

        def mode_of(s):
            mode = get_mode(s.request.mode)
            if scheduler_module._gated(mode) and left[s.id] < horizon - SLACK:
                return plain
            return scheduler_module._stepping_as(mode, arm)

        plan = scheduler.planner.plan([Candidate(s.id, mode_of(s), s.tokens, scheduler._cap(s), s.policy,
                                                 s.can_draft) for s in active])
        drafts = dict(plan.proposals)
        if plan.drafts:
            drafts.update(await scheduler._draft(plan))
        return [[s.tokens[-1]] + drafts[s.id] for s in active], plan.copied

    gate, step = scheduler.gate, engine.step
    observe = gate.observe
    before: dict = {}

    def snapshot():
        active = [s for s in scheduler.running.values() if not s.finished]
        before.clear()
        if not scheduler.waiting:
            before.update({s.id: (s, len(s.output), left_of(s)) for s in active})
        return step()

    def credited(arm, tokens, ms, plain_rate=1.0):
        if before:
            horizon = max(left for _, _, left in before.values())
            after = max(left - (len(s.output) - n) for s, n, left in before.values())
            tokens = len(before) * (horizon - after)
        observe(arm, tokens, ms, plain_rate)

    if side in ("laggard", "credit"):
        scheduler._propose = laggards_propose
    if side == "credit":
        engine.step, gate.observe = snapshot, credited

    def undo() -> None:
        scheduler._propose, engine.step = propose, step
        if side == "credit":
            del gate.observe

    return undo


if __name__ == "__main__":
    compare(tuple(os.environ.get("SIDES", "gate,laggard,credit").split(",")), patch)
