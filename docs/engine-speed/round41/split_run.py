"""Round 41: where a whole run's time goes on each side, call by call: `ar`, adaflash held to the plan arm, adaflash
held to plain decoding, adaflash with its gate. Separate runs taking turns (order reversed every round); each call is
timed from outside the scheduler's step and put in one of three parts: calls that admit (prefill) new sequences,
calls while requests wait that admit none, and calls of the drain (nothing waits). Per side, each part's calls,
milliseconds and the tokens its running sequences committed, the medians over the rounds.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round41/split_run.py DOMAIN C ROUNDS
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import Always, load  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402

MAX_TOKENS = 96
PARTS = ("admit", "waiting", "drain")


def timed_steps(engine: Engine, log: list[dict]) -> None:
    """Log each step of `engine` (its part, ms, tokens its running sequences committed) into `log`."""
    sched = engine.scheduler
    step = sched.step

    async def logged() -> list:
        active = [s for s in sched.running.values() if not s.finished]
        before = sum(len(s.output) for s in active)
        waiting = bool(sched.waiting)
        t0 = time.perf_counter()
        changed = await step()
        ms = (time.perf_counter() - t0) * 1000
        part = "admit" if len(changed) > len(active) else "waiting" if waiting else "drain"
        log.append({"part": part, "ms": ms, "tokens": sum(len(s.output) for s in active) - before,
                    "sequences": len(active)})
        return changed

    sched.step = logged


def main(domain: str, concurrency: int, rounds: int) -> None:
    cell = load(domain)
    sides: dict[str, tuple[Engine, str]] = {}
    for name, arm in (("ar", None), ("plan", Arm.PLAN), ("plain", Arm.PLAIN), ("gated", None)):
        engine = cell.engine()
        if arm is not None:
            engine.scheduler.gate = Always(arm)
        sides[name] = (engine, "ar" if name == "ar" else "adaflash")
    logs: dict[str, list[dict]] = {}
    for engine, _ in sides.values():
        log: list[dict] = []
        timed_steps(engine, log)
        logs[id(engine)] = log
    results: dict[str, list[dict]] = {name: [] for name in sides}
    outputs: dict[str, list] = {}
    for r in range(rounds + 1):  # the first round warms up, unrecorded
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            engine, mode = sides[name]
            log = logs[id(engine)]
            log.clear()
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in cell.ids], concurrency=concurrency)
            wall = (time.perf_counter() - t0) * 1000
            outputs[name] = [s.output for s in seqs]
            if r == 0:
                continue
            row = {"wall": wall, "tokens": sum(map(len, outputs[name])), "gaps": wall - sum(c["ms"] for c in log)}
            for part in PARTS:
                calls = [c for c in log if c["part"] == part]
                row[part] = (len(calls), sum(c["ms"] for c in calls), sum(c["tokens"] for c in calls))
            results[name].append(row)
        assert all(out == outputs["ar"] for out in outputs.values()), "an output departs from ar's"
        if r:
            print(f"round {r}: " + "  ".join(f"{n} {results[n][-1]['tokens'] / results[n][-1]['wall']:.3f}"
                                             for n in sides), "tokens/ms", flush=True)
    print(f"{domain} c={concurrency}, {rounds} rounds, medians (calls, ms, tokens/ms of the running sequences):")
    for name, rows in results.items():
        med = {k: statistics.median(row[k] for row in rows) for k in ("wall", "gaps")}
        parts = "  ".join(
            f"{part} {statistics.median(row[part][0] for row in rows):.0f} calls "
            f"{statistics.median(row[part][1] for row in rows):.0f} ms "
            f"{statistics.median(row[part][2] / row[part][1] for row in rows if row[part][1]):.3f}/ms"
            for part in PARTS)
        print(f"  {name:6s} wall {med['wall']:.0f} ms, over ar {statistics.median(r['wall'] / a['wall'] for r, a in zip(rows, results['ar'])):.3f}; "
              f"{parts}; gaps {med['gaps']:.0f} ms", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
