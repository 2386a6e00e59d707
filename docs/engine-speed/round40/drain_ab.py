"""Round 40, run before the rule was built (on 5322b84, where the engine's gate decides every call; with the rule built,
its `gate` side has it too: `drain_built_ab.py` compares the rule as built against it switched off).

Does the plan arm cost whole runs where nothing waits (the batch drains)? `ar`, adaflash with the engine's
gate, and adaflash whose calls decode plainly whenever no request waits and DRAIN_FROM or more sequences run
(`drain`), in separate runs taking turns (order reversed every round), each in an engine of its own that keeps its
gate over the rounds (after WARM runs of each). Medians of the per-round ratios over `ar`; outputs held equal.

Why: the gate compares arms by tokens per ms of a call at one load. Where the batch only drains (bench_gate's c=64
cell: 64 prompts, all admitted at once), a token committed early by a copy is one the sequence would have committed
later at a step's marginal cost, unless it shortens the longest sequence; a call's rate counts it at the step's
whole cost per sequence.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round40/drain_ab.py math 64 16

DOMAIN: a shared set's domain, `broad:<domain>` for one of the broad mix's held-out domains, or `broad` for all of
its held-out prompts.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import BROAD_MIX, MAX_TOKENS, Cell, load  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.sequence import Request, context_length  # noqa: E402
from adaflash.evaluation.prompts import encode_prompts, load_prompts  # noqa: E402
from adaflash.models.bundle import load_bundle  # noqa: E402
from adaflash.models.drafter import block_size_of  # noqa: E402

DRAIN_FROM = 16
WARM = 2


def drained(engine: Engine) -> Engine:
    sched = engine.scheduler
    arm_of = sched._arm

    def arm(active, admitted):
        chosen = arm_of(active, admitted)
        if chosen is not None and not sched.waiting and len(active) + len(admitted) >= DRAIN_FROM:
            return Arm.PLAIN
        return chosen

    sched._arm = arm
    return engine


def whole_broad_mix() -> Cell:
    """Every held-out prompt of the broad mix (all its domains: 72 prompts), as `cells.load` cuts them."""
    bundle = load_bundle(Path("models/default"))
    ids = encode_prompts(bundle.tokenizer, load_prompts(BROAD_MIX, None, "holdout"), 400, None)
    return Cell(bundle, ids, context_length([len(i) for i in ids], MAX_TOKENS, block_size_of(bundle.drafter)))


def take_turns(cell: Cell, engines: dict[str, tuple[Engine, str]], concurrency: int, rounds: int) -> dict:
    """`engines` (`ar` first, as name -> (engine, mode)) in separate runs of the cell taking turns, order reversed every
    round, after WARM runs of each; each other side's per-round ratios over `ar`, printed as they come, and their
    medians. Outputs held equal to `ar`'s."""

    def run(name: str) -> tuple[float, list[list[int]]]:
        engine, mode = engines[name]
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in cell.ids], concurrency=concurrency)
        return sum(len(s.output) for s in seqs) / (time.perf_counter() - t0), [s.output for s in seqs]

    for _ in range(WARM):
        for name in engines:
            run(name)
    ratios: dict[str, list[float]] = {name: [] for name in list(engines)[1:]}
    for r in range(rounds):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        got = {name: run(name) for name in order}
        assert all(got[name][1] == got["ar"][1] for name in got), "an output differs from ar's"
        for name in ratios:
            ratios[name].append(round(got[name][0] / got["ar"][0], 3))
        print(r, {name: round(got[name][0], 1) for name in engines}, {n: v[-1] for n, v in ratios.items()}, flush=True)
    return {"rounds": rounds, "median_over_ar": {n: statistics.median(v) for n, v in ratios.items()},
            "by_round": ratios}


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = whole_broad_mix() if domain == "broad" else load(domain)
    first = cell.engine()
    engines = {"ar": (first, "ar"),
               "gate": (Engine(cell.bundle.target, cell.bundle.drafter, num_slots=64, max_len=cell.max_len,
                               cost_model=copy.deepcopy(first.cost)), "adaflash"),
               "drain": (drained(Engine(cell.bundle.target, cell.bundle.drafter, num_slots=64, max_len=cell.max_len,
                                        cost_model=copy.deepcopy(first.cost))), "adaflash")}
    result = take_turns(cell, engines, concurrency, rounds)
    print(json.dumps({"domain": domain, "concurrency": concurrency, "drain_from": DRAIN_FROM, **result}))


if __name__ == "__main__":
    main()
