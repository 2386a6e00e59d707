"""`adaflash sweep`: capacity planning. Headless Locust per spec_mode and concurrency level, one report.

    .venv/bin/adaflash sweep --out bench-out/sweep                        # starts its own server
    .venv/bin/adaflash sweep --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics \
        --modes ar,adaflash --concurrency 1,4,16 --duration 60 --ttft-slo-ms 500 --itl-slo-ms 50

For every mode and level it runs `locust -f clients/locust/locustfile.py --headless -u N -r N` in a
process of its own (a fresh gevent hub and fresh connections per level; this process never imports
Locust, so it is not monkey-patched and can start the server). A level lasts --duration seconds
(or until --requests requests are done); requests still running at the end are allowed to
finish, so each level's window runs from its first request's start to its last request's end.

Written under --out:
  locust/<mode>_c<N>_{stats,stats_history,failures,exceptions}.csv, <mode>_c<N>.log   Locust's own
  records/<mode>_c<N>.jsonl       one JSON line per request (the locustfile's --records)
  records/<mode>_c<N>.summary.json  client peak in-flight requests and gevent hub stalls
  sweep.csv                       one row per mode and level (columns: TIDY_FIELDS)
  throughput.png, ttft.png, itl.png, tau.png
  report.md                       tables, plots, and with --ttft-slo-ms/--itl-slo-ms the highest
                                  concurrency per mode that meets them
  sweep.json                      the settings and the rows

Definitions, all from the per-request records: requests/s and output tokens/s are successful
requests and their output tokens over the level's window; TTFT is per request; ITL is a
request's mean time per token after the first, (latency - TTFT) / (tokens - 1), and its
percentiles run over requests; tau = sum(tokens - 1) / sum(verify steps) over the level's
requests (1.0 is plain decoding); errors counts failed requests.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adaflash.cli_args import DEFAULT_MODEL_DIR, csv_list, split_csv
from adaflash.decoding.modes import MODE_NAMES
from adaflash_client.cli import add_connection_arguments, connection_argv, headers_from_args, tls_from_args

DEFAULT_MODES = ["ar", "ngram", "dflash", "adaflash"]
DEFAULT_CONCURRENCY = [1, 2, 4, 8, 16, 32, 64]
LOCUSTFILE = Path(__file__).resolve().parents[1] / "locust" / "locustfile.py"

TIDY_FIELDS = [
    "mode", "concurrency", "requests", "errors", "duration_s", "requests_per_s", "output_tokens",
    "output_tokens_per_s", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p95_ms",
    "latency_p50_ms", "latency_p95_ms", "tau", "mean_accepted_per_step", "mean_draft_len", "acceptance_rate",
    "server_active_mean", "server_active_max", "client_inflight_max", "hub_lag_max_ms", "thread_lag_max_ms",
]


def register(sub: argparse._SubParsersAction) -> None:
    """The `adaflash sweep` command (entry point `adaflash.commands`)."""
    p = sub.add_parser("sweep", help="Locust load per spec_mode and concurrency: CSVs, plots, Markdown report")
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.split("\n\n")[0]
    target = p.add_argument_group("server (default: start one on free ports, like `adaflash serve`)")
    target.add_argument("--url", help="HOST:PORT of a running server's gRPC endpoint")
    target.add_argument("--metrics-url", help="its Prometheus metrics URL, to sample adaflash_active_sequences")
    target.add_argument("--model-dir", type=Path, help=f"models for the started server (default: {DEFAULT_MODEL_DIR}, "
                        "else the tiny random models)")
    target.add_argument("--tiny-random", action="store_true", help="start the server on the seeded tiny random models")
    target.add_argument("--drafter", default="drafter", help="drafter folder name in the model folder ('' for none)")
    target.add_argument("--state-dir", type=Path, default=Path(".serve/sweep"), help="the started server's files")
    target.add_argument("--cost-table", type=Path, help="reuse a measured verify/draft cost table (JSON)")
    target.add_argument("--max-active", type=int, help="the started server's max_active (default: max(64, levels))")
    add_connection_arguments(p.add_argument_group("connection to --url (TLS, headers)"))

    load = p.add_argument_group("load")
    load.add_argument("--modes", type=csv_list(str, MODE_NAMES), default=DEFAULT_MODES,
                      help=f"comma-separated spec_modes (default: {','.join(DEFAULT_MODES)})")
    load.add_argument("--concurrency", type=csv_list(int), default=DEFAULT_CONCURRENCY,
                      help="comma-separated levels: Locust users, each with one request in flight")
    load.add_argument("--duration", type=float,
                      help="seconds of load per level (default 30; with --requests, the cap: default 600)")
    load.add_argument("--requests", type=int, default=0, help="requests per level instead of a duration")
    load.add_argument("--warmup-requests", type=int, default=2, help="unmeasured requests per mode before its levels")
    load.add_argument("--max-tokens", type=int, default=128)
    load.add_argument("--temperature", type=float, default=0.0)
    load.add_argument("--top-k", type=int, default=0)
    load.add_argument("--top-p", type=float, default=1.0)
    load.add_argument("--seed", type=int)
    load.add_argument("--max-draft", type=int)
    load.add_argument("--stop-word", action="append", help="stop word (repeatable)")
    load.add_argument("--prompts", action="append", help="prompt file or folder (repeatable; see clients/locust/)")
    load.add_argument("--domains", default="", help="comma-separated domains to use (default: all)")
    load.add_argument("--domain-weights", default="", help="e.g. code=2,chat=1")
    load.add_argument("--max-prompt-chars", type=int, help="keep each prompt's last characters")
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


def summarize_level(records: list[dict], mode: str, concurrency: int, extra: dict | None = None) -> dict:
    """One tidy row from a level's request records (see the module docstring for the definitions)."""
    ok = [r for r in records if r.get("ok")]
    window = (max(r["t_end"] for r in records) - min(r["t_start"] for r in records)) if records else 0.0
    tokens = sum(r["tokens"] for r in ok)
    stepped = [r for r in ok if r.get("steps")]
    steps = sum(r["steps"] for r in stepped)
    drafted = sum(r.get("drafted", 0) for r in stepped)
    ttft = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
    itl = [r["itl_s"] for r in ok if r.get("itl_s") is not None]
    latency = [r["latency_s"] for r in ok]
    row = {
        "mode": mode,
        "concurrency": concurrency,
        "requests": len(ok),
        "errors": len(records) - len(ok),
        "duration_s": window,
        "requests_per_s": _ratio(len(ok), window),
        "output_tokens": tokens,
        "output_tokens_per_s": _ratio(tokens, window),
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
        "acceptance_rate": _ratio(sum(r.get("accepted", 0) for r in stepped), drafted),
        "server_active_mean": None,
        "server_active_max": None,
        "client_inflight_max": None,
        "hub_lag_max_ms": None,
        "thread_lag_max_ms": None,
    }
    row.update(extra or {})
    return row


def slo_capacity(rows: list[dict], ttft_slo_ms: float | None, itl_slo_ms: float | None,
                 pct: str = "p95") -> dict[str, dict]:
    """Per mode: the levels that meet the objectives (no errors, measured latencies within them) and
    the highest of them (`best`, the row; None when no level does)."""
    def meets(row: dict) -> bool:
        if row["errors"] or not row["requests"]:
            return False
        for slo, key in ((ttft_slo_ms, f"ttft_{pct}_ms"), (itl_slo_ms, f"itl_{pct}_ms")):
            if slo is not None and (row[key] is None or row[key] > slo):
                return False
        return True

    result = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        passing = sorted((r for r in rows if r["mode"] == mode and meets(r)), key=lambda r: r["concurrency"])
        result[mode] = {"levels": [r["concurrency"] for r in passing], "best": passing[-1] if passing else None}
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


def plot_all(rows: list[dict], out: Path, ttft_slo_ms: float | None = None, itl_slo_ms: float | None = None) -> list[Path]:
    """Four PNGs: throughput, TTFT percentiles, ITL percentiles, tau; each against concurrency per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(r["mode"] for r in rows))
    levels = sorted({r["concurrency"] for r in rows})
    colors = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(modes)}

    def series(mode: str, key: str) -> tuple[list[int], list[float]]:
        pts = [(r["concurrency"], r[key]) for r in sorted(rows, key=lambda r: r["concurrency"])
               if r["mode"] == mode and r[key] is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    def axis(ax, ylabel: str, title: str) -> None:
        if len(levels) > 1 and levels[-1] / levels[0] >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrency (users, one request in flight each)")
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
    for mode in modes:
        axes[0].plot(*series(mode, "output_tokens_per_s"), "o-", color=colors[mode], label=mode)
        axes[1].plot(*series(mode, "requests_per_s"), "o-", color=colors[mode], label=mode)
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
        for mode in modes:
            for key, label, style in keys:
                ax.plot(*series(mode, key), marker="o", linestyle=style, color=colors[mode], label=f"{mode} {label}")
        if slo is not None:
            ax.axhline(slo, color="red", linewidth=1, label=f"SLO {slo:g} ms")
        axis(ax, "ms", title)
        ax.legend(fontsize=8, ncol=2)
        save(fig, name)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in modes:
        ax.plot(*series(mode, "tau"), "o-", color=colors[mode], label=mode)
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
    lines = ["# AdaFlash load sweep", ""]
    if settings.get("incomplete"):
        lines += [f"**Incomplete**: the sweep stopped after the levels below: {settings['incomplete'][:300]}", ""]
    lines += [f"- server: {settings['server']}",
              f"- modes: {', '.join(settings['modes'])}; concurrency levels: {', '.join(map(str, settings['concurrency']))}",
              f"- per level: {settings['per_level']}; warm-up: {settings['warmup_requests']} request(s) per mode",
              f"- requests: max_tokens {settings['max_tokens']}, temperature {settings['temperature']}, "
              f"top_k {settings['top_k']}, top_p {settings['top_p']}; prompts: {settings['prompts']}",
              f"- started {settings['started']}, took {settings['elapsed_s']:.0f} s", ""]
    lines += ["## Results", "",
              "| mode | conc. | requests | errors | req/s | output tok/s | TTFT p50 | TTFT p95 | TTFT p99 | ITL p50 | ITL p95 "
              "| tau | server active mean/max |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['concurrency']} | {r['requests']} | {r['errors']} | {_fmt(r['requests_per_s'], 2)} "
            f"| {_fmt(r['output_tokens_per_s'])} | {_fmt(r['ttft_p50_ms'])} | {_fmt(r['ttft_p95_ms'])} "
            f"| {_fmt(r['ttft_p99_ms'])} | {_fmt(r['itl_p50_ms'])} | {_fmt(r['itl_p95_ms'])} | {_fmt(r['tau'], 3)} "
            f"| {_fmt(r['server_active_mean'])} / {_fmt(r['server_active_max'], 0)} |")
    lines += ["", "Times in ms. TTFT and ITL percentiles run over the level's requests; ITL is each request's "
              "mean time per token after the first. tau = tokens per target forward (1.0: plain decoding). "
              "`server active` samples the server's `adaflash_active_sequences` while the level ran "
              "(blank without a metrics URL).", ""]
    if slo is not None:
        pct = settings["slo_percentile"]
        wanted = [f"TTFT {pct} <= {settings['ttft_slo_ms']:g} ms" if settings["ttft_slo_ms"] is not None else None,
                  f"ITL {pct} <= {settings['itl_slo_ms']:g} ms" if settings["itl_slo_ms"] is not None else None]
        lines += ["## Capacity under the SLO", "",
                  f"Objectives: {', '.join(w for w in wanted if w)}, and no errors.", "",
                  "| mode | highest concurrency meeting it | output tok/s there | req/s there "
                  f"| TTFT {pct} | ITL {pct} | levels meeting it |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for mode, res in slo.items():
            b = res["best"]
            if b is None:
                lines.append(f"| {mode} | none | - | - | - | - | - |")
            else:
                lines.append(f"| {mode} | {b['concurrency']} | {_fmt(b['output_tokens_per_s'])} "
                             f"| {_fmt(b['requests_per_s'], 2)} | {_fmt(b[f'ttft_{pct}_ms'])} "
                             f"| {_fmt(b[f'itl_{pct}_ms'])} | {', '.join(map(str, res['levels']))} |")
        best = [res["best"] for res in slo.values() if res["best"] is not None]
        if best:
            top = max(best, key=lambda r: r["output_tokens_per_s"] or 0)
            lines += ["", f"Most output tokens/s within the objectives: **{top['mode']}** at concurrency "
                      f"{top['concurrency']} ({_fmt(top['output_tokens_per_s'])} tok/s)."]
        else:
            lines += ["", "No level of any mode meets the objectives."]
        lines.append("")
    lines += ["## Plots", ""]
    for path in plots:
        lines += [f"![{path.stem}]({path.name})", ""]
    lines += ["## Files", "",
              "- `sweep.csv`: the table above with more columns (latency percentiles, accepted tokens per step, "
              "draft length, acceptance rate, the Locust process's peak in-flight requests, and the largest "
              "wake-up delay of a greenlet (`hub_lag_max_ms`) and of an OS thread (`thread_lag_max_ms`) in it: "
              "similar values mean the process waited for a CPU, a hub delay far above the thread's would mean "
              "a greenlet held the hub)",
              "- `locust/`: Locust's CSVs and log per mode and level (rows `grpc` = requests, `ttft`, `itl`, "
              "`tau_x1000`)",
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

    def update(self, mode: str, concurrency: int, elapsed: float, planned: str, requests: int, errors: int,
               active: float | None, final: bool = False) -> None:
        if self.quiet:
            return
        line = (f"sweep [{self.index}/{self.total}] mode={mode} concurrency={concurrency} "
                f"elapsed {elapsed:5.1f}s{planned} requests {requests} errors {errors}"
                + (f" server active {active:g}" if active is not None else ""))
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r" + line.ljust(110) + ("\n" if final else ""))
        elif final or now - self.last_print >= 5.0:
            self.stream.write(line + "\n")
            self.last_print = now
        self.stream.flush()


@dataclass
class LevelRun:
    records: list[dict]
    summary: dict
    active_samples: list[tuple[float, float]] = field(default_factory=list)


def locust_command(args: argparse.Namespace, url: str, mode: str, concurrency: int, prefix: Path,
                   records: Path, summary: Path) -> list[str]:
    cmd = [sys.executable, "-m", "locust", "-f", str(args.locustfile), "--headless",
           "-u", str(concurrency), "-r", str(concurrency), "-t", f"{args.duration:g}s",
           "--stop-timeout", f"{args.request_timeout:g}", "--csv", str(prefix), "--only-summary",
           "--exit-code-on-error", "0", "--host", url,
           "--spec-mode", mode, "--max-tokens", str(args.max_tokens), "--temperature", str(args.temperature),
           "--top-k", str(args.top_k), "--top-p", str(args.top_p), "--request-timeout", f"{args.request_timeout:g}",
           "--records", str(records), "--summary-json", str(summary), *connection_argv(args)]
    if args.requests:
        cmd += ["--max-requests", str(args.requests)]
    for flag, value in (("--seed", args.seed), ("--max-draft", args.max_draft),
                        ("--max-prompt-chars", args.max_prompt_chars)):
        if value is not None:
            cmd += [flag, str(value)]
    if args.domains:
        cmd += ["--domains", args.domains]
    if args.domain_weights:
        cmd += ["--domain-weights", args.domain_weights]
    for word in args.stop_word or []:
        cmd += ["--stop-word", word]
    for source in args.prompts or []:
        cmd += ["--prompts", str(source)]
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


def run_level(args: argparse.Namespace, url: str, metrics_url: str | None, mode: str, concurrency: int,
              progress: Progress) -> LevelRun:
    """One headless Locust process at `concurrency` users; its records, summary and server samples."""
    stem = f"{mode}_c{concurrency}"
    prefix = args.out / "locust" / stem
    records = args.out / "records" / f"{stem}.jsonl"
    summary = args.out / "records" / f"{stem}.summary.json"
    for path in (records, summary):
        path.unlink(missing_ok=True)
    cmd = locust_command(args, url, mode, concurrency, prefix, records, summary)
    log_path = args.out / "locust" / f"{stem}.log"
    planned = f"/{args.duration:g}s" if not args.requests else f" (target {args.requests} requests)"
    limit = args.duration + args.request_timeout + 60
    samples: list[tuple[float, float]] = []
    start = time.monotonic()
    with log_path.open("w") as log:
        log.write(" ".join(cmd) + "\n\n")
        log.flush()
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            while process.poll() is None:
                elapsed = time.monotonic() - start
                if elapsed > limit:
                    raise RuntimeError(f"locust ({mode}, concurrency {concurrency}) still running after {limit:g} s")
                active = active_sequences(metrics_url) if metrics_url else None
                if active is not None:
                    samples.append((time.time(), active))
                n, errors = _count_lines(records)
                progress.update(mode, concurrency, elapsed, planned, n, errors, active)
                time.sleep(0.5)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"locust ({mode}, concurrency {concurrency}) exited with {process.returncode}; "
                           f"log {log_path}:\n{log_path.read_text()[-3000:]}")
    run = LevelRun(read_records(records), json.loads(summary.read_text()) if summary.is_file() else {}, samples)
    n, errors = _count_lines(records)
    progress.update(mode, concurrency, time.monotonic() - start, planned, n, errors,
                    samples[-1][1] if samples else None, final=True)
    return run


def level_extras(run: LevelRun, duration: float | None) -> dict:
    """Server and client-side figures of a level: active sequences while users were running, peaks, hub stalls."""
    extra = {"client_inflight_max": run.summary.get("inflight_max"), "hub_lag_max_ms": run.summary.get("hub_lag_max_ms"),
             "thread_lag_max_ms": run.summary.get("os_thread_lag_max_ms")}
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


def warm_up(args: argparse.Namespace, url: str) -> None:
    """Readiness, then a few requests per mode with the longest prompt: fails fast on a mode the server
    does not serve or a prompt over its limit, and keeps first-call costs out of the first level."""
    from adaflash_client.client import AdaFlashClient, GenerationError, GenerationParams

    prompt_sets = _load_prompt_sets(args.locustfile)
    by_domain = prompt_sets.load_prompt_set(args.prompts, split_csv(args.domains),
                                            args.max_prompt_chars)
    longest = max((p.text for group in by_domain.values() for p in group), key=len)
    with AdaFlashClient(url, timeout_s=args.request_timeout, tls=tls_from_args(args),
                        headers=headers_from_args(args)) as client:
        deadline = time.monotonic() + 60
        while not (client.server_ready() and client.model_ready()):
            if time.monotonic() > deadline:
                raise SystemExit(f"error: no ready `adaflash` model at {url}")
            time.sleep(0.5)
        for mode in args.modes:
            params = GenerationParams(max_tokens=min(args.max_tokens, 16), temperature=args.temperature,
                                      top_k=args.top_k, top_p=args.top_p, seed=args.seed, spec_mode=mode,
                                      max_draft=args.max_draft)
            for _ in range(max(args.warmup_requests, 1)):
                try:
                    client.generate_streaming(longest, params)
                except GenerationError as e:
                    raise SystemExit(f"error: the warm-up request in mode {mode} failed: {e}") from e


def _start_server(args: argparse.Namespace):
    from adaflash_build.repository import RepositoryConfig, build_repository
    from adaflash_server.launcher import ServerConfig, TritonServer
    from adaflash_server.serve import model_dir_to_serve

    model_dir = model_dir_to_serve(args.model_dir, args.tiny_random, args.state_dir)
    active = args.max_active or max(64, max(args.concurrency))
    cfg = RepositoryConfig(max_active=active, max_batch_size=active)
    print(f"building the model repository for {model_dir} and starting Triton", file=sys.stderr, flush=True)
    repo = build_repository(args.state_dir / "model_repository", model_dir, args.drafter or None, cfg, args.cost_table)
    server = TritonServer(ServerConfig(model_repository=repo, state_dir=args.state_dir / "server")).start()
    return server, str(model_dir)


def run(args: argparse.Namespace) -> int:
    for module, extra in (("locust", "load"), ("matplotlib", "load"), ("tritonclient", "serve")):
        if importlib.util.find_spec(module) is None:
            print(f"error: {module} is not installed (pip install -e '.[{extra}]')", file=sys.stderr)
            return 2
    if not args.locustfile.is_file():
        print(f"error: no locustfile at {args.locustfile} (--locustfile)", file=sys.stderr)
        return 2
    if args.duration is None:
        args.duration = 600.0 if args.requests else 30.0
    if min(args.concurrency) < 1 or args.duration <= 0 or args.requests < 0:
        print("error: --concurrency values, --duration and --requests must be positive", file=sys.stderr)
        return 2
    if connection_argv(args) and not args.url:
        print("error: --ssl, --root-cert, --header and the like are for a running server's --url", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "locust").mkdir(exist_ok=True)
    (args.out / "records").mkdir(exist_ok=True)
    started, t0 = time.strftime("%Y-%m-%d %H:%M:%S"), time.monotonic()
    server = None
    try:
        if args.url:
            url, metrics_url, described = args.url, args.metrics_url, f"{args.url} (running)"
        else:
            server, model_dir = _start_server(args)
            url, metrics_url = server.grpc_url, server.metrics_url
            described = f"{url}, started by the sweep on {model_dir}"
        warm_up(args, url)
        progress = Progress(len(args.modes) * len(args.concurrency), args.quiet)
        rows = []
        failure = None
        for mode, concurrency in ((m, c) for m in args.modes for c in args.concurrency):
            progress.index += 1
            try:
                level = run_level(args, url, metrics_url, mode, concurrency, progress)
            except RuntimeError as e:  # a Locust process failed or hung: report the levels done so far
                failure = str(e)
                print(f"error: {failure}", file=sys.stderr)
                break
            extra = level_extras(level, None if args.requests else args.duration)
            rows.append(summarize_level(level.records, mode, concurrency, extra))
    finally:
        if server is not None:
            server.stop()
    if not rows:
        return 1
    settings = {
        "server": described, "incomplete": failure, "modes": args.modes, "concurrency": args.concurrency,
        "per_level": f"{args.requests} requests (at most {args.duration:g} s)" if args.requests
        else f"{args.duration:g} s of load, then running requests finish",
        "warmup_requests": args.warmup_requests, "max_tokens": args.max_tokens, "temperature": args.temperature,
        "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed, "max_draft": args.max_draft,
        "prompts": ", ".join(map(str, args.prompts)) if args.prompts else "adaflash sample prompts",
        "domains": args.domains or "all", "ttft_slo_ms": args.ttft_slo_ms, "itl_slo_ms": args.itl_slo_ms,
        "slo_percentile": args.slo_percentile, "started": started, "elapsed_s": time.monotonic() - t0,
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
          + (f"; {errors} failed requests (see locust/*_failures.csv)" if errors else ""), file=sys.stderr)
    return 1 if failure else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adaflash sweep", formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.description = __doc__
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
