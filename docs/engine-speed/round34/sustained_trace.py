"""Round 34: one domain's first 256 prompts at a concurrency (sustained: each ended sequence's slot goes to the next
prompt), `ar`, gated adaflash (`gated`) and adaflash planning every call (`plan`) taking turns, each over `ar` of the
same round, with every block the gate ends at 16
sequences and more written to a trace (as round 32's bench_traced: the load, the arm, its calls, its rate in tokens/ms,
the arms' running rates after it, the leader and the plan arm's regret halvings); and each run's calls by arm (`ar`:
none) and kind (`measured` by the gate, the `warmup` after a change of arm, `admitting` a prompt, `other`: at a load the
gate does not measure, or a graph's recording): their number, milliseconds a call (step to step), tokens a call and,
of admitting calls, the sequences each admitted.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round34/sustained_trace.py \
        math 64 4 trace.txt
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cell import load_cell  # noqa: E402
from cells import Always  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding import gate  # noqa: E402
from adaflash.decoding.scheduler import Scheduler  # noqa: E402

PROMPTS = 256


def main() -> None:
    domain, concurrency, rounds, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    trace = open(path, "w")
    end_block, step, arm_of, observe = gate._Load.end_block, Scheduler.step, Scheduler._arm, gate.PlanGate.observe
    call: dict = {}  # of the step under way: its arm, whether it admitted, the gate's verdict on it
    kinds: dict[tuple[str, str], list[float]] = {}  # (arm, kind) -> [calls, ms, tokens, admitted], one run

    def traced_end_block(self: gate._Load) -> None:
        arm, calls, rate = self.arm, self.block.calls, self.block.tokens / self.block.ms
        end_block(self)
        if self.sequences >= 16:
            rates = ", ".join(f"{a.value} {r:.3f}" for a, r in self.rates.items() if r)
            trace.write(f"load {self.sequences:2d} {arm.value:5s} {calls:3d} calls {rate:.3f} tokens/ms -> {rates} "
                        f"lead {self.leading and self.leading.value} halvings {self.halvings[gate.Arm.PLAN]}\n")

    def noted_arm(self: Scheduler, active: list, admitted: list):
        arm = arm_of(self, active, admitted)
        call.update(arm=arm.value if arm else "ar", admitted=len(admitted), kind="other")
        return arm

    def noted_observe(self: gate.PlanGate, arm: gate.Arm, *args) -> None:
        load = self._load
        if load is not None and arm is load.arm:
            call["kind"] = "warmup" if load.warmup else "measured"
        observe(self, arm, *args)

    async def counted_step(self: Scheduler):
        call.clear()
        before = sum(len(s.output) for s in self.running.values())
        t0 = self._mark
        out = await step(self)
        arm = call.get("arm")
        if arm is not None and t0 is not None:
            kind = "admitting" if call["admitted"] else call["kind"]
            ended = sum(len(s.output) for s in out if s.finished and s.id not in self.running)
            tokens = sum(len(s.output) for s in self.running.values()) + ended - before
            tally = kinds.setdefault((arm, kind), [0, 0.0, 0, 0])
            tally[0] += 1
            tally[1] += (self._mark - t0) * 1000
            tally[2] += tokens
            tally[3] += call["admitted"]
        return out

    gate._Load.end_block, Scheduler.step, Scheduler._arm = traced_end_block, counted_step, noted_arm
    gate.PlanGate.observe = noted_observe
    cell = load_cell(domain, PROMPTS)
    engine = cell.engine()
    gates = {"ar": engine.scheduler.gate, "gated": engine.scheduler.gate, "plan": Always(gate.Arm.PLAN)}
    runs = Runs(cell.ids, concurrency)
    over: dict[str, list[float]] = {"gated": [], "plan": []}
    for r in range(rounds):
        rates, seen = {}, {}
        for side in in_turn(["ar", "gated", "plan"], r):
            if side == "gated":
                trace.write(f"== round {r}\n")
            kinds.clear()
            engine.scheduler.gate, engine.scheduler._mark = gates[side], None  # (a run's first call is left out)
            rates[side] = runs.rate(engine, "ar" if side == "ar" else "adaflash")
            seen[side] = "; ".join(f"{arm} {kind} {n} calls {ms / n:.2f} ms {tokens / n:.1f} tokens"
                                   + (f" {admitted / n:.2f} admitted" if admitted else "")
                                   for (arm, kind), (n, ms, tokens, admitted) in sorted(kinds.items()))
        for side in over:
            over[side].append(rates[side] / rates["ar"])
        print(r, {side: round(ratios[-1], 3) for side, ratios in over.items()}, flush=True)
        for side, line in seen.items():
            print("  ", side, line, flush=True)
    for side, ratios in over.items():
        print(f"{domain} c={concurrency} {len(cell.ids)} prompts: {side} / ar median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
