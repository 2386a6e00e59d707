"""The pure parts of `adaflash sweep` and its load generators (Locust in tools/locust/, NVIDIA's aiperf); against a
real tritonserver: tests/integration/test_sweep_served.py.

Locust's plain-Python modules are loaded from their files; importing locust itself monkey-patches the standard
library, which must not happen to the test process. aiperf's export is parsed from a committed real run without it.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

# Never pytest.importorskip("locust"): it imports locust, whose gevent monkey-patching then makes every
# later gRPC call in this process hang (grpc's channel thread blocks the gevent hub).
if importlib.util.find_spec("locust") is None:
    pytest.skip("the load extra (locust) is not installed", allow_module_level=True)
pytest.importorskip("matplotlib")

from adaflash.models.tokenizer import byte_tokenizer, load_tokenizer  # noqa: E402
from adaflash_tools import aiperf_runs  # noqa: E402
from adaflash_tools.sweep import (  # noqa: E402
    TIDY_FIELDS,
    slo_capacity,
    summarize_level,
    write_tidy_csv,
)

ROOT = Path(__file__).resolve().parents[2]
LOCUST_DIR = ROOT / "tools" / "locust"
AIPERF_EXPORT = Path(__file__).parents[1] / "fixtures" / "aiperf"


def _locust_module(name: str):
    """A plain-Python module of tools/locust/ (not a package), loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", LOCUST_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _prompt_sets():
    return _locust_module("prompt_sets")


def _tidy(out: Path) -> list[dict]:
    with (out / "sweep.csv").open() as f:
        return list(csv.DictReader(f))


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
