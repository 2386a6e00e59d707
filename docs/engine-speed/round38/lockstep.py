"""Round 38's records share this: engines run in lockstep, one step of each in turn, each side timed by its own steps
alone. Why: on this machine one run's speed swings by about 5% from run to run (ar alone at chat c=32, 12 runs), so
two sides timed in separate runs differ by as much as anything measured; in lockstep a swing longer than a step falls
on every side alike. Each side is its own engine (its own caches, cost table copy and gate) over the one bundle, with
the scheduler's step mark set just before each of its steps, as `Engine.generate` steps without a pause; outputs are
held equal to `ar`'s.

    sides = {"ar": Side("ar"), "gate": Side("adaflash")}; Lockstep(cell, sides, 32).round()
        -> per side, seconds of its steps as timed and with stalls taken out (`unstalled`)
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import MAX_TOKENS, Cell, load  # noqa: E402

STALL, STALL_SPAN = 1.5, 3

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402


@dataclass
class Side:
    mode: str
    setup: Callable[[Engine], None] = lambda engine: None  # applied once to the side's engine (a gate, a patch)
    engine: Engine | None = field(default=None, init=False)


class Lockstep:
    def __init__(self, cell: Cell, sides: dict[str, Side], concurrency: int) -> None:
        self.cell, self.sides, self.concurrency = cell, sides, concurrency
        first = None
        for side in sides.values():
            side.engine = Engine(cell.bundle.target, cell.bundle.drafter, num_slots=64, max_len=cell.max_len,
                                 cost_model=None if first is None else copy.deepcopy(first.cost))
            first = first or side.engine
            side.setup(side.engine)
        self.reference: list[list[int]] | None = None
        self.rounds = 0

    def round(self) -> dict[str, float]:
        """Each side's seconds over one run of every prompt, as timed and unstalled, the sides stepped in turn (the
        order rotated every round)."""
        names = list(self.sides)
        k = self.rounds % len(names)
        names = names[k:] + names[:k]
        self.rounds += 1
        seqs, steps = {}, {name: [] for name in names}
        for name in names:
            engine = self.sides[name].engine
            engine.scheduler.max_active = self.concurrency
            seqs[name] = [engine.submit(Request(i, MAX_TOKENS, mode=self.sides[name].mode)) for i in self.cell.ids]
        busy = list(names)
        while busy:
            for name in list(busy):
                engine = self.sides[name].engine
                engine.scheduler._mark = t0 = time.perf_counter()
                changed = engine.step()
                steps[name].append((time.perf_counter() - t0, any(s.admitted_at >= t0 for s in changed)))
                if not engine.has_work:
                    busy.remove(name)
        for name in names:
            self.sides[name].engine.scheduler.max_active = self.sides[name].engine.num_slots
            outputs = [s.output for s in seqs[name]]
            self.reference = self.reference or outputs
            assert outputs == self.reference, f"{name}: an output differs"
        return {name: (sum(t for t, _ in steps[name]), unstalled(steps[name])) for name in names}


def unstalled(steps: list[tuple[float, bool]]) -> float:
    """Seconds of a side's steps with stalls taken out: a step that admitted nothing and took more than STALL times the
    median of its side's STALL_SPAN steps either side counts as that median. Why: the machine stalls a step now and
    then by 30-200 ms (ar alone, step by step against the least of six runs; the collector off made no difference),
    and in lockstep a stall falls on one side only. Only for sides whose steps cost alike (plain decoding): a gated
    side's planned step among plain ones can take 1.5 times its neighbours and is then taken out too, so its figures
    here flatter it; round 38 quotes the gated sides as timed."""
    times = [t for t, _ in steps]
    total = 0.0
    for j, (t, admitted) in enumerate(steps):
        near = statistics.median(times[max(0, j - STALL_SPAN) : j + STALL_SPAN + 1])
        total += near if not admitted and t > STALL * near else t
    return total


def compare(sides: dict[str, Side], over: str = "ar") -> None:
    """argv: domain, concurrency, rounds. Prints each round's throughput ratios over `over` and their medians."""
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    lock = Lockstep(load(domain), sides, concurrency)
    ratios: dict[str, list[float]] = {n: [] for n in sides if n != over}
    raw: dict[str, list[float]] = {n: [] for n in ratios}
    for r in range(rounds):
        spent = lock.round()
        for name in ratios:
            raw[name].append(spent[over][0] / spent[name][0])
            ratios[name].append(spent[over][1] / spent[name][1])
        print(r, "unstalled", {n: round(v[-1], 4) for n, v in ratios.items()},
              "raw", {n: round(v[-1], 4) for n, v in raw.items()}, flush=True)
    for name, values in raw.items():
        print(f"{domain} c={concurrency} {name} / {over} raw median {statistics.median(values):.4f}", flush=True)
    for name, values in ratios.items():
        q = statistics.quantiles(values, n=10) if len(values) > 2 else [min(values), max(values)]
        print(f"{domain} c={concurrency} {name} / {over} median {statistics.median(values):.4f} "
              f"(10-90% {q[0]:.4f}-{q[-1]:.4f})", flush=True)
