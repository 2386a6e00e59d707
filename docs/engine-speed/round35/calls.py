"""Round 35: where a run's time goes, call by call, for `ar`, adaflash held to plain decoding (`plain`) and gated
adaflash (`gated`, its gate kept from run to run), taking turns in one engine (reversed every other round); outputs
equal. Each call is put in one kind: admitting (it prefills prompts), and otherwise by its arm, calls at fewer than
TAIL sequences apart (the batch's ragged end). Per kind and run: calls, milliseconds (of them the target's forwards),
tokens committed, prompts admitted and their tokens.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round35/calls.py chat 32 6
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import Always, load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402

TAIL = 16
FIELDS = 6  # calls, ms, forward ms, tokens, admitted, prompt tokens
Tally = dict[str, list[float]]


def traced(engine: Engine, tally: Tally) -> None:
    """Add each step of `engine` to `tally[kind]`."""
    scheduler, backend = engine.scheduler, engine.scheduler.backend
    step, forward, choose = engine.step, backend.forward, scheduler._arm
    call: dict = {}

    async def timed_forward(prefill, verify, feeds, runs=None, stop_early=None):
        t0 = time.perf_counter()
        out = await forward(prefill, verify, feeds, runs, stop_early)
        call["forward"] = call.get("forward", 0.0) + (time.perf_counter() - t0) * 1000
        call["admitted"], call["prompt"] = len(prefill), sum(len(s.tokens) for s in prefill)
        return out

    def arm(active, admitted):
        call["arm"] = choose(active, admitted)
        return call["arm"]

    def traced_step():
        call.clear()
        active = [s for s in scheduler.running.values() if not s.finished]
        before = sum(len(s.output) for s in active)
        t0 = time.perf_counter()
        out = step()
        ms = (time.perf_counter() - t0) * 1000
        name = call["arm"].value if call.get("arm") else "ar"
        kind = "admit" if call.get("admitted") else (f"tail {name}" if len(active) < TAIL else name)
        row = tally.setdefault(kind, [0.0] * FIELDS)
        for i, v in enumerate((1, ms, call.get("forward", 0.0), sum(len(s.output) for s in active) - before,
                               call.get("admitted", 0), call.get("prompt", 0))):
            row[i] += v
        return out

    backend.forward, scheduler._arm, engine.step = timed_forward, arm, traced_step


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    scheduler = engine.scheduler
    gate = scheduler.gate
    runs = Runs(cell.ids, concurrency)
    tally: Tally = {}
    traced(engine, tally)
    totals: dict[str, Tally] = defaultdict(dict)
    seconds: dict[str, float] = defaultdict(float)
    for r in range(rounds):
        for side in in_turn(["ar", "plain", "gated"], r):
            scheduler.gate = gate if side == "gated" else Always(Arm.PLAIN)
            tally.clear()
            t0 = time.perf_counter()
            runs.rate(engine, "ar" if side == "ar" else "adaflash")
            seconds[side] += time.perf_counter() - t0
            for kind, row in tally.items():
                totals[side][kind] = [a + b for a, b in zip(totals[side].get(kind, [0.0] * FIELDS), row)]
        print(r, {side: round(seconds["ar"] / s, 3) for side, s in seconds.items()}, "(cumulative over ar)", flush=True)
    print(f"{domain} c={concurrency}, {rounds} rounds, per run:")
    for side, kinds in totals.items():
        print(f"{side}: {seconds[side] / rounds * 1000:.0f} ms")
        for kind, (calls, ms, forward, tokens, admitted, prompt) in sorted(kinds.items()):
            print(f"  {kind:>10}: {calls / rounds:6.1f} calls {ms / rounds:7.1f} ms (forwards {forward / rounds:7.1f}) "
                  f"{tokens / rounds:7.1f} tokens, {admitted / rounds:5.1f} admitted ({prompt / rounds:6.0f} prompt "
                  "tokens)")


if __name__ == "__main__":
    main()
