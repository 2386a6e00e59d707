"""Round 29: what copies longer than the drafter's block would give prompt lookup at one sequence: `ngram` with its cap
(block_size - 1 = 15 draft tokens) against the same with a cap of 31 (draft_cap's block limit doubled by patching it
for this process only; the CPU engine verifies any feed length, graphed steps take at most 16 new tokens), alternating
in one process, every output equal to the first run's (output in long-copies.txt). The acceptance counts, which
`ngram` does not read and which hold 15 positions, are not kept.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/long_copies.py code 4
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from adaflash.decoding import scheduler, sequence
from adaflash.decoding.sequence import Request

sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell  # noqa: E402


def main() -> None:
    domain, rounds = sys.argv[1], int(sys.argv[2])
    cell = load_cell(domain)
    engine = cell.engine()
    engine.scheduler.planner.controller.observe = lambda *a, **k: None  # ngram reads no estimates; theirs hold 15
    ids = cell.ids[:16]
    caps = {"cap 15": sequence.draft_cap,
            "cap 31": lambda r, produced, length, block, max_len: sequence.draft_cap(r, produced, length, 2 * block,
                                                                                       max_len)}
    rates: dict[str, list[float]] = {k: [] for k in caps}
    steps: dict[str, int] = {}
    reference = None
    for r in range(rounds):
        for name in list(caps) if r % 2 == 0 else list(caps)[::-1]:
            scheduler.draft_cap = caps[name]
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, MAX_TOKENS, mode="ngram") for i in ids], concurrency=1)
            rates[name].append(sum(len(s.output) for s in seqs) / (time.perf_counter() - t0))
            steps[name] = sum(len(s.steps) for s in seqs)
            reference = reference or [s.output for s in seqs]
            assert [s.output for s in seqs] == reference, "an output differs"
    ratio = [round(a / b, 3) for a, b in zip(rates["cap 31"], rates["cap 15"])]
    print(f"{domain} c=1 ngram: cap 15 {statistics.median(rates['cap 15']):.0f} tok/s ({steps['cap 15']} steps), "
          f"cap 31 {statistics.median(rates['cap 31']):.0f} tok/s ({steps['cap 31']} steps); 31 / 15 by round {ratio}, "
          f"median {statistics.median(ratio):.3f}")


if __name__ == "__main__":
    main()
