"""Round 35: how well the length of a copy's match predicts how much of the copy greedy verification accepts. While
adaflash is held to plain decoding, each step's running sequences are recorded (as `shadow.py` does); after the run,
each sequence's copy at each of those positions is looked up again with matches of up to LONGEST tokens (the planner
looks up at most `ngram.MAX_N`), and the tokens the sequence went on to commit say how much of the copy would have been
accepted. Per match length: sequence-steps, mean tokens accepted of the copy, and the share accepted whole.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round35/match_lengths.py chat 32
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from shadow import MAX_TOKENS, Always, Record, accepted, load, recorded  # noqa: E402

from adaflash.decoding import ngram  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402
from adaflash.models.drafter import block_size_of  # noqa: E402

LONGEST = 16


def main() -> None:
    domain, concurrency = sys.argv[1], int(sys.argv[2])
    cell = load(domain)
    engine = cell.engine()
    engine.scheduler.gate = Always(Arm.PLAIN)
    width = block_size_of(cell.bundle.drafter) - 1
    records: list[Record] = []
    recorded(engine, width, records, {})
    seqs = engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in cell.ids], concurrency=concurrency)
    final = {s.id: s.tokens for s in seqs}
    by_match: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])  # steps, tokens accepted, accepted whole
    for _, key, position, _ in records:
        proposal, matched = ngram.lookup(final[key][:position], width, LONGEST)
        actual = final[key][position : position + len(proposal)]
        if not proposal or len(actual) < len(proposal):
            continue
        a = accepted(proposal, actual)
        row = by_match[matched]
        row[0] += 1
        row[1] += a
        row[2] += a == len(proposal)
    print(f"{domain} c={concurrency}: copies of {width} tokens, by the tokens their lookup matched (up to {LONGEST})")
    for matched, (steps, tokens, whole) in sorted(by_match.items()):
        print(f"  matched {matched:2d}: {steps:5d} sequence-steps, {tokens / steps:5.2f} tokens accepted, "
              f"{whole / steps:.2f} accepted whole")


if __name__ == "__main__":
    main()
