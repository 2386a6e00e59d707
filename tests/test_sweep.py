"""`adaflash sweep` and its load generators (Locust in tools/locust/, NVIDIA's aiperf) against a real tritonserver,
plus their pure parts.

The server serves the seeded tiny random models (their text is noise; the load and the figures are
what is checked here) with a fixed cost table, so no cost measurement runs. Locust always runs in
a process of its own: importing it monkey-patches the standard library, which must not happen
to the test process. aiperf runs only where its virtual environment exists (`.venv-aiperf`, which
`adaflash sweep --tool aiperf` makes); its export is parsed from a committed real run without it.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Never pytest.importorskip("locust"): it imports locust, whose gevent monkey-patching then makes every
# later gRPC call in this process hang (grpc's channel thread blocks the gevent hub).
if importlib.util.find_spec("locust") is None:
    pytest.skip("the load extra (locust) is not installed", allow_module_level=True)
pytest.importorskip("matplotlib")

from helpers import fixed_costs  # noqa: E402

from adaflash.models.tokenizer import byte_tokenizer, load_tokenizer  # noqa: E402
from adaflash_server.repository import RepositoryConfig, build_repository, tiny_model_dir  # noqa: E402
from adaflash_tools import aiperf_runs  # noqa: E402
from adaflash_tools.sweep import (  # noqa: E402
    TIDY_FIELDS,
    read_records,
    slo_capacity,
    summarize_level,
    write_tidy_csv,
)
from adaflash_server.launcher import ServerConfig, TritonServer, free_ports  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCUST_DIR = ROOT / "tools" / "locust"
AIPERF_EXPORT = Path(__file__).parent / "fixtures" / "aiperf"
MODES = ["ar", "adaflash"]
LEVELS = [1, 3]
SECONDS = 3
OUTPUT_TOKENS = 24  # held by min_tokens: every request of the sweep produces exactly this many
PROMPT_TOKENS = 48  # --max-prompt-tokens of the sweep
SWEEP_TIMEOUT_S = 300  # far beyond the levels' SECONDS each: only a hung level reaches it
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _locust_module(name: str):
    """A plain-Python module of tools/locust/ (not a package), loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", LOCUST_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _prompt_sets():
    return _locust_module("prompt_sets")


def _run_sweep(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "adaflash.cli", "sweep", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"adaflash sweep still running after {SWEEP_TIMEOUT_S} s: a level hangs "
                    f"(Locust waiting on gRPC at exit?)\n{(exc.stderr or b'').decode(errors='replace')[-3000:]}")
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep-serve")
    costs = root / "costs.json"
    fixed_costs(16).save(costs)
    cfg = RepositoryConfig(max_active=16, max_batch_size=16, max_len=1024, max_prompt_tokens=400,
                           max_output_tokens=600)
    repo = build_repository(root / "model_repository", tiny_model_dir(root), "drafter", cfg, costs)
    with TritonServer(ServerConfig(model_repository=repo, state_dir=root / "state")) as triton:
        triton.target_dir = root / "models" / "tiny-random" / "target"
        yield triton


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    """A two-level sweep over two modes through the `adaflash sweep` command line, outputs held at OUTPUT_TOKENS
    and prompts cut to PROMPT_TOKENS; its folder and progress output."""
    out = tmp_path_factory.mktemp("sweep-out")
    done = _run_sweep(["--url", server.grpc_url, "--metrics-url", server.metrics_url, "--modes", ",".join(MODES),
                       "--concurrency", ",".join(map(str, LEVELS)), "--duration", str(SECONDS),
                       "--output-tokens", str(OUTPUT_TOKENS), "--max-prompt-tokens", str(PROMPT_TOKENS),
                       "--warmup-requests", "1", "--out", str(out), "--ttft-slo-ms", "60000", "--itl-slo-ms", "60000"])
    return out, done.stderr


def _tidy(out: Path) -> list[dict]:
    with (out / "sweep.csv").open() as f:
        return list(csv.DictReader(f))


def _float(text: str) -> float | None:
    return float(text) if text != "" else None


def test_sweep_writes_every_file(sweep):
    out, stderr = sweep
    for name in ("sweep.csv", "sweep.json", "report.md", "throughput.png", "ttft.png", "itl.png", "tau.png",
                 "prompts.jsonl"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for mode in MODES:
        for c in LEVELS:
            stem = f"{mode}_c{c}"
            for suffix in ("_stats.csv", "_stats_history.csv", "_failures.csv", "_exceptions.csv", ".log"):
                assert (out / "locust" / f"{stem}{suffix}").is_file(), stem + suffix
            assert (out / "records" / f"{stem}.jsonl").stat().st_size > 0
            assert (out / "records" / f"{stem}.summary.json").is_file()
            assert f"locust mode={mode} concurrency={c}" in stderr  # the progress display
    assert "requests" in stderr and "elapsed" in stderr


def test_tidy_csv_is_consistent_with_the_records_and_locust(sweep):
    out, _ = sweep
    rows = _tidy(out)
    assert list(rows[0]) == TIDY_FIELDS
    assert [(r["tool"], r["mode"], int(r["concurrency"]), r["request_rate"]) for r in rows] == [
        ("locust", m, c, "") for m in MODES for c in LEVELS]
    for row in rows:
        stem = f"{row['mode']}_c{row['concurrency']}"
        c = int(row["concurrency"])
        records = read_records(out / "records" / f"{stem}.jsonl")
        tokens = sum(r["tokens"] for r in records)
        window = max(r["t_end"] for r in records) - min(r["t_start"] for r in records)
        # valid traffic: no error anywhere
        assert int(row["errors"]) == 0 and all(r["ok"] for r in records)
        with (out / "locust" / f"{stem}_failures.csv").open() as f:
            assert len(list(csv.reader(f))) == 1, "Locust counted failures"
        # tokens/s is tokens over the level's window
        assert int(row["requests"]) == len(records) >= c
        # min_tokens = max_tokens held every output at its length through the server
        assert int(row["output_tokens"]) == tokens and all(r["tokens"] == OUTPUT_TOKENS for r in records)
        assert float(row["duration_s"]) == pytest.approx(window, rel=1e-4)
        assert float(row["output_tokens_per_s"]) == pytest.approx(tokens / window, rel=1e-4)
        assert float(row["requests_per_s"]) == pytest.approx(len(records) / window, rel=1e-4)
        # Locust's own CSV saw the same requests and tokens (response_length = output tokens)
        with (out / "locust" / f"{stem}_stats.csv").open() as f:
            grpc_rows = [r for r in csv.DictReader(f) if r["Type"] == "grpc"]
        assert sum(int(r["Request Count"]) for r in grpc_rows) == len(records)
        assert sum(int(r["Failure Count"]) for r in grpc_rows) == 0
        assert sum(float(r["Average Content Size"]) * int(r["Request Count"]) for r in grpc_rows) == pytest.approx(tokens)
        # latency figures are ordered and plausible
        ttft = [_float(row[k]) for k in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms")]
        itl = [_float(row[k]) for k in ("itl_p50_ms", "itl_p95_ms")]
        assert 0 < ttft[0] <= ttft[1] <= ttft[2] <= 1000 * max(r["latency_s"] for r in records)
        assert 0 < itl[0] <= itl[1]
        for r in records:
            if r["tokens"] > 1:
                assert r["itl_s"] == pytest.approx((r["latency_s"] - r["ttft_s"]) / (r["tokens"] - 1))
        tau = _float(row["tau"])
        assert tau == pytest.approx(sum(r["tokens"] - 1 for r in records) / sum(r["steps"] for r in records), abs=1e-5)  # CSV keeps 5 decimals
        if row["mode"] == "ar":
            assert tau == 1.0 and _float(row["mean_draft_len"]) == 0.0
        # concurrency is real: c requests in flight in Locust, and on the server
        assert int(row["client_inflight_max"]) == c
        assert _float(row["server_active_max"]) == c
        assert 0 < _float(row["server_active_mean"]) <= c
        assert _float(row["client_cpu_s"]) > 0


def test_max_prompt_tokens_cuts_the_prompts_the_load_sent(server, sweep):
    out, _ = sweep
    tokenizer = load_tokenizer(server.target_dir)
    sent = _prompt_sets().load_prompt_set([out / "prompts.jsonl"])
    originals = {p.id: p.text for group in _prompt_sets().load_prompt_set(None).values() for p in group}
    for p in (p for group in sent.values() for p in group):
        assert originals[p.id].endswith(p.text)
        assert len(tokenizer.encode(p.text).ids) == min(PROMPT_TOKENS, len(tokenizer.encode(originals[p.id]).ids))
    used = {r["prompt_id"] for m in MODES for c in LEVELS for r in read_records(out / "records" / f"{m}_c{c}.jsonl")}
    assert used <= set(originals)


def test_plots_are_valid_png_images(sweep):
    from PIL import Image

    out, _ = sweep
    for name in ("throughput.png", "ttft.png", "itl.png", "tau.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE), name
        with Image.open(out / name) as image:
            image.verify()
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 200
            darkest, lightest = image.convert("L").getextrema()
            assert lightest - darkest > 100, f"{name} is blank"


def test_report_has_the_tables_plots_and_slo_capacity(sweep):
    out, _ = sweep
    report = (out / "report.md").read_text()
    for row in _tidy(out):
        assert f"| locust | {row['mode']} | {row['concurrency']} | {row['requests']} | 0 |" in report
    for name in ("throughput", "ttft", "itl", "tau"):
        assert f"![{name}]({name}.png)" in report
    assert "## Capacity under the SLO" in report
    for mode in MODES:  # a generous SLO: every level meets it, so the highest is the last level
        assert f"| locust | {mode} | {LEVELS[-1]} |" in report
    saved = json.loads((out / "sweep.json").read_text())
    assert saved["settings"]["modes"] == MODES and len(saved["rows"]) == len(MODES) * len(LEVELS)


def test_step_shape_runs_the_levels_in_one_locust_run(server, tmp_path):
    records = tmp_path / "steps.jsonl"
    cmd = [sys.executable, "-m", "locust", "-f", f"{LOCUST_DIR / 'locustfile.py'},{LOCUST_DIR / 'step_shape.py'}",
           "--headless", "--host", server.grpc_url, "--spec-mode", "ar", "--max-tokens", "8",
           "--max-prompt-chars", "200", "--step-users", "1,2", "--step-seconds", "1.5", "--stop-timeout", "60",
           "--records", str(records), "--only-summary"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = read_records(records)
    assert rows and all(r["ok"] for r in rows)
    assert {r["users"] for r in rows} == {1, 2}
    assert {r["user"] for r in rows if r["users"] == 2} == {1, 2}


OPEN_RATE = 4.0  # requests/s of the open-loop sweep
INPUT_TOKENS = 32


@pytest.fixture(scope="module")
def open_sweep(server, tmp_path_factory):
    """An open-loop Locust level (Poisson arrivals at OPEN_RATE) with synthetic prompts of INPUT_TOKENS tokens."""
    out = tmp_path_factory.mktemp("open-sweep")
    _run_sweep(["--url", server.grpc_url, "--metrics-url", server.metrics_url, "--modes", "adaflash",
                "--request-rate", f"{OPEN_RATE:g}", "--duration", str(SECONDS), "--input-tokens", str(INPUT_TOKENS),
                "--output-tokens", "8", "--warmup-requests", "1", "--out", str(out), "--quiet"])
    return out


def test_open_loop_locust_sends_at_the_rate_whatever_is_running(server, open_sweep):
    (row,) = _tidy(open_sweep)
    assert (row["tool"], row["concurrency"], float(row["request_rate"])) == ("locust", "", OPEN_RATE)
    records = read_records(open_sweep / "records" / f"adaflash_r{OPEN_RATE:g}.jsonl")
    assert all(r["ok"] and r["tokens"] == 8 for r in records)
    # one Locust user, yet requests overlap: arrivals do not wait for completions
    assert {r["user"] for r in records} == {1} and int(row["client_inflight_max"]) >= 2
    starts = sorted(r["t_start"] for r in records)
    assert starts[-1] - starts[0] <= SECONDS
    assert 0.3 * OPEN_RATE * SECONDS <= len(records) <= 2.5 * OPEN_RATE * SECONDS  # Poisson: ~12, sd ~3.5
    report = (open_sweep / "report.md").read_text()
    assert "offered req/s" in report and f"| locust | adaflash | {OPEN_RATE:g} | {len(records)} | 0 |" in report
    tokenizer = load_tokenizer(server.target_dir)
    prompts = [p for group in _prompt_sets().load_prompt_set([open_sweep / "prompts.jsonl"]).values() for p in group]
    assert len(prompts) == 100 and {len(tokenizer.encode(p.text).ids) for p in prompts} == {INPUT_TOKENS}
    assert {r["prompt_id"] for r in records} <= {p.id for p in prompts}


def _aiperf_installed() -> bool:
    stamp = aiperf_runs.DEFAULT_VENV / ".requirements.txt"
    return (aiperf_runs.DEFAULT_VENV / "bin" / "aiperf").is_file() and stamp.is_file() \
        and stamp.read_text() == aiperf_runs.REQUIREMENTS.read_text()


@pytest.mark.skipif(not _aiperf_installed(), reason="aiperf's venv (.venv-aiperf, made by `adaflash sweep --tool "
                    "aiperf` from clients/aiperf/requirements.txt) is absent: the live aiperf run is skipped")
def test_aiperf_and_locust_rows_share_the_sweep(server, tmp_path):
    from adaflash_server.openai_front import FrontServer

    front = FrontServer(server.grpc_url, "127.0.0.1", free_ports(1)[0]).start()
    try:
        _run_sweep(["--url", server.grpc_url, "--metrics-url", server.metrics_url,
                    "--openai-url", front.url.removesuffix("/v1"), "--tool", "aiperf,locust", "--modes", "adaflash",
                    "--concurrency", "2", "--requests", "6", "--input-tokens", "16", "--output-tokens", "8",
                    "--warmup-requests", "1", "--out", str(tmp_path), "--quiet"])
    finally:
        front.stop()
    rows = _tidy(tmp_path)
    assert [(r["tool"], r["mode"], r["concurrency"]) for r in rows] == [("aiperf", "adaflash", "2"),
                                                                         ("locust", "adaflash", "2")]
    for row in rows:
        assert int(row["requests"]) >= 6 and int(row["errors"]) == 0 and int(row["output_tokens"]) == 8 * int(row["requests"])
        assert _float(row["tau"]) >= 1.0 and int(row["client_inflight_max"]) == 2
    records = read_records(tmp_path / "records" / "aiperf_adaflash_c2.jsonl")
    assert all(r["tokens"] == 8 and r["steps"] and r["finish_reason"] == "length" for r in records)
    sent = [json.loads(line)["payload"] for line in (tmp_path / "aiperf" / "adaflash_c2" / "profile_export_raw.jsonl")
            .read_text().splitlines()]
    assert all(b["spec_mode"] == "adaflash" and b["min_tokens"] == b["max_tokens"] == 8 for b in sent)
    assert "| aiperf | adaflash | 2 |" in (tmp_path / "report.md").read_text()


# --- pure parts --------------------------------------------------------------------------------


def test_aiperf_export_is_read_as_records_and_agrees_with_its_summary():
    """The committed export of a real aiperf run (tests/fixtures/aiperf/README.md): 8 requests, 2 refused."""
    records = aiperf_runs.read_records(AIPERF_EXPORT, "adaflash")
    summary = json.loads((AIPERF_EXPORT / "profile_export_aiperf.json").read_text())
    ok = [r for r in records if r["ok"]]
    failed = [r for r in records if not r["ok"]]
    assert len(records) == 8 and len(ok) == summary["request_count"]["avg"] == 6
    assert len(failed) == summary["error_request_count"]["avg"] == 2
    assert all(r["error"].startswith("400 ") and "exceeds the limit" in r["error"] for r in failed)
    for r in ok:  # min_tokens = max_tokens = 8; the server's statistics came with the finishing chunks
        assert r["tool"] == "aiperf" and r["tokens"] == 8 and r["finish_reason"] == "length"
        assert r["tau"] == pytest.approx((r["tokens"] - 1) / r["steps"])
        assert 0 <= r["accepted"] <= r["drafted"] and r["target_forwards"] >= r["steps"]
        assert r["t_start"] <= r["t_end"] and 0 < r["ttft_s"] <= r["latency_s"]
    row = summarize_level(records, "adaflash", 2, tool="aiperf")
    assert row["requests"] == 6 and row["errors"] == 2
    assert row["output_tokens"] == summary["total_output_tokens"]["avg"] == 48
    for ours, theirs, stat in (("ttft_p50_ms", "time_to_first_token", "p50"),
                               ("ttft_p95_ms", "time_to_first_token", "p95"),
                               ("latency_p50_ms", "request_latency", "p50"),
                               ("itl_p50_ms", "inter_token_latency", "p50")):
        assert row[ours] == pytest.approx(summary[theirs][stat], rel=1e-6), ours  # the same per-request figures
    assert aiperf_runs.own_summary(AIPERF_EXPORT)["request_throughput"] == summary["request_throughput"]["avg"]


def test_locust_and_aiperf_rows_merge_into_one_tidy_csv(tmp_path):
    aiperf_row = summarize_level(aiperf_runs.read_records(AIPERF_EXPORT, "adaflash"), "adaflash", 2, tool="aiperf")
    locust_row = summarize_level([_record(100.0, 2.0, 11, 0.2, 5, 5)], "adaflash", 2, {"hub_lag_max_ms": 1.5})
    open_row = summarize_level([_record(100.0, 2.0, 11, 0.2, 5, 5)], "ar", None, request_rate=0.5)
    write_tidy_csv([locust_row, aiperf_row, open_row], tmp_path / "sweep.csv")
    rows = _tidy(tmp_path)
    assert list(rows[0]) == TIDY_FIELDS and TIDY_FIELDS[0] == "tool"
    assert [(r["tool"], r["mode"], r["concurrency"], r["request_rate"]) for r in rows] == [
        ("locust", "adaflash", "2", ""), ("aiperf", "adaflash", "2", ""), ("locust", "ar", "", "0.5")]
    assert rows[1]["hub_lag_max_ms"] == "" and rows[0]["hub_lag_max_ms"] == "1.5"
    assert float(rows[1]["output_tokens"]) == 48 and float(rows[1]["tau"]) > 0


def test_poisson_arrivals_have_exponential_gaps_at_the_rate():
    from scipy import stats

    arrivals = _locust_module("arrivals")
    rate = 2.0
    schedule = arrivals.PoissonArrivals(rate, start=100.0, seed=7)
    times = [100.0] + [schedule.advance() for _ in range(5000)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / rate, rel=0.05)
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.01
    counts, _ = np.histogram(times, bins=np.arange(100.0, 2101.0))  # arrivals per second: Poisson(rate)
    assert counts.mean() == pytest.approx(rate, rel=0.05)
    assert counts.var(ddof=1) == pytest.approx(rate, rel=0.15)  # a Poisson count's variance equals its mean
    again = arrivals.PoissonArrivals(rate, start=100.0, seed=7)
    assert [again.advance() for _ in range(5)] == times[1:6]
    late = arrivals.PoissonArrivals(rate, start=0.0, seed=7)
    assert late.wait(now=1e6) == 0.0  # behind schedule: the next request goes at once, the schedule is kept
    with pytest.raises(ValueError):
        arrivals.PoissonArrivals(0.0, start=0.0)


@pytest.mark.parametrize("tokenizer", [load_tokenizer(ROOT / "models" / "default" / "target"), byte_tokenizer()],
                         ids=["default-target", "bytes"])
def test_synthetic_prompts_have_exactly_the_tokens_asked(tokenizer):
    ps = _prompt_sets()
    corpus = [p.text for group in ps.load_prompt_set(None).values() for p in group]
    for n in (1, 16, 128):
        prompts = ps.synthetic_prompts(tokenizer, corpus, n, 50, seed=3)
        assert len(prompts) == 50 and {len(tokenizer.encode(p.text).ids) for p in prompts} == {n}
        assert all(p.text in "\n\n".join(corpus) for p in prompts)
    assert ps.synthetic_prompts(tokenizer, corpus, 16, 20, seed=3) == ps.synthetic_prompts(tokenizer, corpus, 16, 20, seed=3)
    assert ps.synthetic_prompts(tokenizer, corpus, 16, 20, seed=3) != ps.synthetic_prompts(tokenizer, corpus, 16, 20, seed=4)
    short = ps.synthetic_prompts(tokenizer, ["def f(x): return x"], 40, 3, seed=0)  # a corpus shorter than n repeats
    assert {len(tokenizer.encode(p.text).ids) for p in short} == {40}


@pytest.mark.parametrize("tokenizer", [load_tokenizer(ROOT / "models" / "default" / "target"), byte_tokenizer()],
                         ids=["default-target", "bytes"])
def test_max_prompt_tokens_keeps_exactly_the_last_tokens(tokenizer):
    ps = _prompt_sets()
    by_domain = ps.load_prompt_set(None)
    for n in (1, 7, 64):
        cut = ps.cut_prompt_set(by_domain, tokenizer, n)
        for domain, prompts in by_domain.items():
            for before, after in zip(prompts, cut[domain]):
                assert before.text.endswith(after.text) and (after.id, after.domain) == (before.id, before.domain)
                assert len(tokenizer.encode(after.text).ids) == min(n, len(tokenizer.encode(before.text).ids))
    assert ps.cut_to_tokens(tokenizer, "def f(x): return x", 10_000) == "def f(x): return x"
    # a character the tokenizer spreads over several tokens cannot be halved: the cut keeps fewer tokens then
    cjk = ps.cut_to_tokens(byte_tokenizer(), "ab猫", 2)
    assert cjk == "" and ps.cut_to_tokens(byte_tokenizer(), "ab猫", 3) == "猫"


def _record(start: float, latency: float, tokens: int, ttft: float, steps: int, accepted: int, ok: bool = True) -> dict:
    if not ok:
        return {"ok": False, "t_start": start, "t_end": start + latency, "latency_s": latency, "error": "boom"}
    return {"ok": True, "t_start": start, "t_end": start + latency, "latency_s": latency, "ttft_s": ttft,
            "itl_s": (latency - ttft) / (tokens - 1), "tokens": tokens, "steps": steps, "accepted": accepted,
            "drafted": 2 * steps}


def test_summarize_level_definitions():
    records = [_record(100.0, 2.0, 11, 0.2, 5, 5), _record(101.0, 3.0, 21, 0.4, 10, 10),
               _record(102.5, 0.1, 0, 0.0, 0, 0, ok=False)]
    row = summarize_level(records, "dflash", 2, {"server_active_max": 2.0})
    assert row["requests"] == 2 and row["errors"] == 1
    assert row["duration_s"] == pytest.approx(4.0)  # first start 100.0, last end 104.0
    assert row["output_tokens"] == 32 and row["output_tokens_per_s"] == pytest.approx(8.0)
    assert row["requests_per_s"] == pytest.approx(0.5)
    assert row["ttft_p50_ms"] == pytest.approx(300.0)
    assert row["tau"] == pytest.approx(30 / 15) and row["mean_accepted_per_step"] == pytest.approx(1.0)
    assert row["mean_draft_len"] == pytest.approx(2.0) and row["acceptance_rate"] == pytest.approx(0.5)
    assert row["server_active_max"] == 2.0 and set(TIDY_FIELDS) <= set(row)
    empty = summarize_level([], "ar", 1)
    assert empty["requests"] == 0 and empty["output_tokens_per_s"] is None and empty["ttft_p95_ms"] is None


def test_slo_capacity_takes_the_highest_passing_level_without_errors():
    def row(mode, c, ttft, itl, errors=0):
        return {"mode": mode, "concurrency": c, "requests": 10, "errors": errors, "ttft_p95_ms": ttft,
                "itl_p95_ms": itl, "ttft_p50_ms": ttft / 2, "itl_p50_ms": itl / 2}

    rows = [row("ar", 1, 50, 10), row("ar", 2, 80, 12), row("ar", 4, 400, 15),
            row("adaflash", 1, 40, 8), row("adaflash", 2, 60, 9, errors=1), row("adaflash", 4, 90, 30)]
    ar, ada = ("locust", "ar"), ("locust", "adaflash")
    got = slo_capacity(rows, ttft_slo_ms=100, itl_slo_ms=20)
    assert got[ar]["best"]["concurrency"] == 2 and got[ar]["levels"] == [1, 2]
    assert got[ada]["levels"] == [1] and got[ada]["best"]["concurrency"] == 1
    assert slo_capacity(rows, ttft_slo_ms=10, itl_slo_ms=None)[ar]["best"] is None
    assert slo_capacity(rows, None, 20, pct="p50")[ada]["levels"] == [1, 4]
    open_loop = [{**row("ar", None, 50, 10), "request_rate": rate, "tool": "aiperf"} for rate in (0.5, 2.0)]
    assert slo_capacity(open_loop, 100, 20)[("aiperf", "ar")]["levels"] == [0.5, 2.0]  # levels by offered rate


def test_prompt_sets_by_domain(tmp_path):
    ps = _prompt_sets()
    (tmp_path / "math.txt").write_text("2+2=\n\nsolve x^2=4\n")
    (tmp_path / "mixed.jsonl").write_text(json.dumps({"prompt": "def f():", "domain": "code"}) + "\n"
                                          + json.dumps({"prompt": "hello", "id": "h1"}) + "\n")
    by_domain = ps.load_prompt_set([tmp_path])
    assert sorted(by_domain) == ["code", "math", "mixed"]
    assert [p.text for p in by_domain["math"]] == ["2+2=", "solve x^2=4"]
    assert ps.load_prompt_set([tmp_path], ["code"]).keys() == {"code"}
    assert [p.text for p in ps.load_prompt_set([tmp_path / "math.txt"], max_chars=3)["math"]] == ["+2=", "2=4"]
    with pytest.raises(ValueError, match="physics"):
        ps.load_prompt_set([tmp_path], ["physics"])
    sampler = ps.PromptSampler(by_domain, ps.parse_weights("math=0,mixed=0"), seed=1)
    assert {sampler.sample().domain for _ in range(50)} == {"code"}
    sample = ps.load_prompt_set(None)  # the adaflash package's sample prompts
    assert len(sample) == 5 and sum(len(v) for v in sample.values()) == 20
    counts = {}
    equal = ps.PromptSampler(sample, seed=0)
    for _ in range(2000):
        d = equal.sample().domain
        counts[d] = counts.get(d, 0) + 1
    assert all(math.isclose(n, 400, rel_tol=0.2) for n in counts.values())
