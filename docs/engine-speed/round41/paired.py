"""Round 41: the gated engine against planning every step (`adaflash-no-gate`), paired round by round, in every
`bench_gate.py` JSON of rounds 36-40 and of this round's run before the change (`before/`), at one concurrency. Per
file and cell the median of the rounds' ratios (gated over planning every step) and each side's median over the best
fixed mode; then all rounds pooled: the median ratio, and the share of rounds the gate ran ahead.

    .venv/bin/python docs/engine-speed/round41/paired.py 8
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
FILES = sorted([*ROOT.glob("round3[6-9]/*.json"), *ROOT.glob("round40/*.json"), *ROOT.glob("round41/before/*.json")])
FIXED = ("ar", "ngram", "dflash")
SIDES = (*FIXED, "adaflash", "adaflash-no-gate")


def rounds_of(path: Path, concurrency: int) -> dict[str, list[dict[str, float]]]:
    """Each cell's complete rounds at `concurrency` (tokens/s by variant) in one bench_gate JSON (none if not one)."""
    try:
        rows = json.loads(path.read_text()).get("rows")
    except (json.JSONDecodeError, AttributeError):
        return {}
    cells: dict[str, dict[int, dict[str, float]]] = {}
    for r in rows if isinstance(rows, list) else []:
        if isinstance(r, dict) and r.get("concurrency") == concurrency and "variant" in r:
            cells.setdefault(r["domain"], {}).setdefault(r["repeat"], {})[r["variant"]] = r["tokens_per_s"]
    return {d: [v for v in rs.values() if all(v.get(s) for s in SIDES)] for d, rs in cells.items()}


def main(concurrency: int) -> None:
    pooled: list[float] = []
    for path in FILES:
        for domain, rounds in sorted(rounds_of(path, concurrency).items()):
            if not rounds:
                continue
            ratio = [v["adaflash"] / v["adaflash-no-gate"] for v in rounds]
            over = {s: statistics.median(v[s] / max(v[f] for f in FIXED) for v in rounds)
                    for s in ("adaflash", "adaflash-no-gate")}
            pooled += ratio
            print(f"{str(path.relative_to(ROOT)):42s} {domain:13s} {len(rounds):2d} rounds  gated / every step "
                  f"{statistics.median(ratio):.3f}  over the best fixed mode: gated {over['adaflash']:.3f}, "
                  f"every step {over['adaflash-no-gate']:.3f}")
    ahead = sum(r > 1 for r in pooled) / len(pooled)
    print(f"c={concurrency}: {len(pooled)} rounds, gated / every step median {statistics.median(pooled):.3f}, "
          f"the gate ahead in {ahead:.0%}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
