"""Round 38: what adaflash's plain decoding costs over `ar`'s, step by step. Sides, each an engine of its own stepped in
lockstep (`lockstep.py`, order rotated every round), one plain decoding step a call (`run_steps=1`, as the engine's
runs are at these loads):
  ar, ar2   `ar` twice: what two identical sides differ by;
  plain     adaflash held to plain decoding: features captured and kept for the drafter, as a gated run's plain calls;
  noviews   the same, but its verifies keep no features (the forward still captures): what the views and their lists
            cost (the drafter's context is then wrong: a measurement only);
  rows      the same, each verified sequence keeping a (tensor, start, stop) reference in a list instead of a view
            (never read: a held-plain side never drafts), set after the verify in a loop of its own;
  nocap     adaflash held plain without a capture (no sequence may draft).
Their batches are alike step for step, so each step's least time over the rounds compares them with the machine's swings
and stalls taken out. Reported apart: the long steps (over 30 ms: the first admissions' prefills) and the others.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round38/plain_overhead.py math 64 8
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import MAX_TOKENS, Always, load  # noqa: E402
from lockstep import Side, Lockstep  # noqa: E402

from adaflash.decoding import steps  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402

LONG_STEP_S = 0.03
_judged = steps._judged
_stepping = {"now": None}  # the patched side stepping now: "noviews", "rows" or None


def patched_judged(logits, hidden, cache, slots, starts, feeds, sampling, generators, wants, histories):
    """`steps._judged`, keeping no features while a `noviews` side steps and references while a `rows` side does."""
    if _stepping["now"] is None:
        return _judged(logits, hidden, cache, slots, starts, feeds, sampling, generators, wants, histories)
    results = _judged(logits, hidden, cache, slots, starts, feeds, sampling, generators, [False] * len(wants),
                      histories)
    if _stepping["now"] == "rows" and hidden is not None:
        row = 0
        for res, feed, want in zip(results, feeds, wants):
            if want:
                res.features = [(hidden, row, row + res.accepted + 1)]
            row += len(feed)
    return results


def one_step(engine: Engine) -> None:
    engine.scheduler.run_steps = 1


def held(engine: Engine) -> None:
    one_step(engine)
    engine.scheduler.gate = Always(Arm.PLAIN)


def patched(name: str):
    """A setup holding the engine plain, its steps taken with `patched_judged` as side `name`."""

    def setup(engine: Engine) -> None:
        held(engine)
        step = engine.step

        def flagged():
            _stepping["now"] = name
            try:
                return step()
            finally:
                _stepping["now"] = None

        engine.step = flagged

    return setup


def uncaptured(engine: Engine) -> None:
    held(engine)
    engine.backend.capture = None


def step_times(lock: Lockstep) -> dict[str, list[float]]:
    """One run of every prompt on each side in lockstep: each side's step times, in order."""
    names = list(lock.sides)
    k = lock.rounds % len(names)
    names, lock.rounds = names[k:] + names[:k], lock.rounds + 1
    times: dict[str, list[float]] = {n: [] for n in names}
    for name in names:
        engine = lock.sides[name].engine
        engine.scheduler.max_active = lock.concurrency
        for ids in lock.cell.ids:
            engine.submit(Request(ids, MAX_TOKENS, mode=lock.sides[name].mode))
    busy = list(names)
    while busy:
        for name in list(busy):
            engine = lock.sides[name].engine
            engine.scheduler._mark = t0 = time.perf_counter()
            engine.step()
            times[name].append(time.perf_counter() - t0)
            if not engine.has_work:
                busy.remove(name)
                engine.scheduler.max_active = engine.num_slots
    return times


def report(domain: str, concurrency: int, runs: list[dict[str, list[float]]], sides: list[str], note: str = "") -> None:
    """Print each side's least step times over `ar`'s (`sides[0]`), from `runs` (`plain_overhead.step_times` each)."""
    n = len(runs[0]["ar"])
    assert all(len(r[name]) == n for r in runs for name in sides), "the sides' steps differ"
    least = {name: [min(r[name][i] for r in runs) for i in range(n)] for name in sides}
    long = [i for i in range(n) if least["ar"][i] > LONG_STEP_S]
    short = [i for i in range(n) if i not in set(long)]
    print(f"{domain} c={concurrency}, {note}{len(runs)} rounds, {n} steps ({len(long)} long: "
          f"{sum(least['ar'][i] for i in long):.3f} s of ar's {sum(least['ar']):.3f} s); each step's least time over "
          "ar's:")
    for name in sides[1:]:
        over = {part: sum(least[name][i] for i in idx) / sum(least["ar"][i] for i in idx) - 1
                for part, idx in (("long", long), ("short", short), ("all", range(n)))}
        print(f"  {name:9s}" + "  ".join(f"{part} {100 * v:+.2f}%" for part, v in over.items()), flush=True)


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    steps._judged = patched_judged
    sides = {"ar": Side("ar", one_step), "ar2": Side("ar", one_step), "plain": Side("adaflash", held),
             "noviews": Side("adaflash", patched("noviews")), "rows": Side("adaflash", patched("rows")),
             "nocap": Side("adaflash", uncaptured)}
    lock = Lockstep(load(domain), sides, concurrency)
    runs = [step_times(lock) for _ in range(rounds)]
    report(domain, concurrency, runs, list(sides))


if __name__ == "__main__":
    main()
