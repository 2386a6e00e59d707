"""`adaflash evaluate`: per-domain quality figures from one command, with greedy equality checked."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from adaflash.cli import main
from adaflash.evaluation.evaluate import is_repetitive
from adaflash.models.bundle import save_bundle
from adaflash.corpus import DOMAINS

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
RESULTS_PY = Path(__file__).parents[2] / "benchmarks" / "results.py"


def _results_page():
    """benchmarks/results.py (a script, not a package), loaded from its file."""
    spec = importlib.util.spec_from_file_location("results_page_under_test", RESULTS_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repetition_measure_finds_short_periods_only():
    fresh = list(range(256))
    assert not is_repetitive(fresh)
    assert is_repetitive(fresh[:128] + [7, 8, 9] * 43)
    assert is_repetitive(fresh[:100] + list(range(16)) * 10)
    assert not is_repetitive(fresh[:100] + list(range(17)) * 10)  # period 17 is beyond the measure
    assert not is_repetitive([5] * 100)  # too short to judge: the window is 128 tokens


def test_evaluate_writes_its_json_with_meta_for_make_results(trained_tiny, tmp_path):
    model_dir = save_bundle(trained_tiny, tmp_path / "models")
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--model-dir", str(model_dir), "--data", str(CORPUS), "--per-domain", "2",
                 "--max-tokens", "24", "--variants", "ngram,dflash,dflash@8", "--json", str(out),
                 "--throughput-variants", "ngram,adaflash",
                 "--throughput-concurrency", "1,4", "--throughput-max-tokens", "16",
                 "--throughput-per-domain", "1"]) == 0
    report = json.loads(out.read_text())
    names = [(r["variant"], r["temperature"]) for r in report["runs"]]
    assert names == [("ar", 0.0), ("ngram", 0.0), ("dflash:drafter", 0.0), ("dflash:drafter@8", 0.0),
                     ("ngram", 1.0), ("dflash:drafter", 1.0), ("dflash:drafter@8", 1.0)]
    for run in report["runs"]:
        assert set(run["per_domain"]) == set(DOMAINS)
        assert all(d["num_requests"] == 2 for d in run["per_domain"].values())
        assert run["greedy_equal_to_ar"] is (True if run["temperature"] == 0 else None)
    b8 = next(r for r in report["runs"] if r["variant"] == "dflash:drafter@8")
    assert 0 < b8["mean_draft_len"] <= 7
    assert set(report["heldout_loss_nats"]) == set(DOMAINS)
    meta = report["meta"]
    assert set(meta) >= {"command", "machine", "commit", "date"} and all(meta.values())
    assert meta["command"].startswith("adaflash evaluate --model-dir ") and "--variants ngram,dflash:drafter," in meta[
        "command"] and "--throughput-variants ngram,adaflash:drafter" in meta["command"]
    rows = report["throughput"]["rows"]
    assert [(r["variant"], r["concurrency"]) for r in rows] == [
        (v, c) for c in (1, 4) for v in ("ar", "ngram", "adaflash:drafter")]
    assert all(r["greedy_equal_to_ar"] is True and r["output_tokens_per_s"] > 0 for r in rows)
    assert all(r["output_tokens"] == rows[0]["output_tokens"] for r in rows)
    text = "\n".join(_results_page().render_quality(report, "quality.json"))  # what `make results` renders of it
    assert meta["command"] in text and "| math |" in text and "| dflash:drafter@8 | 0 |" in text
    assert "| adaflash:drafter | " in text and "x) |" in text
