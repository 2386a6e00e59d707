"""Round 35: copy-length rules replayed on the token streams they would verify, timed by the cost table. Greedy output
is the same in every mode, so one `ar` run gives each prompt's whole stream; a closed workload at the cell's
concurrency is then stepped in simulation: each call, each running sequence looks up its copy (`ngram.lookup` over its
tokens so far, up to the draft cap, matches of up to LONGEST tokens), a rule picks how much of it to verify, greedy
verification accepts the copy's prefix that equals the stream, and the call costs the table's verify of its rows at its
sequences (`CostModel.verify_ms`: the forward alone; prefills, planning and the rest of a step are left out, alike for
every rule). A freed slot takes the next prompt at the next call. Rules:
- `plain`: nothing verified (`ar`); `whole`: the whole copy (`ngram`'s choice, the same lookup at up to ngram.MAX_N);
- `oracle`: up to the copy's first miss (no rule can do better with these copies);
- `matched>=m`: the whole copy where its lookup matched at least m tokens, else nothing.
Each rule's predicted forward time over plain's; then ar and ngram measured in the same engine (medians over ROUNDS
rounds) to check `whole` against `ngram`.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round35/replay.py chat 32
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import MAX_TOKENS, load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from shadow import accepted  # noqa: E402

from adaflash.decoding import ngram  # noqa: E402
from adaflash.decoding.costs import CostModel  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402
from adaflash.models.drafter import block_size_of  # noqa: E402

LONGEST = 16
ROUNDS = 4
Rule = Callable[[list[int], int, list[int]], int]  # (copy, tokens its lookup matched, the stream after it) -> k


RULES: dict[str, Rule] = {
    "plain": lambda copy, matched, actual: 0,
    "whole": lambda copy, matched, actual: len(copy),
    "oracle": lambda copy, matched, actual: min(len(copy), accepted(copy, actual) + 1),
    **{f"matched>={m}": (lambda m: lambda copy, matched, actual: len(copy) if matched >= m else 0)(m)
       for m in (3, 4, 6, 8, 12)},
}


def replay(streams: list[tuple[int, list[int]]], concurrency: int, width: int, cost: CostModel, rule: Rule,
           max_n: int) -> tuple[float, int, int]:
    """The forward milliseconds, calls and rows of a closed workload of `streams` (prompt length, prompt + output)
    under `rule`, its copies looked up with matches of up to `max_n` tokens."""
    waiting = list(range(len(streams)))[::-1]
    running: dict[int, int] = {}  # stream -> tokens it holds (its prompt and the first token come from the prefill)
    ms, calls, rows_total = 0.0, 0, 0
    while waiting or running:
        admitted = []
        while waiting and len(running) + len(admitted) < concurrency:
            admitted.append(waiting.pop())
        sequences, rows = len(running), 0
        for i in list(running):
            stream, held = streams[i][1], running[i]
            actual = stream[held:]
            copy, matched = ngram.lookup(stream[:held], min(width, len(actual) - 1), max_n)
            k = rule(copy, matched, actual[: len(copy)])
            rows += 1 + k
            running[i] = held + 1 + accepted(copy[:k], actual[:k])
            if running[i] >= len(stream):
                del running[i]
        if sequences:
            ms += float(cost.verify_ms(sequences, rows))
            calls += 1
            rows_total += rows
        for i in admitted:
            running[i] = streams[i][0] + 1
    return ms, calls, rows_total


def main() -> None:
    domain, concurrency = sys.argv[1], int(sys.argv[2])
    cell = load(domain)
    engine = cell.engine()
    width = block_size_of(cell.bundle.drafter) - 1
    seqs = engine.generate([Request(i, MAX_TOKENS, mode="ar") for i in cell.ids], concurrency=concurrency)
    streams = [(len(i), s.tokens) for i, s in zip(cell.ids, seqs)]
    print(f"{domain} c={concurrency}: {len(streams)} prompts; predicted forward time over plain decoding's "
          "(calls, rows)")
    plain_ms = None
    for name, rule in RULES.items():
        ms, calls, rows = replay(streams, concurrency, width, engine.cost, rule,
                                 ngram.MAX_N if name == "whole" else LONGEST)
        plain_ms = plain_ms or ms
        print(f"  {name:>11}: time {ms / plain_ms:.3f} (rate {plain_ms / ms:.3f}), {calls} calls, {rows} rows")
    runs = Runs(cell.ids, concurrency)
    over: list[float] = []
    for r in range(ROUNDS):
        rates = {mode: runs.rate(engine, mode) for mode in in_turn(["ar", "ngram"], r)}
        over.append(rates["ngram"] / rates["ar"])
    print(f"  measured: ngram over ar, median of {ROUNDS} rounds, {statistics.median(over):.3f}")


if __name__ == "__main__":
    main()
