"""Round 39: page faults, kernel CPU seconds and wall seconds of one engine's run, in a process of its own, with the
host allocator as the engine sets it (`adaflash.models.host`) or as glibc comes (`GLIBC_TUNABLES=glibc.malloc.check=0`:
a malloc setting that changes nothing, so that the engine leaves the allocator alone). The engine runs every prompt of
the cell twice, one plain step a call (`run_steps=1`) as plain_overhead.py's sides do; the second run is reported.
Sides:
  ar       `ar`;
  plain    adaflash held to plain decoding (features captured and kept for the drafter);
  plan     adaflash held to the plan arm (every step planned);
  gate     adaflash as it comes.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round39/faults.py math 64 ar
    for each side and cell, both ways, three processes each, the two ways alternating: faults.py --table

Kernel seconds (the process's system CPU time) are mostly the faults' handling here: the run makes few system calls.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import MAX_TOKENS, Always, load  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402

SIDES = {"ar": ("ar", None), "plain": ("adaflash", Arm.PLAIN), "plan": ("adaflash", Arm.PLAN),
         "gate": ("adaflash", None)}
CELLS = (("math", 64), ("chat", 32))
PROCESSES = 3
AS_IT_COMES = "glibc.malloc.check=0"


def usage() -> tuple[int, float]:
    """Page faults and kernel CPU seconds of this process so far."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return now.ru_minflt, now.ru_stime


def one(domain: str, concurrency: int, side: str) -> tuple[int, float, float, int]:
    """Faults, kernel seconds, wall seconds and steps of the second run of the cell's prompts."""
    cell = load(domain)
    mode, arm = SIDES[side]
    engine = Engine(cell.bundle.target, cell.bundle.drafter, num_slots=64, max_len=cell.max_len)
    engine.scheduler.run_steps = 1
    if arm is not None:
        engine.scheduler.gate = Always(arm)
    engine.scheduler.max_active = concurrency
    for _ in range(2):
        for ids in cell.ids:
            engine.submit(Request(ids, MAX_TOKENS, mode=mode))
        (f0, k0), t0, steps = usage(), time.perf_counter(), 0
        while engine.has_work:
            engine.scheduler._mark = time.perf_counter()
            engine.step()
            steps += 1
    f1, k1 = usage()
    return f1 - f0, k1 - k0, time.perf_counter() - t0, steps


def table() -> None:
    print("cell      side   | faults kept / as glibc comes | kernel s kept / comes | wall s kept / comes")
    for domain, concurrency in CELLS:
        for side in SIDES:
            row = {"kept": [], "comes": []}
            for _ in range(PROCESSES):
                for way in row:
                    env = dict(os.environ, GLIBC_TUNABLES=AS_IT_COMES) if way == "comes" else dict(os.environ)
                    out = subprocess.run([sys.executable, __file__, domain, str(concurrency), side], env=env,
                                         check=True, capture_output=True, text=True).stdout.split()
                    row[way].append((int(out[0]), float(out[1]), float(out[2])))
            cols = [" / ".join(" ".join(fmt.format(r[i]) for r in row[way]) for way in row)
                    for i, fmt in enumerate(("{:6d}", "{:.3f}", "{:.2f}"))]
            print(f"{domain} c={concurrency:<3d} {side:6s} | " + " | ".join(cols), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table()
    else:
        print(*one(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
