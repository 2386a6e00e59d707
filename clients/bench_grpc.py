"""Time the served gRPC path against the in-process engine: same model folder, prompts, mode, greedy.

Why: a request served by Triton takes a longer road than `Engine.generate` (gRPC, the ensemble's
preprocessing and postprocessing, the orchestrator's BLS calls to the `target` and `drafter`
models, the sequence batcher's queue delay, one streamed response per step). This measures
what that road costs in output tokens per second at each concurrency, and checks first that
it computes the same thing: every served text must equal the decoded in-process output, and
a concurrency where any differs gets no speed (the run then exits 1).

The two paths run one after the other, never at once: the server's target, drafter and
orchestrator processes and this process's engine would otherwise compete for the same CPU
cores (torch threads in each). Without --url the in-process rows run before the server starts,
and the engine uses the verify/draft cost table measured for the server's repository, so the
`adaflash` length policy works from the same figures on both paths.

    .venv/bin/python clients/bench_grpc.py --json /tmp/bench_grpc.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from adaflash.cli_args import csv_list
from adaflash.decoding.costs import CostModel
from adaflash.decoding.engine import Engine
from adaflash.decoding.modes import MODE_NAMES
from adaflash.decoding.sequence import Request, Sequence
from adaflash.evaluation.prompts import load_prompts
from adaflash.models.bundle import Bundle, load_bundle
from adaflash_build.repository import RepositoryConfig, build_repository, tiny_model_dir
from adaflash_client import AdaFlashClient, Completion, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer

PROMPT_CHARS = 300  # prompts keep their last characters, well inside max_prompt_tokens
WARMUP_TOKENS = 4
REPOSITORY = RepositoryConfig(max_active=64, max_batch_size=64, max_len=1024, max_prompt_tokens=400,
                              max_output_tokens=600)


@dataclass
class PathRun:
    """One path at one concurrency: texts in prompt order and the figures reported for them."""

    texts: list[str]
    tokens_per_s: float
    tau: float | None
    mean_ttft_ms: float | None = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, help="folder with target/ and drafter/ (default: tiny random models)")
    p.add_argument("--drafter", default="drafter", help="drafter folder name in --model-dir ('' for none)")
    p.add_argument("--url", help="HOST:PORT of a running server (default: start one on free ports)")
    p.add_argument("--mode", default="adaflash", choices=MODE_NAMES)
    p.add_argument("--concurrency", type=csv_list(int), default=[1, 16], help="comma-separated concurrencies")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--prompts", type=Path, help="JSON lines with `prompt` (default: the packaged sample prompts)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--json", type=Path, help="write the results here")
    return p.parse_args(argv)


def load_texts(path: Path | None, n: int) -> list[str]:
    """The benchmark prompts, each cut to its last PROMPT_CHARS characters."""
    return [p.text[-PROMPT_CHARS:] for p in load_prompts(path, n)]


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def sequence_tau(seq: Sequence) -> float | None:
    """Tokens per verify step as `Completion.tau` counts them, so both paths report the same quantity."""
    return (len(seq.output) - 1) / len(seq.steps) if seq.steps else None


def make_engine(bundle: Bundle, num_slots: int, cost_table: Path | None) -> Engine:
    """The in-process engine; with the server's cost table when there is one (else it measures its own)."""
    cost = CostModel.from_json(json.loads(cost_table.read_text())) if cost_table else None
    return Engine(bundle.target, bundle.drafter, num_slots=num_slots, max_len=REPOSITORY.max_len, cost_model=cost)


def run_in_process(engine: Engine, bundle: Bundle, prompts: list[str], mode: str, max_tokens: int,
                   concurrency: int) -> PathRun:
    """All prompts through `engine.generate` at once, at most `concurrency` in flight; wall-clock throughput."""
    requests = [Request(bundle.tokenizer.encode(p).ids, max_tokens, mode=mode) for p in prompts]
    start = time.perf_counter()
    seqs = engine.generate(requests, concurrency=concurrency)
    wall = time.perf_counter() - start
    return PathRun(texts=[bundle.tokenizer.decode(s.output) for s in seqs],
                   tokens_per_s=sum(len(s.output) for s in seqs) / wall,
                   tau=mean([t for t in map(sequence_tau, seqs) if t is not None]))


def run_grpc(client: AdaFlashClient, prompts: list[str], mode: str, max_tokens: int, concurrency: int) -> PathRun:
    """All prompts as streaming requests from `concurrency` threads; wall-clock throughput, mean TTFT and tau."""
    params = GenerationParams(max_tokens=max_tokens, spec_mode=mode)
    with ThreadPoolExecutor(concurrency) as pool:
        start = time.perf_counter()
        done: list[Completion] = list(pool.map(lambda p: client.generate_streaming(p, params), prompts))
        wall = time.perf_counter() - start
    ttfts = [c.time_to_first_token_s * 1000 for c in done if c.time_to_first_token_s is not None]
    return PathRun(texts=[c.text for c in done], tokens_per_s=sum(c.num_output_tokens for c in done) / wall,
                   tau=mean([c.tau for c in done if c.tau is not None]), mean_ttft_ms=mean(ttfts))


def in_process_runs(model_dir: Path, drafter: str | None, cost_table: Path | None, prompts: list[str], mode: str,
                    max_tokens: int, concurrencies: list[int]) -> dict[int, PathRun]:
    """Load the model folder, warm the engine with one short request, then one run per concurrency."""
    bundle = load_bundle(model_dir, drafter)
    engine = make_engine(bundle, max(concurrencies), cost_table)
    engine.generate([Request(bundle.tokenizer.encode(prompts[0]).ids, WARMUP_TOKENS, mode=mode)])
    runs = {}
    for c in concurrencies:
        runs[c] = run_in_process(engine, bundle, prompts, mode, max_tokens, c)
        print(f"in-process c={c}: {runs[c].tokens_per_s:.1f} tok/s", flush=True)
    return runs


def grpc_runs(url: str, prompts: list[str], mode: str, max_tokens: int, concurrencies: list[int]) -> dict[int, PathRun]:
    """Warm the server with one short request, then one run per concurrency."""
    runs = {}
    with AdaFlashClient(url, timeout_s=600) as client:
        client.generate_streaming(prompts[0], GenerationParams(max_tokens=WARMUP_TOKENS, spec_mode=mode))
        for c in concurrencies:
            runs[c] = run_grpc(client, prompts, mode, max_tokens, c)
            print(f"gRPC       c={c}: {runs[c].tokens_per_s:.1f} tok/s", flush=True)
    return runs


def make_row(c: int, local: PathRun, served: PathRun) -> dict:
    """One output row; a concurrency whose texts differ reports no speed."""
    equal = local.texts == served.texts
    row = {
        "concurrency": c,
        "in_process_tokens_per_s": round(local.tokens_per_s, 2) if equal else None,
        "grpc_tokens_per_s": round(served.tokens_per_s, 2) if equal else None,
        "ratio_grpc_over_in_process": round(served.tokens_per_s / local.tokens_per_s, 4) if equal else None,
        "grpc_mean_ttft_ms": None if served.mean_ttft_ms is None else round(served.mean_ttft_ms, 2),
        "in_process_tau": None if local.tau is None else round(local.tau, 4),
        "grpc_tau": None if served.tau is None else round(served.tau, 4),
        "text_equal": equal,
    }
    if not equal:
        first = next(i for i, (a, b) in enumerate(zip(local.texts, served.texts)) if a != b)
        print(f"c={c}: prompt {first} differs:\n  in-process {local.texts[first]!r}\n  gRPC       "
              f"{served.texts[first]!r}", file=sys.stderr)
    return row


def print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join("-" if r[k] is None else str(r[k]) for k in cols))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    concurrencies = args.concurrency
    drafter = args.drafter or None
    prompts = load_texts(args.prompts, args.num_prompts)
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp:
        work = Path(tmp)
        model_dir = args.model_dir or tiny_model_dir(work)
        if args.url:
            local = in_process_runs(model_dir, drafter, None, prompts, args.mode, args.max_tokens, concurrencies)
            served = grpc_runs(args.url, prompts, args.mode, args.max_tokens, concurrencies)
        else:
            repo = build_repository(work / "model_repository", model_dir, drafter, REPOSITORY)
            cost_table = repo.parent / f"{repo.name}.cost.json" if drafter else None
            local = in_process_runs(model_dir, drafter, cost_table, prompts, args.mode, args.max_tokens, concurrencies)
            with TritonServer(ServerConfig(model_repository=repo, state_dir=work / "server")) as server:
                served = grpc_runs(server.grpc_url, prompts, args.mode, args.max_tokens, concurrencies)
    rows = [make_row(c, local[c], served[c]) for c in concurrencies]
    where = str(args.model_dir) if args.model_dir else "tiny random (seed 0, written to a temp dir)"
    result = {"model_dir": where, "mode": args.mode, "max_tokens": args.max_tokens,
              "num_prompts": len(prompts), "rows": rows}
    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(r["text_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
