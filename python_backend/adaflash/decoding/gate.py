"""Whether the cost-aware sequences plan their steps or decode plainly for a while: measured, not predicted.

Why: the planner weighs a speculative step against a plain one with the cost model, but the price of
planning itself (copy lookups, acceptance estimates, the length choice, drafter probes, a served step's
round trips that plain decoding spreads over a run of steps) is paid on every planned step whatever it
chooses, and the cost model cannot see it. Where speculation gains less than that price (a large batch on
a target whose verify of many tokens costs nearly what it saves), planning every step loses to plain
decoding. So the gate runs the two arms in blocks of calls, follows the one that commits more tokens per
millisecond of the whole step, and keeps trying the other now and then, more often the closer they are.
The output does not depend on the arm (a plain step verifies nothing: it is a step of `ar`), so greedy
decoding stays equal to plain decoding whatever the gate chooses. The engine uses it at every load; the
orchestrator from SERVED_MIN_SEQUENCES running sequences, below which served planning every step was measured
faster (docs/results.md, rounds 13 and 14).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

BLOCK_CALLS = 4  # target calls per block of one arm
# After a switch of arm, the first call is not measured: it carries the switch's own cost (after a plain stretch the
# drafter first appends every position decoded meanwhile), which the arm would not pay while it led; counted, it
# would tilt the comparison toward the arm in the lead.
WARMUP_CALLS = 1
# Of a block's rate in its arm's running rate: the mean of an arm's first blocks, then this weight per block of
# either arm since the arm's rate was last updated (the load's regime is followed, not each text's turns; a first
# block measured at a bad moment does not linger). An arm explored after n leader blocks weighs its new block as
# the leader's rate weighed those n blocks together: both rates then cover the same recent time. With a fixed
# weight a rarely run arm kept a rate from minutes before, while the leader's fell as contexts grew, and the gate
# kept exploring an arm that was far behind (docs/results.md, round 15).
WEIGHT = 0.15
SWITCH_MARGIN = 0.05  # the other arm leads once its rate is this much above the leader's (noise does not flip it)
# Leader blocks between two blocks of the other arm, by how far the leader is ahead (its rate / the other's).
EXPLORE_AFTER = ((1.1, 2), (1.3, 6), (float("inf"), 16))
SERVED_MIN_SEQUENCES = 8  # the orchestrator's `PlanGate(min_sequences)`


class Arm(Enum):
    PLAN = "plan"  # cost-aware sequences plan every step (copies, drafts, their lengths)
    PLAIN = "plain"  # cost-aware sequences verify nothing: plain decoding, in runs where nothing else proposes


@dataclass
class _Load:
    """What the gate knows at one load (running sequences within a power of two): each arm's running rate in
    tokens per ms, and the leader blocks since the other arm last ran."""

    rates: dict[Arm, float | None] = field(default_factory=lambda: {Arm.PLAN: None, Arm.PLAIN: None})
    blocks: dict[Arm, int] = field(default_factory=lambda: {Arm.PLAN: 0, Arm.PLAIN: 0})
    since: dict[Arm, int] = field(default_factory=lambda: {Arm.PLAN: 0, Arm.PLAIN: 0})  # blocks since its last
    led: int = 0
    leading: Arm = Arm.PLAN

    def leader(self) -> Arm:
        """An arm not yet measured, else the leading one, which gives way once the other's running rate is
        SWITCH_MARGIN above its own."""
        plan, plain = self.rates[Arm.PLAN], self.rates[Arm.PLAIN]
        if plan is None:
            return Arm.PLAN
        if plain is None:
            return Arm.PLAIN
        other = _other(self.leading)
        if self.rates[other] > self.rates[self.leading] * (1 + SWITCH_MARGIN):
            self.leading = other
        return self.leading

    def explore_after(self) -> int:
        """Leader blocks before the other arm runs again."""
        plan, plain = self.rates[Arm.PLAN], self.rates[Arm.PLAIN]
        if not plan or not plain:
            return 1
        ahead = max(plan, plain) / min(plan, plain)
        return next(blocks for bound, blocks in EXPLORE_AFTER if ahead < bound)


class PlanGate:
    """The arm of the next call, from the tokens and milliseconds of the calls made on each, learnt apart at
    each load: the rates of both arms grow with the batch, so only rates measured at one load compare."""

    def __init__(self, min_sequences: int = 1) -> None:
        """`min_sequences`: below this many running sequences every call plans, and nothing is learnt."""
        self.min_sequences = min_sequences
        self.loads: dict[int, _Load] = {}  # by load bucket (`bucket`)
        self.arm = Arm.PLAN
        self._bucket: int | None = None  # the load of the current block
        self._calls = 0
        self._tokens = 0
        self._ms = 0.0
        self._warmup = 0  # calls of the current arm still to pass unmeasured

    def choose(self, sequences: int) -> Arm:
        """The arm of a call carrying `sequences` running sequences: the current block's, or on a change of
        load the new load's leader (the block so far is dropped)."""
        if sequences < self.min_sequences:
            self._bucket = None  # (what these calls do is not observed)
            return Arm.PLAN
        bucket = sequences.bit_length()
        if bucket != self._bucket:
            self._bucket, self._calls, self._tokens, self._ms = bucket, 0, 0, 0.0
            self._switch(self.loads.setdefault(bucket, _Load()).leader())
        return self.arm

    def _switch(self, arm: Arm) -> None:
        if arm is not self.arm:
            self.arm, self._warmup = arm, WARMUP_CALLS

    def observe(self, arm: Arm, tokens: int, ms: float) -> None:
        """A call made on `arm` (as `choose` said) committed `tokens` in `ms` (the whole step: planning, drafts,
        forwards, commits, and what its caller did since the previous step). Calls that also prefilled are not
        observed: their time is the new sequences'."""
        if arm is not self.arm or self._bucket is None or ms <= 0:
            return
        if self._warmup:
            self._warmup -= 1
            return
        self._calls, self._tokens, self._ms = self._calls + 1, self._tokens + tokens, self._ms + ms
        if self._calls >= BLOCK_CALLS:
            self._end_block(self.loads[self._bucket])

    def _end_block(self, load: _Load) -> None:
        rate, old = self._tokens / self._ms, load.rates[self.arm]
        load.blocks[self.arm] += 1
        weight = max(1 - (1 - WEIGHT) ** (1 + load.since[self.arm]), 1 / load.blocks[self.arm])
        load.rates[self.arm] = rate if old is None else old + weight * (rate - old)
        load.since[self.arm], load.since[_other(self.arm)] = 0, load.since[_other(self.arm)] + 1
        self._calls, self._tokens, self._ms = 0, 0, 0.0
        leader = load.leader()
        if self.arm is not leader:
            self._switch(leader)
            load.led = 0
            return
        load.led += 1
        if load.led >= load.explore_after():
            self._switch(_other(leader))
            load.led = 0


def _other(arm: Arm) -> Arm:
    return Arm.PLAIN if arm is Arm.PLAN else Arm.PLAN
