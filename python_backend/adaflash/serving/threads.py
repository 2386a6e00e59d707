"""OpenMP wait settings of the serving processes: idle threads sleep at once, the target's spin briefly.

In the core (no Triton import) because both sides need it: the launcher sets the environment
of every model process, and the target model applies its share before torch loads.
"""

from __future__ import annotations

import os

# The target's idle OpenMP threads spin this many iterations before they sleep (docs/history.md, round 18: how long).
TARGET_SPIN_COUNT = 30_000
TARGET_SPIN_VAR = "ADAFLASH_TARGET_GOMP_SPINCOUNT"


def openmp_wait_env(env: dict[str, str]) -> dict[str, str]:
    """OpenMP wait settings for the model processes, unless the caller chose (OMP_WAIT_POLICY or
    GOMP_SPINCOUNT): idle threads sleep at once, except the target's, which spin briefly.

    Threads that sleep at once must be woken for each of a forward's parallel regions, which made the
    served target's decode step far slower than in process; threads that spin while idle (libgomp's
    default: milliseconds after each parallel region) take the cores from another process computing,
    the drafter's, which the step loop calls between the target's forwards. So the target, whose forward
    is on every step's path, spins longer than most gaps inside a forward and a tenth of libgomp's
    default (`spin_target_threads`). The measurements behind the setting are
    in docs/history.md (round 18 and the rounds before it).
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
