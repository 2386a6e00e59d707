"""Round 30: every block a gate with the copy arm ends at one sequence (its arm, its rate, the arms' running rates, the
leader, the regret halvings) over two runs of the broad mix's held-out prompts of a domain: why a gate comparing the
plan and copy arms by their blocks' rates at one sequence settles on whichever first looked ahead. Reads
`arms_ab.py`'s setup.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/gate_trace.py broad:rag
"""
import sys, time
sys.argv = [sys.argv[0], sys.argv[1], "1", "copyarm"] + sys.argv[2:]
exec(open("docs/engine-speed/round30/arms_ab.py").read().split("over = {v")[0])
g = gates["copyarm"]; sch.gate = g
orig_end = gate._Load.end_block
def traced(self):
    arm, rate = self.arm, self.block.tokens / self.block.ms
    orig_end(self)
    print(f"{arm.value:5s} block {rate:.3f} -> rates {', '.join(f'{a.value} {r:.3f}' for a, r in self.rates.items() if r)} lead {self.leading and self.leading.value} halv {[self.halvings[a] for a in self.arms]}")
gate._Load.end_block = traced
for r in range(2):
    seqs = engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in ids], concurrency=1)
