"""Round 28: the engine as at the commit before (its kernels, drafts from the gathered contexts) and as in this
checkout (its kernels, drafts in the drafter's cache), swapped run by run in one process (alternating which goes
first): tokens per second of each mode, and every output equal across the two (output in engine-ab.txt). The cost
table is measured once, on this checkout's code.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round28/engine_ab.py 02f9225 \
        code ar,adaflash 1,8 4
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from kernels_at import kernels_at

from adaflash.decoding.sequence import Request
from adaflash.models import native

sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell  # noqa: E402


def main() -> None:
    revision, domain, modes = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    concurrencies, rounds = [int(c) for c in sys.argv[4].split(",")], int(sys.argv[5])
    libraries = {"before": kernels_at(revision), "after": native._library()}
    cell = load_cell(domain)
    engine = cell.engine()
    drafter = cell.bundle.drafter
    in_cache = type(drafter)._drafts_in_cache
    for c in concurrencies:
        ids = cell.ids[:16] if c == 1 else cell.ids
        rates: dict[tuple[str, str], list[float]] = {(k, m): [] for k in libraries for m in modes}
        for r in range(rounds):
            outputs = {}
            for kernels in (("before", "after") if r % 2 == 0 else ("after", "before")):
                native._library = lambda kernels=kernels: libraries[kernels]
                drafter._drafts_in_cache = (lambda *a: False) if kernels == "before" else (
                    lambda *a: in_cache(drafter, *a))
                for mode in modes:
                    t0 = time.perf_counter()
                    seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in ids], concurrency=c)
                    rates[(kernels, mode)].append(sum(len(s.output) for s in seqs) / (time.perf_counter() - t0))
                    outputs[(kernels, mode)] = [s.output for s in seqs]
            assert all(o == outputs[("before", modes[0])] for o in outputs.values()), "an output differs"
        for mode in modes:
            ratios = [a / b for a, b in zip(rates[("after", mode)], rates[("before", mode)])]
            print(f"{domain} c={c} {mode}: before {statistics.median(rates[('before', mode)]):.0f}, after "
                  f"{statistics.median(rates[('after', mode)]):.0f} tok/s; after / before by round "
                  f"{[round(x, 3) for x in ratios]}, median {statistics.median(ratios):.3f}", flush=True)


if __name__ == "__main__":
    main()
