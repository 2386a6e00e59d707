"""Round 35: whether plain decoding's own output could tell, without running the plan arm, what copies would gain.
While adaflash is held to plain decoding, each step records every running sequence's copy proposal (`ngram.lookup`, as
the planner looks up, up to block_size - 1 tokens); after the run, the tokens each sequence went on to commit say how
much of that copy greedy verification would have accepted. Per step of n sequences, by the cost table:
- `oracle`: each copy verified up to its first miss (the most a length policy could gain);
- `whole`: each copy verified whole (prompt lookup's choice);
the predicted forward rate over plain decoding's (tokens per table millisecond), pooled over the steps at LOADED
sequences and more, and below. Then, measured in the same engine for comparison: ar, adaflash held to the plan arm,
and gated adaflash, whole runs (medians over `ar` of ROUNDS rounds).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round35/shadow.py chat 32

Superseded as an estimate by `replay.py`: pooled over plain decoding's steps, a sequence that repeats itself weighs as
many steps as plain decoding takes over it, where speculation would finish it in a few.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import MAX_TOKENS, Always, load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding import ngram  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402
from adaflash.models.drafter import block_size_of  # noqa: E402

LOADED = 16
ROUNDS = 4
Record = tuple[int, int, int, list[int]]  # (step, sequence id, next position, copy proposal)


def recorded(engine: Engine, width: int, records: list[Record], loads: dict[int, int]) -> None:
    """Before each step, record each running sequence's copy proposal, and the step's sequences in `loads`."""
    scheduler, step = engine.scheduler, engine.step

    def recording_step():
        active = [s for s in scheduler.running.values() if not s.finished]
        index = len(loads)
        loads[index] = len(active)
        for s in active:
            records.append((index, s.id, len(s.tokens), ngram.lookup(s.tokens, width)[0]))
        return step()

    engine.step = recording_step


def accepted(proposal: list[int], actual: list[int]) -> int:
    """Tokens of `proposal` greedy verification accepts where the sequence went on with `actual`."""
    n = 0
    while n < len(proposal) and n < len(actual) and proposal[n] == actual[n]:
        n += 1
    return n


def predicted(engine: Engine, records: list[Record], loads: dict[int, int], final: dict[int, list[int]]) -> None:
    """Print the oracle and whole-copy forward rates over plain decoding's, at LOADED sequences and more, and below."""
    cost = engine.cost
    per_step: dict[int, list[list[int]]] = {}  # step -> [tokens oracle, rows oracle, rows whole]
    for index, key, position, proposal in records:
        a = accepted(proposal, final[key][position : position + len(proposal)])
        row = per_step.setdefault(index, [0, 0, 0])
        row[0] += 1 + a
        row[1] += 1 + (min(len(proposal), a + 1) if proposal else 0)
        row[2] += 1 + len(proposal)
    for name, keep in ((f">={LOADED}", lambda n: n >= LOADED), (f"2-{LOADED - 1}", lambda n: 1 < n < LOADED)):
        steps = [(loads[i], row) for i, row in per_step.items() if keep(loads[i])]
        if not steps:
            continue
        plain = sum(n for n, _ in steps) / sum(float(cost.verify_ms(n, n)) for n, _ in steps)
        tokens = sum(row[0] for _, row in steps)
        oracle = tokens / sum(float(cost.verify_ms(n, row[1])) for n, row in steps)
        whole = tokens / sum(float(cost.verify_ms(n, row[2])) for n, row in steps)
        print(f"  steps at {name} sequences: {len(steps)}; tokens a sequence-step if copies verified "
              f"{tokens / sum(n for n, _ in steps):.2f}; forward rate over plain: oracle {oracle / plain:.3f}, "
              f"whole {whole / plain:.3f}")


def main() -> None:
    domain, concurrency = sys.argv[1], int(sys.argv[2])
    cell = load(domain)
    engine = cell.engine()
    runs = Runs(cell.ids, concurrency)
    scheduler = engine.scheduler
    gate = scheduler.gate
    records: list[Record] = []
    loads: dict[int, int] = {}
    step = engine.step
    scheduler.gate = Always(Arm.PLAIN)
    recorded(engine, block_size_of(cell.bundle.drafter) - 1, records, loads)
    seqs = engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in cell.ids], concurrency=concurrency)
    engine.step = step
    final = {s.id: s.tokens for s in seqs}
    print(f"{domain} c={concurrency}: shadow of copies from adaflash held to plain decoding")
    predicted(engine, records, loads, final)
    over: dict[str, list[float]] = {"plan": [], "gated": []}
    for r in range(ROUNDS):
        rates = {}
        for side in in_turn(["ar", "plan", "gated"], r):
            scheduler.gate = gate if side == "gated" else Always(Arm.PLAN)
            rates[side] = runs.rate(engine, "ar" if side == "ar" else "adaflash")
        for side in over:
            over[side].append(rates[side] / rates["ar"])
    print(f"  measured over ar, medians of {ROUNDS} rounds:", {k: round(statistics.median(v), 3) for k, v in over.items()})


if __name__ == "__main__":
    main()
