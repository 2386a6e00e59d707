"""The drafter's block forward on PyTorch against ONNX Runtime (`--drafter-backend onnx`) on this CPU: the time of
one draft per block length at batch 1 and 8, and end-to-end `adaflash` (and `dflash`) tokens/s in process with each
backend.

Why interleaved: other processes share the cores, and this machine's speed drifts over minutes (docs/history.md).
The two backends take turns trial by trial in one process, the first of each pair alternating, so that the drift
weighs on both alike; the medians and their ratio compare them. Every draft the two make is checked equal, and
every end-to-end output equal to plain decoding's (`ar`), so no speed is reported for a wrong answer. The forward
times are taken at each `--threads` count (both backends alike): on a busy machine PyTorch's OpenMP threads wait on
each other at every barrier, which one thread never does, so the thread count moves the comparison.

    python benchmarks/bench_onnx_drafter.py --json bench-out/onnx-drafter.json   (needs the onnx extra)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort
import torch

from adaflash.cli_args import csv_list
from adaflash.decoding.costs import block_lengths
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, load_prompts
from adaflash.models.bundle import Bundle, load_bundle
from adaflash.models.backends import on_backend
from adaflash.models.drafter import DFlashDrafter
from adaflash.models.target import Transformer

BACKENDS = ("torch", "onnx")


def in_turns(trial: int) -> tuple[str, ...]:
    """Both backends, the one that goes first alternating from trial to trial."""
    return BACKENDS if trial % 2 == 0 else BACKENDS[::-1]


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1000


def forward_times(target: Transformer, drafters: dict[str, DFlashDrafter], batches: list[int], context: int,
                  trials: int) -> list[dict]:
    """Milliseconds of one `draft` call (the context gathered, the block forward, its heads) per batch and block
    length, over `context` cached positions per sequence."""
    torch_drafter = drafters["torch"]
    cfg = torch_drafter.config
    cache = torch_drafter.new_cache(max(batches), context + cfg.block_size + 1)
    g = torch.Generator().manual_seed(0)
    features = torch.randn(max(batches) * context, torch_drafter.fc.weight.shape[1], generator=g)
    torch_drafter.append_context(cache, list(range(max(batches))), features, [context] * max(batches))
    cases = [(b, n) for b in batches for n in block_lengths(cfg.block_size)]
    ms = {(case, name): [] for case in cases for name in BACKENDS}
    for trial in range(-2, trials):  # two warm-up trials, not kept
        for b, n in cases:
            slots, anchors = list(range(b)), [5 + i for i in range(b)]
            out = {}
            for name in in_turns(trial):
                out[name], t = timed(lambda: drafters[name].draft(target, cache, slots, anchors, n))
                if trial >= 0:
                    ms[((b, n), name)].append(t)
            if not torch.equal(out["torch"].tokens, out["onnx"].tokens):
                raise SystemExit(f"error: the backends drafted different tokens at batch {b}, block {n}")
    rows = []
    for b, n in cases:
        med = {name: statistics.median(ms[((b, n), name)]) for name in BACKENDS}
        rows.append({"batch": b, "block_length": n, "trials": trials,
                     "torch_ms_median": round(med["torch"], 3), "onnx_ms_median": round(med["onnx"], 3),
                     "torch_over_onnx": round(med["torch"] / med["onnx"], 3)})
    return rows


def end_to_end(engines: dict[str, Engine], prompts: list[list[int]], max_tokens: int, modes: list[str],
               concurrencies: list[int], rounds: int) -> list[dict]:
    """Tokens/s of each mode per backend, each backend on an engine of its own. At concurrency c the prompts run in
    waves of c; each wave runs on both engines in turn before the next, and the whole set `rounds` times. Also the
    share of steps whose draft came from the drafter (adaflash copies from the context too): what a faster drafter
    can speed up at most."""
    rows = []
    for c in concurrencies:
        waves = [prompts[i:i + c] for i in range(0, len(prompts), c)]
        reference = [[s.output for s in engines["torch"].generate([Request(p, max_tokens, mode="ar") for p in w],
                                                                  concurrency=c)] for w in waves]
        for mode in modes:
            tokens, seconds = dict.fromkeys(BACKENDS, 0), dict.fromkeys(BACKENDS, 0.0)
            steps, drafted = dict.fromkeys(BACKENDS, 0), dict.fromkeys(BACKENDS, 0)
            per_wave_ratio = []
            for r in range(rounds):
                for i, wave in enumerate(waves):
                    wave_ms = {}
                    for name in in_turns(r * len(waves) + i):
                        seqs, wave_ms[name] = timed(lambda: engines[name].generate(
                            [Request(p, max_tokens, mode=mode) for p in wave], concurrency=c))
                        if [s.output for s in seqs] != reference[i]:
                            raise SystemExit(f"error: {mode} on {name} differs from ar at concurrency {c}")
                        tokens[name] += sum(len(s.output) for s in seqs)
                        seconds[name] += wave_ms[name] / 1000
                        records = [st for s in seqs for st in s.steps]
                        steps[name] += len(records)
                        drafted[name] += sum(st.draft_len > 0 and not st.copied for st in records)
                    per_wave_ratio.append(wave_ms["torch"] / wave_ms["onnx"])
            tps = {name: tokens[name] / seconds[name] for name in BACKENDS}
            rows.append({"mode": mode, "concurrency": c, "prompts": len(prompts), "rounds": rounds,
                         "max_tokens": max_tokens, **{f"{name}_tokens_per_s": round(tps[name], 2) for name in BACKENDS},
                         "onnx_over_torch_tokens_per_s": round(tps["onnx"] / tps["torch"], 3),
                         "wave_time_torch_over_onnx_median": round(statistics.median(per_wave_ratio), 3),
                         **{f"{name}_drafter_step_share": round(drafted[name] / steps[name], 3) for name in BACKENDS},
                         "equal_to_ar": True})
    return rows


def at_threads(threads: int, bundle: Bundle, prompts: list[list[int]], args: argparse.Namespace,
               whole: bool) -> dict:
    """The forward times with PyTorch's intra-op threads and the ONNX Runtime session's (made after) set to
    `threads`; with `whole`, end to end too."""
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    drafters = {"torch": bundle.drafter, "onnx": on_backend(bundle.drafter, bundle.target, "onnx")}
    run = {"threads": threads, "export_and_session_s": round(time.perf_counter() - t0, 1),
           "forward": forward_times(bundle.target, drafters, args.batches, args.context, args.trials)}
    for row in run["forward"]:
        print(threads, row, flush=True)
    if not whole:
        return run
    max_len = context_length([len(p) for p in prompts], args.max_tokens, bundle.drafter.config.block_size)
    # Each engine's cost table times its own drafter, as `adaflash bench --drafter-backend` does.
    engines = {name: Engine(bundle.target, d, num_slots=max(args.concurrency), max_len=max_len)
               for name, d in drafters.items()}
    run["end_to_end"] = end_to_end(engines, prompts, args.max_tokens, args.modes, args.concurrency, args.rounds)
    for row in run["end_to_end"]:
        print(threads, row, flush=True)
    run["cost_table_draft_ms"] = {name: e.cost.to_json()["draft_ms"] for name, e in engines.items()}
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=Path("models/default"), help="holds target/ and drafter/")
    p.add_argument("--drafter", default="drafter")
    p.add_argument("--threads", type=csv_list(int), default=[1, 2],
                   help="intra-op threads of both backends, one forward-time run each; end to end at the last "
                        "(2: PyTorch's default here, the core count)")
    p.add_argument("--context", type=int, default=256, help="cached context positions per sequence (forward times)")
    p.add_argument("--batches", type=csv_list(int), default=[1, 8])
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--prompts", type=int, default=8, help="packaged sample prompts, domains in turn (end to end)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=csv_list(int), default=[1, 8])
    p.add_argument("--modes", type=csv_list(str, ("adaflash", "dflash")), default=["adaflash", "dflash"],
                   help="end to end; dflash drafts with the drafter at every step")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    bundle = load_bundle(args.model_dir, args.drafter)
    prompts = encode_prompts(bundle.tokenizer, load_prompts(None, args.prompts), 512)
    runs = [at_threads(t, bundle, prompts, args, whole=i == len(args.threads) - 1) for i, t in enumerate(args.threads)]
    report = {"model_dir": str(args.model_dir), "drafter": args.drafter, "context": args.context,
              "machine": {"cpu_cores": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                          "onnxruntime": ort.__version__,
                          "shared": "the cores were shared with other engineers' processes during the run",
                          "load_average_1min_before_after": [load_before, os.getloadavg()[0]]},
              "runs": runs}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
