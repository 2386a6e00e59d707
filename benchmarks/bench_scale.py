"""The engine at real size: Qwen3-0.6B's shape with random weights (`scale_fixture.py`), fp32 on this CPU, beside
llama.cpp f32 on the same folder, in one run.

    .venv/bin/python benchmarks/bench_scale.py --json bench-out/scale.json                 # make bench-scale
    .venv/bin/python benchmarks/bench_scale.py --shape tiny --prompt-lengths 32,64 --no-llama --json /tmp/s.json

What it measures, each part a section of the JSON (written after every part, so a long run's parts survive its end):
- `bandwidth` (measured last, so that its buffer is not in the memory's peak): the machine's memory read bandwidth
  (torch summing a 1 GiB tensor, best of 5), and from it the decode bound: the target's weight bytes a token reads
  over that bandwidth.
- `ar`: plain decoding per prompt length and concurrency: prefill tokens/s (the prompts' tokens over the time from
  admission to the first token) and decode ms per step (first token to the last, per step), prompts of exactly
  that many tokens (random ids, as llama-bench's), outputs of `--max-tokens` (no end token stops them).
- `modes`: every mode at `--modes-prompt-tokens` and each of `--modes-concurrency`, greedy-equal to `ar`, and
  adaflash against the best fixed mode (random weights accept little: the point is that adaflash falls back to plain
  decoding without loss).
- `long`: every mode greedy-equal to `ar` on one prompt of the longest length.
- `memory`: the process's peak resident memory against `plan-memory`'s prediction for the largest engine it built
  (the weights, caches and activations over the resident memory before the models were loaded).
- `llama_cpp`: llama-bench's prompt processing and token generation on the same folder converted to GGUF f32 (its
  build from `make bench-peers`' source).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from adaflash.decoding.engine import Engine
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request, Sequence
from adaflash.evaluation.bench import run_bench
from adaflash.models.bundle import load_bundle
from adaflash.models.memory import plan_memory
from adaflash_contract.modes import MODE_NAMES

HERE = Path(__file__).parent
KIB = 1024


def _script(name: str):
    """A sibling benchmark script, loaded from its file (scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_for_scale", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_bandwidth_gbs(gib: float = 1.0, repeats: int = 5) -> float:
    """Memory read bandwidth: the best of `repeats` sums over `gib` GiB of fp32 (GB/s)."""
    x = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - started)
    return round(x.numel() * 4 / best / 1e9, 2)


def weight_bytes_per_token(target: torch.nn.Module) -> int:
    """What one decode step reads at least: every weight of the target once (a tied head counted once)."""
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in target.parameters()}.values())


def prompts_of(length: int, count: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]


def timed_ar(engine: Engine, prompts: list[list[int]], max_tokens: int) -> dict:
    """Prefill tokens/s and decode ms per step of one wave of `ar` requests run together."""
    seqs: list[Sequence] = engine.generate([Request(p, max_tokens, "ar", stop_ids=()) for p in prompts],
                                           len(prompts))
    admitted, first = min(s.admitted_at for s in seqs), max(s.first_token_at for s in seqs)
    finished = max(s.finished_at for s in seqs)
    steps = max(len(s.output) for s in seqs) - 1
    return {"prompt_tokens": sum(len(p) for p in prompts), "concurrency": len(prompts),
            "prefill_s": round(first - admitted, 3),
            "prefill_tokens_per_s": round(sum(len(p) for p in prompts) / (first - admitted), 1),
            "decode_ms_per_step": round((finished - first) / steps * 1e3, 2) if steps else None,
            "decode_tokens_per_s": round(len(prompts) * steps / (finished - first), 2) if steps else None}


def resident_kib() -> int:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0])


class Run:
    """The record, written after each part."""

    def __init__(self, path: Path, meta: dict) -> None:
        self.path, self.record = path, {"meta": meta}

    def add(self, part: str, value) -> None:
        self.record[part] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.record, indent=1) + "\n")
        print(f"{part}: {json.dumps(value)[:400]}", flush=True)


HEADROOM = 64  # positions past the output a step may write (a draft block being verified), beyond the context limit


def engine_for(bundle, slots: int, tokens: int, prefill_tokens: int) -> Engine:
    """An engine whose sequences hold `tokens` (prompt and output) and what a step writes past them."""
    return Engine(bundle.target, bundle.drafter, num_slots=slots, max_len=tokens + HEADROOM,
                  prefill_tokens=prefill_tokens)


def ar_grid(bundle, lengths: list[int], concurrency: list[int], max_tokens: int, most_tokens: int,
            prefill_tokens: int) -> tuple[list[dict], tuple[int, int]]:
    """`ar` per (length, concurrency) where length x concurrency fits `most_tokens`; the largest engine's shape."""
    rows, largest = [], (1, 1)
    vocab = bundle.target.config.vocab_size
    for length in lengths:
        fitting = [c for c in concurrency if c * length <= most_tokens] or [1]
        engine = engine_for(bundle, max(fitting), length + max_tokens, prefill_tokens)
        largest = max(largest, (max(fitting), length + max_tokens + HEADROOM), key=lambda s: s[0] * s[1])
        timed_ar(engine, prompts_of(min(length, 32), 1, vocab, seed=0), 2)  # warm-up
        for c in fitting:
            rows.append({"prompt_tokens_each": length, **timed_ar(engine, prompts_of(length, c, vocab, seed=c),
                                                                    max_tokens)})
            print(f"ar: {rows[-1]}", flush=True)
        del engine
    return rows, largest


def modes_grid(bundle, length: int, concurrency: list[int], max_tokens: int, prefill_tokens: int) -> dict:
    """Every mode per concurrency, greedy-equal to `ar`; adaflash over the best fixed mode."""
    engine = engine_for(bundle, max(concurrency), length + max_tokens, prefill_tokens)
    count = max(concurrency)
    prompts = prompts_of(length, count, bundle.target.config.vocab_size, seed=7)
    rows, equal = run_bench(engine, prompts, [None] * count, list(MODE_NAMES), concurrency, max_tokens,
                            SamplingParams(), progress=False)
    out = {"prompt_tokens_each": length, "requests": count, "max_tokens": max_tokens, "all_equal_to_ar": equal,
           "rows": [{k: r[k] for k in ("mode", "concurrency", "output_tokens_per_s", "tau", "mean_draft_len",
                                       "greedy_equal_to_ar")} for r in rows]}
    out["adaflash_over_best_fixed"] = {
        str(c): round(next(r["output_tokens_per_s"] for r in rows if r["concurrency"] == c and r["mode"] == "adaflash")
                      / max(r["output_tokens_per_s"] for r in rows if r["concurrency"] == c
                            and r["mode"] not in ("adaflash", "adaflash-published")), 3) for c in concurrency}
    return out


def long_equal(bundle, length: int, max_tokens: int, prefill_tokens: int) -> dict:
    engine = engine_for(bundle, 1, length + max_tokens, prefill_tokens)
    prompts = prompts_of(length, 1, bundle.target.config.vocab_size, seed=11)
    rows, equal = run_bench(engine, prompts, [None], list(MODE_NAMES), [1], max_tokens, SamplingParams(),
                            progress=False)
    return {"prompt_tokens": length, "max_tokens": max_tokens, "all_equal_to_ar": equal,
            "rows": [{k: r[k] for k in ("mode", "output_tokens_per_s", "tau", "greedy_equal_to_ar")} for r in rows]}


def llama_cpp(model_dir: Path, work: Path, lengths: list[int], max_tokens: int, threads: int) -> dict:
    """llama-bench on the target converted to GGUF f32: prompt processing per length and token generation."""
    peers = _script("bench_peers")
    tree = peers.llama_source(work)
    bin_dir, build_s = peers.build_llama(tree, work)
    gguf = peers.convert(tree, model_dir / "target", work / "scale-target-f32.gguf", "f32")
    done = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-p", ",".join(map(str, lengths)),
                           "-n", str(max_tokens), "-t", str(threads), "-r", "2", "-o", "json"],
                          capture_output=True, text=True, check=True, timeout=7200)
    results = json.loads(done.stdout)
    return {"build_commit": results[0]["build_commit"], "build_s": build_s, "threads": threads,
            "prompt_tokens_per_s": {str(r["n_prompt"]): round(r["avg_ts"], 1) for r in results if r["n_prompt"]},
            "generation_tokens_per_s": next(round(r["avg_ts"], 2) for r in results if r["n_gen"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, help="default: bench-out/scale/<shape>-random, written when missing")
    p.add_argument("--shape", default="qwen3-0.6b", help="the fixture's shape (scale_fixture.py)")
    p.add_argument("--prompt-lengths", default="128,2048,8192")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--most-tokens", type=int, default=8192, help="prompt tokens of one wave at most (length x c)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prefill-tokens", type=int, default=4096, help="the scheduler's prefill budget per step")
    p.add_argument("--modes-prompt-tokens", type=int, default=128)
    p.add_argument("--modes-concurrency", default="1,16")
    p.add_argument("--modes-max-tokens", type=int, default=32)
    p.add_argument("--long-max-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--no-llama", action="store_true", help="leave out llama.cpp")
    p.add_argument("--llama-work", type=Path, default=Path("bench-out/peers"), help="llama.cpp's source and build")
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.prompt_lengths.split(",")]
    model_dir = args.model_dir or Path(f"bench-out/scale/{args.shape}-random")
    if not (model_dir / "target" / "model.safetensors").exists():
        _script("scale_fixture").write_fixture(model_dir, args.shape)
    torch.set_num_threads(args.threads)
    run = Run(args.json, {"command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
                          "machine": f"{platform.machine()}, {args.threads} threads", "torch": torch.__version__,
                          "model_dir": str(model_dir), "shape": args.shape,
                          "date": time.strftime("%Y-%m-%d", time.gmtime())})
    before_kib = resident_kib()
    bundle = load_bundle(model_dir)
    rows, (slots, max_len) = ar_grid(bundle, lengths, [int(c) for c in args.concurrency.split(",")],
                                     args.max_tokens, args.most_tokens, args.prefill_tokens)
    run.add("ar", rows)
    plan = plan_memory(bundle.target.config, bundle.drafter.config, "float32", slots, max_len, args.prefill_tokens)
    run.add("memory", {"largest_engine": {"slots": slots, "max_len": max_len},
                       "predicted_bytes": plan.total_bytes,
                       "measured_peak_bytes": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib) * KIB,
                       "resident_before_models_bytes": before_kib * KIB})
    run.add("modes", modes_grid(bundle, args.modes_prompt_tokens, [int(c) for c in args.modes_concurrency.split(",")],
                                args.modes_max_tokens, args.prefill_tokens))
    run.add("long", long_equal(bundle, max(lengths), args.long_max_tokens, args.prefill_tokens))
    bandwidth, weights = read_bandwidth_gbs(), weight_bytes_per_token(bundle.target)  # after the memory's peak
    run.add("bandwidth", {"read_gb_per_s": bandwidth, "target_weight_bytes": weights,
                          "decode_bound_ms_per_token": round(weights / (bandwidth * 1e9) * 1e3, 2)})
    if not args.no_llama:
        del bundle
        run.add("llama_cpp", llama_cpp(model_dir, args.llama_work, lengths, args.max_tokens, args.threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
