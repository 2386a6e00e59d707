"""Round 37: every block a gate ends in gated runs of one cell (`ar` and adaflash taking turns, a gate kept from run
to run): its load, arm, calls, its rate (tokens per token plain decoding commits in its time), the arms' running rates
after it, and the arm and cause of the next block (`gate_causes.classify`).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round37/block_trace.py math 64 6
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import load  # noqa: E402
from gate_causes import classify  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding import gate as gate_module  # noqa: E402


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    end_block = gate_module._Load.end_block
    round_ = [0]

    def end(load: gate_module._Load) -> None:
        arm, calls, rate = load.arm.value, load.block.calls, load.block.tokens / load.block.plain
        end_block(load)
        rates = " ".join(f"{a.value}={r:.3f}" for a, r in load.rates.items() if r is not None)
        print(f"r{round_[0]} {load.sequences:>3}+ {arm:>5} {calls:>3} calls rate {rate:.3f} | {rates} | next "
              f"{load.arm.value} {classify(load)}", flush=True)

    gate_module._Load.end_block = end
    runs = Runs(cell.ids, concurrency)
    for r in range(rounds):
        round_[0] = r
        rates = {side: runs.rate(engine, side) for side in in_turn(["ar", "adaflash"], r)}
        print(f"round {r}: adaflash / ar {rates['adaflash'] / rates['ar']:.3f}", flush=True)


if __name__ == "__main__":
    main()
