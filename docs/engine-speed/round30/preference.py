"""Round 30: what `gate.PLAIN_PREFERENCE` stands for, measured again on the fixed cost table: adaflash with every call on
the plan arm and with every call on the plain arm, alternating by round, at one load: the rate of the calls a gate
observes (tokens per ms of the timed calls) and the whole run's tokens per second. Where the whole runs' ratio (plan
over plain) falls short of the observed calls' ratio, the gap is what the calls leave out (sequences out of step,
admissions one by one, a shrinking batch at the end); round 26 measured it at 0.87-0.90 and set the preference to 10%.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/preference.py broad:translation 8 4
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cells import MAX_TOKENS, Always, load  # noqa: E402

from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    observed, whole = [], []
    reference = None
    for r in range(rounds):
        calls, runs = {}, {}
        for arm in (Arm.PLAN, Arm.PLAIN) if r % 2 == 0 else (Arm.PLAIN, Arm.PLAN):
            engine.scheduler.gate = gate = Always(arm)
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in cell.ids], concurrency=concurrency)
            runs[arm] = sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)
            calls[arm] = gate.seen.tokens / gate.seen.ms
            reference = reference or [s.output for s in seqs]
            assert [s.output for s in seqs] == reference, "an output differs"
        observed.append(calls[Arm.PLAN] / calls[Arm.PLAIN])
        whole.append(runs[Arm.PLAN] / runs[Arm.PLAIN])
    print(f"{domain} c={concurrency}: plan / plain, observed calls {[round(x, 3) for x in observed]} median "
          f"{statistics.median(observed):.3f}; whole runs {[round(x, 3) for x in whole]} median "
          f"{statistics.median(whole):.3f}; whole / observed {statistics.median(whole) / statistics.median(observed):.3f}",
          flush=True)


if __name__ == "__main__":
    main()
