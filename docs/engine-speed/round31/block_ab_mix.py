"""Round 31: `block_ab.py` with the gates kept across domains, as `bench_gate.py` keeps its engine's gate from cell to
cell (a server's traffic changes under one gate): for each domain in turn, rounds of `ar`, adaflash gated with blocks of
each size, and adaflash planning every step, the order reversed every other round; medians over `ar` of the same round.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round31/block_ab_mix.py 8 5 32,256 \
        broad:code broad:math broad:qa broad:rag broad:summarisation broad:translation
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding import gate as gate_module  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import PlanGate  # noqa: E402


def main() -> None:
    concurrency, rounds = int(sys.argv[1]), int(sys.argv[2])
    sizes, domains = [int(n) for n in sys.argv[3].split(",")], sys.argv[4:]
    cells = {domain: load(domain) for domain in domains}
    first = cells[domains[0]]
    max_len = max(cell.max_len for cell in cells.values())
    engine = Engine(first.bundle.target, first.bundle.drafter, num_slots=64, max_len=max_len)
    gates = {f"gated-{n}": (n, PlanGate(arms=engine.scheduler.gate.arms)) for n in sizes}
    sides = ["ar", *gates, "no-gate"]
    for domain, cell in cells.items():
        ids = cell.ids[:16] if concurrency == 1 else cell.ids
        over: dict[str, list[float]] = {side: [] for side in sides[1:]}
        runs = Runs(ids, concurrency)
        for r in range(rounds):
            rates = {}
            for side in in_turn(sides, r):
                n, gate = gates.get(side, (sizes[0], None))
                gate_module.BLOCK_SEQUENCE_STEPS = n
                engine.scheduler.gate = gate
                rates[side] = runs.rate(engine, "ar" if side == "ar" else "adaflash")
            for side in over:
                over[side].append(rates[side] / rates["ar"])
        print(f"{domain} c={concurrency}", ", ".join(f"{side} {statistics.median(v):.3f}" for side, v in over.items()),
              flush=True)


if __name__ == "__main__":
    main()
