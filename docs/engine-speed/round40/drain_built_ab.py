"""Round 40: the drain rule as built (`Scheduler._drains`, `gate.DRAIN_MARGINAL_SHARE`) against the same engine with it
switched off, and `ar`; `drain_ab.py`'s method: separate runs taking turns (order reversed every round), each side an
engine of its own that keeps its gate over the rounds (after WARM runs of each), medians of per-round ratios over `ar`,
outputs held equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round40/drain_built_ab.py \
        multilingual 64 12
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import MAX_TOKENS, load  # noqa: E402
from drain_ab import WARM, whole_broad_mix  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402


def rule_off(engine: Engine) -> Engine:
    engine.scheduler._drains = lambda active, sequences: False
    return engine


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = whole_broad_mix() if domain == "broad" else load(domain)
    first = cell.engine()

    def adaflash() -> Engine:
        return Engine(cell.bundle.target, cell.bundle.drafter, num_slots=64, max_len=cell.max_len,
                      cost_model=copy.deepcopy(first.cost))

    engines = {"ar": (first, "ar"), "off": (rule_off(adaflash()), "adaflash"), "built": (adaflash(), "adaflash")}

    def run(name: str) -> tuple[float, list[list[int]]]:
        engine, mode = engines[name]
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in cell.ids], concurrency=concurrency)
        return sum(len(s.output) for s in seqs) / (time.perf_counter() - t0), [s.output for s in seqs]

    for _ in range(WARM):
        for name in engines:
            run(name)
    ratios: dict[str, list[float]] = {"off": [], "built": []}
    for r in range(rounds):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        got = {name: run(name) for name in order}
        assert all(got[name][1] == got["ar"][1] for name in got), "an output differs from ar's"
        for name in ratios:
            ratios[name].append(round(got[name][0] / got["ar"][0], 3))
        print(r, {name: round(got[name][0], 1) for name in engines}, {n: v[-1] for n, v in ratios.items()}, flush=True)
    print(json.dumps({"domain": domain, "concurrency": concurrency, "rounds": rounds,
                      "median_over_ar": {n: statistics.median(v) for n, v in ratios.items()}, "by_round": ratios}))


if __name__ == "__main__":
    main()
