"""A decode step of the target on the thread that first used OpenMP, on a second one, and on a thread of its own.

Why: the orchestrator runs the target in its process (`serving.remote.TargetInProcess`), and its event loop lives
on a thread of Triton's making. libgomp throttles its threads' spinning once a second thread of a process has run
parallel regions, and each region then puts its workers to sleep and wakes them. This measures what that costs
a decode step, and that a thread which alone uses OpenMP (the process's other threads set to one thread, as the
orchestrator does) runs as fast as the first. Each case in a process of its own, one after the other.

    .venv/bin/python benchmarks/bench_threads.py --model-dir models/default --json bench-out/threads.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from adaflash.models.target import Transformer

CASES = {
    "first thread": "the main thread, the process's first OpenMP user",
    "second thread": "a thread started after the main thread ran parallel regions",
    "thread of its own": "a thread that loads and runs the target; the main thread then uses torch with one thread",
}
CONTEXT = 55


def decode_ms(target: Transformer, steps: int) -> float:
    """Milliseconds per one-token forward over CONTEXT cached positions (the cache rolled back after each)."""
    cache = target.new_cache(1, CONTEXT + 8)
    target.forward(cache, [0], [list(range(5, 5 + CONTEXT))])
    for _ in range(20):
        target.forward(cache, [0], [[7]])
        cache.truncate(0, CONTEXT)
    start = time.perf_counter()
    for _ in range(steps):
        target.forward(cache, [0], [[7]])
        cache.truncate(0, CONTEXT)
    return (time.perf_counter() - start) * 1000 / steps


def run_case(case: str, target_dir: str, steps: int) -> float:
    if case == "first thread":
        return decode_ms(Transformer.from_pretrained(target_dir), steps)
    if case == "second thread":
        target = Transformer.from_pretrained(target_dir)
        decode_ms(target, 20)
        with ThreadPoolExecutor(1) as other:
            return other.submit(decode_ms, target, steps).result()
    with ThreadPoolExecutor(1) as own:
        target = own.submit(Transformer.from_pretrained, target_dir).result()
        torch.set_num_threads(1)
        x = torch.randn(512, 512)
        _ = [x @ x for _ in range(5)]  # the main thread's own work, one thread
        return own.submit(decode_ms, target, steps).result()


def _child(case: str, target_dir: str, steps: int, out) -> None:
    out.send(run_case(case, target_dir, steps))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=Path("models/default"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--reps", type=int, default=3, help="rounds of every case, alternating")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    spawn = multiprocessing.get_context("spawn")
    results: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(args.reps):
        for case in CASES:
            receive, send = spawn.Pipe(duplex=False)
            child = spawn.Process(target=_child, args=(case, str(args.model_dir / "target"), args.steps, send))
            child.start()
            ms = receive.recv()
            child.join()
            results[case].append(round(ms, 3))
    rows = [{"case": case, "what": what, "decode_step_ms": results[case],
             "median_ms": sorted(results[case])[len(results[case]) // 2]} for case, what in CASES.items()]
    for row in rows:
        print(f"{row['case']:>18}: {row['median_ms']:.3f} ms per decode step ({row['decode_step_ms']})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model_dir": str(args.model_dir), "threads": torch.get_num_threads(),
                                         "context": CONTEXT, "steps": args.steps, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
