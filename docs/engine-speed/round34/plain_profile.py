"""Round 34: where adaflash held to one arm (plain unless named) spends time that `ar` does not, in one engine: runs of
each under cProfile after an untimed one, and the functions whose own time differs most between the two (ms a run).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round34/plain_profile.py math 64 \
        [reversed] [plan]

With `reversed`, adaflash runs first (a drift of the machine's speed between the two shows as a difference).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import Always, load  # noqa: E402
from turns import Runs  # noqa: E402

from adaflash.decoding.gate import Arm  # noqa: E402

SHOWN = 25
RUNS = 3


def own_ms(profile: cProfile.Profile) -> dict[str, tuple[int, float]]:
    """Per function (file:line name): its calls and its own milliseconds, over RUNS runs."""
    stats = pstats.Stats(profile).stats
    return {f"{Path(f).name}:{line} {name}": (calls, tt * 1000 / RUNS)
            for (f, line, name), (_, calls, tt, _, _) in stats.items()}


def main() -> None:
    domain, concurrency = sys.argv[1], int(sys.argv[2])
    cell = load(domain)
    engine = cell.engine()
    arm = Arm.PLAN if "plan" in sys.argv[3:] else Arm.PLAIN
    engine.scheduler.gate = Always(arm)
    runs = Runs(cell.ids, concurrency)
    profiles = {}
    modes = ("ar", "adaflash")
    for mode in modes[::-1] if "reversed" in sys.argv[3:] else modes:
        runs.rate(engine, mode)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(RUNS):
            runs.rate(engine, mode)
        profile.disable()
        profiles[mode] = own_ms(profile)
    ar, ada = profiles["ar"], profiles["adaflash"]
    total = {mode: sum(ms for _, ms in p.values()) for mode, p in profiles.items()}
    print(f"{domain} c={concurrency}: own time a run under cProfile, ar {total['ar']:.0f} ms, adaflash held to "
          f"{arm.value} {total['adaflash']:.0f} ms")
    diff = {k: ada.get(k, (0, 0.0))[1] - ar.get(k, (0, 0.0))[1] for k in {*ar, *ada}}
    for k in sorted(diff, key=lambda k: -abs(diff[k]))[:SHOWN]:
        print(f"{diff[k]:+8.1f} ms  ar {ar.get(k, (0, 0))[0] // RUNS:6d} calls {ar.get(k, (0, 0.0))[1]:7.1f} ms  "
              f"adaflash {ada.get(k, (0, 0))[0] // RUNS:6d} calls {ada.get(k, (0, 0.0))[1]:7.1f} ms  {k}")


if __name__ == "__main__":
    main()
