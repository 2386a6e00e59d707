"""Round 29: the planner and policy as at a commit before (`git show REV:...`, loaded beside this checkout's), with the
gate's plain blocks as long as the plan arm's (as before this round), and as in this checkout, swapped run by run in
one engine (alternating which goes first), with `ngram` run in the same rounds: tokens per second of adaflash under
each, its ratio to `ngram`'s, the per-call time of `Planner.plan`, and every output equal to `ngram`'s (which equals
`ar`'s). Each side keeps its own controller (estimates, probes) and its own gate across its runs, as an engine would;
the cost model and the models are shared.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/plan_ab.py d3449c8 \
        code,chat 1 4
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from adaflash.decoding import gate
from adaflash.decoding.planner import Planner
from adaflash.decoding.sequence import Request

sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell  # noqa: E402


def planner_at(revision: str, like: Planner) -> Planner:
    """A planner built from `revision`'s planner.py and policy.py, with `like`'s cost model and block size."""
    folder = Path(tempfile.mkdtemp())
    modules = {}
    for name in ("policy", "planner"):
        source = subprocess.run(["git", "show", f"{revision}:python_backend/adaflash/decoding/{name}.py"],
                                check=True, capture_output=True, text=True).stdout
        source = source.replace("from adaflash.decoding.policy import", "from old_policy import")
        (folder / f"old_{name}.py").write_text(source)
        spec = importlib.util.spec_from_file_location(f"old_{name}", folder / f"old_{name}.py")
        modules[name] = importlib.util.module_from_spec(spec)
        sys.modules[f"old_{name}"] = modules[name]
        spec.loader.exec_module(modules[name])
    c = like.controller
    return modules["planner"].Planner(modules["policy"].LengthController(c.cost, c.block_size))


def main() -> None:
    revision, domains = sys.argv[1], sys.argv[2].split(",")
    concurrencies, rounds = [int(c) for c in sys.argv[3].split(",")], int(sys.argv[4])
    for domain in domains:
        cell = load_cell(domain)
        engine = cell.engine()
        sch = engine.scheduler
        planners = {"after": sch.planner, "before": planner_at(revision, sch.planner)}
        gates = {"after": sch.gate, "before": gate.PlanGate(arms=sch.gate.arms)}
        plain_steps = {"after": gate.PLAIN_BLOCK_SEQUENCE_STEPS, "before": gate.BLOCK_SEQUENCE_STEPS}
        for c in concurrencies:
            ids = cell.ids[:16] if c == 1 else cell.ids
            rates: dict[str, list[float]] = {k: [] for k in ("ngram", "before", "after")}
            plan_us: dict[str, list[float]] = {"before": [], "after": []}
            for r in range(rounds):
                outputs = {}
                for side in ("ngram", "before", "after") if r % 2 == 0 else ("ngram", "after", "before"):
                    mode = "ngram" if side == "ngram" else "adaflash"
                    if side != "ngram":
                        sch.planner, sch.gate = planners[side], gates[side]
                        gate.PLAIN_BLOCK_SEQUENCE_STEPS = plain_steps[side]
                    spent = [0.0, 0]
                    plan = sch.planner.plan

                    def timed(*a, plan=plan, spent=spent, **k):
                        t = time.perf_counter()
                        out = plan(*a, **k)
                        spent[0] += time.perf_counter() - t
                        spent[1] += 1
                        return out
                    sch.planner.plan = timed
                    t0 = time.perf_counter()
                    seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in ids], concurrency=c)
                    rates[side].append(sum(len(s.output) for s in seqs) / (time.perf_counter() - t0))
                    del sch.planner.plan
                    if side != "ngram":
                        plan_us[side].append(spent[0] / max(spent[1], 1) * 1e6)
                    outputs[side] = [s.output for s in seqs]
                assert outputs["before"] == outputs["after"] == outputs["ngram"], "an output differs"
            med = {k: statistics.median(v) for k, v in rates.items()}
            over = {k: [round(a / n, 3) for a, n in zip(rates[k], rates["ngram"])] for k in ("before", "after")}
            ab = [round(a / b, 3) for a, b in zip(rates["after"], rates["before"])]
            print(f"{domain} c={c}: ngram {med['ngram']:.0f}, before {med['before']:.0f}, "
                  f"after {med['after']:.0f} tok/s; "
                  f"over ngram by round before {over['before']} after {over['after']} (medians "
                  f"{statistics.median(over['before']):.3f} / {statistics.median(over['after']):.3f}); after / before "
                  f"{ab}, median {statistics.median(ab):.3f}; plan us/call before "
                  f"{statistics.median(plan_us['before']):.1f} after {statistics.median(plan_us['after']):.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
