"""Round 33: how each cell's outputs end under `ar`: prompts, how many run to max_tokens (the rest stop at an end
token), the shortest and longest lengths (`ends.txt`).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/ends.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import MAX_TOKENS, load  # noqa: E402

from adaflash.decoding.sequence import Request  # noqa: E402

CELLS = [("multilingual", 32), ("broad:math", 8), ("math", 64), ("broad:translation", 8), ("broad:qa", 8)]


def main() -> None:
    for domain, c in CELLS:
        cell = load(domain)
        seqs = cell.engine().generate([Request(i, MAX_TOKENS, mode="ar") for i in cell.ids], concurrency=c)
        lengths = sorted(len(s.output) for s in seqs)
        print(domain, c, "prompts", len(seqs), "ran to max_tokens", lengths.count(MAX_TOKENS), "lengths",
              lengths[:10], "...", lengths[-5:])


if __name__ == "__main__":
    main()
