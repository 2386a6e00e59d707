"""Round 40's lockstep records share this: round 38's report of sides stepped in lockstep (`../round38/lockstep.py`,
`../round38/plain_overhead.py`), each step's least time over the rounds, summed and set against `ar`'s, the long
steps (the first admissions' prefills) apart from the others."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round38"))
from plain_overhead import LONG_STEP_S  # noqa: E402


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
