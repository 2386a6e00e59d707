"""The plan gate's A/B in one process: `ar`, `ngram`, `dflash`, `adaflash` with the gate and without, taking turns.

Why: this machine's speed moves by tens of percent over minutes, and the gate changes adaflash by a few percent,
so the two are compared as medians of runs taking turns within one process (an engine for the fixed modes, one for
adaflash with the gate and one without: the same weights and the same measured cost table), each cell a domain alone
at one concurrency. Every output must equal `ar`'s (greedy), or with --tie-tolerance depart from it only at a near-tie
(GPUs); a cell where one does not gets no speed and the run exits 1.

    .venv/bin/python benchmarks/bench_gate.py --model-dir models/default --json bench-out/gate.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from adaflash.cli_args import add_placement_args, csv_list
from adaflash.decoding.engine import Engine
from adaflash.decoding.gate import Arm, Totals
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.bench import departures
from adaflash.evaluation.prompts import PACKAGED_DATA, Prompt, encode_prompts, eval_set_prompts, load_prompts
from adaflash.models import graphs
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
from adaflash.models.placement import placement

FIXED = ("ar", "ngram", "dflash")  # adaflash is held against the best of these
VARIANTS = (*FIXED, "adaflash", "adaflash-no-gate")  # the last: Engine(plan_gate=False)
# A round's order, reversed every other round: adaflash runs next to `ar` (the best fixed mode under load on a CPU),
# one run from `ngram` (best at low load), and reversing cancels a steady drift of the machine's speed out of every
# pair.
RUN_ORDER = ("dflash", "ngram", "ar", "adaflash", "adaflash-no-gate")
# Beside the ratio of a cell's medians: the median of adaflash's ratios to each round's best fixed mode, with a
# bootstrap interval of it (rounds resampled with replacement). Why: rounds of one cell swing by several percent on
# this machine, and the same cells landed on either side of the 0.97 bar from one run to the next (docs/history.md,
# engine speed rounds 31-33); the interval says whether a cell's miss is its own or the machine's.
INTERVAL = 0.90
RESAMPLES = 10_000
POOLED = "pooled"  # the one cell of --pooled
LOW_LOAD_PROMPTS = 16  # at concurrency 1 a cell runs this many prompts (a pass over 64 would take minutes)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--eval-data", type=Path, default=PACKAGED_DATA,
                   help="a data folder holding eval/ (default: the packaged sample, whose sets have 16 rows each: "
                        "a full data folder for more per domain)")
    p.add_argument("--per-domain", type=int, default=64, help="at most this many prompts per domain")
    p.add_argument("--prompts", type=Path, help="instead of --eval-data: JSON lines with prompt and domain")
    p.add_argument("--split", choices=("tune", "holdout"), help="with --prompts: only this split")
    p.add_argument("--domains", type=csv_list(str), help="only these domains (default: every one)")
    p.add_argument("--pooled", action="store_true",
                   help="every prompt (after --domains) in one cell, domain 'pooled': mixed traffic under load")
    p.add_argument("--concurrency", type=csv_list(int), default=[1, 8, 32, 64])
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--max-prompt-tokens", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=0,
                   help="untimed rounds of each cell first (GPUs: CUDA graphs are recorded on a shape's first use, "
                        "which a server pays once in its life, not in every cell)")
    p.add_argument("--tie-tolerance", type=float, default=0.0,
                   help="an output may depart from ar's where the target's logits of the two tokens are within this "
                        "fraction of the largest logit (GPUs; see adaflash bench)")
    add_placement_args(p)
    p.add_argument("--json", type=Path, required=True)
    return p.parse_args(argv)


def load(args: argparse.Namespace) -> list[Prompt]:
    """The prompts, each labelled with the cell it runs in."""
    if args.prompts:
        prompts = load_prompts(args.prompts, None, args.split)
    else:
        prompts = eval_set_prompts(args.eval_data, args.per_domain, training_template=True)
    prompts = [p for p in prompts if not args.domains or p.domain in args.domains]
    return [dataclasses.replace(p, domain=POOLED) for p in prompts] if args.pooled else prompts


def summarise(rows: list[dict]) -> list[dict]:
    """Per cell the median tok/s of each variant, and adaflash's with and without the gate over the best of the
    FIXED modes: of the medians, and round by round (the variants of a round ran back to back, so the machine's
    drift over minutes, which moves a cell's medians by tens of percent, mostly cancels within a round), with the
    median of adaflash's round ratios and its interval (`median_interval`)."""
    cells = sorted({(r["domain"], r["concurrency"]) for r in rows}, key=lambda c: (c[0], c[1]))
    out = []
    for domain, c in cells:
        rounds: dict[int, dict[str, float]] = {}
        calls: dict[str, int] = {}
        for r in rows:
            if (r["domain"], r["concurrency"]) == (domain, c):
                rounds.setdefault(r["repeat"], {})[r["variant"]] = r["tokens_per_s"]
                for arm, run in r.get("arms", {}).items():
                    calls[arm] = calls.get(arm, 0) + run["calls"]
        med = {v: statistics.median(tps[v] for tps in rounds.values()) for v in VARIANTS}
        best_fixed = max(FIXED, key=lambda v: med[v])
        best = med[best_fixed]
        out.append({"domain": domain, "concurrency": c, "median_tokens_per_s": med,
                    "best_fixed": best_fixed,
                    "adaflash_over_best": round(med["adaflash"] / best, 3),
                    "adaflash_no_gate_over_best": round(med["adaflash-no-gate"] / best, 3),
                    "adaflash_over_best_by_round": _over_best(rounds, "adaflash"),
                    "adaflash_round_median_interval": median_interval(_over_best(rounds, "adaflash")),
                    "adaflash_no_gate_over_best_by_round": _over_best(rounds, "adaflash-no-gate"),
                    "adaflash_calls_by_arm": calls})
    return out


def median_interval(ratios: list[float], seed: int = 0) -> dict[str, float]:
    """The median of `ratios` and its INTERVAL bootstrap interval (RESAMPLES resamples, seeded: a summary is
    reproducible from its rows)."""
    draws = np.random.default_rng(seed).integers(0, len(ratios), (RESAMPLES, len(ratios)))
    low, high = np.percentile(np.median(np.asarray(ratios)[draws], axis=1), [50 * (1 - INTERVAL), 50 * (1 + INTERVAL)])
    return {"median": round(statistics.median(ratios), 3), "low": round(float(low), 3), "high": round(float(high), 3)}


def _over_best(rounds: dict[int, dict[str, float]], variant: str) -> list[float]:
    """`variant` over the best FIXED mode of the same round, round by round."""
    return [round(tps[variant] / max(tps[v] for v in FIXED), 3) for _, tps in sorted(rounds.items())]


def gate_state(engine: Engine) -> dict[str, dict]:
    """What the gated engine's gate learnt by the end, per load (sequences from 2**(bucket-1)): each arm's running
    rate (tokens committed per token plain decoding commits in the time, `PlanGate.observe`), its blocks run, and
    the arm leading. Where a cell loses, this says whether the gate followed the faster arm and how often it tried
    the other."""
    return {f"{1 << (bucket - 1)}+": {"rates": {a.value: r and round(r, 4) for a, r in load.rates.items()},
                                      "blocks": {a.value: n for a, n in load.blocks.items()},
                                      "leading": load.leading and load.leading.value}
            for bucket, load in sorted(engine.speculation.gate.loads.items())}


def arms_run(before: dict[Arm, Totals], after: dict[Arm, Totals]) -> dict[str, dict]:
    """The gated run's observed calls on each arm, and their tokens per ms: where a cell's time went."""
    out = {}
    for arm, end in after.items():
        calls, tokens, ms = (end.calls - before[arm].calls, end.tokens - before[arm].tokens, end.ms - before[arm].ms)
        out[arm.value] = {"calls": calls, "tokens_per_ms": round(tokens / ms, 3) if ms > 0 else None}
    return out


def round_order(repeat: int) -> tuple[str, ...]:
    """The variants of round `repeat` in the order they run (`RUN_ORDER`)."""
    return RUN_ORDER if repeat % 2 == 0 else RUN_ORDER[::-1]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        place = placement(args.device, args.dtype)
    except ValueError as exc:
        raise SystemExit(f"error: --{exc}") from None
    bundle = load_bundle(args.model_dir, place=place)
    prompts = load(args)
    ids = encode_prompts(bundle.tokenizer, prompts, args.max_prompt_tokens, None)
    max_len = context_length([len(i) for i in ids], args.max_tokens, block_size_of(bundle.drafter))
    slots = max(args.concurrency)
    gated = Engine(bundle.target, bundle.drafter, num_slots=slots, max_len=max_len)
    plain = Engine(bundle.target, bundle.drafter, num_slots=slots, max_len=max_len,
                   cost_model=copy.deepcopy(gated.cost), plan_gate=False)
    # The fixed modes in an engine of their own: their drafts and copies teach the acceptance estimates of the engine
    # they run in, so in adaflash's they set what adaflash planned with next, differently with the order of the runs.
    fixed = Engine(bundle.target, bundle.drafter, num_slots=slots, max_len=max_len,
                   cost_model=copy.deepcopy(gated.cost))
    engines = {**{m: (fixed, m) for m in FIXED}, "adaflash": (gated, "adaflash"),
               "adaflash-no-gate": (plain, "adaflash")}
    rows, ok = [], True
    for domain in sorted({p.domain for p in prompts}):
        mine = [i for i, p in zip(ids, prompts) if p.domain == domain]
        for c in args.concurrency:
            cell = mine[:LOW_LOAD_PROMPTS] if c == 1 else mine
            if len(cell) < c:
                continue
            for _ in range(args.warmup):
                for engine, mode in engines.values():
                    engine.generate([Request(i, args.max_tokens, mode=mode) for i in cell], concurrency=c)
            for repeat in range(args.repeats):
                outputs, walls, arms = {}, {}, {}
                for variant in round_order(repeat):
                    engine, mode = engines[variant]
                    tally, recorded = copy.deepcopy(gated.speculation.gate.totals), graphs.recordings()
                    t0 = time.perf_counter()
                    seqs = engine.generate([Request(i, args.max_tokens, mode=mode) for i in cell], concurrency=c)
                    walls[variant] = time.perf_counter() - t0, graphs.recordings() - recorded
                    outputs[variant] = [s.output for s in seqs]
                    if variant == "adaflash":
                        arms = {"arms": arms_run(tally, gated.speculation.gate.totals)}
                for variant in VARIANTS:  # checked once the round has run `ar`, whatever the order
                    gaps = departures(bundle.target, cell, outputs["ar"], outputs[variant])
                    right = max(gaps, default=0.0) <= args.tie_tolerance
                    ok &= right
                    wall, graphs_recorded = walls[variant]
                    rows.append({"domain": domain, "concurrency": c, "repeat": repeat, "variant": variant,
                                 "tokens_per_s": round(sum(map(len, outputs[variant])) / wall, 1) if right else None,
                                 "greedy_equal_to_ar": not gaps, "departures_at_ties": len(gaps) if right else None,
                                 "graphs_recorded": graphs_recorded, **(arms if variant == "adaflash" else {})})
                    print(domain, c, repeat, variant, rows[-1]["tokens_per_s"], flush=True)
    summary = summarise(rows) if ok else []
    for s in summary:
        interval = s["adaflash_round_median_interval"]
        print(f"{s['domain']:14s} c={s['concurrency']:<3d} best {s['best_fixed']:5s} adaflash "
              f"{s['adaflash_over_best']:.2f} (rounds {s['adaflash_over_best_by_round']}, their median "
              f"{interval['median']:.3f}, {INTERVAL:.0%} interval {interval['low']:.3f}-{interval['high']:.3f}), "
              f"without the gate {s['adaflash_no_gate_over_best']:.2f}; calls by arm {s['adaflash_calls_by_arm']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                     "device": str(place.device), "dtype": place.dtype_name,
                                     "gate_at_the_end": gate_state(gated), "rows": rows,
                                     "summary": summary}, indent=1) + "\n")
    if not ok:
        print("error: an output departs from ar's other than at a near-tie; no summary", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
