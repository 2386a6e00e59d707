"""`adaflash sweep`: capacity planning. Load per tool, spec_mode and level (Locust over gRPC, NVIDIA's aiperf over
the OpenAI endpoint), one report.

    .venv/bin/adaflash sweep --out bench-out/sweep                        # starts its own server
    .venv/bin/adaflash sweep --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics \
        --modes ar,adaflash --concurrency 1,4,16 --duration 60 --ttft-slo-ms 500 --itl-slo-ms 50
    .venv/bin/adaflash sweep --tool locust,aiperf --modes adaflash --request-rate 0.5,1,2 \
        --input-tokens 128 --output-tokens 64                             # open loop, chosen lengths

Levels: closed loop at --concurrency N (N users, one request each in flight) or open loop at --request-rate R
(requests arrive as a Poisson process of R per second, whatever is still running); one kind per sweep. Tools,
each in a process of its own per mode and level:
* locust (default): `locust -f tools/locust/locustfile.py --headless` (-u N, or one user with --request-rate R;
  a fresh gevent hub and fresh connections per level; this process never imports Locust, so it is not
  monkey-patched and can start the server);
* aiperf: NVIDIA's `aiperf profile` against the OpenAI-compatible endpoint (`aiperf_runs.py`), from a virtual
  environment of its own that the sweep makes on first use (--aiperf-venv), with `spec_mode` as an extra field.
A level lasts --duration seconds (or until --requests requests are done); requests still running at the end are
allowed to finish, so each level's window runs from its first request's start to its last request's end.

Prompts: the prompt set (--prompts, --domains, --max-prompt-chars; --max-prompt-tokens keeps each prompt's last
tokens, counted with the target's tokenizer), or with --input-tokens N synthetic prompts of exactly N tokens
(windows of the prompt set's text, seeded by --prompt-seed). They are written once to prompts.jsonl, which the
Locust users read; aiperf reads the same prompts in the order Locust's sampler draws them. --output-tokens M sends
max_tokens = min_tokens = M, so every request produces M tokens unless the context ends first.

Written under --out:
  prompts.jsonl                   the prompts both tools send
  locust/<mode>_<level>_{stats,stats_history,failures,exceptions}.csv, .log   Locust's own (level: c<N> or r<R>)
  aiperf/<mode>_<level>/          aiperf's exports (summary JSON/CSV, per-request and raw JSON lines, its log)
  records/[aiperf_]<mode>_<level>.jsonl   one JSON line per request (Locust's --records; aiperf's, converted)
  records/[aiperf_]<mode>_<level>.summary.json   client-side figures (Locust: in-flight peak, hub stalls;
                                  aiperf: a few of its own summary figures)
  sweep.csv                       one row per tool, mode and level (columns: TIDY_FIELDS)
  throughput.png, ttft.png, itl.png, tau.png
  report.md                       tables, plots, and with --ttft-slo-ms/--itl-slo-ms the highest level per tool
                                  and mode that meets them
  sweep.json                      the settings and the rows

Definitions, all from the per-request records, the same for both tools: requests/s and output tokens/s are
successful requests and their output tokens over the level's window; TTFT is per request; ITL is a request's mean
time per token after the first, (latency - TTFT) / (tokens - 1), and its percentiles run over requests; tau =
sum(tokens - 1) / sum(verify steps) over the level's requests (1.0 is plain decoding); errors counts failed
requests; client_cpu_s is the CPU time (user + system) of the load generator's processes for the level, start-up
included, as the operating system accounts it to this process's finished children.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import re
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from adaflash.cli_args import DEFAULT_MODEL_DIR, csv_list, split_csv
from adaflash_contract.modes import MODE_NAMES
from adaflash_tools import aiperf_runs
from adaflash_client.cli import add_connection_arguments, connection_argv, headers_from_args, tls_from_args

if TYPE_CHECKING:
    from adaflash_client.client import Completion

DEFAULT_MODES = ["ar", "ngram", "dflash", "adaflash"]
SERVER_DEFAULT = "default"  # a mode of the sweep: no spec_mode sent (the only choice a TensorRT-LLM ensemble takes)
DEFAULT_CONCURRENCY = [1, 2, 4, 8, 16, 32, 64]
TOOLS = ("locust", "aiperf")
LOCUSTFILE = Path(__file__).resolve().parents[1] / "locust" / "locustfile.py"
SYNTHETIC_PROMPTS = 100  # distinct prompts of --input-tokens tokens
AIPERF_INPUTS = 1000  # prompts drawn for aiperf's sequential dataset (it wraps around)
OPENAI_PORT = 9000  # `adaflash serve`'s default --openai-port
ACTIVE_SAMPLE_S = 0.2  # how often a level reads the server's active sequences: often enough to see a short level's peak

TIDY_FIELDS = [
    "tool", "mode", "concurrency", "request_rate", "requests", "errors", "duration_s", "requests_per_s",
    "output_tokens", "output_tokens_per_s", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p95_ms",
    "latency_p50_ms", "latency_p95_ms", "tau", "mean_accepted_per_step", "mean_draft_len", "acceptance_rate",
    "server_active_mean", "server_active_max", "client_inflight_max", "hub_lag_max_ms", "thread_lag_max_ms",
    "client_cpu_s",
]


@dataclass(frozen=True)
class Level:
    """One load level: closed loop at `concurrency` users, or open loop at `rate` requests/s (Poisson arrivals)."""

    concurrency: int | None = None
    rate: float | None = None

    @property
    def name(self) -> str:
        """In file names: c<N> or r<R>."""
        return f"c{self.concurrency}" if self.rate is None else f"r{self.rate:g}"

    @property
    def label(self) -> str:
        return f"concurrency={self.concurrency}" if self.rate is None else f"rate={self.rate:g}/s"


def level_value(row: dict) -> float:
    """A row's level on its axis: the concurrency, or the offered request rate."""
    return row["concurrency"] if row.get("request_rate") is None else row["request_rate"]


def register(sub: argparse._SubParsersAction) -> None:
    """The `adaflash sweep` command (entry point `adaflash.commands`)."""
    p = sub.add_parser("sweep", help="Locust load per spec_mode and concurrency: CSVs, plots, Markdown report")
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.split("\n\n")[0]
    target = p.add_argument_group("server (default: start one on free ports, like `adaflash serve`)")
    target.add_argument("--url", help="HOST:PORT of a running server's gRPC endpoint")
    target.add_argument("--model-name", default="adaflash",
                        help="the model Locust loads: adaflash, or a TensorRT-LLM ensemble (`ensemble`) with "
                        f"--modes {SERVER_DEFAULT}; its own statistics are then blank")
    target.add_argument("--metrics-url", help="its Prometheus metrics URL, to sample adaflash_active_sequences")
    target.add_argument("--model-dir", type=Path, help=f"models for the started server (default: {DEFAULT_MODEL_DIR}, "
                        "else the tiny random models)")
    target.add_argument("--tiny-random", action="store_true", help="start the server on the seeded tiny random models")
    target.add_argument("--drafter", default="drafter", help="drafter folder name in the model folder ('' for none)")
    target.add_argument("--state-dir", type=Path, default=Path(".serve/sweep"), help="the started server's files")
    target.add_argument("--cost-table", type=Path, help="reuse a measured verify/draft cost table (JSON)")
    target.add_argument("--max-active", type=int, help="the started server's max_active (default: max(64, levels))")
    target.add_argument("--openai-url", help="with --url and --tool aiperf: the server's OpenAI endpoint "
                        f"(default: http://<--url's host>:{OPENAI_PORT}; a started server gets one on a free port)")
    target.add_argument("--tokenizer", type=Path, help="the target's folder, for token counts and aiperf "
                        "(default: the one the server's `adaflash` model reads, asked over gRPC); Locust also counts "
                        "the output tokens of a model that reports none with it")
    add_connection_arguments(p.add_argument_group("connection to --url (TLS, headers)"))

    load = p.add_argument_group("load")
    load.add_argument("--tool", type=csv_list(str, TOOLS), default=["locust"],
                      help="comma-separated load generators: locust (gRPC), aiperf (OpenAI endpoint); default locust")
    load.add_argument("--aiperf-venv", type=Path, default=aiperf_runs.DEFAULT_VENV,
                      help="aiperf's own virtual environment, made on first use (clients/aiperf/requirements.txt)")
    load.add_argument("--modes", type=csv_list(str, (*MODE_NAMES, SERVER_DEFAULT)), default=DEFAULT_MODES,
                      help=f"comma-separated spec_modes, {SERVER_DEFAULT} for the server's own (none sent; "
                      f"default: {','.join(DEFAULT_MODES)})")
    load.add_argument("--concurrency", type=csv_list(int),
                      help="closed loop: comma-separated levels, users each with one request in flight "
                      f"(default: {','.join(map(str, DEFAULT_CONCURRENCY))} without --request-rate)")
    load.add_argument("--request-rate", type=csv_list(float),
                      help="open loop instead: comma-separated levels in requests/s, Poisson arrivals")
    load.add_argument("--duration", type=float,
                      help="seconds of load per level (default 30; with --requests, the cap: default 600)")
    load.add_argument("--requests", type=int, default=0, help="requests per level instead of a duration")
    load.add_argument("--warmup-requests", type=int, default=2, help="unmeasured requests per mode before its levels")
    load.add_argument("--max-tokens", type=int, default=128)
    load.add_argument("--output-tokens", type=int,
                      help="hold every output at this length: max_tokens = min_tokens = it (instead of --max-tokens)")
    load.add_argument("--input-tokens", type=int,
                      help="synthetic prompts of exactly this many tokens, windows of the prompt set's text")
    load.add_argument("--temperature", type=float, default=0.0)
    load.add_argument("--top-k", type=int, default=0)
    load.add_argument("--top-p", type=float, default=1.0)
    load.add_argument("--seed", type=int)
    load.add_argument("--max-draft", type=int)
    load.add_argument("--stop-word", action="append", help="stop word (repeatable)")
    load.add_argument("--prompts", action="append", help="prompt file or folder (repeatable; see tools/locust/)")
    load.add_argument("--domains", default="", help="comma-separated domains to use (default: all)")
    load.add_argument("--domain-weights", default="", help="e.g. code=2,chat=1")
    load.add_argument("--max-prompt-chars", type=int, help="keep each prompt's last characters")
    load.add_argument("--max-prompt-tokens", type=int, help="keep each prompt's last tokens (the target's tokenizer)")
    load.add_argument("--prompt-seed", type=int, default=0,
                      help="seed of the synthetic prompts, the prompt draws and the arrival times")
    load.add_argument("--request-timeout", type=float, default=300.0, help="seconds before a request is given up")
    load.add_argument("--locustfile", type=Path, default=LOCUSTFILE)

    report = p.add_argument_group("report")
    report.add_argument("--out", type=Path, default=Path("bench-out/sweep"), help="output folder")
    report.add_argument("--ttft-slo-ms", type=float, help="time-to-first-token objective (at --slo-percentile)")
    report.add_argument("--itl-slo-ms", type=float, help="inter-token latency objective (at --slo-percentile)")
    report.add_argument("--slo-percentile", choices=["p50", "p95"], default="p95")
    report.add_argument("--quiet", action="store_true", help="no progress display")


# ---------------------------------------------------------------------------------------------
# Aggregation (pure functions: unit-tested without a server)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation), None for no values."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def completion_record(completion: Completion) -> dict:
    """A finished request's figures as the records carry them (the Locust user writes them): None where the server
    reports nothing to derive one from (a TensorRT-LLM ensemble sends no per-step statistics, and no token count
    unless asked for TensorRT-LLM's or counted with a tokenizer), never a zero that would read as a measurement."""
    tokens, ttft, steps = completion.num_output_tokens, completion.time_to_first_token_s, completion.accepted_per_step
    return {"latency_s": completion.latency_s, "ttft_s": ttft,
            "itl_s": (completion.latency_s - ttft) / (tokens - 1) if ttft is not None and (tokens or 0) > 1 else None,
            "tokens": tokens, "target_forwards": completion.target_forwards,
            "steps": None if steps is None else len(steps), "accepted": completion.accepted_draft_tokens,
            "drafted": completion.draft_tokens, "tau": completion.tau, "finish_reason": completion.finish_reason}


def summarize_level(records: list[dict], mode: str, concurrency: int | None, extra: dict | None = None, *,
                    tool: str = "locust", request_rate: float | None = None) -> dict:
    """One tidy row from a level's request records (see the module docstring for the definitions). The output
    tokens (and so tokens/s) are None, a blank cell, when a successful request has no count (a sum over the others
    would read as the level's); tau and the acceptance figures come from the requests that report them."""
    ok = [r for r in records if r.get("ok")]
    window = (max(r["t_end"] for r in records) - min(r["t_start"] for r in records)) if records else 0.0
    tokens = None if any(r.get("tokens") is None for r in ok) else sum(r["tokens"] for r in ok)
    stepped = [r for r in ok if r.get("steps")]
    steps = sum(r["steps"] for r in stepped)
    drafted = sum(r["drafted"] for r in stepped)
    counted = [r for r in ok if r.get("drafted") is not None]
    ttft = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
    itl = [r["itl_s"] for r in ok if r.get("itl_s") is not None]
    latency = [r["latency_s"] for r in ok]
    row = {
        "tool": tool,
        "mode": mode,
        "concurrency": concurrency,
        "request_rate": request_rate,
        "requests": len(ok),
        "errors": len(records) - len(ok),
        "duration_s": window,
        "requests_per_s": _ratio(len(ok), window),
        "output_tokens": tokens,
        "output_tokens_per_s": None if tokens is None else _ratio(tokens, window),
        "ttft_p50_ms": _ms(percentile(ttft, 50)),
        "ttft_p95_ms": _ms(percentile(ttft, 95)),
        "ttft_p99_ms": _ms(percentile(ttft, 99)),
        "itl_p50_ms": _ms(percentile(itl, 50)),
        "itl_p95_ms": _ms(percentile(itl, 95)),
        "latency_p50_ms": _ms(percentile(latency, 50)),
        "latency_p95_ms": _ms(percentile(latency, 95)),
        "tau": _ratio(sum(r["tokens"] - 1 for r in stepped), steps),
        "mean_accepted_per_step": _ratio(sum(r.get("accepted", 0) for r in stepped), steps),
        "mean_draft_len": _ratio(drafted, steps),
        "acceptance_rate": _ratio(sum(r["accepted"] for r in counted), sum(r["drafted"] for r in counted)),
        "server_active_mean": None,
        "server_active_max": None,
        "client_inflight_max": None,
        "hub_lag_max_ms": None,
        "thread_lag_max_ms": None,
        "client_cpu_s": None,
    }
    row.update(extra or {})
    return row


def inflight_max(records: list[dict]) -> int:
    """The most requests in flight at once among the records (a start before an end at the same instant)."""
    events = sorted([(r["t_start"], 1) for r in records] + [(r["t_end"], -1) for r in records],
                    key=lambda e: (e[0], -e[1]))
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def series_of(row: dict) -> tuple[str, str]:
    """What a line of the plots and a line of the SLO table follow: the tool and the mode."""
    return row.get("tool", "locust"), row["mode"]


def slo_capacity(rows: list[dict], ttft_slo_ms: float | None, itl_slo_ms: float | None,
                 pct: str = "p95") -> dict[tuple[str, str], dict]:
    """Per (tool, mode): the levels that meet the objectives (no errors, measured latencies within them) and
    the highest of them (`best`, the row; None when no level does)."""
    def meets(row: dict) -> bool:
        if row["errors"] or not row["requests"]:
            return False
        for slo, key in ((ttft_slo_ms, f"ttft_{pct}_ms"), (itl_slo_ms, f"itl_{pct}_ms")):
            if slo is not None and (row[key] is None or row[key] > slo):
                return False
        return True

    result = {}
    for series in dict.fromkeys(series_of(r) for r in rows):
        passing = sorted((r for r in rows if series_of(r) == series and meets(r)), key=level_value)
        result[series] = {"levels": [level_value(r) for r in passing], "best": passing[-1] if passing else None}
    return result


def write_tidy_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=TIDY_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in TIDY_FIELDS})


def _cell(value):
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value


def read_records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# Plots and report


def load_axis_label(rows: list[dict]) -> str:
    if any(r.get("request_rate") is not None for r in rows):
        return "offered request rate (requests/s, Poisson arrivals)"
    return "concurrency (users, one request in flight each)"


def plot_all(rows: list[dict], out: Path, ttft_slo_ms: float | None = None, itl_slo_ms: float | None = None) -> list[Path]:
    """Four PNGs: throughput, TTFT percentiles, ITL percentiles, tau; each against the level, a line per tool and
    mode (a square marker for aiperf, a circle for Locust)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = list(dict.fromkeys(series_of(r) for r in rows))
    several_tools = len({tool for tool, _ in lines}) > 1
    levels = sorted({level_value(r) for r in rows})
    colors = {line: plt.get_cmap("tab10")(i % 10) for i, line in enumerate(lines)}
    markers = {"locust": "o", "aiperf": "s"}

    def legend(line: tuple[str, str]) -> str:
        return f"{line[1]} ({line[0]})" if several_tools else line[1]

    def series(line: tuple[str, str], key: str) -> tuple[list[float], list[float]]:
        pts = [(level_value(r), r[key]) for r in sorted(rows, key=level_value)
               if series_of(r) == line and r[key] is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    def axis(ax, ylabel: str, title: str) -> None:
        if len(levels) > 1 and levels[-1] / levels[0] >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [f"{c:g}" for c in levels])
        ax.set_xlabel(load_axis_label(rows))
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)

    paths = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for line in lines:
        style = {"marker": markers[line[0]], "linestyle": "-", "color": colors[line], "label": legend(line)}
        axes[0].plot(*series(line, "output_tokens_per_s"), **style)
        axes[1].plot(*series(line, "requests_per_s"), **style)
    axis(axes[0], "output tokens / s", "Throughput (tokens)")
    axis(axes[1], "requests / s", "Throughput (requests)")
    axes[0].legend()
    save(fig, "throughput.png")

    for name, title, keys, slo in (
        ("ttft.png", "Time to first token", [("ttft_p50_ms", "p50", "-"), ("ttft_p95_ms", "p95", "--"),
                                             ("ttft_p99_ms", "p99", ":")], ttft_slo_ms),
        ("itl.png", "Inter-token latency (per-request mean)", [("itl_p50_ms", "p50", "-"),
                                                               ("itl_p95_ms", "p95", "--")], itl_slo_ms),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for line in lines:
            for key, label, style in keys:
                ax.plot(*series(line, key), marker=markers[line[0]], linestyle=style, color=colors[line],
                        label=f"{legend(line)} {label}")
        if slo is not None:
            ax.axhline(slo, color="red", linewidth=1, label=f"SLO {slo:g} ms")
        axis(ax, "ms", title)
        ax.legend(fontsize=8, ncol=2)
        save(fig, name)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for line in lines:
        ax.plot(*series(line, "tau"), marker=markers[line[0]], linestyle="-", color=colors[line], label=legend(line))
    axis(ax, "tokens per target forward (tau)", "Acceptance: tau")
    ax.legend()
    save(fig, "tau.png")
    return paths


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def write_report(rows: list[dict], out: Path, settings: dict, plots: list[Path], slo: dict | None) -> Path:
    open_loop = any(r.get("request_rate") is not None for r in rows)
    load = "offered req/s" if open_loop else "conc."
    lines = ["# AdaFlash load sweep", ""]
    if settings.get("incomplete"):
        lines += [f"**Incomplete**: the sweep stopped after the levels below: {settings['incomplete'][:300]}", ""]
    lines += [f"- server: {settings['server']}",
              f"- tools: {', '.join(settings['tools'])}; modes: {', '.join(settings['modes'])}; "
              f"{settings['loop']} levels: {', '.join(f'{v:g}' for v in settings['levels'])}",
              f"- per level: {settings['per_level']}; warm-up: {settings['warmup_requests']} request(s) per mode",
              f"- requests: max_tokens {settings['max_tokens']}, min_tokens {settings['min_tokens']}, "
              f"temperature {settings['temperature']}, top_k {settings['top_k']}, top_p {settings['top_p']}; "
              f"prompts: {settings['prompts']}",
              f"- started {settings['started']}, took {settings['elapsed_s']:.0f} s", ""]
    lines += ["## Results", "",
              f"| tool | mode | {load} | requests | errors | req/s | output tok/s | TTFT p50 | TTFT p95 | TTFT p99 "
              "| ITL p50 | ITL p95 | tau | server active mean/max | client CPU s |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['tool']} | {r['mode']} | {level_value(r):g} | {r['requests']} | {r['errors']} "
            f"| {_fmt(r['requests_per_s'], 2)} | {_fmt(r['output_tokens_per_s'])} | {_fmt(r['ttft_p50_ms'])} "
            f"| {_fmt(r['ttft_p95_ms'])} | {_fmt(r['ttft_p99_ms'])} | {_fmt(r['itl_p50_ms'])} "
            f"| {_fmt(r['itl_p95_ms'])} | {_fmt(r['tau'], 3)} "
            f"| {_fmt(r['server_active_mean'])} / {_fmt(r['server_active_max'], 0)} | {_fmt(r['client_cpu_s'])} |")
    lines += ["", "Times in ms. TTFT and ITL percentiles run over the level's requests; ITL is each request's "
              "mean time per token after the first. tau = tokens per target forward (1.0: plain decoding). "
              "`server active` samples the server's `adaflash_active_sequences` while the level ran "
              "(blank without a metrics URL). `client CPU s`: CPU time of the load generator's processes for the "
              "level, start-up included (they share the machine with the server when it runs here).", ""]
    if slo is not None:
        pct = settings["slo_percentile"]
        wanted = [f"TTFT {pct} <= {settings['ttft_slo_ms']:g} ms" if settings["ttft_slo_ms"] is not None else None,
                  f"ITL {pct} <= {settings['itl_slo_ms']:g} ms" if settings["itl_slo_ms"] is not None else None]
        lines += ["## Capacity under the SLO", "",
                  f"Objectives: {', '.join(w for w in wanted if w)}, and no errors.", "",
                  f"| tool | mode | highest {load} meeting it | output tok/s there | req/s there "
                  f"| TTFT {pct} | ITL {pct} | levels meeting it |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
        for (tool, mode), res in slo.items():
            b = res["best"]
            if b is None:
                lines.append(f"| {tool} | {mode} | none | - | - | - | - | - |")
            else:
                lines.append(f"| {tool} | {mode} | {level_value(b):g} | {_fmt(b['output_tokens_per_s'])} "
                             f"| {_fmt(b['requests_per_s'], 2)} | {_fmt(b[f'ttft_{pct}_ms'])} "
                             f"| {_fmt(b[f'itl_{pct}_ms'])} | {', '.join(f'{v:g}' for v in res['levels'])} |")
        best = [res["best"] for res in slo.values() if res["best"] is not None]
        if best:
            top = max(best, key=lambda r: r["output_tokens_per_s"] or 0)
            lines += ["", f"Most output tokens/s within the objectives: **{top['mode']}** ({top['tool']}) at "
                      f"{load} {level_value(top):g} ({_fmt(top['output_tokens_per_s'])} tok/s)."]
        else:
            lines += ["", "No level of any mode meets the objectives."]
        lines.append("")
    lines += ["## Plots", ""]
    for path in plots:
        lines += [f"![{path.stem}]({path.name})", ""]
    lines += ["## Files", "",
              "- `sweep.csv`: the table above with more columns (latency percentiles, accepted tokens per step, "
              "draft length, acceptance rate, the client's peak in-flight requests, and for Locust the largest "
              "wake-up delay of a greenlet (`hub_lag_max_ms`) and of an OS thread (`thread_lag_max_ms`) in it: "
              "similar values mean the process waited for a CPU, a hub delay far above the thread's would mean "
              "a greenlet held the hub)",
              "- `prompts.jsonl`: the prompts both tools sent",
              "- `locust/`: Locust's CSVs and log per mode and level (rows `grpc` = requests, `ttft`, `itl`, "
              "`tau_x1000`)",
              "- `aiperf/`: aiperf's exports and log per mode and level",
              "- `records/`: every request as a JSON line, and the client summary per level",
              "- `sweep.json`: settings and rows", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


# ---------------------------------------------------------------------------------------------
# Running the levels


def active_sequences(metrics_url: str) -> float | None:
    """The server's adaflash_active_sequences summed over modes, None when it cannot be read."""
    try:
        text = urllib.request.urlopen(metrics_url, timeout=1.0).read().decode()
    except OSError:
        return None
    values = re.findall(r"^adaflash_active_sequences(?:\{[^}]*\})? (\S+)$", text, re.M)
    return sum(float(v) for v in values) if values else None


class Progress:
    """One status line on stderr: redrawn in place on a terminal, a line every few seconds elsewhere."""

    def __init__(self, total: int, quiet: bool = False, stream=sys.stderr) -> None:
        self.total = total
        self.quiet = quiet
        self.stream = stream
        self.tty = stream.isatty()
        self.last_print = 0.0
        self.index = 0

    def update(self, label: str, elapsed: float, planned: str, counts: tuple[int, int] | None,
               active: float | None, final: bool = False) -> None:
        if self.quiet:
            return
        line = (f"sweep [{self.index}/{self.total}] {label} elapsed {elapsed:5.1f}s{planned}"
                + (f" requests {counts[0]} errors {counts[1]}" if counts is not None else "")
                + (f" server active {active:g}" if active is not None else ""))
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r" + line.ljust(120) + ("\n" if final else ""))
        elif final or now - self.last_print >= 5.0:
            self.stream.write(line + "\n")
            self.last_print = now
        self.stream.flush()


@dataclass(frozen=True)
class Endpoints:
    """Where the load goes: gRPC (Locust, the warm-up) and its metrics; the OpenAI endpoint and the model name it
    serves (aiperf); the target's folder (its tokenizer)."""

    grpc_url: str
    metrics_url: str | None
    openai_url: str | None = None
    model: str | None = None
    target_dir: Path | None = None


@dataclass
class LevelRun:
    records: list[dict]
    summary: dict
    active_samples: list[tuple[float, float]] = field(default_factory=list)
    cpu_s: float | None = None


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_process(cmd: list[str], log_path: Path, limit: float, metrics_url: str | None, progress: Progress,
                label: str, planned: str,
                counts: Callable[[], tuple[int, int] | None] = lambda: None) -> tuple[list[tuple[float, float]], float]:
    """Run one load generator to its end, its output in `log_path`, sampling the server's active sequences and
    updating the progress line; its (samples, CPU seconds). RuntimeError when it fails or outlives `limit`."""
    samples: list[tuple[float, float]] = []
    cpu_before, start = _children_cpu_s(), time.monotonic()
    with log_path.open("w") as log:
        log.write(" ".join(cmd) + "\n\n")
        log.flush()
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            while process.poll() is None:
                elapsed = time.monotonic() - start
                if elapsed > limit:
                    raise RuntimeError(f"{label}: still running after {limit:g} s")
                active = active_sequences(metrics_url) if metrics_url else None
                if active is not None:
                    samples.append((time.time(), active))
                progress.update(label, elapsed, planned, counts(), active)
                time.sleep(ACTIVE_SAMPLE_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"{label}: exited with {process.returncode}; log {log_path}:\n{log_path.read_text()[-3000:]}")
    progress.update(label, time.monotonic() - start, planned, counts(), samples[-1][1] if samples else None,
                    final=True)
    return samples, _children_cpu_s() - cpu_before


def locust_command(args: argparse.Namespace, url: str, mode: str, level: Level, prefix: Path,
                   records: Path, summary: Path) -> list[str]:
    users = level.concurrency if level.rate is None else 1
    cmd = [sys.executable, "-m", "locust", "-f", str(args.locustfile), "--headless",
           "-u", str(users), "-r", str(users), "-t", f"{args.duration:g}s",
           "--stop-timeout", f"{args.request_timeout:g}", "--csv", str(prefix), "--only-summary",
           "--exit-code-on-error", "0", "--host", url, "--model-name", args.model_name,
           "--max-tokens", str(args.max_tokens), "--temperature", str(args.temperature),
           "--top-k", str(args.top_k), "--top-p", str(args.top_p), "--request-timeout", f"{args.request_timeout:g}",
           "--prompts", str(args.out / "prompts.jsonl"), "--prompt-seed", str(args.prompt_seed),
           "--records", str(records), "--summary-json", str(summary), *connection_argv(args)]
    if args.requests:
        cmd += ["--max-requests", str(args.requests)]
    for flag, value in (("--spec-mode", spec_mode(mode)), ("--request-rate", level.rate),
                        ("--min-tokens", args.min_tokens), ("--seed", args.seed), ("--max-draft", args.max_draft),
                        ("--tokenizer", args.tokenizer)):
        if value is not None:
            cmd += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if args.domain_weights:
        cmd += ["--domain-weights", args.domain_weights]
    for word in args.stop_word or []:
        cmd += ["--stop-word", word]
    return cmd


def _count_lines(path: Path) -> tuple[int, int]:
    """(requests, errors) recorded so far; a partly written last line is skipped."""
    if not path.is_file():
        return 0, 0
    n = errors = 0
    for line in path.read_text().splitlines():
        if line.endswith("}"):
            n += 1
            errors += '"ok": false' in line
    return n, errors


def _planned(args: argparse.Namespace) -> str:
    return f"/{args.duration:g}s" if not args.requests else f" (target {args.requests} requests)"


def run_locust_level(args: argparse.Namespace, ends: Endpoints, mode: str, level: Level,
                     progress: Progress) -> LevelRun:
    """One headless Locust process for the level; its records, summary, server samples and CPU time."""
    stem = f"{mode}_{level.name}"
    records = args.out / "records" / f"{stem}.jsonl"
    summary = args.out / "records" / f"{stem}.summary.json"
    for path in (records, summary):
        path.unlink(missing_ok=True)
    cmd = locust_command(args, ends.grpc_url, mode, level, args.out / "locust" / stem, records, summary)
    samples, cpu = run_process(cmd, args.out / "locust" / f"{stem}.log", args.duration + args.request_timeout + 60,
                               ends.metrics_url, progress, f"locust mode={mode} {level.label}", _planned(args),
                               lambda: _count_lines(records))
    return LevelRun(read_records(records), json.loads(summary.read_text()) if summary.is_file() else {}, samples, cpu)


def request_body(args: argparse.Namespace, mode: str) -> dict:
    """The OpenAI request fields beyond the prompt, as aiperf adds them (--extra-inputs): the same request as the
    Locust users' (OpenAI's defaults differ from the server's, so sampling is sent explicitly)."""
    body = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    for name, value in (("spec_mode", spec_mode(mode)), ("min_tokens", args.min_tokens), ("seed", args.seed),
                        ("max_draft", args.max_draft), ("stop", args.stop_word)):
        if value is not None:
            body[name] = value
    return body


def run_aiperf_level(args: argparse.Namespace, ends: Endpoints, mode: str, level: Level, progress: Progress,
                     aiperf: Path) -> LevelRun:
    """One `aiperf profile` run for the level, its exports read back as records."""
    stem = f"{mode}_{level.name}"
    artifacts = args.out / "aiperf" / stem
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    cmd = aiperf_runs.aiperf_command(
        aiperf, openai_url=ends.openai_url, model=ends.model, tokenizer_dir=ends.target_dir,
        inputs=args.out / "aiperf" / "inputs.jsonl", artifacts=artifacts, body=request_body(args, mode),
        concurrency=level.concurrency, request_rate=level.rate, duration=args.duration, requests=args.requests,
        request_timeout=args.request_timeout, seed=args.prompt_seed, headers=headers_from_args(args))
    samples, cpu = run_process(cmd, artifacts / "aiperf.log", args.duration + args.request_timeout + 120,
                               ends.metrics_url, progress, f"aiperf mode={mode} {level.label}", _planned(args))
    records = aiperf_runs.read_records(artifacts, mode)
    summary = {"inflight_max": inflight_max(records), **aiperf_runs.own_summary(artifacts)}
    (args.out / "records" / f"aiperf_{stem}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (args.out / "records" / f"aiperf_{stem}.summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return LevelRun(records, summary, samples, cpu)


def level_extras(run: LevelRun, duration: float | None) -> dict:
    """Server and client-side figures of a level: active sequences while the load ran, peaks, hub stalls, CPU."""
    extra = {"client_inflight_max": run.summary.get("inflight_max"), "hub_lag_max_ms": run.summary.get("hub_lag_max_ms"),
             "thread_lag_max_ms": run.summary.get("os_thread_lag_max_ms"), "client_cpu_s": run.cpu_s}
    if run.records and run.active_samples:
        t0 = min(r["t_start"] for r in run.records)
        t1 = t0 + duration if duration else max(r["t_end"] for r in run.records)
        inside = [v for t, v in run.active_samples if t0 <= t <= t1]
        extra["server_active_mean"] = float(np.mean(inside)) if inside else None
        extra["server_active_max"] = max(v for _, v in run.active_samples)
    return extra


def _load_prompt_sets(locustfile: Path):
    """The locustfile's prompt_sets module (plain Python), loaded from its folder."""
    name = "adaflash_locust_prompt_sets"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, locustfile.parent / "prompt_sets.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


def prepare_prompts(args: argparse.Namespace, target_dir: Path | None) -> dict:
    """The prompts of every level, by domain, written to prompts.jsonl (and, drawn in Locust's order, to aiperf's
    inputs): the prompt set as chosen, cut to --max-prompt-tokens, or synthetic ones of --input-tokens."""
    prompt_sets = _load_prompt_sets(args.locustfile)
    by_domain = prompt_sets.load_prompt_set(args.prompts, split_csv(args.domains), args.max_prompt_chars)
    if args.input_tokens or args.max_prompt_tokens:
        from adaflash.models.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(target_dir)
        if args.input_tokens:
            corpus = [p.text for group in by_domain.values() for p in group]
            by_domain = {"synthetic": prompt_sets.synthetic_prompts(tokenizer, corpus, args.input_tokens,
                                                                    SYNTHETIC_PROMPTS, args.prompt_seed)}
        else:
            by_domain = prompt_sets.cut_prompt_set(by_domain, tokenizer, args.max_prompt_tokens)
    prompt_sets.write_prompt_set(by_domain, args.out / "prompts.jsonl")
    if "aiperf" in args.tool:
        sampler = prompt_sets.PromptSampler(by_domain, prompt_sets.parse_weights(args.domain_weights),
                                            seed=args.prompt_seed)
        aiperf_runs.write_inputs([sampler.sample().text for _ in range(AIPERF_INPUTS)],
                                 args.out / "aiperf" / "inputs.jsonl")
    return by_domain


def warm_up(args: argparse.Namespace, url: str, longest: str) -> None:
    """Readiness, then a few requests per mode with the longest prompt: fails fast on a mode the server
    does not serve or a prompt over its limit, and keeps first-call costs out of the first level."""
    from adaflash_client.client import AdaFlashClient, GenerationError, GenerationParams

    with AdaFlashClient(url, model_name=args.model_name, timeout_s=args.request_timeout, tls=tls_from_args(args),
                        headers=headers_from_args(args)) as client:
        deadline = time.monotonic() + 60
        while not (client.server_ready() and client.model_ready()):
            if time.monotonic() > deadline:
                raise SystemExit(f"error: no ready `{args.model_name}` model at {url}")
            time.sleep(0.5)
        for mode in args.modes:
            params = GenerationParams(max_tokens=min(args.max_tokens, 16), temperature=args.temperature,
                                      top_k=args.top_k, top_p=args.top_p, seed=args.seed, spec_mode=spec_mode(mode),
                                      max_draft=args.max_draft)
            for _ in range(max(args.warmup_requests, 1)):
                try:
                    client.generate_streaming(longest, params)
                except (GenerationError, ValueError) as e:
                    raise SystemExit(f"error: the warm-up request in mode {mode} failed: {e}") from e


def spec_mode(mode: str) -> str | None:
    """What a sweep mode sends as spec_mode: nothing for the server's default."""
    return None if mode == SERVER_DEFAULT else mode


def served_model(openai_url: str, headers: dict[str, str]) -> str:
    """The model name the OpenAI endpoint serves (its first in GET /v1/models)."""
    request = urllib.request.Request(f"{openai_url}/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["data"][0]["id"]
    except OSError as e:
        raise SystemExit(f"error: no OpenAI endpoint at {openai_url} (--openai-url): {e}") from e


def endpoints(args: argparse.Namespace, grpc_url: str, metrics_url: str | None, openai_url: str | None) -> Endpoints:
    """Where each tool sends its load; the OpenAI endpoint's model name and the target's folder are asked of the
    server only when a tool or a token count needs them. A running server's OpenAI endpoint defaults to
    `adaflash serve`'s port on the gRPC host."""
    aiperf = "aiperf" in args.tool
    if aiperf and openai_url is None:
        openai_url = f"http://{grpc_url.rsplit(':', 1)[0]}:{OPENAI_PORT}"
    needs_target = aiperf or args.input_tokens or args.max_prompt_tokens
    return Endpoints(grpc_url, metrics_url, openai_url if aiperf else None,
                     served_model(openai_url, headers_from_args(args)) if aiperf else None,
                     served_target_dir(args, grpc_url) if needs_target else None)


def served_target_dir(args: argparse.Namespace, url: str) -> Path:
    """--tokenizer, else the target folder the server's `adaflash` model reads (the same machine's path)."""
    if args.tokenizer:
        return args.tokenizer
    from adaflash_server.openai_front import Upstream, served_parameters

    return Path(served_parameters(Upstream(url, tls_from_args(args), headers_from_args(args) or None))[
        "target_dir"])


def _start_server(args: argparse.Namespace, levels: list[Level]):
    from adaflash_server.repository import RepositoryConfig, build_repository
    from adaflash_server.launcher import ServerConfig, TritonServer
    from adaflash_server.serve import model_dir_to_serve

    model_dir = model_dir_to_serve(args.model_dir, args.tiny_random, args.state_dir)
    active = args.max_active or max(64, *(level.concurrency or 0 for level in levels))
    cfg = RepositoryConfig(max_active=active, max_batch_size=active)
    print(f"building the model repository for {model_dir} and starting Triton", file=sys.stderr, flush=True)
    repo = build_repository(args.state_dir / "model_repository", model_dir, args.drafter or None, cfg, args.cost_table)
    server = TritonServer(ServerConfig(model_repository=repo, state_dir=args.state_dir / "server")).start()
    return server, str(model_dir)


def _start_front(grpc_url: str):
    """The OpenAI endpoint in front of the started server, on a free port (aiperf's target)."""
    from adaflash_server.launcher import free_ports
    from adaflash_server.openai_front import FrontServer

    return FrontServer(grpc_url, "127.0.0.1", free_ports(1)[0]).start()


def _levels(args: argparse.Namespace) -> list[Level] | None:
    """The sweep's levels: one kind, closed or open loop; None (after saying why) for an invalid choice."""
    if args.concurrency and args.request_rate:
        print("error: --concurrency (closed loop) or --request-rate (open loop), not both", file=sys.stderr)
        return None
    if args.request_rate:
        if min(args.request_rate) <= 0:
            print("error: --request-rate values must be positive", file=sys.stderr)
            return None
        return [Level(rate=r) for r in args.request_rate]
    concurrency = args.concurrency or DEFAULT_CONCURRENCY
    if min(concurrency) < 1:
        print("error: --concurrency values must be positive", file=sys.stderr)
        return None
    return [Level(concurrency=c) for c in concurrency]


def _check_args(args: argparse.Namespace) -> bool:
    """What argparse cannot check; False (after saying why) when the sweep cannot run as asked."""
    needed = [("locust", "load"), ("matplotlib", "load"), ("tritonclient", "serve")]
    for module, extra in needed:
        if importlib.util.find_spec(module) is None:
            print(f"error: {module} is not installed (pip install -e '.[{extra}]')", file=sys.stderr)
            return False
    problems = [
        (not args.locustfile.is_file(), f"no locustfile at {args.locustfile} (--locustfile)"),
        (args.duration <= 0 or args.requests < 0, "--duration and --requests must be positive"),
        (bool(connection_argv(args)) and not args.url,
         "--ssl, --root-cert, --header and the like are for a running server's --url"),
        ("aiperf" in args.tool and tls_from_args(args) is not None,
         "--tool aiperf takes no TLS options (aiperf reaches the OpenAI endpoint by --openai-url only)"),
        (args.output_tokens is not None and args.output_tokens < 1, "--output-tokens must be positive"),
        (args.input_tokens is not None and args.max_prompt_tokens is not None,
         "--input-tokens makes prompts of its length: --max-prompt-tokens would not apply"),
    ]
    for failed, message in problems:
        if failed:
            print(f"error: {message}", file=sys.stderr)
            return False
    return True


def run(args: argparse.Namespace) -> int:
    if args.duration is None:
        args.duration = 600.0 if args.requests else 30.0
    levels = _levels(args)
    if levels is None or not _check_args(args):
        return 2
    args.min_tokens = args.output_tokens
    if args.output_tokens:
        args.max_tokens = args.output_tokens
    aiperf = aiperf_runs.ensure_aiperf(args.aiperf_venv) if "aiperf" in args.tool else None
    for folder in ("records", *args.tool):
        (args.out / folder).mkdir(parents=True, exist_ok=True)
    started, t0 = time.strftime("%Y-%m-%d %H:%M:%S"), time.monotonic()
    server = front = None
    rows: list[dict] = []
    failure = None
    try:
        if args.url:
            ends, described = endpoints(args, args.url, args.metrics_url, args.openai_url), f"{args.url} (running)"
        else:
            server, model_dir = _start_server(args, levels)
            front = _start_front(server.grpc_url) if aiperf else None
            ends = endpoints(args, server.grpc_url, server.metrics_url, front.url.removesuffix("/v1") if front else None)
            described = f"{server.grpc_url}, started by the sweep on {model_dir}"
        by_domain = prepare_prompts(args, ends.target_dir)
        warm_up(args, ends.grpc_url, max((p.text for group in by_domain.values() for p in group), key=len))
        progress = Progress(len(args.tool) * len(args.modes) * len(levels), args.quiet)
        for tool, mode, level in ((t, m, lv) for t in args.tool for m in args.modes for lv in levels):
            progress.index += 1
            try:
                if tool == "aiperf":
                    level_run = run_aiperf_level(args, ends, mode, level, progress, aiperf)
                else:
                    level_run = run_locust_level(args, ends, mode, level, progress)
            except RuntimeError as e:  # a load generator failed or hung: report the levels done so far
                failure = str(e)
                print(f"error: {failure}", file=sys.stderr)
                break
            extra = level_extras(level_run, None if args.requests else args.duration)
            rows.append(summarize_level(level_run.records, mode, level.concurrency, extra, tool=tool,
                                        request_rate=level.rate))
    finally:
        if front is not None:
            front.stop()
        if server is not None:
            server.stop()
    if not rows:
        return 1
    settings = {
        "server": described, "openai_url": ends.openai_url, "incomplete": failure, "tools": args.tool,
        "modes": args.modes, "loop": "open (Poisson arrivals, requests/s)" if levels[0].rate else "closed (concurrency)",
        "levels": [level.rate or level.concurrency for level in levels],
        "per_level": f"{args.requests} requests (at most {args.duration:g} s)" if args.requests
        else f"{args.duration:g} s of load, then running requests finish",
        "warmup_requests": args.warmup_requests, "max_tokens": args.max_tokens, "min_tokens": args.min_tokens,
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed,
        "max_draft": args.max_draft, "prompts": describe_prompts(args, by_domain),
        "domains": args.domains or "all", "prompt_seed": args.prompt_seed, "ttft_slo_ms": args.ttft_slo_ms,
        "itl_slo_ms": args.itl_slo_ms, "slo_percentile": args.slo_percentile, "started": started,
        "elapsed_s": time.monotonic() - t0,
    }
    write_tidy_csv(rows, args.out / "sweep.csv")
    plots = plot_all(rows, args.out, args.ttft_slo_ms, args.itl_slo_ms)
    slo = None
    if args.ttft_slo_ms is not None or args.itl_slo_ms is not None:
        slo = slo_capacity(rows, args.ttft_slo_ms, args.itl_slo_ms, args.slo_percentile)
    report = write_report(rows, args.out, settings, plots, slo)
    (args.out / "sweep.json").write_text(json.dumps({"settings": settings, "rows": rows}, indent=1) + "\n")
    errors = sum(r["errors"] for r in rows)
    print(f"wrote {args.out}/sweep.csv, {report}, {len(plots)} plots"
          + (f"; {errors} failed requests (see records/)" if errors else ""), file=sys.stderr)
    return 1 if failure else 0


def describe_prompts(args: argparse.Namespace, by_domain: dict) -> str:
    source = ", ".join(map(str, args.prompts)) if args.prompts else "adaflash sample prompts"
    count = sum(len(group) for group in by_domain.values())
    if args.input_tokens:
        return f"{count} synthetic prompts of {args.input_tokens} tokens (windows of {source}, seed {args.prompt_seed})"
    cut = f", each cut to its last {args.max_prompt_tokens} tokens" if args.max_prompt_tokens else ""
    return f"{count} prompts of {source}{cut}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adaflash sweep", formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.description = __doc__
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
