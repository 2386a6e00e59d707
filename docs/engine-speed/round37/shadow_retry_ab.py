"""Round 37: a gate carried from one workload to the next. While plain decoding leads a load, every plain call checks a
few sequences' copies after the fact (what a lookup PROBE tokens back proposed against what was then committed: free
for greedy text), and the load keeps a running mean of the tokens they would have accepted. When that mean rises past
RISE times its level at the plan arm's last block (plus SLACK tokens), the plan arm's regret is restored and it is
tried at once (`shadow`), against the gate as it is (`gate`). Why: a load whose plan arm was found far behind on one
workload tries it rarely (its regret halved twice), and on the next workload, where it wins, it took rounds to lead
(docs/results.md, engine speed round 36: multilingual c=64 after chat, code and math at 64).

Each side a gate of its own; each round runs `ar`, gate and shadow (reversed every other round) on the FIRST cell for
WARM rounds, then on the SECOND cell for ROUNDS rounds, each over `ar` of the same round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round37/shadow_retry_ab.py \
        math multilingual 64 4 6
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding import ngram  # noqa: E402
from adaflash.decoding.gate import Arm, PlanGate  # noqa: E402
from adaflash.decoding.planner import COPY_MATCH  # noqa: E402

PROBE, SAMPLE, EMA, RISE, SLACK = 8, 4, 0.05, 1.5, 0.5


class ShadowGate(PlanGate):
    def __init__(self, arms) -> None:
        super().__init__(arms=arms)
        self.evidence: dict[int, float] = {}
        self.at_try: dict[int, float] = {}
        self.triggers = 0

    def shadow(self, accepted: list[int]) -> None:
        load = self._load
        if load is None or not accepted:
            return
        key = id(load)
        old = self.evidence.get(key)
        mean = sum(accepted) / len(accepted)
        self.evidence[key] = mean if old is None else old + EMA * (mean - old)
        if load.arm is Arm.PLAN:
            self.at_try[key] = self.evidence[key]
            return
        base = self.at_try.get(key)
        if (base is not None and load.leading is Arm.PLAIN and load.rates[Arm.PLAN] is not None
                and self.evidence[key] > base * RISE + SLACK):
            load.halvings[Arm.PLAN] = 0
            load.since[Arm.PLAN] = 10**6
            self.at_try[key] = self.evidence[key]
            self.triggers += 1


def install(engine, gate: ShadowGate) -> None:
    scheduler, step, choose = engine.scheduler, engine.step, engine.scheduler._arm
    chosen = [None]
    turn = [0]

    def arm(active, admitted):
        chosen[0] = choose(active, admitted)
        return chosen[0]

    def shadowed():
        chosen[0] = None
        out = step()
        if chosen[0] is Arm.PLAIN:
            seqs = [s for s in scheduler.running.values() if len(s.output) > PROBE]
            picked = [seqs[(turn[0] + i) % len(seqs)] for i in range(min(SAMPLE, len(seqs)))] if seqs else []
            turn[0] += SAMPLE
            accepted = []
            for s in picked:
                p = len(s.tokens) - PROBE
                proposal, _ = ngram.lookup(s.tokens[:p], PROBE, COPY_MATCH)
                n = 0
                while n < len(proposal) and proposal[n] == s.tokens[p + n]:
                    n += 1
                accepted.append(n)
            gate.shadow(accepted)
        return out

    scheduler._arm, engine.step = arm, shadowed


def main() -> None:
    first, second, concurrency, warm, rounds = (sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                                                int(sys.argv[5]))
    cells = {name: load(name) for name in (first, second)}
    engine = max(cells.values(), key=lambda c: c.max_len).engine()  # room for both cells' prompts
    arms = engine.scheduler.gate.arms
    gates = {"gate": PlanGate(arms=arms), "shadow": ShadowGate(arms)}
    step, choose = engine.step, engine.scheduler._arm
    for name, count in ((first, warm), (second, rounds)):
        runs, over = Runs(cells[name].ids, concurrency), {side: [] for side in gates}
        for r in range(count):
            rates = {}
            for side in in_turn(["ar", *gates], r):
                if side != "ar":
                    engine.scheduler.gate = gates[side]
                    if side == "shadow":
                        install(engine, gates[side])
                rates[side] = runs.rate(engine, "ar" if side == "ar" else "adaflash")
                engine.step, engine.scheduler._arm = step, choose
            for side in over:
                over[side].append(rates[side] / rates["ar"])
            print(name, r, {k: round(v[-1], 3) for k, v in over.items()}, "triggers", gates["shadow"].triggers,
                  "plan calls", {k: g.tally[Arm.PLAN].calls for k, g in gates.items()}, flush=True)
        for side, ratios in over.items():
            print(f"{name} c={concurrency} {side} / ar median {statistics.median(ratios):.3f}", flush=True)


if __name__ == "__main__":
    main()
