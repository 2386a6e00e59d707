"""What the step loop asks before every call: whether the call speculates, and what each sequence verifies.

`SpeculationPolicy` owns the gate (`gate.PlanGate`: plan, copy prompt lookup's way, or decode plainly, measured
per load), the planner (`planner.Planner`: copies, drafts and their lengths), the length controller with its
acceptance estimates (`policy.LengthController`), the cost model (`costs.CostModel`, held once, by the controller)
and the drafter proposers. `build_speculation` assembles it, for the in-process engine and for the Triton
orchestrator alike, and the loop asks nothing else what to do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from adaflash.decoding.costs import CostModel
from adaflash.decoding.gate import (
    DRAIN_MARGINAL_SHARE,
    SERVED_MIN_SEQUENCES,
    Arm,
    PlanGate,
    arms_for,
    engine_min_sequences,
)
from adaflash.decoding.plan import Candidate, Plan
from adaflash.decoding.planner import Planner
from adaflash.decoding.policy import LengthController
from adaflash.decoding.proposers import Proposer, proposers_for
from adaflash.decoding.sequence import Sequence, draft_cap
from adaflash_contract.modes import MODES, REFERENCE_MODE, Length, Mode

# Plain decoding steps one call may carry (`SpeculationPolicy._run_length`): as many as keep the call's fixed cost
# (its time outside the forwards since the previous step: on a server, the round trip to a target model and the
# responses and checks between steps) within RUN_OVERHEAD_SHARE of the call, at most MAX_RUN_STEPS and MAX_RUN_MS of
# forwards, so that a request arriving meanwhile, a cancellation and a stream's next response wait at most that long.
RUN_OVERHEAD_SHARE = 0.1
MAX_RUN_STEPS = 8
MAX_RUN_MS = 50.0
EMA = 0.2  # weight of the newest call in the running estimates of a call's fixed cost and a step's forward

# The fixed mode a cost-aware sequence steps as on each arm of the gate but the plan arm.
ARM_MODES: dict[Arm, Mode] = {Arm.COPY: MODES["ngram"], Arm.PLAIN: MODES[REFERENCE_MODE]}

GateMinimum = Callable[[bool], int]  # the gate's fewest sequences, from whether the cost table is padded (graphed)


@dataclass
class CallPlan:
    """What one call does. `arm`: the gate's for the cost-aware sequences (None: the gate does not decide it);
    `drains`: they decode plainly because the batch only drains; `committed`: the running sequences' output before
    the call (the gate is told what it added); `runs`: plain decoding steps per sequence, when every one decodes
    plainly; else `plan`: what each verifies (None when no sequence runs yet)."""

    arm: Arm | None = None
    drains: bool = False
    committed: int = 0
    runs: list[int] | None = None
    plan: Plan | None = None


class SpeculationPolicy:
    def __init__(self, controller: LengthController, planner: Planner, max_len: int, has_drafter: bool,
                 gate_minimum: GateMinimum | None = None, run_steps: int | None = None) -> None:
        """`gate_minimum`: None makes cost-aware sequences plan every step (no gate). `run_steps`: plain decoding
        steps per call when every sequence decodes plainly (None: chosen live, `_run_length`)."""
        self.controller, self.planner = controller, planner
        self.max_len, self.has_drafter = max_len, has_drafter
        self.gate_minimum, self.run_steps = gate_minimum, run_steps
        self.gate = self._new_gate()
        self.proposers: dict[str, Proposer] = proposers_for(controller)
        self.call_overhead_ms: float | None = None  # of a plain decoding call: its time outside the forwards
        self.decode_step_ms: float | None = None  # of a plain decoding call: its forwards' time per step

    @property
    def cost(self) -> CostModel | None:
        return self.controller.cost

    @cost.setter
    def cost(self, cost: CostModel) -> None:
        """A cost table that arrives after the policy was built (the served target measures it in its process): the
        gate's arms follow it, so the gate is made anew (no step ran before it came)."""
        self.controller.cost = cost
        self.gate = self._new_gate()

    @property
    def block_size(self) -> int:
        return self.controller.block_size

    def _new_gate(self) -> PlanGate | None:
        if self.gate_minimum is None:
            return None
        padded = self.cost is not None and self.cost.padded
        return PlanGate(self.gate_minimum(padded), arms_for(self.planner.copies, padded))

    def admit(self, seq: Sequence) -> None:
        """A new sequence: whether it drafts, and its acceptance estimates."""
        seq.can_draft = self.has_drafter and seq.request.mode.drafter is not None
        seq.policy = self.controller.new_sequence()

    def plan_call(self, active: list[Sequence], admitted: list[Sequence], waiting: int) -> CallPlan:
        """The gate's arm for the call (its load counts the sequences it admits too: counted without them, each
        admission to a full batch read as a load of its own), then plain decoding runs where no sequence proposes,
        else each sequence's proposal."""
        sequences = len(active) + len(admitted)
        gated = self.gate is not None and any(_gated(s.request.mode) for s in active)
        drains = gated and self._drains(sequences, waiting)
        arm = None if not gated else Arm.PLAIN if drains else self.gate.choose(sequences)
        call = CallPlan(arm, drains, 0 if arm is None else sum(len(s.output) for s in active))
        if active and not admitted and not any(_stepping_as(s.request.mode, arm).proposes for s in active):
            n = self._run_length()
            call.runs = [min(n, s.request.max_tokens - len(s.output), self.max_len - len(s.tokens) + 1)
                         for s in active]
        elif active:
            call.plan = self.planner.plan([Candidate(s.id, _stepping_as(s.request.mode, arm), s.tokens, self._cap(s),
                                                     s.policy, s.can_draft) for s in active])
        return call

    def _cap(self, seq: Sequence) -> int:
        return draft_cap(seq.request, len(seq.output), len(seq.tokens), self.block_size, self.max_len)

    def _drains(self, sequences: int, waiting: int) -> bool:
        """Whether the call's cost-aware sequences decode plainly because the batch only drains (no request waits)
        where a verified token costs most of what a plain step costs a sequence (`gate.DRAIN_MARGINAL_SHARE`)."""
        return self.cost is not None and not waiting and self.cost.marginal_share(sequences) >= DRAIN_MARGINAL_SHARE

    def _run_length(self) -> int:
        """Steps per call such that the call's fixed cost stays within RUN_OVERHEAD_SHARE of it, from the last
        calls' estimates: a server's round trips are worth several steps at low load, the engine's few."""
        if self.run_steps is not None:
            return self.run_steps
        if self.call_overhead_ms is None or not self.decode_step_ms:
            return 1
        n = math.ceil(self.call_overhead_ms * (1 - RUN_OVERHEAD_SHARE) / (RUN_OVERHEAD_SHARE * self.decode_step_ms))
        return max(1, min(n, MAX_RUN_STEPS, int(MAX_RUN_MS // self.decode_step_ms)))

    def observe_run(self, sequences: int, steps: list[int], ms: float) -> None:
        """A plain decoding call whose forwards took `ms`: when every step carried every sequence, the cost model
        learns from it as from so many one-token verifies."""
        if self.cost is not None and min(steps) == max(steps):
            self.cost.observe_verify(sequences, sequences, ms / steps[0])

    def observe_verify(self, feeds: list[list[int]], ms: float) -> None:
        if self.cost is not None:
            self.cost.observe_verify(len(feeds), sum(map(len, feeds)), ms, max(map(len, feeds)))

    def observe_verified(self, seq: Sequence, draft_len: int, accepted: int, matched: int) -> None:
        """What a sequence's verify accepted of its proposal (copied after a lookup of `matched` tokens, or drafted)."""
        self.controller.observe(seq.policy, draft_len, accepted, matched=matched)

    def observe_call(self, call: CallPlan, active: list[Sequence], ms: float, forwards_ms: float,
                     runs: list[int] | None) -> None:
        """A call without admissions took `ms` from the previous call's end, `forwards_ms` of it in the forwards:
        the rest is its fixed cost (the cost model's per-step overhead after a planned call, `_run_length`'s estimate
        after a plain run), and the gate learns the arm's tokens a ms."""
        if runs is None:
            if self.cost is not None:
                self.cost.observe_step(ms - forwards_ms)
        else:
            self.call_overhead_ms = _ema(self.call_overhead_ms, ms - forwards_ms)
            self.decode_step_ms = _ema(self.decode_step_ms, forwards_ms / max(runs))
        if call.arm is not None and not call.drains:
            tokens = sum(len(s.output) for s in active) - call.committed
            self.gate.observe(call.arm, tokens, ms, self._plain_rate(len(active)))

    def _plain_rate(self, sequences: int) -> float:
        """What plain decoding commits a ms at `sequences` by the cost table, the gate's yardstick (1 without one)."""
        return self.cost.plain_rate(sequences) if self.cost is not None and self.cost.verify else 1.0


def build_speculation(cost: CostModel | None, block_size: int, max_len: int, has_drafter: bool, *, served: bool,
                      copies: bool = True, plan_gate: bool = True, prior_weight: float = 4.0, probe_every: int = 8,
                      run_steps: int | None = None) -> SpeculationPolicy:
    """The speculation stack of an engine (`served=False`) or of the Triton orchestrator (`served=True`): the gate
    decides from `gate.SERVED_MIN_SEQUENCES` sequences in the orchestrator, from `gate.engine_min_sequences` in the
    engine. `copies=False` keeps adaflash to its drafter; `plan_gate=False` makes it plan every step."""
    controller = LengthController(cost, block_size, prior_weight, probe_every)
    minimum = (lambda padded: SERVED_MIN_SEQUENCES) if served else engine_min_sequences
    return SpeculationPolicy(controller, Planner(controller, copies), max_len, has_drafter,
                             minimum if plan_gate else None, run_steps)


def _gated(mode: Mode) -> bool:
    """Whether the gate decides for a mode: only the cost-aware one chooses freely how much to propose."""
    return mode.length is Length.COST_AWARE


def _stepping_as(mode: Mode, arm: Arm | None) -> Mode:
    """The mode a sequence of `mode` steps as in a call on `arm`."""
    return ARM_MODES[arm] if _gated(mode) and arm in ARM_MODES else mode


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + EMA * (new - old)
