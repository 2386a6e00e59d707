"""Round 41: what adaflash's plan arm does and where its time goes, next to `ar`, in whole runs of one cell. Sides: `ar`
and adaflash held to the plan arm, an engine each, separate runs taking turns after a warm-up round. Per run: the
time inside `Planner.plan` and `Planner.cut`, the drafter's forwards, the target's forwards, and the rest; the
verify steps by what they verified (nothing, a copy, a draft) with the tokens proposed and accepted.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round41/plan_calls.py DOMAIN C ROUNDS
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import Always, load  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402

MAX_TOKENS = 96


def timed(owner: object, name: str, spent: Counter) -> None:
    """Add the wall time of `owner.name` (a function or a coroutine function) to spent[name]."""
    inner = getattr(owner, name)
    if name in ("forward", "draft"):
        async def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return await inner(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
    else:
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
    setattr(owner, name, wrapper)


def main(domain: str, concurrency: int, rounds: int) -> None:
    cell = load(domain)
    sides: dict[str, tuple[Engine, str, Counter]] = {}
    for name in ("ar", "plan"):
        engine, spent = cell.engine(), Counter()
        if name == "plan":
            engine.scheduler.gate = Always(Arm.PLAN)
        for owner, method in ((engine.planner, "plan"), (engine.planner, "cut"), (engine.backend, "forward"),
                              (engine.backend, "draft")):
            timed(owner, method, spent)
        sides[name] = (engine, "ar" if name == "ar" else "adaflash", spent)
    rows: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(rounds + 1):  # the first round warms up, unrecorded
        outputs = {}
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            engine, mode, spent = sides[name]
            spent.clear()
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in cell.ids], concurrency=concurrency)
            wall = time.perf_counter() - t0
            outputs[name] = [s.output for s in seqs]
            steps = [st for s in seqs for st in s.steps]
            kinds = Counter("copy" if st.copied else "draft" if st.draft_len else "none" for st in steps)
            row = {"wall": wall, "tokens": sum(map(len, outputs[name])), **{k: spent[k] for k in
                                                                           ("plan", "cut", "draft", "forward")}}
            row["rest"] = wall - sum(row[k] for k in ("plan", "cut", "draft", "forward"))
            for kind in ("none", "copy", "draft"):
                mine = [st for st in steps if ("copy" if st.copied else "draft" if st.draft_len else "none") == kind]
                row[f"{kind} steps"] = (kinds[kind], sum(st.draft_len for st in mine), sum(st.accepted for st in mine))
            if r:
                rows[name].append(row)
        assert outputs["plan"] == outputs["ar"], "an output departs from ar's"
        if r:
            print(f"round {r}: plan over ar {rows['ar'][-1]['wall'] / rows['plan'][-1]['wall']:.3f}", flush=True)
    print(f"{domain} c={concurrency}, {rounds} rounds, medians:")
    for name, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall", "plan", "cut", "draft", "forward", "rest")}
        kinds = "  ".join(f"{k} {statistics.median(r[k][0] for r in rs):.0f} "
                          f"(proposed {statistics.median(r[k][1] for r in rs):.0f}, "
                          f"accepted {statistics.median(r[k][2] for r in rs):.0f})"
                          for k in ("none steps", "copy steps", "draft steps"))
        print(f"  {name:4s} wall {1000 * med['wall']:.0f} ms: " + ", ".join(
            f"{k} {1000 * med[k]:.0f}" for k in ("forward", "draft", "plan", "cut", "rest")) + f"; {kinds}", flush=True)
    print(f"  plan over ar, median of rounds: "
          f"{statistics.median(a['wall'] / p['wall'] for a, p in zip(rows['ar'], rows['plan'])):.3f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
