"""The plan gate: blocks of calls on each arm, the fastest arm followed at each load, the others tried again."""

from __future__ import annotations

import dataclasses
import random

import pytest

from helpers import fixed_costs, random_prompts

from adaflash.decoding import gate as gate_module
from adaflash.decoding.costs import CostModel
from adaflash.decoding.engine import Engine
from adaflash.decoding.gate import (ARMS, BLOCK_CALLS, BLOCK_SEQUENCE_STEPS, CLEARLY_BEHIND, CONFIRM_BLOCKS,
                                   DRAIN_MARGINAL_SHARE, EAGER_MIN_SEQUENCES, EXPLORE_AFTER_FEWEST, EXPLORE_BACKOFF, EXPLORE_REGRET,
                                   FULL_PREFERENCE_FROM, PLAIN_BLOCK_SEQUENCE_STEPS, PLAIN_PREFERENCE,
                                   SMALL_PLAIN_PREFERENCE, SWITCH_MARGIN, WARMUP_CALLS, WEIGHT, Arm, PlanGate, arms_for,
                                   block_calls, plain_preference)
from adaflash.decoding.sequence import Request

TWO = (Arm.PLAN, Arm.PLAIN)  # a gate without the copy arm: what the rules do between two arms
EVEN = 64  # sequences at which every arm's block is BLOCK_CALLS calls: the regret's waits read in blocks there


def run_blocks(gate: PlanGate, sequences: int, rates: dict[Arm, float], blocks: int) -> list[Arm]:
    """Feed `blocks` blocks of calls whose rate is the arm's in `rates` (tokens per ms); the arm of each block."""
    arms = []
    for _ in range(blocks):
        arm = gate.choose(sequences)
        arms.append(arm)
        load = gate.loads[sequences.bit_length()]
        ended = sum(load.blocks.values())
        for _ in range(block_calls(sequences) + WARMUP_CALLS):
            assert gate.choose(sequences) is arm
            gate.observe(arm, round(rates[arm] * 100), 100.0)
            if sum(load.blocks.values()) > ended:
                break
        assert sum(load.blocks.values()) == ended + 1
    return arms


def test_both_arms_are_measured_first_then_the_faster_one_leads():
    gate = PlanGate(arms=TWO)
    arms = run_blocks(gate, 8, {Arm.PLAN: 1.0, Arm.PLAIN: 3.0}, 3)
    assert arms == [Arm.PLAN, Arm.PLAIN, Arm.PLAIN]
    gate = PlanGate(arms=TWO)
    assert run_blocks(gate, 8, {Arm.PLAN: 3.0, Arm.PLAIN: 1.0}, 3) == [Arm.PLAN, Arm.PLAIN, Arm.PLAN]


def tries(arms: list[Arm], arm: Arm) -> list[int]:
    """The blocks between two successive tries of `arm`."""
    tried = [i for i, a in enumerate(arms) if a is arm]
    return [b - a for a, b in zip(tried, tried[1:])]


def explored(ahead: float) -> tuple[int, float]:
    """Two arms, plain decoding `ahead` times the plan arm's rate at EVEN sequences (its score PLAIN_PREFERENCE above
    that): the blocks from one try of the plan arm to the next once they are steady (every halving of the regret
    taken), and the share of the leader's score trying it costs."""
    assert block_calls(EVEN, Arm.PLAN) == block_calls(EVEN, Arm.PLAIN) == BLOCK_CALLS
    gate = PlanGate(arms=TWO)
    blocks = 2 + int(6 * 2**EXPLORE_BACKOFF / EXPLORE_REGRET)
    arms = run_blocks(gate, EVEN, {Arm.PLAN: 1.0, Arm.PLAIN: ahead}, blocks)[2:]
    gaps = tries(arms, Arm.PLAN)[EXPLORE_BACKOFF:]
    assert len(gaps) >= 3 and len(set(gaps)) == 1  # a steady interval
    return gaps[0], (1 - 1 / (ahead * (1 + PLAIN_PREFERENCE))) / gaps[0]


@pytest.mark.parametrize("ahead", [0.92, 1.08, 1.2, 3.0, 100.0])
def test_trying_the_arm_behind_costs_at_most_the_regret_however_far_behind_it_is(ahead):
    every, cost = explored(ahead)
    assert cost <= EXPLORE_REGRET and every >= EXPLORE_AFTER_FEWEST + 1


def test_the_arm_behind_is_tried_less_often_the_further_the_leader_is_ahead_but_still_tried():
    """An arm within a few percent is compared every few blocks; one that commits next to nothing still once in
    2**EXPLORE_BACKOFF / EXPLORE_REGRET blocks (the text or the load may change)."""
    gaps = [explored(ahead)[0] for ahead in (0.92, 1.08, 1.2, 3.0, 100.0)]
    assert gaps == sorted(gaps) and gaps[0] == EXPLORE_AFTER_FEWEST + 1 and gaps[1] < gaps[2] < gaps[3]
    assert round(2**EXPLORE_BACKOFF / EXPLORE_REGRET) - 2**EXPLORE_BACKOFF <= gaps[-1] <= round(
        2**EXPLORE_BACKOFF / EXPLORE_REGRET)  # (it commits a hundredth of the leader's tokens: within a block a halving)


def test_an_arm_found_clearly_behind_try_after_try_is_allowed_less_regret_until_it_comes_within_reach(monkeypatch):
    """Each try past its first CONFIRM_BLOCKS that finds the arm behind still more than CLEARLY_BEHIND halves its regret, so its
    waits double, up to EXPLORE_BACKOFF halvings; a try that finds it within reach gives it the whole regret again, as
    does a change of leader. An arm close behind keeps its whole regret."""
    far = {Arm.PLAN: 2.0, Arm.PLAIN: 1.0}
    blocks = 4 + int(3 * 2**EXPLORE_BACKOFF / EXPLORE_REGRET)
    with monkeypatch.context() as m:
        m.setattr(gate_module, "EXPLORE_BACKOFF", 0)
        whole = tries(run_blocks(PlanGate(arms=TWO), EVEN, far, blocks), Arm.PLAIN)[1:]
    assert len(set(whole)) == 1
    gate = PlanGate(arms=TWO)
    gaps = tries(run_blocks(gate, EVEN, far, blocks), Arm.PLAIN)[1:]
    assert [round(g / whole[0]) for g in gaps[:4]] == [1, 2, 4, 4] and gaps[3] == gaps[2] and EXPLORE_BACKOFF == 2
    load = gate.loads[EVEN .bit_length()]
    assert load.halvings[Arm.PLAIN] == EXPLORE_BACKOFF
    near = {Arm.PLAN: 2.0, Arm.PLAIN: 2.0 * (1 - CLEARLY_BEHIND / 2) / (1 + PLAIN_PREFERENCE)}
    for _ in range(blocks):
        if run_blocks(gate, EVEN, near, 1) == [Arm.PLAIN]:
            break
    assert load.halvings[Arm.PLAIN] == 0 and load.leader() is Arm.PLAN
    close = PlanGate(arms=TWO)
    assert len(set(tries(run_blocks(close, EVEN, near, 4 + 60)[4:], Arm.PLAIN))) == 1
    switched = PlanGate()  # both arms behind the copy arm clearly, then the plan arm ahead of it
    run_blocks(switched, EVEN, {Arm.PLAN: 1.0, Arm.COPY: 3.0, Arm.PLAIN: 1.0}, 2 * blocks)
    load = switched.loads[EVEN .bit_length()]
    assert load.halvings == {Arm.PLAN: EXPLORE_BACKOFF, Arm.COPY: 0, Arm.PLAIN: EXPLORE_BACKOFF}
    ahead = {Arm.PLAN: 6.0, Arm.COPY: 3.0, Arm.PLAIN: 1.0}
    for _ in range(2 * blocks):
        if run_blocks(switched, EVEN, ahead, 1) == [Arm.PLAN]:
            break
    assert run_blocks(switched, EVEN, ahead, 1) == [Arm.PLAN]  # the try confirmed (CONFIRM_WEIGHT)
    assert load.leader() is Arm.PLAN and load.halvings[Arm.PLAIN] == 0  # its verdict was against another leader


def until_tried(gate: PlanGate, rates: dict[Arm, float], arm: Arm) -> None:
    """Blocks at EVEN sequences until one runs on `arm` (within a bound)."""
    for _ in range(1000):
        if run_blocks(gate, EVEN, rates, 1) == [arm]:
            return
    raise AssertionError(f"{arm} was not tried")


def test_a_try_that_puts_an_arm_ahead_takes_the_lead_only_if_a_second_block_keeps_it_there(monkeypatch):
    """The plan arm, long behind plain decoding, reads 1.4 in one try and 0.8 as before in the next block: the gate
    runs that second block, the two weigh alike (CONFIRM_WEIGHT), and plain decoding still leads. Taken on the try
    alone, the lead went to the plan arm for more blocks. Two good blocks take it."""
    steady, lucky = {Arm.PLAN: 0.8, Arm.PLAIN: 1.0}, {Arm.PLAN: 1.4, Arm.PLAIN: 1.0}

    def after_lucky_try(gate: PlanGate) -> list[Arm]:
        run_blocks(gate, EVEN, steady, 40)
        assert gate.loads[EVEN .bit_length()].leader() is Arm.PLAIN
        until_tried(gate, lucky, Arm.PLAN)
        return run_blocks(gate, EVEN, steady, 2)

    gate = PlanGate(arms=TWO)
    assert after_lucky_try(gate) == [Arm.PLAN, Arm.PLAIN] and gate.loads[EVEN .bit_length()].leading is Arm.PLAIN
    with monkeypatch.context() as m:
        m.setattr(gate_module._Load, "_challenges", lambda self: False)
        assert after_lucky_try(PlanGate(arms=TWO)) == [Arm.PLAN, Arm.PLAN]
    good = PlanGate(arms=TWO)
    run_blocks(good, EVEN, steady, 40)
    until_tried(good, lucky, Arm.PLAN)
    assert run_blocks(good, EVEN, lucky, 3) == [Arm.PLAN] * 3
    assert good.loads[EVEN .bit_length()].leader() is Arm.PLAN


def test_a_change_of_leader_is_followed():
    gate = PlanGate(arms=TWO)
    run_blocks(gate, 1, {Arm.PLAN: 2.0, Arm.PLAIN: 1.0}, 6)
    arms = run_blocks(gate, 1, {Arm.PLAN: 0.5, Arm.PLAIN: 1.0}, 24)
    assert gate.loads[1].leader() is Arm.PLAIN and arms.count(Arm.PLAIN) > arms.count(Arm.PLAN)


def test_each_load_is_learnt_apart():
    """Rates at one sequence do not decide for 64: both arms are measured there anew, and the first load's
    choice is still known when it comes back."""
    gate = PlanGate(arms=TWO)
    run_blocks(gate, 1, {Arm.PLAN: 2.0, Arm.PLAIN: 1.0}, 5)  # each arm measured twice (CONFIRM_BLOCKS)
    assert run_blocks(gate, 64, {Arm.PLAN: 10.0, Arm.PLAIN: 30.0}, 4) == [Arm.PLAN, Arm.PLAIN, Arm.PLAIN, Arm.PLAN]
    assert gate.choose(1) is Arm.PLAN
    assert gate.choose(100) is Arm.PLAIN  # 64 to 127 sequences: one load


def test_a_load_s_block_carries_on_across_calls_at_another_load():
    """Sequences ending and others joining move the load across a power of two from call to call (31, 32, 31..):
    each load's calls add to its own block, which the other load's calls between them do not cut, so both loads
    learn both arms (when a change of load dropped the block under way, neither ever completed one)."""
    gate = PlanGate(arms=TWO)
    for _ in range(4 * block_calls(32)):
        for sequences in (31, 32):
            gate.observe(gate.choose(sequences), 100, 1.0)
    for load in (gate.loads[31 .bit_length()], gate.loads[32 .bit_length()]):
        assert None not in load.rates.values()
    half, calls = PlanGate(arms=TWO), block_calls(8)
    for _ in range(calls - 1):
        half.observe(half.choose(8), 100, 1.0)
    half.observe(half.choose(16), 100, 1.0)
    assert half.loads[8 .bit_length()].rates[Arm.PLAN] is None
    half.observe(half.choose(8), 300, 1.0)  # the block's last call, after the other load's
    assert half.loads[8 .bit_length()].rates[Arm.PLAN] == pytest.approx((100.0 * (calls - 1) + 300.0) / calls)


def test_calls_of_the_other_arm_or_without_time_are_not_counted():
    gate = PlanGate(arms=TWO)
    gate.choose(4)
    for _ in range(3 * block_calls(4)):
        gate.observe(Arm.PLAIN, 100, 1.0)
        gate.observe(Arm.PLAN, 100, 0.0)
    assert gate.loads[4 .bit_length()].rates == {Arm.PLAN: None, Arm.PLAIN: None} and gate.choose(4) is Arm.PLAN


def test_the_leader_keeps_its_place_within_the_margin():
    """Scores within SWITCH_MARGIN of each other: the arm leading stays, whichever is a little ahead."""
    gate = PlanGate(arms=TWO)
    run_blocks(gate, 2, {Arm.PLAN: 1.5, Arm.PLAIN: 1.0}, 4)
    assert gate.loads[2].leader() is Arm.PLAN
    arms = run_blocks(gate, 2, {Arm.PLAN: 1.0, Arm.PLAIN: (1.0 + SWITCH_MARGIN / 2) / (1 + plain_preference(2))}, 40)
    assert arms[2:].count(Arm.PLAN) > arms[2:].count(Arm.PLAIN)


def test_an_arm_s_first_blocks_count_alike():
    """The running rate starts as the mean of an arm's blocks, so a first block measured at a bad moment does
    not outweigh the next ones."""
    gate = PlanGate(arms=TWO)
    run_blocks(gate, 1, {Arm.PLAN: 1.0, Arm.PLAIN: 0.5}, 1)
    run_blocks(gate, 1, {Arm.PLAN: 3.0, Arm.PLAIN: 0.5}, 2)
    assert gate.loads[1].rates[Arm.PLAN] == pytest.approx(2.0)


def test_the_first_call_after_a_switch_is_not_measured():
    """It carries the switch's own cost (the drafter's catch-up after a plain stretch), which the arm would not pay
    while leading."""
    gate = PlanGate(arms=TWO)
    run_blocks(gate, 8, {Arm.PLAN: 1.0, Arm.PLAIN: 1.0}, 1)
    assert gate.choose(8) is Arm.PLAIN
    gate.observe(Arm.PLAIN, 1, 1000.0)  # a slow first call
    for _ in range(block_calls(8)):
        gate.observe(Arm.PLAIN, 200, 100.0)
    assert gate.loads[8 .bit_length()].rates[Arm.PLAIN] == pytest.approx(2.0)


def test_below_its_minimum_load_every_call_plans_and_nothing_is_learnt():
    """A gate with a minimum load (`min_sequences`: the orchestrator's, an eager engine's): fewer running sequences plan
    every call, however fast plain decoding looked at a higher load, and their calls teach nothing; from the minimum
    on it decides as before."""
    gate = PlanGate(min_sequences=8, arms=TWO)
    for _ in range(3 * (block_calls(7) + WARMUP_CALLS)):
        assert gate.choose(7) is Arm.PLAN
        gate.observe(Arm.PLAN, 1, 100.0)
    assert gate.loads == {}
    assert run_blocks(gate, 8, {Arm.PLAN: 1.0, Arm.PLAIN: 3.0}, 4) == [Arm.PLAN, Arm.PLAIN, Arm.PLAIN, Arm.PLAN]
    assert gate.choose(2) is Arm.PLAN
    gate.observe(Arm.PLAN, 1, 100.0)
    assert gate.loads[8 .bit_length()].blocks == {Arm.PLAN: 2, Arm.PLAIN: 2}
    assert gate.choose(8) is Arm.PLAIN


def test_an_eager_engine_plans_every_call_up_to_eight_sequences_and_a_graphed_one_s_gate_decides_from_one(
        trained_tiny):
    """Where steps are eager the gate's blocks and tries cost more than they save at low loads (`EAGER_MIN_SEQUENCES`):
    a batch of eight plans every call and teaches the gate nothing, with plain decoding's output. Where steps are graphed
    the gate decides from one sequence (its copy arm)."""
    bundle = trained_tiny
    prompts = random_prompts(10, seed=43)
    eager = Engine(bundle.target, bundle.drafter, num_slots=8, max_len=96, cost_model=fixed_costs(8))
    seqs = eager.generate([Request(p, 16, mode="adaflash", stop_ids=()) for p in prompts], concurrency=8)
    assert eager.speculation.gate.loads == {} and eager.speculation.gate.totals[Arm.PLAN].calls == 0
    assert eager.speculation.gate.min_sequences == EAGER_MIN_SEQUENCES
    assert any(st.draft_len for s in seqs for st in s.steps)
    ar = Engine(bundle.target, None, num_slots=8, max_len=96)
    assert [s.output for s in seqs] == [s.output for s in ar.generate([Request(p, 16, stop_ids=()) for p in prompts])]
    graphed = dataclasses.replace(fixed_costs(8), padded=True)
    assert Engine(bundle.target, bundle.drafter, num_slots=8, max_len=96,
                  cost_model=graphed).speculation.gate.min_sequences == 1


def test_an_arm_run_again_after_many_leader_blocks_catches_up_with_its_new_rate_at_once():
    """The other arm's new block weighs as much as the leader's rate gave the blocks since it last ran: a rate
    left from long before does not keep the gate on an arm that has fallen behind (with a fixed weight, one
    block moved plain's stale 1.0 only to ~2.0, short of the leader's 2.0 plus the margin)."""
    gate = PlanGate(arms=TWO)
    run_blocks(gate, 8, {Arm.PLAN: 2.0, Arm.PLAIN: 1.0}, 40)
    load = gate.loads[8 .bit_length()]
    assert load.leader() is Arm.PLAN and load.blocks[Arm.PLAN] > 1 / WEIGHT
    arms = []
    while Arm.PLAIN not in arms:
        arms += run_blocks(gate, 8, {Arm.PLAN: 2.0, Arm.PLAIN: 4.0}, 1)
    assert load.rates[Arm.PLAIN] > 3.5 and load.leader() is Arm.PLAIN


def test_arms_run_at_different_sequences_of_one_load_compare_against_plain_decodings_rate_at_each():
    """A load spans up to twice the sequences, and a call's tokens per ms grow with them whatever its arm. Where the
    plan arm's blocks ran at 60 sequences (5.0 tokens/ms where plain decoding commits 5.5) and plain decoding's at 32
    (4.0 where it commits 4.0), plain decoding leads; compared as they are, the plan arm would (5.0 against 4.4 with
    plain's preference)."""
    plain_rate = {60: 5.5, 32: 4.0}
    runs = {Arm.PLAN: (60, 5.0), Arm.PLAIN: (32, 4.0)}
    for yardstick in (True, False):
        gate = PlanGate(arms=TWO)
        for _ in range(6 * (BLOCK_CALLS + WARMUP_CALLS)):
            sequences, rate = runs[gate.choose(32)]
            gate.observe(gate.choose(sequences), round(rate * 100), 100.0, plain_rate[sequences] if yardstick else 1.0)
        leader = gate.loads[32 .bit_length()].leader()
        assert leader is (Arm.PLAIN if yardstick else Arm.PLAN)


def test_three_arms_are_measured_in_turn_then_the_fastest_leads():
    gate = PlanGate()
    arms = run_blocks(gate, 8, {Arm.PLAN: 1.0, Arm.COPY: 3.0, Arm.PLAIN: 2.0}, 5)
    assert arms == [Arm.PLAN, Arm.COPY, Arm.PLAIN, Arm.COPY, Arm.COPY]


def test_each_arm_behind_is_tried_again_as_often_as_its_own_distance_says():
    """Plain decoding close behind the copy arm is tried every few blocks, the plan arm far behind rarely; with two
    arms behind, each half as often as one arm behind would be."""
    gate = PlanGate()
    rates = {Arm.PLAN: 1.0, Arm.COPY: 3.0, Arm.PLAIN: 2.6}
    scores = {**rates, Arm.PLAIN: rates[Arm.PLAIN] * (1 + PLAIN_PREFERENCE)}
    arms = run_blocks(gate, EVEN, rates, 3 + int(6 * 2**EXPLORE_BACKOFF / EXPLORE_REGRET))[3:]
    assert arms.count(Arm.COPY) > arms.count(Arm.PLAIN) > arms.count(Arm.PLAN) > 0
    cost = 0.0
    for arm in (Arm.PLAN, Arm.PLAIN):
        gaps = tries(arms, arm)[EXPLORE_BACKOFF:]  # the plan arm's once its regret's halvings are all taken
        assert len(gaps) >= 2 and max(gaps) - min(gaps) <= 1  # delayed at most by the other's turn
        cost += (1 - scores[arm] / scores[Arm.COPY]) / min(gaps)
    assert cost <= EXPLORE_REGRET  # both arms behind together


def test_a_block_carries_as_many_sequence_steps_at_every_load():
    """One sequence's block of four calls swung with whether its copies hit: a block spans at least
    BLOCK_SEQUENCE_STEPS sequence steps, in at least BLOCK_CALLS calls."""
    assert block_calls(1) == BLOCK_SEQUENCE_STEPS and block_calls(64) == BLOCK_CALLS
    assert all(block_calls(n) * n >= BLOCK_SEQUENCE_STEPS for n in range(1, 65))
    gate = PlanGate()
    arm = gate.choose(1)
    for _ in range(BLOCK_SEQUENCE_STEPS - 1):
        gate.observe(arm, 1, 1.0)
    assert gate.loads[1].rates[Arm.PLAN] is None
    gate.observe(arm, 1, 1.0)
    assert gate.loads[1].rates[Arm.PLAN] == pytest.approx(1.0)


@pytest.mark.parametrize("plain_ahead", [False, True])
def test_at_one_sequence_trying_the_arm_behind_costs_at_most_the_regret_in_calls(plain_ahead):
    """One sequence's plain blocks are a fraction of the plan arm's in calls: whichever leads, the calls spent on the
    arm behind, times how far behind it is, stay within the regret; the wait between tries is counted in calls."""
    rates = {Arm.PLAN: 1.0, Arm.PLAIN: 1.3} if plain_ahead else {Arm.PLAN: 1.3, Arm.PLAIN: 1.0}
    behind = min(rates, key=rates.get)
    longer = block_calls(1, Arm.PLAN) // block_calls(1, Arm.PLAIN)
    assert longer > 1
    blocks = 5 + int(2 * longer * 2**EXPLORE_BACKOFF / EXPLORE_REGRET)
    arms = run_blocks(PlanGate(arms=TWO), 1, rates, blocks)[5:]  # past each arm's first two
    calls = {arm: arms.count(arm) * block_calls(1, arm) for arm in TWO}
    assert arms.count(behind) >= 3
    assert calls[behind] * (1 - rates[behind] / max(rates.values())) / sum(calls.values()) <= EXPLORE_REGRET


def test_an_arm_that_looked_far_behind_in_its_first_block_is_tried_again_soon():
    """One block is not a verdict: a plan arm whose first block measured far behind plain decoding (a stretch of text
    with nothing to copy) is measured again after EXPLORE_AFTER_FEWEST blocks, and leads once it is; measured twice,
    an arm far behind waits its regret's blocks."""
    gate = PlanGate(arms=TWO)
    first = {Arm.PLAN: 0.5, Arm.PLAIN: 1.0}
    arms = run_blocks(gate, 1, first, 2) + run_blocks(gate, 1, {Arm.PLAN: 2.0, Arm.PLAIN: 1.0}, 3)
    assert arms == [Arm.PLAN, Arm.PLAIN, Arm.PLAIN, Arm.PLAN, Arm.PLAN]  # PLAN's second try, after two
    assert gate.loads[1].leader() is Arm.PLAN
    assert EXPLORE_AFTER_FEWEST == CONFIRM_BLOCKS == 2
    gate = PlanGate(arms=TWO)
    arms = run_blocks(gate, 1, first, 4 + 30)
    assert arms[:4] == [Arm.PLAN, Arm.PLAIN, Arm.PLAIN, Arm.PLAN] and Arm.PLAN not in arms[4:]


@pytest.mark.parametrize("seed", range(5))
def test_an_arm_whose_copies_hit_in_runs_leads_where_its_mean_rate_is_ahead(seed):
    """At 8 sequences a speculating arm's calls commit in runs (stretches of text whose copies hit, then stretches whose
    copies miss), and a try of an arm long behind replaces its rate: a block too short to span the runs read whichever
    it fell in, and a try that fell in a miss kept the faster arm out for hundreds of calls (translation on the CPU,
    docs/history.md, round 31). Here the plan arm's calls read 10 tokens/ms and 2 in runs of about twelve, 1.5 times
    plain decoding's 4 on the mean: it leads in most calls (blocks of 32 sequence steps gave it 5-17% of them)."""
    rng = random.Random(seed)
    gate, calls, hit = PlanGate(arms=TWO), {Arm.PLAN: 0, Arm.PLAIN: 0}, True
    for _ in range(20000):
        arm = gate.choose(8)
        calls[arm] += 1
        if arm is Arm.PLAN:
            hit = hit is (rng.random() >= 1 / 12)
            gate.observe(arm, 40 if hit else 8, 4.0)
        else:
            gate.observe(arm, 8, 2.0)
    assert calls[Arm.PLAN] > 0.6 * sum(calls.values())


def test_a_plain_block_is_shorter():
    """Plain decoding commits a token a sequence every call, so its block needs fewer calls than a speculating arm's
    to measure it: where it is far behind, each of its blocks is what exploring it costs."""
    assert block_calls(1, Arm.PLAIN) == PLAIN_BLOCK_SEQUENCE_STEPS < BLOCK_SEQUENCE_STEPS
    assert block_calls(64, Arm.PLAIN) == BLOCK_CALLS
    gate = PlanGate(arms=TWO)
    for _ in range(BLOCK_SEQUENCE_STEPS):
        gate.observe(gate.choose(1), 3, 1.0)
    assert gate.choose(1) is Arm.PLAIN
    for _ in range(WARMUP_CALLS + PLAIN_BLOCK_SEQUENCE_STEPS - 1):
        gate.observe(Arm.PLAIN, 1, 1.0)
    assert gate.loads[1].rates[Arm.PLAIN] is None
    gate.observe(Arm.PLAIN, 1, 1.0)
    assert gate.loads[1].rates[Arm.PLAIN] == pytest.approx(1.0) and gate.choose(1) is Arm.PLAN


@pytest.mark.parametrize("arms", [(Arm.PLAIN, Arm.PLAN), (Arm.PLAN, Arm.COPY)])
def test_a_gate_starts_with_the_plan_arm_and_can_decode_plainly(arms):
    with pytest.raises(ValueError, match="Arm.PLAN"):
        PlanGate(arms=arms)


def test_the_copy_arm_is_an_option_where_steps_are_padded_and_the_planner_copies():
    """On graphed steps a plan's host work is what the copy arm saves; where the forward dominates, the plan arm's own
    copies cover prompt lookup and the copy arm's slow exploring blocks only cost."""
    assert arms_for(copies=True, padded=True) == ARMS
    assert arms_for(copies=True, padded=False) == arms_for(copies=False, padded=True) == TWO


@pytest.mark.parametrize("sequences", [8, 32, EVEN])
@pytest.mark.parametrize("clearly", [False, True])
def test_another_arm_leads_plain_decoding_only_where_clearly_faster(sequences, clearly):
    """A speculating arm's calls leave out what its sequences out of step cost (admissions one by one, a shrinking
    batch at the end): within the load's preference of plain's rate, plain decoding leads; well past it, the arm
    does. A gate without the preference, or one sequence alone, follows the faster rate."""
    preference = plain_preference(sequences)
    plan, leads = ((1.0 + preference) * (1 + 2 * SWITCH_MARGIN), Arm.PLAN) if clearly else (1.0 + preference / 2,
                                                                                             Arm.PLAIN)
    gate = PlanGate(arms=TWO)
    arms = run_blocks(gate, sequences, {Arm.PLAN: plan, Arm.PLAIN: 1.0}, 2 + 30)[2:]
    assert gate.loads[sequences.bit_length()].leader() is leads
    assert arms.count(leads) > len(arms) // 2
    neutral = PlanGate(arms=TWO, plain_preference=lambda n: 0.0)
    run_blocks(neutral, sequences, {Arm.PLAN: 1.0 + preference / 2, Arm.PLAIN: 1.0}, 2 + 30)
    assert neutral.loads[sequences.bit_length()].leader() is Arm.PLAN
    run_blocks(gate, 1, {Arm.PLAN: 1.0 + preference / 2, Arm.PLAIN: 1.0}, 2 + 30)
    assert gate.loads[1].leader() is Arm.PLAN  # one sequence is out of step with no one


def test_the_preference_for_plain_decoding_is_the_full_one_from_64_sequences():
    """Below FULL_PREFERENCE_FROM sequences a batch out of step costs less at its ragged end, and the plan arm's
    copies behind long matches won there with the smaller preference (docs/history.md, engine speed round 36)."""
    assert [plain_preference(n) for n in (1, 2, 8, 32, 63, 64, 127, 128)] == \
        [0.0] + [SMALL_PLAIN_PREFERENCE] * 4 + [PLAIN_PREFERENCE] * 3
    assert 0.0 < SMALL_PLAIN_PREFERENCE < PLAIN_PREFERENCE and FULL_PREFERENCE_FROM == 64
    gate = PlanGate(arms=TWO)
    for sequences in (2, 40, 64, 100):
        gate.choose(sequences)
    assert [load.plain_preference for load in gate.loads.values()] == [SMALL_PLAIN_PREFERENCE] * 2 + [PLAIN_PREFERENCE]


def _compute_bound_costs(num_slots: int) -> CostModel:
    """A verify costs 0.5 ms plus 0.2 ms a token: from 4 sequences a verified token costs most of what a plain step
    costs a sequence (`CostModel.marginal_share` 0.615 at 4, 0.545 at 3, 0.444 at 2); the drafter next to nothing."""
    sizes = [b for b in (1, 2, 4, 8) if b <= num_slots]
    verify = {b: [(b * k, 0.5 + 0.2 * b * k) for k in (1, 2, 4, 8, 16)] for b in sizes}
    return CostModel(verify=verify, draft={b: [(n, 0.001) for n in (2, 4, 8, 16)] for b in sizes})


def test_the_marginal_share_is_high_where_the_forward_is_compute_bound_and_low_where_it_is_not():
    bound = _compute_bound_costs(8)
    assert bound.marginal_share(4) == pytest.approx(0.8 / 1.3)
    assert bound.marginal_share(2) < DRAIN_MARGINAL_SHARE <= bound.marginal_share(4) < bound.marginal_share(8)
    assert fixed_costs(16).marginal_share(16) < 0.1  # a fixed cost that dwarfs each token's, as on a GPU


@pytest.mark.parametrize("compute_bound", [True, False])
def test_a_draining_batch_decodes_plainly_where_a_token_costs_most_of_a_step(trained_tiny, compute_bound):
    """Where no request waits and a verified token costs most of a plain step's share (`gate.DRAIN_MARGINAL_SHARE`:
    from 4 sequences on this table), adaflash's calls decode plainly, neither asking the gate nor teaching it, and
    propose nothing; while requests wait, at fewer sequences, or where the table says a token costs little, the gate
    chooses. The output is plain decoding's either way."""
    prompts = random_prompts(7, seed=41)
    cost = _compute_bound_costs(4) if compute_bound else fixed_costs(4)
    engine = Engine(trained_tiny.target, trained_tiny.drafter, num_slots=4, max_len=96, cost_model=cost, run_steps=2)
    sched = engine.speculation
    asked, proposed, observed = [], [], []
    choose, plan, observe = sched.gate.choose, engine.speculation.planner.plan, sched.gate.observe

    def planned(*args, **kwargs):
        out = plan(*args, **kwargs)
        proposed.append(bool(out.drafts) or any(out.proposals.values()))
        return out

    sched.gate.choose = lambda n: asked.append(n) or choose(n)
    engine.speculation.planner.plan = planned
    sched.gate.observe = lambda *a, **k: observed.append(1) or observe(*a, **k)
    seqs = [engine.submit(Request(p, 24 + 4 * i, mode="adaflash", stop_ids=())) for i, p in enumerate(prompts)]
    drained = chosen = 0
    while engine.has_work:
        running, waiting = len(engine.running), len(engine.waiting)
        admits = min(waiting, 4 - running)
        before = len(asked), len(proposed), len(observed)
        engine.step()
        if not running:
            continue
        if compute_bound and waiting == admits and running + admits >= 4:
            assert (len(asked), len(observed)) == (before[0], before[2]) and not any(proposed[before[1]:])
            drained += 1
        else:
            assert len(asked) == before[0] + 1
            chosen += 1
    ar = Engine(trained_tiny.target, None, num_slots=4, max_len=96)
    reference = ar.generate([Request(p, 24 + 4 * i, stop_ids=()) for i, p in enumerate(prompts)])
    assert [s.output for s in seqs] == [s.output for s in reference]
    assert chosen > 0 and (drained > 0 if compute_bound else drained == 0)
