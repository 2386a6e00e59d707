"""OpenMP wait settings of the serving processes: idle threads sleep at once, the target's spin briefly.

In the core (no Triton import) because both sides need it: the launcher sets the environment
of every model process, and the target model applies its share before torch loads.
"""

from __future__ import annotations

import os

# The target's idle OpenMP threads spin this many iterations (about 75 us here) before they sleep.
TARGET_SPIN_COUNT = 3_000
TARGET_SPIN_VAR = "ADAFLASH_TARGET_GOMP_SPINCOUNT"


def openmp_wait_env(env: dict[str, str]) -> dict[str, str]:
    """OpenMP wait settings for the model processes, unless the caller chose (OMP_WAIT_POLICY or
    GOMP_SPINCOUNT): idle threads sleep at once, except the target's, which spin briefly.

    Five model processes share the cores, and the target and the drafter run forwards at the same
    time under load. Threads that spin while idle (libgomp's default: ~5 ms after each parallel
    region) take the cores from the process computing. Threads that sleep at once must be woken for
    each of a forward's ~150 parallel regions: the served target's decode step took 2.3x its
    in-process time (9.5 vs 4 ms, default models, 2 cores). So the target, whose forward is on every
    step's path, spins just longer than most gaps inside a forward (`spin_target_threads`).
    Measured (default models, `adaflash sweep`, 20 s per level, ar / adaflash output tokens/s, runs
    interleaved): all sleeping 70-77 / 164-172 at concurrency 1 and 179-189 / 340-373 at 32; the
    target spinning 0.7 ms 123-127 / 227-247 and 162-183 / 318-324; spinning 75 us (this setting)
    109-114 / 194-197 and 174-180 / 338-362.
    """
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return {}
    return {"OMP_WAIT_POLICY": "PASSIVE", TARGET_SPIN_VAR: str(TARGET_SPIN_COUNT)}


def spin_target_threads() -> None:
    """The target model's share of `openmp_wait_env`; call it before torch is imported, since libgomp
    reads its settings once, when it loads."""
    spin = os.environ.get(TARGET_SPIN_VAR)
    if spin is not None:
        os.environ.pop("OMP_WAIT_POLICY", None)
        os.environ["GOMP_SPINCOUNT"] = spin
