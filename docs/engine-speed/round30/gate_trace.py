"""Round 30: every block a gate with the copy arm ends at one sequence (its arm, its rate, the arms' running rates, the
leader, the regret halvings) over two runs of the broad mix's held-out prompts of a domain: why a gate comparing the
plan and copy arms by their blocks' rates at one sequence settles on whichever first looked ahead. Its output in
the round's results was taken before the cost table's fix.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/gate_trace.py broad:rag
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cells import MAX_TOKENS, load  # noqa: E402

from adaflash.decoding import gate  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402

cell = load(sys.argv[1])
engine = cell.engine()
ids = cell.ids[:16]
g = gate.PlanGate(arms=gate.ARMS)  # the copy arm too: at one sequence, the gate arms_ab.py's `copyarm` had
engine.scheduler.gate = g
orig_end = gate._Load.end_block


def traced(self: gate._Load) -> None:
    arm, rate = self.arm, self.block.tokens / self.block.ms
    orig_end(self)
    print(f"{arm.value:5s} block {rate:.3f} -> rates {', '.join(f'{a.value} {r:.3f}' for a, r in self.rates.items() if r)}"
          f" lead {self.leading and self.leading.value} halv {[self.halvings[a] for a in self.arms]}")


gate._Load.end_block = traced
for _ in range(2):
    engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in ids], concurrency=1)
