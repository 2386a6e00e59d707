"""Whether the cost-aware sequences plan their steps, verify their copies of the context, or decode plainly for a
while: measured, not predicted.

Why: the planner weighs a speculative step against a plain one with the cost model, but the price of
planning itself (copy lookups, acceptance estimates, the length choice, drafter probes, a served step's
round trips that plain decoding spreads over a run of steps) is paid on every planned step whatever it
chooses, and the cost model cannot see it. Where speculation gains less than that price (a large batch on
a target whose verify of many tokens costs nearly what it saves), planning every step loses to plain
decoding, and where the planned steps commit what prompt lookup's would, the planning is paid for nothing (on a
GPU host it cost 0.7 ms a step over prompt lookup's at 8 sequences: docs/history.md, GPU round 24). So the gate runs
its arms in blocks of calls, follows the one that commits the most tokens per millisecond of the whole step, and
keeps trying the others now and then, more often the closer they are. Its arms are the fixed modes a cost-aware
sequence could have been (`Arm`): the plan itself, prompt lookup (where steps are graphed: `arms_for`), plain
decoding. The output does not depend on the arm (each verifies losslessly), so greedy decoding stays equal to plain
decoding whatever the gate chooses. The engine uses it at every load where its steps are graphed, from
EAGER_MIN_SEQUENCES running sequences where they are eager; the orchestrator from SERVED_MIN_SEQUENCES: below these,
planning every step was measured faster (docs/history.md, rounds 13, 14 and 41).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

# Target calls per block of one arm: at least BLOCK_CALLS, and enough that the block carries BLOCK_SEQUENCE_STEPS
# sequence steps. A block's rate swings with whether copies hit in it, and a try of an arm long behind replaces its
# running rate (`WEIGHT`), so one short block decided the arm's next hundreds of calls. One sequence's block of 4 calls
# swung so on a GPU (docs/history.md, GPU round 24); at 8 sequences on the CPU a block of 4 calls of the plan arm on
# translation read 0.99-2.7 tokens/ms while plain decoding's read 1.7-2.4, and the gate decoded plainly in 92% of the
# calls though planning every step ran 1.11 of `ar` (round 31). From 64 sequences a block is BLOCK_CALLS calls.
BLOCK_CALLS = 4
BLOCK_SEQUENCE_STEPS = 256
# A plain decoding block carries fewer: each of its calls commits one token a sequence, so its rate does not swing with
# the text, and where plain decoding is far behind (one sequence on text that copies well) its blocks are the gate's
# exploring cost. At one sequence on the CPU a plain block of 32 calls among the plan arm's cost about 20 steps of the
# ~600 a run takes (docs/history.md, round 29).
PLAIN_BLOCK_SEQUENCE_STEPS = 8
# After a load's switch of arm, its first call is not measured: it carries the switch's own cost (after a plain
# stretch the drafter first appends every position decoded meanwhile), which the arm would not pay while it led;
# counted, it would tilt the comparison toward the arm in the lead. (A call at another load between two of this
# load's is not a switch: a warm-up per such call would leave loads that alternate on different arms unmeasured.)
WARMUP_CALLS = 1
# Of a block's rate in its arm's running rate: the mean of an arm's first blocks, then this weight per block of
# any arm since the arm's rate was last updated (the load's regime is followed, not each text's turns; a first
# block measured at a bad moment does not linger). An arm explored after n leader blocks weighs its new block as
# the leader's rate weighed those n blocks together: both rates then cover the same recent time. With a fixed
# weight a rarely run arm kept a rate from minutes before, while the leader's fell as contexts grew, and the gate
# kept exploring an arm that was far behind (docs/history.md, round 15).
WEIGHT = 0.15
SWITCH_MARGIN = 0.05  # another arm leads once its rate is this much above the leader's (noise does not flip it)
# Another arm leads plain decoding only where its rate is this much above plain's (`plain_preference`): PLAIN_PREFERENCE
# from FULL_PREFERENCE_FROM sequences, SMALL_PLAIN_PREFERENCE below. Why: the calls the gate observes
# are not all a speculating arm costs. Its sequences advance out of step, so they end one by one and each admission
# prefills alone, where plain decoding's end together and prefill together; a batch's last sequences then run in a
# shrinking batch. On the CPU at 8 sequences the plan arm's observed calls ran plain's rate while whole runs on it
# took 0.87-0.90 of plain's throughput (docs/history.md, round 26). On cost tables timed in order (round 30) whole runs
# took 0.955-1.031 of what the calls promised, but a 3% preference then let the plan arm lead in half the calls of math
# at 64 sequences, where its whole runs were 0.87 of plain's: a block's rate swings with the text, and the preference
# also keeps a lucky block from displacing plain decoding, whose rate does not swing. One sequence alone has no one to
# be out of step with: there the rates compare as they are. Below 64 sequences the smaller preference: once the plan
# arm's copies followed matches of up to 16 tokens (`planner.COPY_MATCH`), 5% gained over 10% at 8 and 32 sequences
# and lost at 64, where a batch out of step costs more at its ragged end (docs/history.md, engine speed round 36).
PLAIN_PREFERENCE = 0.10
SMALL_PLAIN_PREFERENCE = 0.05
FULL_PREFERENCE_FROM = 64
# An arm that does not lead is tried again once the leader's blocks since its last try are enough that the try costs
# at most EXPLORE_REGRET of the leader's rate: one block at 1/ahead of the leader's score in every n + 1, where the
# leader's score is `ahead` times the arm's, costs (1 - 1/ahead) / (n + 1); so n is at most 1 / EXPLORE_REGRET - 1
# (an arm that commits nothing) and at least EXPLORE_AFTER_FEWEST (close arms stay compared). With two arms behind,
# each is allowed half the regret (it waits twice as many blocks), so that trying both costs what trying one would.
# Why: the fixed steps before (2 blocks within 10%, 6 within 30%, else 16) cost up to 2.5-4% of the leader's rate
# wherever one arm is best, the size of what the 0.97 bar leaves the gate (docs/history.md, round 27); the price is
# a slower look at an arm far behind (at 8 sequences on the CPU a block is about 20 ms, so 99 of them take 2 s).
EXPLORE_REGRET = 0.01
EXPLORE_AFTER_FEWEST = 2
# An arm tried again and still found clearly behind (its score more than CLEARLY_BEHIND below the leader's) is allowed
# half its regret for its next try, down to a 2**EXPLORE_BACKOFF-th; found within reach, or once another arm leads, the
# whole regret again. Why: at a steady load the same verdict, found try after try, cost the whole regret for good; at
# one sequence on the CPU the plain arm's blocks kept a load ~1% behind the plan arm's own rate (docs/history.md,
# round 30). Arms within reach of each other stay compared as often as before, and one far behind is still tried.
EXPLORE_BACKOFF = 2
CLEARLY_BEHIND = 2 * SWITCH_MARGIN
# An arm measured in fewer blocks than this is tried again after EXPLORE_AFTER_FEWEST blocks, however far behind it
# looked: one block is not a verdict. At one sequence a first plan block of text that did not copy put the plan arm 30%
# behind plain decoding, and the load then decoded plainly for 666 of its first 980 calls (docs/history.md, round 29).
CONFIRM_BLOCKS = 2
# A try that puts an arm past the leader is followed by a second block of that arm before the lead changes, the two
# blocks weighing alike in its rate. Why: a try of an arm long behind replaces its rate (`WEIGHT`), and blocks of one
# arm at one load swing with the text: at 32 sequences on the CPU a try of the plan arm read 3.94 tokens/ms where its
# blocks read 2.6-3.4, it took the lead, and the load ran four more plan blocks before plain decoding led again, in a
# cell where planning every step ran 0.91 of `ar` (docs/history.md, engine speed round 32).
CONFIRM_WEIGHT = 0.5
SERVED_MIN_SEQUENCES = 8  # the orchestrator's `PlanGate(min_sequences)`
# The engine's `PlanGate(min_sequences)` where its steps are eager (a CPU): up to 8 sequences every call plans. Why:
# there the gate's blocks, tries and switches cost more than it saved. Paired with planning every step in the same
# rounds of the CPU's gate benchmarks, the gate was behind at one and at eight sequences, and at eight it missed the
# 0.97 bar in more cells. Where it held a code load on plain decoding, whose calls there commit less a ms than the
# plan arm's, whole runs lost to planning every step (docs/history.md, engine speed round 41). Where steps are graphed
# the copy arm is the gate's lever at low loads (GPU round 25), so there it decides from one sequence.
EAGER_MIN_SEQUENCES = 9
# Where no request waits, the running sequences only drain. A token that a speculative step commits early is then one
# its sequence would have committed later anyway, in a step that runs whether or not (unless it shortens the longest
# sequence), so it saves only what one more token of that later step costs, while the gate's rates credit each token
# at what a step costs a sequence. From this `CostModel.marginal_share` (a forward bound by its arithmetic: a CPU under
# load) such calls decode plainly, and the gate is neither asked nor taught (`Scheduler._drains`). On the CPU that
# gained where the gate had missed the bar (math and chat at 64 sequences) and cost multilingual about a point
# (docs/history.md, engine speed round 40). Where a verified token costs little more than the step (a GPU's small
# batches), the gate decides as before.
DRAIN_MARGINAL_SHARE = 0.55


def plain_preference(sequences: int) -> float:
    """How far above plain decoding's rate another arm must run to lead a load whose fewest sequences are
    `sequences`."""
    if sequences <= 1:
        return 0.0
    return PLAIN_PREFERENCE if sequences >= FULL_PREFERENCE_FROM else SMALL_PLAIN_PREFERENCE


class Arm(Enum):
    PLAN = "plan"  # cost-aware sequences plan every step (copies, drafts, their lengths)
    COPY = "copy"  # cost-aware sequences verify their copy of the context whole, as prompt lookup (`ngram`) does
    PLAIN = "plain"  # cost-aware sequences verify nothing: plain decoding, in runs where nothing else proposes


ARMS = (Arm.PLAN, Arm.COPY, Arm.PLAIN)  # in the order a load first measures them


def engine_min_sequences(padded: bool) -> int:
    """The fewest running sequences at which the engine's gate decides: every load where steps are `padded`
    (graphed), else EAGER_MIN_SEQUENCES."""
    return 1 if padded else EAGER_MIN_SEQUENCES


def arms_for(copies: bool, padded: bool) -> tuple[Arm, ...]:
    """The arms of a gate: the copy arm where the planner may copy and the target's steps are padded (graphed), whose
    host work a plan's adds to; else plan and plain. Where the forward dominates a step (eager, a CPU) the plan arm's
    own copies already do what prompt lookup does, and the copy arm only cost its exploration: its blocks of whole
    copies are slow calls there (docs/history.md, round 25, the CPU A/B)."""
    return ARMS if copies and padded else (Arm.PLAN, Arm.PLAIN)


def block_calls(sequences: int, arm: Arm = Arm.PLAN) -> int:
    """Calls in one block of `arm` at a load of `sequences`."""
    steps = PLAIN_BLOCK_SEQUENCE_STEPS if arm is Arm.PLAIN else BLOCK_SEQUENCE_STEPS
    return max(BLOCK_CALLS, -(-steps // max(sequences, 1)))


@dataclass
class Totals:
    """Calls, the tokens they committed and their milliseconds: a block under way, or the calls observed on one arm
    over the gate's life, warm-ups included (what a benchmark reads of where a run's time went); and the tokens plain
    decoding commits in those milliseconds at those calls' loads (`PlanGate.observe`)."""

    calls: int = 0
    tokens: int = 0
    ms: float = 0.0
    plain: float = 0.0

    def add(self, tokens: int, ms: float, plain_rate: float = 1.0) -> None:
        self.calls, self.tokens, self.ms = self.calls + 1, self.tokens + tokens, self.ms + ms
        self.plain += ms * plain_rate


@dataclass
class _Load:
    """What the gate knows at one load (running sequences within a power of two): each arm's running rate (tokens
    committed per token plain decoding commits in the time at the calls' loads, `PlanGate.observe`), its blocks, the
    blocks of any arm since it last ran, and the block under way (its arm and what its calls so far committed). A
    load keeps its own block: where the load moves between two powers of two (sequences end and others join around
    32), the calls at each add to that load's block, which another load's calls between them do not cut."""

    arms: tuple[Arm, ...]
    plain_preference: float = PLAIN_PREFERENCE
    sequences: int = 1  # the fewest running sequences of this load: what its blocks' calls carry (`block_calls`)
    rates: dict[Arm, float | None] = field(init=False)
    blocks: dict[Arm, int] = field(init=False)
    since: dict[Arm, int] = field(init=False)
    halvings: dict[Arm, int] = field(init=False)  # of an arm's regret, one per try that found it clearly behind
    leading: Arm | None = None  # once every arm is measured
    arm: Arm = field(init=False)  # of the block under way
    warmup: int = 0  # its calls still to pass unmeasured after the load's change of arm
    block: Totals = field(default_factory=Totals)  # what the block's measured calls committed so far
    confirming: bool = False  # the block under way is a second try of an arm whose try put it past the leader

    def __post_init__(self) -> None:
        self.rates = {arm: None for arm in self.arms}
        self.blocks = {arm: 0 for arm in self.arms}
        self.since = {arm: 0 for arm in self.arms}
        self.halvings = {arm: 0 for arm in self.arms}
        self.arm = self.leader()

    def add(self, tokens: int, ms: float, plain_rate: float) -> bool:
        """A measured call of the block's arm; whether the block is complete."""
        self.block.add(tokens, ms, plain_rate)
        return self.block.calls >= block_calls(self.sequences, self.arm)

    def end_block(self) -> None:
        """Fold the block's rate into its arm's running rate, and start the next block on the leader or on an arm
        overdue for another try."""
        rate, old = self.block.tokens / self.block.plain, self.rates[self.arm]
        self.blocks[self.arm] += 1
        weight = CONFIRM_WEIGHT if self.confirming else max(1 - (1 - WEIGHT) ** (1 + self.since[self.arm]),
                                                            1 / self.blocks[self.arm])
        self.rates[self.arm] = rate if old is None else old + weight * (rate - old)
        for arm in self.arms:
            self.since[arm] = 0 if arm is self.arm else self.since[arm] + 1
        self.block = Totals()
        self.confirming = not self.confirming and self._challenges()
        if self.confirming:
            return
        before = self.leading
        leader = self.leader()
        self._follow_verdict(before, leader)
        arm = self.overdue(leader) or leader
        if arm is not self.arm:
            self.arm, self.warmup = arm, WARMUP_CALLS

    def _challenges(self) -> bool:
        """Whether the block just ended was a try that puts its arm SWITCH_MARGIN past the leader's score: the lead
        changes only if a second block of it, weighed as much as the try, keeps it there (CONFIRM_WEIGHT)."""
        leading = self.leading
        return (leading is not None and self.arm is not leading
                and self.score(self.arm) > self.score(leading) * (1 + SWITCH_MARGIN))

    def _follow_verdict(self, before: Arm | None, leader: Arm) -> None:
        """The regret halvings after a block: all back to none where the lead changed hands; else the block's arm, if
        it does not lead, one more where it is clearly behind (EXPLORE_BACKOFF) and none where it is within reach. An
        arm's first CONFIRM_BLOCKS blocks are no verdict: at one sequence a block's rate swings with the text."""
        if before is not leader:
            self.halvings = dict.fromkeys(self.arms, 0)
        elif self.arm is not leader:
            clearly = (self.blocks[self.arm] > CONFIRM_BLOCKS
                       and self.score(self.arm) < self.score(leader) * (1 - CLEARLY_BEHIND))
            self.halvings[self.arm] = min(self.halvings[self.arm] + 1, EXPLORE_BACKOFF) if clearly else 0

    def leader(self) -> Arm:
        """An arm not yet measured, else the leading one: at first the best by its score (`score`), then the one
        leading until another's score is SWITCH_MARGIN above its own."""
        for arm in self.arms:
            if self.rates[arm] is None:
                return arm
        best = max(self.arms, key=self.score)
        if self.leading is None or self.score(best) > self.score(self.leading) * (1 + SWITCH_MARGIN):
            self.leading = best
        return self.leading

    def score(self, arm: Arm) -> float:
        """An arm's running rate, plain decoding's raised by the load's `plain_preference`."""
        return self.rates[arm] * (1 + self.plain_preference if arm is Arm.PLAIN else 1)

    def overdue(self, leader: Arm) -> Arm | None:
        """The arm to try again after a block of `leader`: of those that waited their blocks (EXPLORE_REGRET), the
        one furthest past it (none while `leader` is an arm not yet measured)."""
        if self.rates[leader] is None:
            return None
        waited = {arm: self.since[arm] - self._explore_after(leader, arm) for arm in self.arms if arm is not leader}
        due = [arm for arm, past in waited.items() if past >= 0]
        return max(due, key=lambda arm: waited[arm]) if due else None

    def _explore_after(self, leader: Arm, arm: Arm) -> int:
        """The leader's blocks before `arm` is tried again. Where the arms' blocks differ in calls (a plain block is
        shorter, `block_calls`), the wait is in the leader's calls: a long block tried after short ones costs more."""
        others = len(self.arms) - 1  # arms behind, each allowed its share of the regret
        if self.blocks[arm] < CONFIRM_BLOCKS:
            return EXPLORE_AFTER_FEWEST * others
        behind = 1 - self.score(arm) / self.score(leader) if self.rates[arm] else 1.0  # of the leader's score
        calls = block_calls(self.sequences, arm) / block_calls(self.sequences, leader)
        regret = EXPLORE_REGRET / 2 ** self.halvings[arm]
        return max(EXPLORE_AFTER_FEWEST * others, math.ceil(calls * (others * behind / regret - 1)))


class PlanGate:
    """The arm of the next call, from the tokens and milliseconds of the calls made on each, learnt apart at
    each load: the rates of every arm grow with the batch, so only rates measured at one load compare."""

    def __init__(self, min_sequences: int = 1, arms: tuple[Arm, ...] = ARMS,
                 plain_preference: Callable[[int], float] = plain_preference) -> None:
        """`min_sequences`: below this many running sequences every call plans, and nothing is learnt. `arms`: those
        the gate chooses from (`arms_for`), Arm.PLAN first. `plain_preference`: a load's, from its fewest sequences."""
        if arms[0] is not Arm.PLAN or Arm.PLAIN not in arms:
            raise ValueError("a gate's arms start with Arm.PLAN and include Arm.PLAIN")
        self.min_sequences, self.arms, self.plain_preference = min_sequences, arms, plain_preference
        self.loads: dict[int, _Load] = {}  # by load bucket (`bucket`)
        self._load: _Load | None = None  # of the last call (None: below min_sequences)
        self.totals = {arm: Totals() for arm in arms}

    def choose(self, sequences: int) -> Arm:
        """The arm of a call carrying `sequences` running sequences: that load's block's."""
        if sequences < self.min_sequences:
            self._load = None  # (what these calls do is not observed)
            return Arm.PLAN
        bucket = sequences.bit_length()
        if bucket not in self.loads:
            fewest = 1 << (bucket - 1)
            self.loads[bucket] = _Load(self.arms, self.plain_preference(fewest), fewest)
        self._load = self.loads[bucket]
        return self._load.arm

    def observe(self, arm: Arm, tokens: int, ms: float, plain_rate: float = 1.0) -> None:
        """A call made on `arm` (as `choose` said) committed `tokens` in `ms` (the whole step: planning, drafts,
        forwards, commits, and what its caller did since the previous step), where plain decoding commits
        `plain_rate` tokens a ms at the call's sequences (`CostModel.plain_rate`; 1: rates compare as they are). Calls
        that also prefilled are not observed: their time is the new sequences'.

        Why the yardstick: a load spans up to twice the sequences, and a call's tokens per ms grow with them whatever
        its arm, so blocks taken at different sequences of one load compared the sequences as much as the arms. On
        the CPU, while a burst of 64 sequences fell through the 32-63 load, plain decoding's own blocks there read 4.1
        tokens/ms at 60-63 sequences and 3.4 at 32-34, and the plan arm's blocks from that fall led the load on into
        the next cell's 32 sequences, where planning every step ran 0.91 of `ar` (docs/history.md, engine speed round
        32)."""
        load = self._load
        if load is None or arm is not load.arm or ms <= 0:
            return
        self.totals[arm].add(tokens, ms)
        if load.warmup:
            load.warmup -= 1
        elif load.add(tokens, ms, plain_rate):
            load.end_block()
