"""Round 32: `bench_gate.py` as it is, with every block the gated engine's gate ends at 4 sequences and more written to
a trace (the load, the block's arm, its calls and the fewest and most sequences they ran, its rate in tokens/ms, the
arms' running rates after it, the leader and the plan arm's regret halvings), and a line before each of adaflash's
gated runs. The first argument is the trace's
path; the others are bench_gate's.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round32/bench_traced.py \
        trace.txt --model-dir models/default --domains code,math --concurrency 32,64 --repeats 3 --json out.json
"""

from __future__ import annotations

import sys

import bench_gate
from adaflash.decoding import gate


def main() -> int:
    trace = open(sys.argv[1], "w")
    end_block, generate = gate._Load.end_block, bench_gate.Engine.generate
    choose, observe = gate.PlanGate.choose, gate.PlanGate.observe
    chosen_at, blocks_at = [0], {}  # the sequences of the last call chosen; per load, the block's sequences so far

    def traced_choose(self: gate.PlanGate, sequences: int) -> gate.Arm:
        chosen_at[0] = sequences
        return choose(self, sequences)

    def traced_observe(self: gate.PlanGate, arm: gate.Arm, *args) -> None:
        if self._load is not None and arm is self._load.arm and not self._load.warmup:
            blocks_at.setdefault(id(self._load), []).append(chosen_at[0])
        observe(self, arm, *args)

    def traced_end_block(self: gate._Load) -> None:
        arm, calls, rate = self.arm, self.block.calls, self.block.tokens / self.block.ms
        at = blocks_at.pop(id(self), [0])
        end_block(self)
        if self.sequences >= 4:
            rates = ", ".join(f"{a.value} {r:.3f}" for a, r in self.rates.items() if r)
            trace.write(f"load {self.sequences:2d} {arm.value:5s} {calls:3d} calls at {min(at)}-{max(at)} sequences "
                        f"{rate:.3f} tokens/ms -> {rates} lead {self.leading and self.leading.value} halvings "
                        f"{self.halvings[gate.Arm.PLAN]}\n")
            trace.flush()

    def traced_generate(self: bench_gate.Engine, requests: list, concurrency: int) -> list:
        if self.scheduler.gate is not None and requests[0].mode == "adaflash":
            trace.write(f"== gated run of {len(requests)} at c={concurrency}\n")
        return generate(self, requests, concurrency)

    gate._Load.end_block, bench_gate.Engine.generate = traced_end_block, traced_generate
    gate.PlanGate.choose, gate.PlanGate.observe = traced_choose, traced_observe
    return bench_gate.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
