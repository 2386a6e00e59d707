"""Round 41's verdict table: every cell of `verdict.sh`'s JSONs against the issue's bar (adaflash at least BAR of the
best fixed mode of its rounds, every output equal to `ar`'s), as a markdown table.

    .venv/bin/python docs/engine-speed/round41/verdict.py [FOLDER]

FOLDER: where the JSONs are (default: this one; `before/` holds the low-load parts run on the commit before the
engine's gate stopped deciding below 9 sequences).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
PARTS = {"shared sets": ("verdict-shared-low.json", "verdict-shared-high.json"),
         "broad mix (held out)": ("verdict-broad-low.json", "verdict-broad-pooled.json")}
BAR = 0.97


def cells(folder: Path) -> list[tuple[str, dict, int, bool]]:
    """(set, summary cell, rounds, every output equal to `ar`'s) for each cell of the parts that ran."""
    out = []
    for name, files in PARTS.items():
        for file in files:
            path = folder / file
            if not path.exists():
                continue
            run = json.loads(path.read_text())
            for cell in run["summary"]:
                mine = [r for r in run["rows"] if (r["domain"], r["concurrency"]) == (cell["domain"],
                                                                                       cell["concurrency"])]
                rounds = len({r["repeat"] for r in mine})
                out.append((name, cell, rounds, all(r["greedy_equal_to_ar"] for r in mine)))
    return out


def main(folder: Path) -> None:
    print("| set | cell | c | rounds | best fixed | adaflash over it: median of rounds (90% interval) "
          "| ratio of medians | outputs equal to `ar` | bar |")
    print("|---|---|---|---|---|---|---|---|---|")
    passed = total = 0
    for name, cell, rounds, equal in cells(folder):
        interval = cell["adaflash_round_median_interval"]
        ok = equal and interval["median"] >= BAR
        passed, total = passed + ok, total + 1
        print(f"| {name} | {cell['domain']} | {cell['concurrency']} | {rounds} | {cell['best_fixed']} "
              f"| {interval['median']:.3f} ({interval['low']:.3f}-{interval['high']:.3f}) "
              f"| {cell['adaflash_over_best']:.3f} | {'yes' if equal else 'NO'} | {'pass' if ok else '**miss**'} |")
    print(f"\n{passed} of {total} cells pass (median of round ratios >= {BAR}, outputs equal).")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
