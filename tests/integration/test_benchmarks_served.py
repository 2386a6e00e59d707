"""The benchmark scripts that start servers or processes of their own, run at toy scale: bench_grpc (a tritonserver
per layout on the tiny random models, its served texts checked equal to the in-process engine's) and bench_threads
(each case in a spawned process). As in tests/unit/test_benchmarks.py, each script's `main(argv)` runs in this
process and its --json report is read back; no speed is asserted."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from adaflash.models.bundle import save_bundle, tiny_random_bundle

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def script(name: str) -> ModuleType:
    """benchmarks/<name>.py loaded from its file under its own name, benchmarks/ on the path: a spawned process
    unpickles the script's functions by that name."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_bench_grpc_serves_the_engines_texts_on_both_layouts(tmp_path):
    """Its default models (the tiny random ones), two modes at two concurrencies, one round: every served text
    equals the in-process one (exit 0) on the target as a model of its own and in the orchestrator's process, read
    by tritonclient's sync client with a new stream per request and with one stream for all of a user's."""
    out = tmp_path / "grpc.json"
    code = script("bench_grpc").main(["--modes", "ar,adaflash", "--concurrency", "1,2", "--min-requests", "2",
                                      "--requests-per-user", "1", "--max-tokens", "8", "--reps", "1",
                                      "--clients", "new-stream,reused-stream", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0
    assert {"model_dir", "prompts", "stream_interval_ms", "max_responses_per_s", "max_tokens", "reps",
            "rows"} <= report.keys()
    assert [(r["mode"], r["concurrency"], r["target"], r["client"]) for r in report["rows"]] == [
        (m, c, t, k) for m in ("ar", "adaflash") for c in (1, 2) for t in ("own", "orchestrator")
        for k in ("new-stream", "reused-stream")]
    assert all(r["in_process_mean_ttft_ms"] > 0 and r["grpc_mean_ttft_ms"] > 0 for r in report["rows"])
    assert all(r["text_equal"] and r["grpc_tokens_per_s"] for r in report["rows"])
    assert all(r["calls"] for r in report["rows"])  # the orchestrator's call counters were read


def test_bench_threads_runs_each_case_in_a_process_of_its_own(tmp_path):
    target = save_bundle(tiny_random_bundle(seed=0), tmp_path / "models")
    out = tmp_path / "threads.json"
    assert script("bench_threads").main(["--model-dir", str(target), "--steps", "5", "--reps", "1",
                                         "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {"model_dir", "threads", "context", "steps", "rows"} <= report.keys()
    assert [r["case"] for r in report["rows"]] == list(script("bench_threads").CASES)
    assert all(len(r["decode_step_ms"]) == 1 and r["median_ms"] > 0 for r in report["rows"])
