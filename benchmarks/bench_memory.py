"""Resident memory of a served `adaflash serve`: every process of the server, before and after a warm-up load.

Why: what a deployment has to reserve is the memory of all the processes one `adaflash serve` starts (the launcher
with the OpenAI front, tritonserver, a process per Python model, the watchdog), and it grows with the load a server
has seen (caches written, allocator arenas), so it is read from /proc after a load, not derived from the models.

The server is started as a user starts it: `adaflash serve` as a subprocess, on free ports of 127.0.0.1, with a
state folder of its own (`--serve-arg` passes more options, `--env` sets its environment, e.g. an allocator
setting to compare). Once it says it serves, this reads every process of its tree (the launcher and all its
descendants): VmRSS and the anonymous and file-backed parts of it (/proc/PID/status), the proportional set size
(Pss, /proc/PID/smaps_rollup: shared pages split among the processes that map them, so the rows add up to what the
server holds), and whether the process maps libtorch. Then `--requests` streaming requests run from `--concurrency`
users (tritonclient's asyncio gRPC client, a stream per request; the prompts of the evaluation sets of
`--eval-domains`; the modes of `--modes` in turn), and the processes are read again. The load's tokens per second
are reported too, as a rough check only: this machine's speed drifts.

    .venv/bin/python benchmarks/bench_memory.py --model-dir models/default --json bench-out/bench_memory.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from adaflash.cli_args import csv_list
from adaflash.evaluation.prompts import PACKAGED_DATA, eval_prompts
from adaflash_client.client import build_inputs, is_final, parse_chunk
from adaflash_contract.modes import MODE_NAMES
from adaflash_contract.wire import GenerationError, GenerationParams
from adaflash_server.launcher import descendants, free_ports

READY_LINE = "Ctrl-C stops the server"  # the last line `adaflash serve` prints once everything serves
PROMPT_CHARS = 300  # a prompt keeps its last characters, well inside the default max_prompt_tokens
STOP_TIMEOUT_S = 60.0  # after SIGTERM the launcher drains and stops; killed after this
STATUS_FIELDS = {"VmRSS": "rss_kb", "RssAnon": "anon_kb", "RssFile": "file_kb", "RssShmem": "shmem_kb"}
ROLLUP_FIELDS = {"Pss": "pss_kb", "Pss_Anon": "pss_anon_kb", "Pss_File": "pss_file_kb"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, help="folder with target/ and drafters (default: tiny random models)")
    p.add_argument("--drafter", default="drafter", help="drafter folder name in --model-dir ('' for none)")
    p.add_argument("--requests", type=int, default=1000, help="requests of the warm-up load")
    p.add_argument("--concurrency", type=int, default=8, help="users of the warm-up load, each a request at a time")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--modes", type=csv_list(str, MODE_NAMES), default=["ar", "adaflash"],
                   help="spec_mode of the requests, in turn")
    p.add_argument("--eval-domains", type=csv_list(str), default=["code", "math", "chat"],
                   help="the evaluation sets the prompts come from, --per-domain each")
    p.add_argument("--eval-data", type=Path, default=PACKAGED_DATA, help="data folder with eval/ (default: packaged)")
    p.add_argument("--per-domain", type=int, default=16)
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set in the server's environment (repeatable), e.g. MALLOC_ARENA_MAX=2")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="one more argument of `adaflash serve` (repeatable; --serve-arg=--max-active --serve-arg=8)")
    p.add_argument("--mappings", type=int, default=0, metavar="N",
                   help="also report each process's N largest mappings by resident size (/proc/PID/smaps)")
    p.add_argument("--settle-s", type=float, default=2.0, help="pause after the load before reading the processes")
    p.add_argument("--ready-timeout-s", type=float, default=600.0)
    p.add_argument("--state-dir", type=Path, help="the server's state folder (default: a temporary one, removed)")
    p.add_argument("--json", type=Path, help="write the report here")
    args = p.parse_args(argv)
    if bad := [e for e in args.env if "=" not in e]:
        p.error(f"--env: expected NAME=VALUE, got {', '.join(bad)}")
    return args


def read_fields(path: Path, names: dict[str, str]) -> dict[str, int]:
    """The `Name:   value kB` lines of a /proc file that `names` maps, under their new names (kB)."""
    found = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in names and rest.split():
            found[names[name]] = int(rest.split()[0])
    return found


def largest_mappings(pid: int, count: int) -> list[dict]:
    """The `count` mappings of a process with the most resident memory: what holds it (a file, [heap], [anon])."""
    found, current = [], None
    for line in (Path("/proc") / str(pid) / "smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:  # a mapping's first line: its range, ..., its name
            start, end = (int(x, 16) for x in head[0].split("-"))
            current = {"name": head[5] if len(head) > 5 else "[anon]", "size_kb": (end - start) // 1024}
            found.append(current)
        elif head and head[0] in ("Rss:", "Anonymous:") and current is not None:
            current["rss_kb" if head[0] == "Rss:" else "anon_kb"] = int(head[1])
    return sorted(found, key=lambda m: -m.get("rss_kb", 0))[:count]


def maps_torch(pid: int) -> bool:
    """Whether the process has libtorch mapped: it imported torch."""
    return "libtorch" in (Path("/proc") / str(pid) / "maps").read_text()


def role(argv: list[str], launcher: int, pid: int) -> str:
    """What a process of the server is: the launcher, tritonserver, a Python model's process (by model), the
    watchdog, or its program's name."""
    if pid == launcher:
        return "launcher"
    program = Path(argv[0]).name if argv else "?"
    if program == "triton_python_backend_stub" and len(argv) > 1:
        return f"model {Path(argv[1]).parts[-3]}"  # .../<model>/<version>/model.py
    if "adaflash-watchdog" in argv:
        return "watchdog"
    return program


def tree(root: int) -> list[int]:
    """`root` and all its descendants, parents before their children."""
    return [root, *descendants(root)]


def process_row(pid: int, launcher: int, mappings: int) -> dict | None:
    """One process's memory (kB) and what it is; None when it is gone or a zombie."""
    proc = Path("/proc") / str(pid)
    try:
        argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
        status = read_fields(proc / "status", STATUS_FIELDS)
        rollup = read_fields(proc / "smaps_rollup", ROLLUP_FIELDS)
        torch = maps_torch(pid)
        largest = largest_mappings(pid, mappings) if mappings else None
    except OSError:
        return None
    if "rss_kb" not in status:
        return None  # a zombie has no memory left
    row = {"pid": pid, "role": role(argv, launcher, pid), **status, **rollup, "torch": torch,
           "command": " ".join(argv)[:160]}
    return row if largest is None else {**row, "largest_mappings": largest}


def snapshot(launcher: int, mappings: int = 0) -> dict:
    """Every process of the server's tree and their sums (kB); the watchdog's `sleep` counts as the watchdog."""
    rows = [row for pid in tree(launcher) if (row := process_row(pid, launcher, mappings)) is not None]
    if any(r["role"] == "watchdog" for r in rows):
        rows = [{**r, "role": "watchdog"} if r["role"] == "sleep" else r for r in rows]
    total = {key: sum(r.get(key, 0) for r in rows) for key in (*STATUS_FIELDS.values(), *ROLLUP_FIELDS.values())}
    return {"processes": rows, "total": total}


@dataclass
class Server:
    """A running `adaflash serve` subprocess."""

    process: subprocess.Popen
    grpc_url: str
    log: Path


def serve_command(args: argparse.Namespace, state_dir: Path, ports: list[int]) -> list[str]:
    """`adaflash serve` with the models, on the given free ports of 127.0.0.1 (gRPC, HTTP, metrics, OpenAI)."""
    models = ["--model-dir", str(args.model_dir)] if args.model_dir else ["--tiny-random"]
    return [sys.executable, "-m", "adaflash.entry", "serve", *models, "--drafter", args.drafter,
            "--state-dir", str(state_dir), "--host", "127.0.0.1", "--grpc-port", str(ports[0]),
            "--http-port", str(ports[1]), "--metrics-port", str(ports[2]), "--openai-port", str(ports[3]),
            *args.serve_arg]


def start_server(args: argparse.Namespace, state_dir: Path) -> Server:
    """Start `adaflash serve` in a session of its own, as a supervisor would, and wait until it says it serves."""
    ports = free_ports(4)
    log = state_dir / "serve.log"
    env = {**os.environ, **dict(e.split("=", 1) for e in args.env)}
    with log.open("w") as out:
        process = subprocess.Popen(serve_command(args, state_dir, ports), stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    server = Server(process, f"127.0.0.1:{ports[0]}", log)
    deadline = time.monotonic() + args.ready_timeout_s
    while READY_LINE not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"`adaflash serve` did not start; the end of {log}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return server


def stop_server(server: Server) -> None:
    """SIGTERM (the launcher drains, then stops its server), SIGKILL after STOP_TIMEOUT_S."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


def load_prompts(args: argparse.Namespace) -> list[str]:
    by_domain = eval_prompts(args.eval_data, args.per_domain)
    if unknown := set(args.eval_domains) - set(by_domain):
        raise SystemExit(f"error: --eval-domains: unknown {', '.join(sorted(unknown))}")
    return [p[-PROMPT_CHARS:] for d in args.eval_domains for p in by_domain[d]]


async def one_request(client: grpcaio.InferenceServerClient, prompt: str, params: GenerationParams) -> int:
    """One streaming request on a gRPC stream of its own, read to its final response; its output tokens."""
    async def requests():
        yield {"model_name": "adaflash", "inputs": build_inputs(prompt, params, stream=True)}

    tokens = 0
    async for result, error in client.stream_infer(requests()):
        if error is not None:
            raise GenerationError.from_triton(error)
        chunk = parse_chunk(result)
        if chunk is not None and chunk.num_output_tokens is not None:
            tokens = chunk.num_output_tokens
        if is_final(result):
            break
    return tokens


async def warm_up(url: str, prompts: list[str], modes: list[str], requests: int, concurrency: int,
                  max_tokens: int) -> dict:
    """`requests` requests from `concurrency` users in one event loop, each sending its next when the last one
    finished: request i takes prompt i and mode i (both in turn)."""
    client = grpcaio.InferenceServerClient(url)
    todo, tokens = iter(range(requests)), []

    async def user() -> None:
        for i in todo:
            params = GenerationParams(max_tokens=max_tokens, spec_mode=modes[i % len(modes)])
            tokens.append(await one_request(client, prompts[i % len(prompts)], params))

    start = time.perf_counter()
    try:
        await asyncio.gather(*(user() for _ in range(concurrency)))
    finally:
        await client.close()
    wall = time.perf_counter() - start
    return {"requests": len(tokens), "tokens": sum(tokens), "seconds": wall, "tokens_per_s": sum(tokens) / wall}


def server_ready(url: str) -> bool:
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.is_model_ready("adaflash")
    finally:
        client.close()


def measure(args: argparse.Namespace, state_dir: Path) -> dict:
    """Start the server, read its processes, load it, read them again; the server stopped in every case."""
    prompts = load_prompts(args)
    started = time.perf_counter()
    server = start_server(args, state_dir)
    try:
        ready_s = time.perf_counter() - started
        assert server_ready(server.grpc_url), "the adaflash model is not ready"
        before = snapshot(server.process.pid, args.mappings)
        load = asyncio.run(warm_up(server.grpc_url, prompts, args.modes, args.requests, args.concurrency,
                                   args.max_tokens))
        time.sleep(args.settle_s)
        after = snapshot(server.process.pid, args.mappings)
    finally:
        stop_server(server)
    return {"ready_s": ready_s, "started": before, "after_load": after, "load": load}


def print_table(report: dict) -> None:
    print(f"{'process':<22}{'RSS MB start':>14}{'RSS MB after':>14}{'PSS MB after':>14}  torch")
    started = {r["role"]: r for r in report["started"]["processes"]}
    for row in report["after_load"]["processes"]:
        first = started.get(row["role"], {}).get("rss_kb", 0)
        print(f"{row['role']:<22}{first / 1024:>14.0f}{row['rss_kb'] / 1024:>14.0f}"
              f"{row.get('pss_kb', 0) / 1024:>14.0f}  {'yes' if row['torch'] else 'no'}")
    a, b = report["started"]["total"], report["after_load"]["total"]
    print(f"{'all':<22}{a['rss_kb'] / 1024:>14.0f}{b['rss_kb'] / 1024:>14.0f}{b['pss_kb'] / 1024:>14.0f}")
    load = report["load"]
    print(f"load: {load['requests']} requests, {load['tokens']} tokens in {load['seconds']:.1f} s "
          f"({load['tokens_per_s']:.0f} tok/s); ready after {report['ready_s']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="adaflash-bench-memory-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = {"model_dir": str(args.model_dir or "tiny-random"), "drafter": args.drafter, "env": args.env,
                  "serve_args": args.serve_arg, "modes": args.modes, "concurrency": args.concurrency,
                  "max_tokens": args.max_tokens, "eval_domains": args.eval_domains, **measure(args, state_dir)}
    finally:
        if args.state_dir is None:
            shutil.rmtree(state_dir, ignore_errors=True)
    print_table(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
