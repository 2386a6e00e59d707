"""`adaflash sweep` and its load generators (Locust in tools/locust/, NVIDIA's aiperf) against a real
tritonserver; their pure parts are tests/unit/test_sweep.py.

The server serves the seeded tiny random models (their text is noise; the load and the figures are
what is checked here) with a fixed cost table, so no cost measurement runs. Locust always runs in
a process of its own: importing it monkey-patches the standard library, which must not happen
to the test process. aiperf runs only where its virtual environment exists (`.venv-aiperf`, which
`adaflash sweep --tool aiperf` makes)."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys

import pytest

# Never pytest.importorskip("locust"): it imports locust, whose gevent monkey-patching then makes every
# later gRPC call in this process hang (grpc's channel thread blocks the gevent hub).
if importlib.util.find_spec("locust") is None:
    pytest.skip("the load extra (locust) is not installed", allow_module_level=True)
pytest.importorskip("matplotlib")

from helpers import fixed_costs  # noqa: E402
from test_sweep import LOCUST_DIR, _prompt_sets, _tidy  # noqa: E402

from adaflash.models.tokenizer import load_tokenizer  # noqa: E402
from adaflash_server.repository import RepositoryConfig, build_repository, tiny_model_dir  # noqa: E402
from adaflash_tools import aiperf_runs  # noqa: E402
from adaflash_tools.sweep import TIDY_FIELDS, read_records  # noqa: E402
from adaflash_server.launcher import ServerConfig, TritonServer, free_ports  # noqa: E402

MODES = ["ar", "adaflash"]
LEVELS = [1, 3]
SECONDS = 3
OUTPUT_TOKENS = 24  # held by min_tokens: every request of the sweep produces exactly this many
PROMPT_TOKENS = 48  # --max-prompt-tokens of the sweep
SWEEP_TIMEOUT_S = 300  # far beyond the levels' SECONDS each: only a hung level reaches it
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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
