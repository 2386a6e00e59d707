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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import load  # noqa: E402
from drain_ab import take_turns, whole_broad_mix  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402


def rule_off(engine: Engine) -> Engine:
    engine.scheduler._drains = lambda sequences: False
    return engine


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = whole_broad_mix() if domain == "broad" else load(domain)
    first = cell.engine()

    def adaflash() -> Engine:
        return Engine(cell.bundle.target, cell.bundle.drafter, num_slots=64, max_len=cell.max_len,
                      cost_model=copy.deepcopy(first.cost))

    engines = {"ar": (first, "ar"), "off": (rule_off(adaflash()), "adaflash"), "built": (adaflash(), "adaflash")}
    print(json.dumps({"domain": domain, "concurrency": concurrency, **take_turns(cell, engines, concurrency, rounds)}))


if __name__ == "__main__":
    main()
