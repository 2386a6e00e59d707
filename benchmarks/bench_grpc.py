"""Time the served gRPC path against the in-process engine: same model folder, prompts, modes, greedy.

Why: a request served by Triton takes a longer road than `Engine.generate` (gRPC, the `adaflash`
model's checks, tokenising and step loop with its BLS calls to the `target` and `drafter` models,
one detokenised response streamed per step). This measures what that road costs in
output tokens per second at each concurrency, and checks first that it computes the same thing:
every served text must equal the decoded in-process output, and a concurrency where any differs
gets no speed (the run then exits 1).

The client is lean: asyncio gRPC streams in this one process (tritonclient's aio client), its own
CPU time reported, because it shares the machine's cores with the server. The paths run one after
the other, never at once (the servers' processes and this process's engine would compete for the
same cores): per mode and concurrency, `--reps` rounds of the in-process run and then a served run
on each layout (`--layouts`: the target as a model of its own, or in the `adaflash` model's process; a
server each, idle while the others run), because this machine's speed drifts by tens of percent over
minutes and a ratio is only worth what its two halves share; rows report medians. One verify/draft
cost table, measured here and given to the servers, is what `adaflash` plans from on every path.
Per served run the orchestrator's own metrics say how many sequences each `target` and `drafter`
call carried, and Triton's statistics how many times each model executed.

    .venv/bin/python benchmarks/bench_grpc.py --model-dir models/default --json bench-out/bench_grpc.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from adaflash.cli_args import csv_list
from adaflash.decoding.costs import CostModel, measure_costs
from adaflash.decoding.engine import Engine
from adaflash_contract.modes import MODE_NAMES
from adaflash.decoding.sequence import Request, Sequence
from adaflash.evaluation.prompts import PACKAGED_DATA, eval_prompts, load_prompts
from adaflash.models.bundle import Bundle, load_bundle
from adaflash.serving.pacing import response_rate
from adaflash_server.repository import RepositoryConfig, build_repository, tiny_model_dir
from adaflash_client.client import GenerationError, GenerationParams, build_inputs, is_final, parse_chunk
from adaflash_server.launcher import ServerConfig, TritonServer

PROMPT_CHARS = 300  # prompts keep their last characters, well inside max_prompt_tokens
WARMUP_TOKENS = 4
REPOSITORY = RepositoryConfig(max_active=64, max_batch_size=64, max_len=1024, max_prompt_tokens=400,
                              max_output_tokens=600)
# Where the served target runs: the `target` model of its own, or in the orchestrator's process.
LAYOUTS = {"own": False, "orchestrator": True}
# How the served path's client talks: tritonclient's asyncio client with a gRPC stream per request (all users in one
# event loop); its sync client as a script or a Locust user writes it, a thread per user, with a new stream
# (`start_stream` .. `stop_stream`) per request, or with one stream per user that carries all its requests.
CLIENTS = ("aio", "new-stream", "reused-stream")
STREAM_DEADLINE_S = 300.0  # a request's final response comes in this long or the run fails
CALLS = re.compile(r'^adaflash_model_call(s|_sequences)_total\{model="([^"]+)",op="([^"]+)"\} (\S+)$', re.M)


@dataclass
class PathRun:
    """One path at one concurrency: texts in prompt order and the figures reported for them."""

    texts: list[str]
    tokens_per_s: float
    tau: float | None
    mean_ttft_ms: float | None = None
    tokens_per_response: float | None = None  # how many tokens a streamed response carried, on average
    client_cpu_share: float | None = None  # the client's CPU seconds per wall second
    calls: dict | None = None  # per model and op: calls and mean sequences per call


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, help="folder with target/ and drafter/ (default: tiny random models)")
    p.add_argument("--drafter", default="drafter", help="drafter folder name in --model-dir ('' for none)")
    p.add_argument("--modes", type=csv_list(str), default=["ar", "adaflash"], help=f"of {', '.join(MODE_NAMES)}")
    p.add_argument("--concurrency", type=csv_list(int), default=[1, 8, 32, 64], help="comma-separated concurrencies")
    p.add_argument("--prompts", type=Path, help="JSON lines with `prompt` (default: the packaged sample prompts)")
    p.add_argument("--eval-domains", type=csv_list(str), help="instead of --prompts: the evaluation sets of these "
                   "domains (e.g. code,math,chat) under --eval-data, --per-domain prompts each")
    p.add_argument("--eval-data", type=Path, default=PACKAGED_DATA, help="data folder with eval/ (default: packaged)")
    p.add_argument("--per-domain", type=int, default=16)
    p.add_argument("--clients", type=csv_list(str), default=["aio"], help=f"of {', '.join(CLIENTS)}: a served run "
                   "each, in turn, per round")
    p.add_argument("--requests-per-user", type=int, default=2, help="prompts per run: this many per concurrent user, "
                   "at least --min-requests")
    p.add_argument("--min-requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--stream-interval-ms", type=float, default=REPOSITORY.stream_interval_ms,
                   help="the server's stream interval (0: a response per step)")
    p.add_argument("--max-responses-per-s", type=float, default=REPOSITORY.max_responses_per_s,
                   help="the server's rate of streamed responses, shared by the streams (0: no limit; "
                   "-1, the default: sized to this machine's cores)")
    p.add_argument("--layouts", type=csv_list(str), default=list(LAYOUTS),
                   help=f"where the served target runs, of {', '.join(LAYOUTS)}: a server each, run in turn")
    p.add_argument("--reps", type=int, default=3, help="alternations of the paths per mode and concurrency (medians)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    if unknown := set(args.layouts) - set(LAYOUTS):
        p.error(f"--layouts: unknown {', '.join(sorted(unknown))}")
    if unknown := set(args.clients) - set(CLIENTS):
        p.error(f"--clients: unknown {', '.join(sorted(unknown))}")
    return args


def prompts_for(all_prompts: list[str], concurrency: int, per_user: int, least: int) -> list[str]:
    """The run's prompts: the first ones, repeated when the file has fewer."""
    n = max(least, per_user * concurrency)
    return [all_prompts[i % len(all_prompts)] for i in range(n)]


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def sequence_tau(seq: Sequence) -> float | None:
    """Tokens per verify step as `Completion.tau` counts them, so both paths report the same quantity."""
    return (len(seq.output) - 1) / len(seq.steps) if seq.steps else None


def measured_costs(bundle: Bundle) -> CostModel | None:
    """The verify/draft cost table both paths plan from, measured as the target model would at startup."""
    return measure_costs(bundle.target, bundle.drafter, REPOSITORY.max_active) if bundle.drafter else None


def run_in_process(engine: Engine, bundle: Bundle, prompts: list[str], mode: str, max_tokens: int,
                   concurrency: int) -> PathRun:
    """All prompts through `engine.generate` at once, at most `concurrency` in flight; wall-clock throughput."""
    requests = [Request(bundle.tokenizer.encode(p).ids, max_tokens, mode=mode) for p in prompts]
    start = time.perf_counter()
    seqs = engine.generate(requests, concurrency=concurrency)
    wall = time.perf_counter() - start
    return PathRun(texts=[bundle.tokenizer.decode(s.output) for s in seqs],
                   tokens_per_s=sum(len(s.output) for s in seqs) / wall,
                   tau=mean([t for t in map(sequence_tau, seqs) if t is not None]),
                   mean_ttft_ms=mean([(s.first_token_at - s.admitted_at) * 1000 for s in seqs]))


@dataclass
class Served:
    text: str
    tokens: int
    ttft_s: float | None
    steps: int
    responses: int


class Reading:
    """One request's responses as they come, each parsed once: its text and counts, and when its first text came
    (from the reading's start, before the request was sent)."""

    def __init__(self) -> None:
        self.start, self.first_at = time.perf_counter(), None
        self.text: list[str] = []
        self.tokens = self.steps = self.count = 0

    def add(self, result: grpcclient.InferResult) -> bool:
        """Take a response; whether it was the final one."""
        chunk = parse_chunk(result)
        if chunk is not None:
            if self.first_at is None and chunk.text:
                self.first_at = time.perf_counter()
            self.count += 1
            self.text.append(chunk.text)
            self.tokens = chunk.num_output_tokens
            self.steps += len(chunk.accepted_per_step)
        return is_final(result)

    def served(self) -> Served:
        ttft = None if self.first_at is None else self.first_at - self.start
        return Served("".join(self.text), self.tokens, ttft, self.steps, self.count)


async def one_request(client: grpcaio.InferenceServerClient, prompt: str, params: GenerationParams) -> Served:
    """One streaming request on a gRPC stream of its own, read to its final response."""
    async def requests():
        yield {"model_name": "adaflash", "inputs": build_inputs(prompt, params, stream=True)}

    reading = Reading()
    async for result, error in client.stream_infer(requests()):
        if error is not None:
            raise GenerationError.from_triton(error)
        if reading.add(result):
            break
    return reading.served()


async def run_aio(url: str, prompts: list[str], params: GenerationParams, concurrency: int) -> list[Served]:
    """`concurrency` users in one event loop, each sending its next prompt when the last one finished."""
    client = grpcaio.InferenceServerClient(url)
    results: list[Served | None] = [None] * len(prompts)
    todo = iter(range(len(prompts)))

    async def user() -> None:
        for i in todo:
            results[i] = await one_request(client, prompts[i], params)

    try:
        await asyncio.gather(*(user() for _ in range(concurrency)))
    finally:
        await client.close()
    return results


def sync_user(url: str, prompts: list[str], params: GenerationParams, todo: Iterator[int], lock: threading.Lock,
              results: list[Served | None], reuse: bool) -> None:
    """One user of tritonclient's sync client: its prompts one after the other, a new stream for each (`reuse`
    False) or all on one stream, each read to its final response."""
    client = grpcclient.InferenceServerClient(url)
    responses: queue.SimpleQueue = queue.SimpleQueue()
    on_response = lambda result, error: responses.put((result, error))  # noqa: E731 - the stream's callback
    try:
        if reuse:
            client.start_stream(on_response)
        while (i := _next(todo, lock)) is not None:
            reading = Reading()
            if not reuse:
                client.start_stream(on_response)
            client.async_stream_infer("adaflash", build_inputs(prompts[i], params, stream=True), request_id=str(i),
                                      enable_empty_final_response=True)
            final = False
            while not final:
                result, error = responses.get(timeout=STREAM_DEADLINE_S)
                if error is not None:
                    raise GenerationError.from_triton(error)
                final = reading.add(result)
            results[i] = reading.served()
            if not reuse:
                client.stop_stream()
        if reuse:
            client.stop_stream()
    finally:
        client.close()


def _next(todo: Iterator[int], lock: threading.Lock) -> int | None:
    with lock:
        return next(todo, None)


def run_sync(url: str, prompts: list[str], params: GenerationParams, concurrency: int, reuse: bool) -> list[Served]:
    results: list[Served | None] = [None] * len(prompts)
    todo, lock = iter(range(len(prompts))), threading.Lock()
    with ThreadPoolExecutor(concurrency) as pool:
        for f in [pool.submit(sync_user, url, prompts, params, todo, lock, results, reuse) for _ in range(concurrency)]:
            f.result()
    return results


async def run_grpc(url: str, prompts: list[str], mode: str, max_tokens: int, concurrency: int,
                   client: str = "aio") -> PathRun:
    """`concurrency` users of `client` (CLIENTS), each sending its next prompt when the last one finished; texts in
    prompt order."""
    params = GenerationParams(max_tokens=max_tokens, spec_mode=mode)
    cpu0, start = time.process_time(), time.perf_counter()
    if client == "aio":
        results = await run_aio(url, prompts, params, concurrency)
    else:
        results = await asyncio.to_thread(run_sync, url, prompts, params, concurrency, client == "reused-stream")
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return PathRun(texts=[r.text for r in results], tokens_per_s=sum(r.tokens for r in results) / wall,
                   tau=mean([(r.tokens - 1) / r.steps for r in results if r.steps]),
                   mean_ttft_ms=mean([r.ttft_s * 1000 for r in results if r.ttft_s is not None]),
                   tokens_per_response=sum(r.tokens for r in results) / sum(r.responses for r in results),
                   client_cpu_share=cpu / wall)


def call_counts(metrics_url: str) -> dict[tuple[str, str], tuple[float, float]]:
    """(model, op) -> (sequences, calls) so far, from the orchestrator's counters."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out: dict[tuple[str, str], list[float]] = {}
    for kind, model, op, value in CALLS.findall(text):
        out.setdefault((model, op), [0.0, 0.0])[0 if kind == "_sequences" else 1] = float(value)
    return {k: (v[0], v[1]) for k, v in out.items()}


def executions(http_url: str) -> dict[str, int]:
    """Each loaded model's execution count (Triton's statistics API)."""
    with urllib.request.urlopen(f"{http_url}/v2/models/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"]
    return {s["name"]: int(s["execution_count"]) for s in stats}


def call_summary(before: dict, after: dict, exec_before: dict, exec_after: dict) -> dict:
    """Calls and mean sequences per call for each model and op during a run, with Triton's execution counts."""
    out = {}
    for key, (seqs, calls) in after.items():
        s0, c0 = before.get(key, (0.0, 0.0))
        if calls - c0:
            out[f"{key[0]}.{key[1]}"] = {"calls": int(calls - c0), "mean_sequences": round((seqs - s0) / (calls - c0), 2)}
    for model in ("target", "drafter"):  # (no `target` model where the target runs in the orchestrator)
        if model in exec_after:
            out[f"{model}.triton_executions"] = exec_after[model] - exec_before.get(model, 0)
    steps = out.get("target.step", {}).get("calls", 0)
    if steps and "target.triton_executions" in out:
        out["target_executions_per_step"] = round(out["target.triton_executions"] / steps, 3)
    return out


async def served_run(server: TritonServer, prompts: list[str], mode: str, max_tokens: int, c: int,
                     client: str) -> PathRun:
    """One served run, with the model calls it made."""
    before, exec_before = call_counts(server.metrics_url), executions(server.http_url)
    served = await run_grpc(server.grpc_url, prompts, mode, max_tokens, c, client)
    served.calls = call_summary(before, call_counts(server.metrics_url), exec_before, executions(server.http_url))
    return served


def rotated(layouts: list[str], rep: int) -> list[str]:
    """The layouts in the order of round `rep`: each starts a round in turn, so that none always runs at the same
    place in a round, where the machine's drift within a round would favour it (docs/history.md, round 16)."""
    k = rep % len(layouts)
    return layouts[k:] + layouts[:k]


async def alternated_runs(servers: dict[str, TritonServer], engine: Engine, bundle: Bundle, prompts: list[str],
                          args: argparse.Namespace) -> list[dict]:
    """Per mode and concurrency, `reps` rounds of the in-process run and then a served run of each layout and client
    (`rotated`); a row per layout and client, its ratio the median of the rounds' (a round's parts run minutes apart
    at most)."""
    rows = []
    for mode in args.modes:
        engine.generate([Request(bundle.tokenizer.encode(prompts[0]).ids, WARMUP_TOKENS, mode=mode)])
        for server in servers.values():
            await run_grpc(server.grpc_url, prompts[:1], mode, WARMUP_TOKENS, 1)
        for c in args.concurrency:
            chosen = prompts_for(prompts, c, args.requests_per_user, args.min_requests)
            local: list[PathRun] = []
            paths = [(layout, client) for layout in servers for client in args.clients]
            served: dict[tuple[str, str], list[PathRun]] = {path: [] for path in paths}
            for rep in range(args.reps):
                local.append(run_in_process(engine, bundle, chosen, mode, args.max_tokens, c))
                for layout, client in rotated(paths, rep):
                    served[layout, client].append(
                        await served_run(servers[layout], chosen, mode, args.max_tokens, c, client))
            for (layout, client), runs in served.items():
                row = make_row(mode, c, layout, client, local, runs)
                print(f"{mode} c={c} target {layout}, client {client}: in-process {row['in_process_tokens_per_s']} "
                      f"tok/s, gRPC {row['grpc_tokens_per_s']} tok/s, ratio {row['ratio_grpc_over_in_process']}, "
                      f"TTFT in-process {row['in_process_mean_ttft_ms']} ms, gRPC {row['grpc_mean_ttft_ms']} ms",
                      flush=True)
                rows.append(row)
    return rows


def make_row(mode: str, c: int, layout: str, client: str, local: list[PathRun], served: list[PathRun]) -> dict:
    """One output row from paired runs: medians; a concurrency whose texts ever differ reports no speed."""
    equal = all(a.texts == b.texts for a, b in zip(local, served))
    last = served[-1]
    row = {
        "mode": mode,
        "concurrency": c,
        "target": layout,
        "client": client,
        "requests": len(local[0].texts),
        "in_process_tokens_per_s": round(median([r.tokens_per_s for r in local]), 2) if equal else None,
        "grpc_tokens_per_s": round(median([r.tokens_per_s for r in served]), 2) if equal else None,
        "ratio_grpc_over_in_process": round(median([b.tokens_per_s / a.tokens_per_s for a, b in zip(local, served)]),
                                            4) if equal else None,
        "ratios": [round(b.tokens_per_s / a.tokens_per_s, 4) for a, b in zip(local, served)] if equal else None,
        "in_process_mean_ttft_ms": round(median([r.mean_ttft_ms for r in local]), 2),
        "grpc_mean_ttft_ms": None if last.mean_ttft_ms is None else round(median([r.mean_ttft_ms for r in served]), 2),
        "grpc_tokens_per_response": round(last.tokens_per_response, 2),
        "in_process_tau": None if local[-1].tau is None else round(local[-1].tau, 4),
        "grpc_tau": None if last.tau is None else round(last.tau, 4),
        "client_cpu_share": round(median([r.client_cpu_share for r in served]), 3),
        "text_equal": equal,
        "calls": last.calls,
    }
    if not equal:
        a, b = next((a, b) for a, b in zip(local, served) if a.texts != b.texts)
        first = next(i for i, (x, y) in enumerate(zip(a.texts, b.texts)) if x != y)
        print(f"{mode} c={c} target {layout}: prompt {first} differs:\n  in-process {a.texts[first]!r}\n  gRPC       "
              f"{b.texts[first]!r}", file=sys.stderr)
    return row


def print_table(rows: list[dict]) -> None:
    cols = [k for k in rows[0] if k != "calls"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join("-" if r[k] is None else str(r[k]) for k in cols))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    drafter = args.drafter or None
    if args.eval_domains:
        by_domain = eval_prompts(args.eval_data, args.per_domain)
        prompts = [p[-PROMPT_CHARS:] for d in args.eval_domains for p in by_domain[d]]
    else:
        prompts = [p.text[-PROMPT_CHARS:] for p in load_prompts(args.prompts, None)]
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp:
        work = Path(tmp)
        model_dir = args.model_dir or tiny_model_dir(work)
        config = replace(REPOSITORY, stream_interval_ms=args.stream_interval_ms,
                         max_responses_per_s=args.max_responses_per_s)
        bundle = load_bundle(model_dir, drafter)
        cost, cost_table = measured_costs(bundle), work / "cost.json"
        if cost is not None:
            cost.save(cost_table)
        engine = Engine(bundle.target, bundle.drafter, num_slots=max(args.concurrency), max_len=REPOSITORY.max_len,
                        cost_model=cost)
        with ExitStack() as stack:
            servers = {}
            for layout in args.layouts:
                repo = build_repository(work / f"repository-{layout}", model_dir, drafter,
                                        replace(config, target_in_orchestrator=LAYOUTS[layout]),
                                        cost_table if cost is not None else None)
                servers[layout] = stack.enter_context(
                    TritonServer(ServerConfig(model_repository=repo, state_dir=work / f"server-{layout}")))
            rows = asyncio.run(alternated_runs(servers, engine, bundle, prompts, args))
    where = str(args.model_dir) if args.model_dir else "tiny random (seed 0, written to a temp dir)"
    source = (f"evaluation sets {','.join(args.eval_domains)} of {args.eval_data}, {args.per_domain} each"
              if args.eval_domains else str(args.prompts or "packaged sample prompts"))
    result = {"model_dir": where, "prompts": source, "clients": args.clients,
              "stream_interval_ms": args.stream_interval_ms, "max_responses_per_s": args.max_responses_per_s,
              "responses_per_s_shared_by_the_streams": response_rate(args.max_responses_per_s),
              "max_tokens": args.max_tokens, "reps": args.reps, "rows": rows}
    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(r["text_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
