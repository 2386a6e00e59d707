"""docs/results.md from the benchmark records in benchmarks/results/*.json (`make results`).

Every figure on that page comes from a record here, and every record names the command that produced it, the
machine, the commit and the date (its `meta`; a part measured apart carries its own). A rerun replaces a record and
`make results` rewrites the page; tests/unit/test_results.py fails when the committed page is not what the records
give, or when a record lacks one of those fields.

    python3 benchmarks/results.py                  # write docs/results.md
    python3 benchmarks/results.py --check          # exit 1 when docs/results.md is not what the records give
    python3 benchmarks/results.py stamp bench-out/peers.json peers --command "make bench-peers"
    python3 benchmarks/results.py stamp bench-out/gate.json engine-speed --part "shared sets" --command "..."

`stamp` writes a fresh report as benchmarks/results/NAME.json with its meta (machine: this host, unless
--machine; commit: HEAD; date: today, UTC). With --part, the report is `bench_gate.py`'s: its cells replace the part
of that set at those loads in NAME.json. `adaflash evaluate` writes quality.json with its meta itself
(`make evaluate`).

Standard library only: the page builds without the project installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"  # its headline table, between HEADLINE_START and HEADLINE_END
HEADLINE_START, HEADLINE_END = "<!-- headline:start -->", "<!-- headline:end -->"
META = ("command", "machine", "commit", "date")


class RecordError(ValueError):
    """A record lacks what the page needs."""


def need(obj: dict, where: str, fields: tuple[str, ...] = META) -> dict:
    missing = [f for f in fields if f not in obj or obj[f] in (None, "")]
    if missing:
        raise RecordError(f"{where}: missing {', '.join(missing)}")
    return obj


def provenance(meta: dict, where: str, label: str = "") -> str:
    need(meta, where)
    head = f"{label}: " if label else ""
    return (f"{head}`{meta['command']}`; {meta['machine']}; commit `{meta['commit']}`, {meta['date']}.")


def title(rec: dict, default: str) -> str:
    text = rec.get("title", default)
    return text[:1].upper() + text[1:]


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(r) + " |" for r in rows])


def f2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def f3(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def n0(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


# ---------------------------------------------------------------- engine speed

def gate_cells(report: dict) -> list[dict]:
    """`bench_gate.py`'s report -> its cells: the summary's figures, with rounds and output equality from its rows."""
    cells = []
    for cell in report["summary"]:
        mine = [r for r in report["rows"] if (r["domain"], r["concurrency"]) == (cell["domain"], cell["concurrency"])]
        out = {"domain": cell["domain"], "concurrency": cell["concurrency"],
               "rounds": len({r["repeat"] for r in mine}), "best_fixed": cell["best_fixed"],
               "median_tokens_per_s": {k: round(v, 1) for k, v in cell["median_tokens_per_s"].items()},
               "adaflash_over_best_ratio_of_medians": cell["adaflash_over_best"],
               "adaflash_over_best_by_round": cell["adaflash_over_best_by_round"]}
        interval = cell.get("adaflash_round_median_interval")
        if interval:
            out.update({"adaflash_over_best_round_median": interval["median"], "interval_low": interval["low"],
                        "interval_high": interval["high"]})
        if "adaflash_no_gate_over_best" in cell:
            out["adaflash_no_gate_over_best_ratio_of_medians"] = cell["adaflash_no_gate_over_best"]
        if cell.get("adaflash_calls_by_arm"):
            out["adaflash_calls_by_arm"] = cell["adaflash_calls_by_arm"]
        out["outputs_equal_to_ar"] = all(r["greedy_equal_to_ar"] for r in mine)
        out["departures_at_ties"] = sum(r.get("departures_at_ties", 0) for r in mine)
        cells.append(out)
    return cells


def _cell_figure(cell: dict, where: str) -> float:
    need(cell, where, ("adaflash_over_best_round_median", "interval_low", "interval_high", "best_fixed", "rounds",
                       "outputs_equal_to_ar"))
    return cell["adaflash_over_best_round_median"]


def _passes(cell: dict, bar: float) -> bool:
    return cell["outputs_equal_to_ar"] and cell["adaflash_over_best_round_median"] >= bar


def render_engine_speed(rec: dict, name: str) -> list[str]:
    meta = need(rec.get("meta", {}), f"{name}: meta")
    need(rec, name, ("bar", "parts"))
    bar = rec["bar"]
    cells = []  # (set, cell, part)
    for i, part in enumerate(rec["parts"]):
        need(part, f"{name}: parts[{i}]", ("set", "command", "cells"))
        for cell in part["cells"]:
            _cell_figure(cell, f"{name}: parts[{i}] {cell.get('domain')}")
            cells.append((part["set"], cell))
    loads = sorted({c["concurrency"] for _, c in cells})
    rows, seen = [], {}
    for set_name, cell in cells:
        seen.setdefault((set_name, cell["domain"]), {})[cell["concurrency"]] = cell
    for (set_name, domain), by_load in seen.items():
        row = [set_name, domain]
        for c in loads:
            cell = by_load.get(c)
            if cell is None:
                row.append("")
                continue
            text = f"{cell['adaflash_over_best_round_median']:.3f}"
            row.append((text if _passes(cell, bar) else f"**{text}**") + f" ({cell['best_fixed']})")
        rows.append(row)
    passed = sum(_passes(c, bar) for _, c in cells)
    rounds = sorted({c["rounds"] for _, c in cells})
    out = [f"**{title(rec, 'engine speed')}.** {provenance(meta, name)}", "",
           f"Each cell: adaflash's throughput over the best fixed mode of the same round (`ar`, `ngram`, `dflash`; "
           f"which in brackets), the median over {' or '.join(map(str, rounds))} rounds; below the bar "
           f"({bar}: {rec.get('bar_rule', 'median of rounds at least the bar')}) in bold.", ""]
    out += table(["set", "cell"] + [f"c={c}" for c in loads], rows)
    unequal = [f"{s} {c['domain']} c={c['concurrency']}" for s, c in cells if not c["outputs_equal_to_ar"]]
    out += ["", f"{passed} of {len(cells)} cells pass; outputs equal to `ar`'s in "
                f"{len(cells) - len(unequal)} of {len(cells)}" + (f" (not: {', '.join(unequal)})" if unequal else "")
            + ". The parts, each one run:", ""]
    for part in rec["parts"]:
        c = sorted({x["concurrency"] for x in part["cells"]})
        out.append(f"- {part['set']}, c={','.join(map(str, c))}: `{part['command']}`")
    reruns = rec.get("reruns", [])
    if reruns:
        out += ["", "**Cells below the bar, run again with more rounds** (the median's bootstrap interval, as "
                    "`bench_gate.py` reports it, in brackets):", ""]
        rows = []
        for i, part in enumerate(reruns):
            where = f"{name}: reruns[{i}]"
            need(part, where, ("set", "command", "commit", "date", "cells"))
            for cell in part["cells"]:
                _cell_figure(cell, f"{where} {cell.get('domain')}")
                rows.append([part["set"], cell["domain"], str(cell["concurrency"]), str(cell["rounds"]),
                             cell["best_fixed"],
                             f"{cell['adaflash_over_best_round_median']:.3f} "
                             f"({cell['interval_low']:.3f}-{cell['interval_high']:.3f})",
                             "pass" if _passes(cell, bar) else "**below**", f"`{part['commit']}`, {part['date']}"])
        out += table(["set", "cell", "c", "rounds", "best fixed", "adaflash / best", "bar", "recorded"], rows)
        out += [""] + [f"- `{part['command']}`" for part in reruns]
    return out


def render_onnx(rec: dict, name: str) -> list[str]:
    meta = need(rec.get("meta", {}), f"{name}: meta")
    runs = {r["threads"]: r for r in need(rec, name, ("runs",))["runs"]}
    one = runs.get(1) or runs[min(runs)]
    out = [f"**{title(rec, 'ONNX drafter')}.** {provenance(meta, name)}", "",
           f"One draft call, {rec['context']} cached positions a sequence, median ms over trials, the two backends "
           f"alternating, {one['threads']} thread:", ""]
    out += table(["batch", "block length", "torch ms", "onnx ms", "torch / onnx"],
                 [[str(r["batch"]), str(r["block_length"]), f"{r['torch_ms_median']:.1f}", f"{r['onnx_ms_median']:.1f}",
                   f2(r["torch_over_onnx"])] for r in one["forward"]])
    e2e = [r for run in rec["runs"] for r in run.get("end_to_end", [])]
    if e2e:
        threads = next(run["threads"] for run in rec["runs"] if run.get("end_to_end"))
        out += ["", f"End to end in process ({threads} threads), every output equal to `ar`'s: "
                + "; ".join(f"{r['mode']} c={r['concurrency']} onnx / torch {f2(r['onnx_over_torch_tokens_per_s'])} "
                            f"(per-wave median {f2(r['wave_time_torch_over_onnx_median'])})" for r in e2e) + "."]
    return out


# ---------------------------------------------------------------- peers

def render_peers(rec: dict, name: str) -> list[str]:
    meta = need(rec.get("meta", {}), f"{name}: meta")
    rows = need(rec, name, ("rows",))["rows"]
    versions = ", ".join(f"{k} {v}" for k, v in rec.get("versions", {}).items())
    out = [f"**{title(rec, 'peers')}.** {provenance(meta, name)}", "",
           f"{rec['num_prompts']} prompts of `{rec['prompts']}`, {rec['max_tokens']} new tokens, greedy, "
           f"concurrency {rec['concurrency']}; {versions}. Output tokens/s over whole requests (prefill included); "
           "llama.cpp's generation-only rate beside it.", ""]
    body = []
    ours_ar = next(r["tokens_per_s"] for r in rows if r["engine"] == "ours" and r["method"] == "ar")
    for r in rows:
        if r["tokens_per_s"] is None and r["prompts"] == 0:
            continue  # llama-bench's synthetic rows: no prompts, no outputs to compare
        body.append([r["engine"], r["method"], r["dtype"], n0(r["tokens_per_s"]), n0(r["generation_tokens_per_s"]),
                     f"{r['equal_to_ar']}/{r['prompts']}", f2(r["tau"]),
                     f2(None if r["tokens_per_s"] is None else r["tokens_per_s"] / ours_ar)])
    out += table(["engine", "method", "dtype", "tok/s", "generation tok/s", "equal to our ar", "tau",
                  "over our ar"], body)
    return out


# ---------------------------------------------------------------- served

def render_served(rec: dict, name: str) -> list[str]:
    meta = need(rec.get("meta", {}), f"{name}: meta")
    out = [f"**{title(rec, 'served')}.** {meta['machine']}.", ""]
    clients = {"aio": "asyncio, a stream per request", "new-stream": "sync, a new stream per request",
               "reused-stream": "sync, one stream reused"}
    layout = {"orchestrator": "in the orchestrator (default)", "own": "`target` model"}
    for i, run in enumerate(need(rec, name, ("runs",))["runs"]):
        need(run, f"{name}: runs[{i}]", ("command", "commit", "date", "rows"))
        loads = sorted({r["concurrency"] for r in run["rows"]})
        keys = list(dict.fromkeys((r["mode"], r["target"], r.get("client", "aio")) for r in run["rows"]))
        cell = {(r["mode"], r["target"], r.get("client", "aio"), r["concurrency"]): r for r in run["rows"]}
        rows = []
        for mode, target, client in keys:
            row = [f"`{mode}`", layout.get(target, target), clients.get(client, client)]
            for c in loads:
                r = cell.get((mode, target, client, c))
                row.append("-" if r is None else
                           f"{f2(r['ratio_grpc_over_in_process'])} ({n0(r['grpc_tokens_per_s'])} / "
                           f"{n0(r['in_process_tokens_per_s'])})")
            first = cell.get((mode, target, client, loads[0]), {})
            row.append(f"{first['grpc_mean_ttft_ms']:.1f} / {first['in_process_mean_ttft_ms']:.1f}"
                       if first.get("in_process_mean_ttft_ms") is not None else "-")
            rows.append(row)
        equal = all(r["text_equal"] for r in run["rows"])
        single = [x for r in run["rows"] for x in r.get("ratios", [])]
        out += [f"`{run['command']}`; commit `{run['commit']}`, {run['date']}: {run['reps']} rounds, "
                f"{run['max_tokens']} new tokens, {run['prompts']}; served / in-process, median of rounds "
                f"(served / in-process tok/s); every served text equal to the in-process one: "
                f"{'yes' if equal else 'NO'}"
                + (f"; single rounds {min(single):.2f}-{max(single):.2f}" if single else "")
                + f". TTFT: mean per request at c={loads[0]}, served (as the client saw it) / in-process (prefill, "
                  "from the request's admission).", ""]
        out += table(["mode", "target", "client (tritonclient)"] + [f"c={c}" for c in loads]
                     + [f"TTFT ms c={loads[0]}"], rows) + [""]
    return out[:-1]


# ---------------------------------------------------------------- memory

def render_memory(rec: dict, name: str) -> list[str]:
    meta = need(rec.get("meta", {}), f"{name}: meta", ("command", "machine", "date", "warm_up"))
    runs = need(rec, name, ("runs",))["runs"]
    roles = list(dict.fromkeys(p["role"] for run in runs for p in run["processes"]))
    cell = {(run["label"], p["role"]): p for run in runs for p in run["processes"]}
    rows = []
    for role in roles:
        row = [role]
        for run in runs:
            p = cell.get((run["label"], role))
            row.append("-" if p is None else f"{p['rss_mib']} / {p['pss_mib']}" + (" (torch)" if p["torch"] else ""))
        rows.append(row)
    rows.append(["**all**"] + [f"**{run['total_rss_mib']} / {run['total_pss_mib']}**" for run in runs])
    notes = "; ".join(f"{run['label']} (`{run['commit']}`): {run['note']}" for run in runs)
    return [f"**{title(rec, 'memory')}.** {meta['machine']}; `{meta['command']}`, {meta['date']}. Warm-up: "
            f"{meta['warm_up']}. MiB, RSS / PSS (PSS splits shared pages among the processes mapping them, so its "
            f"column adds up to what the server holds). {notes}.", ""] + table(
        ["process"] + [run["label"] for run in runs], rows)


# ---------------------------------------------------------------- GPU

def render_gpu(rec: dict, name: str) -> list[str]:
    meta = need(rec.get("meta", {}), f"{name}: meta")
    out = [f"**{title(rec, 'GPU')}.** {provenance(meta, name)}", ""]
    rows = []
    for i, run in enumerate(need(rec, name, ("runs",))["runs"]):
        need(run, f"{name}: runs[{i}]", ("round", "gpu", "calls", "commit", "date", "ran", "tests", "result"))
        rows.append([str(run["round"]), run["gpu"], f"`{run['commit']}`, {run['date']}", str(run["calls"]),
                     run["ran"], run["tests"], run["result"]])
    out += table(["round", "GPU", "code", "calls", "what ran", "GPU tests", "result"], rows)
    gate = rec.get("gate")
    if gate:
        need(gate, f"{name}: gate")
        rows = []
        for cell in gate["cells"]:
            arms = cell.get("adaflash_calls_by_arm", {})
            rows.append([cell["domain"], str(cell["concurrency"]), cell["best_fixed"],
                         f2(cell["adaflash_over_best_ratio_of_medians"]),
                         f2(cell.get("adaflash_no_gate_over_best_ratio_of_medians")),
                         ", ".join(f2(x) for x in cell["adaflash_over_best_by_round"]),
                         " / ".join(str(arms[k]) for k in arms), "yes" if cell["outputs_equal_to_ar"] else "NO"])
        out += ["", f"**The gate benchmark on graphed steps** (round {gate.get('round')}). "
                    f"{provenance(gate, name + ': gate', 'Command')}", "",
                "adaflash over the best fixed mode (ratio of medians), without the gate beside it; calls by arm "
                f"({' / '.join(gate['cells'][0].get('adaflash_calls_by_arm', {}))}); outputs equal to `ar`'s up to "
                "near-ties:", ""]
        out += table(["set", "c", "best fixed", "adaflash / best", "no gate / best", "rounds", "calls by arm",
                      "equal"], rows)
    pre = rec.get("graphed_prefills")
    if pre:
        need(pre, f"{name}: graphed_prefills")
        rows = []
        for eager, graphed in zip(pre["eager"], pre["graphed"]):
            e, g = eager["median_tokens_per_s"], graphed["median_tokens_per_s"]
            rows.append([f"{eager['domain']} c={eager['concurrency']}"]
                        + [f"{n0(e[m])} / {n0(g[m])}" for m in ("ar", "ngram", "adaflash")]
                        + [f"{f2(eager['adaflash_over_best_ratio_of_medians'])} / "
                           f"{f2(graphed['adaflash_over_best_ratio_of_medians'])}"])
        out += ["", f"**Graphed prefills, eager / graphed, median tok/s** (round {pre.get('round')}). "
                    f"{provenance(pre, name + ': graphed_prefills', 'Command')}", ""]
        out += table(["cell", "ar", "ngram", "adaflash", "adaflash / best"], rows)
    graphs = rec.get("graphs")
    if graphs:
        need(graphs, f"{name}: graphs")
        loads = sorted({r["concurrency"] for r in graphs["rows"]})
        modes = list(dict.fromkeys(r["mode"] for r in graphs["rows"]))
        cell = {(r["mode"], r["concurrency"]): r for r in graphs["rows"]}
        rows = [[f"`{m}`"] + [f"{cell[(m, c)]['speedup']:.2f}x ({n0(cell[(m, c)]['graphs_tok_s'])})"
                              for c in loads] for m in modes]
        equal = all(r["graphs_equal_to_eager"] == r["prompts"] == r["graphs_equal_to_plain"] for r in graphs["rows"])
        out += ["", f"**CUDA graphs against eager steps, default models, fp32** (round {graphs.get('round')}). "
                    f"{provenance(graphs, name + ': graphs', 'Command')} Graphed over eager (graphed tok/s); every "
                    f"output equal to eager's and to plain decoding's: {'yes' if equal else 'NO'}.", ""]
        out += table(["mode"] + [f"c={c}" for c in loads], rows)
    ceiling = rec.get("graph_ceiling")
    if ceiling:
        need(ceiling, f"{name}: graph_ceiling")
        rows = [[r["dtype"], str(r["sequences"]), f2(r["full_forward_ms"]), f2(r["layers_eager_ms"]),
                 f2(r["layers_graph_ms"]), "yes" if r["graph_equal_to_eager"] else "NO"] for r in ceiling["rows"]]
        out += ["", f"**What a graph could gain: one decode step's layers** (round {ceiling.get('round')}). "
                    f"{provenance(ceiling, name + ': graph_ceiling', 'Command')}", ""]
        out += table(["dtype", "sequences", "full forward ms", "layers eager ms", "layers as one graph ms",
                      "equal"], rows)
    if rec.get("unverified"):
        out += ["", "**Unverified on a GPU:**", ""] + [f"- {u}" for u in rec["unverified"]]
    return out


# ---------------------------------------------------------------- quality

def render_quality(rec: dict, name: str) -> list[str]:
    meta = need(rec.get("meta", {}), f"{name}: meta")
    need(rec, name, ("heldout_loss_nats", "runs", "per_domain_prompts", "max_tokens", "concurrency"))
    domains = list(rec["heldout_loss_nats"])
    ar = next(r for r in rec["runs"] if r["variant"] == "ar")
    sets = ", ".join(f"{d}: `{f}`" for d, f in rec.get("eval_sets", {}).items())
    out = [f"**{title(rec, 'quality')}.** {provenance(meta, name)}", "",
           f"{rec['per_domain_prompts']} prompts per domain (first rows of {sets}), {rec['max_tokens']} new tokens, "
           f"concurrency {rec['concurrency']}. Held-out loss on `heldout_<domain>.jsonl` reference continuations. "
           "Repetitive: the share of greedy outputs that end in a short loop (`is_repetitive`, "
           "`adaflash/evaluation/evaluate.py`).", ""]
    rows = []
    for d in domains:
        loss, rep = rec["heldout_loss_nats"][d], ar["repetition"][d]
        rows.append([d, f3(loss), f"{math.exp(loss):.1f}", f2(rep["repetitive_share"]),
                     f"{rep['reached_max_tokens']}/{rep['outputs']}"])
    out += table(["domain", "held-out loss (nats/token)", "perplexity", "repetitive", "reached max tokens"], rows)
    rows = []
    for r in rec["runs"]:
        if r["variant"] == "ar":
            continue
        taus = [r["per_domain"][d]["tau"] for d in domains]
        mean = sum(taus) / len(taus)
        eq = "-" if r["greedy_equal_to_ar"] is None else str(r["greedy_equal_to_ar"]).lower()
        rows.append([r["variant"], f"{r['temperature']:g}"] + [f2(t) for t in taus] + [f2(mean), eq])
    out += ["", "Tau (tokens committed per decoding target forward, bonus token included):", ""]
    out += table(["variant", "T"] + domains + ["mean", "greedy equal to ar"], rows)
    tp = rec.get("throughput")
    if tp:
        loads = sorted({r["concurrency"] for r in tp["rows"]})
        names = list(dict.fromkeys(r["variant"] for r in tp["rows"]))
        cell = {(r["variant"], r["concurrency"]): r for r in tp["rows"]}
        rows = [[n] + [("output differs" if cell[(n, c)]["output_tokens_per_s"] is None else
                        f"{n0(cell[(n, c)]['output_tokens_per_s'])} ({f2(cell[(n, c)]['speedup_vs_ar'])}x)")
                       if (n, c) in cell else "-" for c in loads] for n in names]
        out += ["", f"Greedy throughput in the same run ({tp['prompts']} prompts, {tp['max_tokens']} new tokens; "
                    "output tokens/s, over `ar` in brackets; the code of that commit: the current engine's speed is "
                    "under [engine speed](#engine-speed)):", ""]
        out += table(["variant"] + [f"c={c}" for c in loads], rows)
    return out


# ---------------------------------------------------------------- capacity

def render_capacity(rec: dict, name: str) -> list[str]:
    meta = need(rec.get("meta", {}), f"{name}: meta")
    s = need(rec, name, ("settings", "rows"))["settings"]
    rows = rec["rows"]
    loads = sorted({r["concurrency"] for r in rows})
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    cell = {(r["mode"], r["concurrency"]): r for r in rows}
    errors = sum(r["errors"] for r in rows)
    out = [f"**{title(rec, 'capacity')}.** {provenance(meta, name)}", "",
           f"{s['loop']} at {', '.join(map(str, loads))}; {s['per_level']}; {s['max_tokens']} new tokens, temperature "
           f"{s['temperature']:g}, {s['prompts']}; {sum(r['requests'] for r in rows):,} requests, {errors} errors. "
           "Output tokens/s:", ""]
    out += table(["mode"] + [f"c={c}" for c in loads],
                 [[f"`{m}`"] + [n0(cell[(m, c)]["output_tokens_per_s"]) for c in loads] for m in modes])
    if "ar" in modes:
        ratio = [m for m in modes if m != "ar"]
        out += ["", "Over `ar` at the same concurrency:", ""]
        out += table(["mode"] + [f"c={c}" for c in loads],
                     [[f"`{m}`"] + [f2(cell[(m, c)]["output_tokens_per_s"] / cell[("ar", c)]["output_tokens_per_s"])
                                    for c in loads] for m in ratio])
    pct = s.get("slo_percentile", "p95")
    out += ["", f"TTFT {pct} / ITL {pct}, ms:", ""]
    out += table(["mode"] + [f"c={c}" for c in loads],
                 [[f"`{m}`"] + [f"{n0(cell[(m, c)]['ttft_p95_ms'])} / {cell[(m, c)]['itl_p95_ms']:.1f}"
                                for c in loads] for m in modes])
    if s.get("ttft_slo_ms") and s.get("itl_slo_ms"):
        best = []
        for m in modes:
            ok = [c for c in loads if cell[(m, c)]["ttft_p95_ms"] <= s["ttft_slo_ms"]
                  and cell[(m, c)]["itl_p95_ms"] <= s["itl_slo_ms"]]
            if ok:
                best.append(f"`{m}` up to c={max(ok)} ({n0(cell[(m, max(ok))]['output_tokens_per_s'])} tok/s)")
            else:
                best.append(f"`{m}` at no level")
        out += ["", f"Within TTFT {pct} <= {s['ttft_slo_ms']:g} ms and ITL {pct} <= {s['itl_slo_ms']:g} ms (the "
                    f"highest concurrency meeting both): {'; '.join(best)}."]
    return out


# ---------------------------------------------------------------- reliability

def render_reliability(rec: dict, name: str) -> list[str]:
    meta = need(rec.get("meta", {}), f"{name}: meta")
    sc = need(rec, name, ("scenarios", "config", "passed"))["scenarios"]
    cfg = rec["config"]
    out = [f"**{title(rec, 'reliability')}.** {provenance(meta, name)}", "",
           f"Scale {rec['scale']}, models `{rec['model_dir']}`, `max_active` {cfg['max_active']}, `max_queued` "
           f"{cfg['max_queued']}. Every scenario passed: {'yes' if rec['passed'] else 'NO'}. What each requires: "
           "[reliability.md](reliability.md).", ""]
    rows = []
    if "overload" in sc:
        o = sc["overload"]
        rows.append(["overload", "pass" if o["passed"] else "**fail**",
                     f"{o['users']} users for {o['seconds']:.0f} s: {o['requests']:,} requests, {o['completed']:,} "
                     f"complete, {o['refused_naming_a_limit']} refused naming a limit, {o['other_errors']} other "
                     f"errors; peaks: {o['peak_queued']:.0f} queued, {o['peak_active']:.0f} active; queue wait p50 <= "
                     f"{o['queue_wait_p50_s_at_most']:g} s, p99 <= {o['queue_wait_p99_s_at_most']:g} s; TTFT p50 "
                     f"{o['ttft_p50_s']:.2f} s, p99 {o['ttft_p99_s']:.2f} s; {n0(o['output_tokens_per_s'])} output "
                     f"tok/s; idle {o['s_to_idle_after']:g} s after"])
    if "cancellations" in sc:
        c = sc["cancellations"]
        rows.append(["cancellations", "pass" if c["passed"] else "**fail**",
                     f"{c['requests']:,} requests: {c['cancelled_mid_stream']} cancelled mid-stream, "
                     f"{c['completed_before_their_cancel']} finished before their cancel, "
                     f"{c['cancelled_in_queue_before_any_response']} cancelled in the queue; {c['errors']} errors; "
                     f"idle {c['s_to_idle_after']:g} s after the last cancel"])
    if "malformed" in sc:
        m = sc["malformed"]
        outcomes = m["requests_by_outcome"] if "requests_by_outcome" in m else malformed_outcomes(m.get("rows", []))
        by = "; ".join(f"{k} {v}" for k, v in outcomes.items())
        rows.append(["malformed input", "pass" if m["passed"] else "**fail**",
                     f"{m['kinds']} kinds, {m['requests']} requests, {len(m['failing'])} failing" +
                     (f" ({by})" if by else "")])
    if "fuzz" in sc:
        z = sc["fuzz"]
        by = "; ".join(f"{k} {v:,}" for k, v in z["outcomes"].items())
        rows.append(["fuzz", "pass" if z["passed"] else "**fail**",
                     f"{z['requests']:,} generated requests ({by}); {len(z['failing'])} server errors or hangs; "
                     f"idle {z['idle_after_s']} s after; served after: {'yes' if z['served_after'] else 'NO'}"])
    if "huge_bodies" in sc:
        h = sc["huge_bodies"]
        cases = "; ".join(f"{name}: {c['refused_413']}/{c['bodies']} refused with 413, the slowest in "
                          f"{c['slowest_refusal_s']:.3f} s, a 16-token completion meanwhile {c['completion_s']:.3f} s"
                          for name, c in h["cases"].items())
        rows.append(["huge bodies", "pass" if h["passed"] else "**fail**",
                     f"{cases} (alone: {h['completion_alone_s']:.3f} s)"])
    if "soak" in sc:
        s = sc["soak"]
        growth = "; ".join(f"{p} {g['growth'] * 100:+.2f}%" for p, g in s["memory_kib_after_warmup_and_at_end"].items())
        rows.append(["soak", "pass" if s["passed"] else "**fail**",
                     f"{s['users']} users for {s['seconds'] / 60:.0f} min: {s['requests']:,} requests, {s['errors']} "
                     f"errors; TTFT p50 {s['ttft_p50_s']:.3f} s, p99 {s['ttft_p99_s']:.3f} s; resident memory after "
                     f"the warm-up to the end: {growth}; canary unchanged: "
                     f"{'yes' if s['canary_unchanged'] else 'NO'}"])
    if "chaos" in sc:
        rows.append(["chaos", "pass" if sc["chaos"]["passed"] else "**fail**", chaos_summary(sc["chaos"])])
    out += table(["scenario", "result", "measured"], rows)
    if "chaos" in sc:
        out += ["", "Chaos, by the kind of process killed (seconds from the kill; the worst of its kills):", ""]
        out += table(["killed", "kills", "readiness false after", "ready again after", "served again after",
                      "ready while failing"], chaos_by_kind(sc["chaos"]["rows"]))
    if "faults" in sc:
        f = sc["faults"]
        out += ["", f"Faults ({'pass' if f['passed'] else '**fail**'}): SIGKILL of each model process while "
                    f"{f['users']} clients send requests; seconds from the kill"
                + (f"; absent (in another process): {', '.join(f['absent'])}" if f.get("absent") else "") + ":", ""]
        out += table(["model killed", "not ready after", "ready again after", "first success after ready",
                      "requests after the kill / failed", "hung", "ready while failing"],
                     [[f"`{r['model']}`", f2(r["s_to_not_ready"]), f2(r["s_to_ready_again"]),
                       f2(r["s_to_first_success_after_ready"]), f"{r['requests_after_kill']} / {r['failed_after_kill']}",
                       str(r["hung"]), f2(r["longest_ready_while_failing_s"])] for r in f["rows"]])
    return out


def chaos_summary(c: dict) -> str:
    doors = ", ".join(f"{k} {v:,}" for k, v in c["requests_by_door"].items())
    growth = c["memory_growth"].get("total")
    return (f"{c['users']} users for {c['seconds'] / 60:.0f} min, {len(c['modes'])} modes: {c['requests']:,} requests "
            f"({doors}; {c['cancelled']:,} cancelled by their client); {c['kills']} kills; {c['failed']:,} failed while a "
            f"process was down, {c['failed_outside_faults']} outside a fault, {c['hung']} hung; the server's resident "
            f"memory after the warm-up to the end {growth * 100:+.2f}%; canary unchanged: "
            f"{'yes' if c['canary_unchanged'] else 'NO'}")


def chaos_by_kind(rows: list[dict]) -> list[list[str]]:
    def worst(kills: list[dict], key: str) -> str:
        values = [k[key] for k in kills]
        return "never" if any(v is None for v in values) else f2(max(values))

    return [[f"`{kind}`", str(len(kills)), worst(kills, "to_not_ready_s"), worst(kills, "to_ready_s"),
             worst(kills, "to_served_s"), worst(kills, "ready_while_failing_s")]
            for kind in sorted({r["kind"] for r in rows}) for kills in [[r for r in rows if r["kind"] == kind]]]


def malformed_outcomes(rows: list[dict]) -> dict[str, int]:
    """The malformed-input scenario's requests counted by who refused them (`make soak`'s rows)."""
    counts: dict[str, int] = {}
    for r in rows:
        if not r["refused"]:
            key = f"{r['protocol']}: not refused"
        elif "refused_by" in r:
            naming = ", naming the field" if r["names_field"] and r["refused_by"] == "models" else ""
            key = f"{r['protocol']}: refused by {r['refused_by']}{naming}"
        else:
            key = f"{r['protocol']}: {r['kind']} (connection dropped)"
        counts[key] = counts.get(key, 0) + 1
    return counts


def render_failover(rec: dict, name: str) -> list[str]:
    meta = need(rec.get("meta", {}), f"{name}: meta")
    r = need(rec, name, ("result", "settings"))["result"]
    phases = "; ".join(f"{k.replace('_', ' ')}: {v['requests']} ({v['failed']} failed)" for k, v in r["by_phase"].items())
    checks = sum(bool(v) for v in r["checks"].values())
    return [f"**{title(rec, 'failover')}** ({'pass' if r['passed'] else '**fail**'}). {provenance(meta, name)}", "",
            f"{rec['settings']['users']} users, replica `{r['killed']}` killed after {rec['settings']['before_s']:g} s: "
            f"{r['requests']} requests, {r['failed']} failed ({phases}); its port refused connections "
            f"{r['port_closed_after_s']:g} s after the kill; recovered in {r['recovery_s']:g} s; {checks} of "
            f"{len(r['checks'])} checks hold."]


# ---------------------------------------------------------------- the page

SECTIONS = [  # (anchor, link text, heading, [(record, renderer)])
    ("engine-speed", "engine speed", "Engine speed: adaflash against the best fixed mode",
     [("engine-speed.json", render_engine_speed), ("onnx-drafter.json", render_onnx)]),
    ("peers", "peers", "Peers: other engines on the same models", [("peers.json", render_peers)]),
    ("served", "served", "Served against in-process", [("served.json", render_served)]),
    ("memory", "memory", "Memory of the server", [("memory.json", render_memory)]),
    ("gpu", "GPU", "GPU: what ran, with which result", [("gpu.json", render_gpu)]),
    ("quality", "quality", "Quality of the default models", [("quality.json", render_quality)]),
    ("capacity", "capacity", "Capacity", [("capacity.json", render_capacity)]),
    ("reliability", "reliability", "Reliability",
     [("reliability.json", render_reliability), ("failover.json", render_failover)]),
]

INTRO = """# Results

<!-- Generated by benchmarks/results.py from benchmarks/results/*.json (`make results`); edit the records, not this page. -->

The current figures, one section per question. Every figure comes from a record in `benchmarks/results/`, which names
the command that produced it, the machine, the commit and the date; `make results` writes this page from them. The
commit is the code measured where the record names it, else the commit that recorded it. Commands are quoted as they
ran, without their output paths; the scripts then under `clients/` are now under `benchmarks/`. The CPU machine is
shared with other work: compare ratios measured in one run, not absolute figures across runs. How each figure came
about, and what was tried and not kept: [history.md](history.md) and git history.

Sections: """


def render(records: Path = RECORDS) -> str:
    """The page, from the records in `records`; RecordError when one is missing or lacks a field."""
    lines = [INTRO + ", ".join(f"[{label}](#{anchor})" for anchor, label, _, _ in SECTIONS) + "."]
    for anchor, _, title, parts in SECTIONS:
        lines += ["", f'<a id="{anchor}"></a>', "", f"## {title}"]
        for file, fn in parts:
            path = records / file
            if not path.exists():
                raise RecordError(f"{file}: missing (benchmarks/results/{file})")
            lines += [""] + fn(json.loads(path.read_text()), file)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the README's headline figures

def _range(values: list[float], digits: int = 2) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else f"{lo:.{digits}f}-{hi:.{digits}f}"


def _engine_cells(rec: dict) -> list[dict]:
    """Each cell's last word: a rerun's where the cell was run again with more rounds, else the verdict run's."""
    cells = {(p["set"], c["domain"], c["concurrency"]): c for p in rec["parts"] for c in p["cells"]}
    for part in rec.get("reruns", []):
        cells.update({(part["set"], c["domain"], c["concurrency"]): c for c in part["cells"]})
    return list(cells.values())


def render_headline(records: Path = RECORDS) -> str:
    """Five rows for the README, each from a record, each linked to its section of docs/results.md."""
    def load(name: str) -> dict:
        path = records / name
        if not path.exists():
            raise RecordError(f"{name}: missing (benchmarks/results/{name})")
        return json.loads(path.read_text())

    engine, peers, served, gpu, quality = (load(n) for n in ("engine-speed.json", "peers.json", "served.json",
                                                             "gpu.json", "quality.json"))
    cells = _engine_cells(engine)
    low = [c["adaflash_over_best_round_median"] for c in cells if c["concurrency"] == 1]
    high = [c["adaflash_over_best_round_median"] for c in cells if c["concurrency"] > 1]
    equal = all(c["outputs_equal_to_ar"] for c in cells)
    rows_by = {(r["engine"], r["method"], r["dtype"]): r for r in peers["rows"]}
    ours = rows_by[("ours", "ar", "f32")]["tokens_per_s"]
    ours_ada = next(r["tokens_per_s"] for r in peers["rows"] if r["engine"] == "ours" and r["method"].startswith("adaflash"))
    llama = rows_by[("llama.cpp", "plain", "f32")]["tokens_per_s"]
    run = served["runs"][0]
    by_mode = {m: [r["ratio_grpc_over_in_process"] for r in run["rows"] if r["mode"] == m and r["target"] == "orchestrator"
                   and r.get("client", "aio") != "reused-stream"] for m in ("ar", "adaflash")}
    gate = gpu["gate"]
    gpu_ratios = [c["adaflash_over_best_ratio_of_medians"] for c in gate["cells"]]
    rows = [
        ["adaflash over the best fixed mode (`ar`, `ngram`, `dflash`), in process, default models, CPU",
         f"{_range(low, 3)} at c=1; {_range(high, 3)} at c=8-64 (bar {engine['bar']}); outputs equal to `ar`: "
         f"{'all' if equal else 'NOT all'}", "[engine speed](docs/results.md#engine-speed)",
         f"`{engine['meta']['commit']}`, {engine['meta']['date']}"],
        ["`ar` against llama.cpp f32 plain on the same model, c=1", f"{ours / llama:.2f}x; adaflash {ours_ada / llama:.2f}x",
         "[peers](docs/results.md#peers)", f"`{peers['meta']['commit']}`, {peers['meta']['date']}"],
        ["served through Triton over in-process, a gRPC stream per request, "
         f"c={min(r['concurrency'] for r in run['rows'])}-{max(r['concurrency'] for r in run['rows'])}",
         f"`ar` {_range(by_mode['ar'])}; `adaflash` {_range(by_mode['adaflash'])}", "[served](docs/results.md#served)",
         f"`{run['commit']}`, {run['date']}"],
        [f"adaflash over the best fixed mode on graphed steps, {gate['machine'].split(',')[0]} (open)",
         f"{_range(gpu_ratios)} (c=1-32)", "[GPU](docs/results.md#gpu)", f"`{gate['commit']}`, {gate['date']}"],
        ["tau of the served drafter alone (`dflash` mode), greedy, per domain", _quality_tau(quality),
         "[quality](docs/results.md#quality)", f"`{quality['meta']['commit']}`, {quality['meta']['date']}"],
    ]
    return "\n".join(table(["what", "figure", "where", "measured"], rows))


def _quality_tau(rec: dict) -> str:
    runs = [r for r in rec["runs"] if r["variant"] == "dflash:drafter" and r["temperature"] == 0]
    if not runs:
        raise RecordError("quality.json: no greedy run of dflash:drafter")
    taus = [d["tau"] for d in runs[0]["per_domain"].values()]
    return f"{_range(taus)} across domains"


def with_headline(readme: str, headline: str) -> str:
    """The README with its headline block replaced (between the two markers); RecordError without them."""
    start, end = readme.find(HEADLINE_START), readme.find(HEADLINE_END)
    if start < 0 or end < start:
        raise RecordError(f"README.md: no {HEADLINE_START} ... {HEADLINE_END} block")
    block = (f"{HEADLINE_START}\n<!-- Generated by benchmarks/results.py (`make results`). -->\n{headline}\n\n"
             "Each row: the section of docs/results.md that holds its table, command, machine and commit.\n")
    return readme[:start] + block + readme[end:]


# ---------------------------------------------------------------- stamp

def this_machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"


def head_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return out + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def stamp(source: Path, name: str, command: str, machine: str | None, part: str | None,
          commit: str | None = None, date: str | None = None, records: Path = RECORDS) -> Path:
    meta = {"command": command, "machine": machine or this_machine(), "commit": commit or head_commit(),
            "date": date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()}
    report = json.loads(source.read_text())
    dest = records / f"{name}.json"
    if part is None:
        report.pop("meta", None)
        out = {"meta": meta, **report}
    else:
        out = json.loads(dest.read_text()) if dest.exists() else {"meta": meta, "bar": 0.97, "parts": []}
        cells = gate_cells(report)
        loads = {c["concurrency"] for c in cells}
        out["parts"] = [p for p in out.get("parts", []) if not (p["set"] == part and loads & {
            c["concurrency"] for c in p["cells"]})] + [{"set": part, "command": command, "cells": cells}]
        out["meta"] = {**out.get("meta", {}), **{k: meta[k] for k in ("commit", "date", "machine")}}
    dest.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["stamp"]:
        p = argparse.ArgumentParser(prog="results.py stamp")
        p.add_argument("source", type=Path)
        p.add_argument("name", help="the record's name in benchmarks/results/, without .json")
        p.add_argument("--command", required=True)
        p.add_argument("--machine")
        p.add_argument("--commit")
        p.add_argument("--date")
        p.add_argument("--part", help="a bench_gate.py report: its cells become this set's part of the record")
        a = p.parse_args(argv[1:])
        print(stamp(a.source, a.name, a.command, a.machine, a.part, a.commit, a.date))
        return 0
    p = argparse.ArgumentParser(description="docs/results.md from benchmarks/results/*.json")
    p.add_argument("--check", action="store_true", help="exit 1 when the page is not what the records give")
    p.add_argument("--records", type=Path, default=RECORDS)
    p.add_argument("--out", type=Path, default=PAGE)
    p.add_argument("--readme", type=Path, default=README)
    a = p.parse_args(argv)
    try:
        pages = {a.out: render(a.records), a.readme: with_headline(a.readme.read_text(), render_headline(a.records))}
    except RecordError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.check:
        stale = [path for path, text in pages.items() if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path} is not what {a.records} gives: run make results", file=sys.stderr)
        return 1 if stale else 0
    for path, text in pages.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
