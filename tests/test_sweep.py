"""`adaflash sweep` and the Locust load (clients/locust/) against a real tritonserver, plus their pure parts.

The server serves the seeded tiny random models (their text is noise; the load and the figures are
what is checked here) with a fixed cost table, so no cost measurement runs. Locust always runs in
a process of its own: importing it monkey-patches the standard library, which must not happen
to the test process.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

# Never pytest.importorskip("locust"): it imports locust, whose gevent monkey-patching then makes every
# later gRPC call in this process hang (grpc's channel thread blocks the gevent hub).
if importlib.util.find_spec("locust") is None:
    pytest.skip("the load extra (locust) is not installed", allow_module_level=True)
pytest.importorskip("matplotlib")

from helpers import fixed_costs  # noqa: E402

from adaflash_build.repository import RepositoryConfig, build_repository, tiny_model_dir  # noqa: E402
from adaflash_client.sweep import TIDY_FIELDS, read_records, slo_capacity, summarize_level  # noqa: E402
from adaflash_server.launcher import ServerConfig, TritonServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCUST_DIR = ROOT / "clients" / "locust"
MODES = ["ar", "adaflash"]
LEVELS = [1, 3]
SECONDS = 3
SWEEP_TIMEOUT_S = 300  # far beyond the levels' SECONDS each: only a hung level reaches it
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _prompt_sets():
    spec = importlib.util.spec_from_file_location("prompt_sets_under_test", LOCUST_DIR / "prompt_sets.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep-serve")
    costs = root / "costs.json"
    fixed_costs(16).save(costs)
    cfg = RepositoryConfig(max_active=16, max_batch_size=16, max_len=1024, max_prompt_tokens=400,
                           max_output_tokens=600)
    repo = build_repository(root / "model_repository", tiny_model_dir(root), "drafter", cfg, costs)
    with TritonServer(ServerConfig(model_repository=repo, state_dir=root / "state")) as triton:
        yield triton


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    """A two-level sweep over two modes through the `adaflash sweep` command line; its folder and progress output."""
    out = tmp_path_factory.mktemp("sweep-out")
    cmd = [sys.executable, "-m", "adaflash.cli", "sweep", "--url", server.grpc_url, "--metrics-url", server.metrics_url,
           "--modes", ",".join(MODES), "--concurrency", ",".join(map(str, LEVELS)), "--duration", str(SECONDS),
           "--max-tokens", "24", "--max-prompt-chars", "200", "--warmup-requests", "1", "--out", str(out),
           "--ttft-slo-ms", "60000", "--itl-slo-ms", "60000"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"adaflash sweep still running after {SWEEP_TIMEOUT_S} s: a level hangs "
                    f"(Locust waiting on gRPC at exit?)\n{(exc.stderr or b'').decode(errors='replace')[-3000:]}")
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stderr


def _tidy(out: Path) -> list[dict]:
    with (out / "sweep.csv").open() as f:
        return list(csv.DictReader(f))


def _float(text: str) -> float | None:
    return float(text) if text != "" else None


def test_sweep_writes_every_file(sweep):
    out, stderr = sweep
    for name in ("sweep.csv", "sweep.json", "report.md", "throughput.png", "ttft.png", "itl.png", "tau.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for mode in MODES:
        for c in LEVELS:
            stem = f"{mode}_c{c}"
            for suffix in ("_stats.csv", "_stats_history.csv", "_failures.csv", "_exceptions.csv", ".log"):
                assert (out / "locust" / f"{stem}{suffix}").is_file(), stem + suffix
            assert (out / "records" / f"{stem}.jsonl").stat().st_size > 0
            assert (out / "records" / f"{stem}.summary.json").is_file()
            assert f"mode={mode} concurrency={c}" in stderr  # the progress display
    assert "requests" in stderr and "elapsed" in stderr


def test_tidy_csv_is_consistent_with_the_records_and_locust(sweep):
    out, _ = sweep
    rows = _tidy(out)
    assert list(rows[0]) == TIDY_FIELDS
    assert [(r["mode"], int(r["concurrency"])) for r in rows] == [(m, c) for m in MODES for c in LEVELS]
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
        assert int(row["output_tokens"]) == tokens and all(0 < r["tokens"] <= 24 for r in records)
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
        assert f"| {row['mode']} | {row['concurrency']} | {row['requests']} | 0 |" in report
    for name in ("throughput", "ttft", "itl", "tau"):
        assert f"![{name}]({name}.png)" in report
    assert "## Capacity under the SLO" in report
    for mode in MODES:  # a generous SLO: every level meets it, so the highest is the last level
        assert f"| {mode} | {LEVELS[-1]} |" in report
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


# --- pure parts --------------------------------------------------------------------------------


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
    got = slo_capacity(rows, ttft_slo_ms=100, itl_slo_ms=20)
    assert got["ar"]["best"]["concurrency"] == 2 and got["ar"]["levels"] == [1, 2]
    assert got["adaflash"]["levels"] == [1] and got["adaflash"]["best"]["concurrency"] == 1
    assert slo_capacity(rows, ttft_slo_ms=10, itl_slo_ms=None)["ar"]["best"] is None
    assert slo_capacity(rows, None, 20, pct="p50")["adaflash"]["levels"] == [1, 4]


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
