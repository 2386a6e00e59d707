"""Where one decoding step's time goes: the target forward against everything else, and the torch operations
the forward issues, for a mode at a concurrency (1 by default), on the CPU or a GPU.

Why: on a small model a step's cost is mostly fixed work (Python, operator dispatch) rather than arithmetic,
and an optimisation is only real if the forward or the rest measurably shrinks. The script times the engine's
steps after each prompt's prefill (tokens/s end to end includes prefills), the target forwards inside them,
and profiles a few steps' operators and Python functions. It uses only the engine's public API, so it runs unchanged against an
older checkout (PYTHONPATH=<checkout>/python_backend) for a before/after table measured alike. On a GPU the
forward's clock waits for the device before and after each forward (so the forward's figure is its device
time, and the rest is the host's own work), and the profile adds each operator's device time; since those waits
also stop the host from queueing ahead, `tokens_per_s_unclocked` decodes the same prompts without the clock.

    python benchmarks/bench_step.py --json bench-out/step.json [--modes ar] [--prompts 8 --max-tokens 64]
    python benchmarks/bench_step.py --device cuda --concurrency 8 --modes ar,ngram,adaflash --json bench-out/gpu/step.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import statistics
import subprocess
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from adaflash.cli_args import add_placement_args
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, load_prompts, read_jsonl
from adaflash.models.bundle import Bundle, load_bundle
from adaflash.models.drafter import block_size_of
from adaflash.models.placement import placement

# A data folder (eval/humaneval.jsonl): the packaged evaluation sample of this checkout (python_backend/adaflash/data/
# README.md), by path so that the script still runs against an older checkout's core.
EVAL_DATA = Path(__file__).resolve().parents[1] / "python_backend" / "adaflash" / "data"


class ForwardClock:
    """Times every call of the target's `forward` (the engine calls it by name, once per step)."""

    def __init__(self, engine: Engine) -> None:
        self.target, self.inner, self.ms, self.place = engine.target, engine.target.forward, [], engine.backend.place
        self.target.forward = self

    def detach(self) -> None:
        del self.target.forward

    def attach(self) -> None:
        self.target.forward = self

    def __call__(self, *args, **kwargs):
        self.place.synchronize()
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        self.place.synchronize()
        self.ms.append((time.perf_counter() - t0) * 1000)
        return out


class DraftClock:
    """Keeps the milliseconds of every draft call (the backend times it to the device's end, context appends
    included): with a cheap target step the drafter's share is what decides whether drafting pays."""

    def __init__(self, engine: Engine) -> None:
        self.backend, self.inner, self.ms = engine.backend, engine.backend.draft, []

        async def timed(*args, **kwargs):
            out = await self.inner(*args, **kwargs)
            self.ms.append(out.ms)
            return out

        self.backend.draft = timed


def run_steps(engine: Engine, clock: ForwardClock, prompts: list[list[int]], mode: str, max_tokens: int,
              concurrency: int = 1, drafts: DraftClock | None = None) -> dict:
    """The prompts `concurrency` at a time; each group's first step (its prefill) is left out of the step figures.
    With `drafts`, the drafts' time too: their median over the steps that drafted, and those steps' share."""
    step_ms, forward_ms, draft_ms, tokens, wall = [], [], [], 0, 0.0
    groups = [prompts[i:i + concurrency] for i in range(0, len(prompts), concurrency)]
    for group in groups:
        seqs = [engine.submit(Request(ids, max_tokens, mode=mode)) for ids in group]
        t0 = time.perf_counter()
        engine.step()
        while engine.has_work:
            clock.ms.clear()
            if drafts is not None:
                drafts.ms.clear()
            s0 = time.perf_counter()
            engine.step()
            step_ms.append((time.perf_counter() - s0) * 1000)
            forward_ms.append(sum(clock.ms))
            if drafts is not None and drafts.ms:
                draft_ms.append(sum(drafts.ms))
        engine.backend.place.synchronize()
        wall += time.perf_counter() - t0
        tokens += sum(len(s.output) for s in seqs)
    step, forward = statistics.median(step_ms), statistics.median(forward_ms)
    return {"steps": len(step_ms), "output_tokens": tokens, "tokens_per_s_end_to_end": round(tokens / wall, 2),
            "step_ms_median": round(step, 3), "forward_ms_median": round(forward, 3),
            "rest_ms_median": round(step - forward, 3),
            "tokens_per_step": round(tokens / (len(step_ms) + len(groups)), 3)} | (
        {"draft_ms_median": round(statistics.median(draft_ms), 3),
         "drafting_share": round(len(draft_ms) / len(step_ms), 3)} if draft_ms else {})


def run_unclocked(engine: Engine, clock: ForwardClock, prompts: list[list[int]], mode: str, max_tokens: int,
                  concurrency: int) -> float:
    """Tokens per second of the same decoding without the clock. Why: on a GPU the clock's waits before and after
    each forward keep the host from queueing work ahead of the device, which real decoding does not pay."""
    clock.detach()
    try:
        engine.backend.place.synchronize()
        t0 = time.perf_counter()
        seqs = engine.generate([Request(ids, max_tokens, mode=mode) for ids in prompts], concurrency=concurrency)
        engine.backend.place.synchronize()
        return round(sum(len(s.output) for s in seqs) / (time.perf_counter() - t0), 2)
    finally:
        clock.attach()


def prefill(engine: Engine, prompts: list[list[int]], mode: str, steps: int) -> None:
    """Submit `prompts` for `steps` decode steps after their prefill, and run the prefill (what the profiles leave
    out)."""
    for ids in prompts:
        engine.submit(Request(ids, steps + 1, mode=mode))
    engine.step()


def decode_all(engine: Engine) -> int:
    """Step until every sequence is done, the device's queue drained; the steps taken."""
    done = 0
    while engine.has_work:
        engine.step()
        done += 1
    engine.backend.place.synchronize()
    return done


def host_profile(engine: Engine, prompts: list[list[int]], mode: str, steps: int) -> dict:
    """Python functions per decode step by their own time (cProfile), top 15: what the host does around the
    operators (on the first GPU run, an index tensor made from a list by every layer showed up here first); and
    the project's own functions by their time with what they call, top 25, which says which part of a step holds
    the time (on a GPU a function that reads the device back also holds the device work queued before it)."""
    prefill(engine, prompts, mode, steps)
    prof = cProfile.Profile()
    prof.enable()
    done = decode_all(engine)
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, callers)
    top = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:15]
    ours = sorted(((k, v) for k, v in stats.items() if "adaflash" in k[0]), key=lambda item: item[1][3], reverse=True)
    return {"steps": done, "top": [{"function": f"{Path(file).name}:{line}({name})",
                                    "calls_per_step": round(calls / done, 1),
                                    "self_us_per_step": round(own / done * 1e6, 1)}
                                   for (file, line, name), (_, calls, own, _, _) in top],
            "top_cumulative": [{"function": f"{Path(file).name}:{line}({name})",
                                "calls_per_step": round(calls / done, 1),
                                "cumulative_us_per_step": round(cum / done * 1e6, 1)}
                               for (file, line, name), (_, calls, _, cum, _) in ours[:25]]}


def op_profile(engine: Engine, prompts: list[list[int]], mode: str, steps: int) -> dict:
    """Operators per decode step (after the prefill) of `prompts` decoded together, top 15 by self CPU time,
    and on a GPU top 15 by self device time."""
    prefill(engine, prompts, mode, steps)
    gpu = engine.backend.place.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu) as prof:
        done = decode_all(engine)
    counts, cpu, device = Counter(), Counter(), Counter()
    for e in prof.key_averages():
        counts[e.key] += e.count
        cpu[e.key] += e.self_cpu_time_total
        device[e.key] += getattr(e, "self_device_time_total", 0) if gpu else 0

    def top(times: Counter) -> list[dict]:
        return [{"op": k, "calls_per_step": round(counts[k] / done, 1), "self_us_per_step": round(v / done, 1)}
                for k, v in times.most_common(15)]

    return {"steps": done, "ops_per_step": round(sum(counts.values()) / done, 1), "top": top(cpu)} | (
        {"top_device": top(device), "device_us_per_step": round(sum(device.values()) / done, 1)} if gpu else {})


def code_prompts(bundle: Bundle, eval_data: Path, n: int) -> list[list[int]]:
    """`n` code prompts as token ids: HumanEval's from the data folder when it has them, else the sample prompts."""
    humaneval = eval_data / "eval" / "humaneval.jsonl"
    texts = read_jsonl(humaneval)[:n] if humaneval.exists() else load_prompts(None, n)
    return encode_prompts(bundle.tokenizer, texts, 512)


def git_revision() -> str:
    import adaflash

    root = Path(adaflash.__file__).resolve().parents[2]
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=Path("models/default"))
    p.add_argument("--prompts", type=int, default=8, help="code prompts (HumanEval's, from --eval-data)")
    p.add_argument("--eval-data", type=Path, default=EVAL_DATA,
                   help="a data folder holding eval/humaneval.jsonl (default: the packaged sample, 16 prompts)")
    p.add_argument("--concurrency", type=int, default=1, help="sequences decoded together")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--modes", default="ar", help="comma-separated")
    p.add_argument("--profile-steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="timed passes per mode; the best is reported")
    add_placement_args(p)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        place = placement(args.device, args.dtype)
    except ValueError as exc:
        raise SystemExit(f"error: --{exc}") from None
    bundle = load_bundle(args.model_dir, place=place)
    ids = code_prompts(bundle, args.eval_data, args.prompts)
    max_len = context_length([len(i) for i in ids], args.max_tokens, block_size_of(bundle.drafter))
    engine = Engine(bundle.target, bundle.drafter, num_slots=args.concurrency, max_len=max_len)
    clock, drafts = ForwardClock(engine), DraftClock(engine)
    report = {"revision": git_revision(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "platform": platform.platform(), "device": str(engine.backend.place.device), "dtype": engine.backend.place.dtype_name,
              "concurrency": args.concurrency, "prompts": len(ids), "max_tokens": args.max_tokens, "modes": {}}
    c = args.concurrency
    for mode in args.modes.split(","):
        run_steps(engine, clock, ids[:2 * c], mode, min(16, args.max_tokens), c)  # warm-up
        runs = [run_steps(engine, clock, ids, mode, args.max_tokens, c, drafts) for _ in range(args.repeats)]
        best = max(runs, key=lambda r: r["tokens_per_s_end_to_end"])
        best["tokens_per_s_unclocked"] = max(run_unclocked(engine, clock, ids, mode, args.max_tokens, c)
                                             for _ in range(args.repeats))
        report["modes"][mode] = best | {"profile": op_profile(engine, ids[:c], mode, args.profile_steps),
                                        "host_profile": host_profile(engine, ids[:c], mode, args.profile_steps)}
        print(mode, {k: v for k, v in best.items()}, flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
