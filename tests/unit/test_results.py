"""docs/results.md is what `make results` (benchmarks/results.py) renders from benchmarks/results/*.json."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _results():
    """benchmarks/results.py (a script, not a package), loaded from its file."""
    spec = importlib.util.spec_from_file_location("results_page_under_test", ROOT / "benchmarks" / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_what_the_records_give():
    results = _results()
    assert (ROOT / "docs" / "results.md").read_text() == results.render(), "docs/results.md is stale: make results"


def test_the_readme_headline_is_what_the_records_give():
    results = _results()
    readme = (ROOT / "README.md").read_text()
    assert readme == results.with_headline(readme, results.render_headline()), "README.md is stale: make results"
    assert results.render_headline().count("\n") == 6  # a header, its rule and five rows


def test_the_page_has_one_section_per_question_and_stays_small():
    text = _results().render()
    for anchor in ("engine-speed", "peers", "served", "memory", "gpu", "quality", "capacity", "reliability"):
        assert text.count(f'<a id="{anchor}"></a>') == 1, anchor
    assert len(text.encode()) <= 30_000


def test_every_record_names_its_command_machine_commit_and_date():
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        meta = json.loads(path.read_text())["meta"]
        assert all(meta.get(field) for field in ("command", "machine", "commit", "date")), path.name


@pytest.mark.parametrize("record, drop", [("peers.json", ("meta", "commit")), ("capacity.json", ("meta", "date")),
                                          ("served.json", ("runs", 0, "command")),
                                          ("gpu.json", ("gate", "machine"))])
def test_a_record_without_a_field_the_page_names_fails(tmp_path, record, drop):
    results = _results()
    records = tmp_path / "records"
    shutil.copytree(ROOT / "benchmarks" / "results", records)
    data = json.loads((records / record).read_text())
    holder = data
    for key in drop[:-1]:
        holder = holder[key]
    del holder[drop[-1]]
    (records / record).write_text(json.dumps(data))
    with pytest.raises(results.RecordError, match=f"{record}.*missing {drop[-1]}"):
        results.render(records)
    page = tmp_path / "results.md"
    assert results.main(["--records", str(records), "--out", str(page)]) == 2 and not page.exists()


def test_a_missing_record_fails_and_check_says_when_the_page_is_stale(tmp_path):
    results = _results()
    records = tmp_path / "records"
    shutil.copytree(ROOT / "benchmarks" / "results", records)
    page, readme = tmp_path / "results.md", tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    paths = ["--records", str(records), "--out", str(page), "--readme", str(readme)]
    assert results.main(paths) == 0
    assert results.main(["--check", *paths]) == 0
    page.write_text(page.read_text().replace("| shared sets | chat |", "| shared sets | chat (typed) |"))
    assert results.main(["--check", *paths]) == 1
    (records / "quality.json").unlink()
    with pytest.raises(results.RecordError, match="quality.json"):
        results.render(records)


def test_stamp_adds_meta_and_a_gate_report_becomes_a_part(tmp_path):
    results = _results()
    report = {"rows": [{"domain": "code", "concurrency": 8, "repeat": r, "variant": v, "tokens_per_s": 1.0,
                        "greedy_equal_to_ar": True} for r in range(2) for v in ("ar", "adaflash")],
              "summary": [{"domain": "code", "concurrency": 8, "best_fixed": "ar",
                           "median_tokens_per_s": {"ar": 100.0, "adaflash": 99.0}, "adaflash_over_best": 0.99,
                           "adaflash_over_best_by_round": [0.98, 1.0],
                           "adaflash_round_median_interval": {"median": 0.99, "low": 0.98, "high": 1.0}}]}
    source = tmp_path / "gate.json"
    source.write_text(json.dumps(report))
    dest = results.stamp(source, "engine-speed", "bench_gate.py --concurrency 8", "a machine", "shared sets",
                         commit="abc1234", date="2026-12-07", records=tmp_path)
    record = json.loads(dest.read_text())
    assert record["meta"] == {"command": "bench_gate.py --concurrency 8", "machine": "a machine",
                              "commit": "abc1234", "date": "2026-12-07"}
    [part] = record["parts"]
    assert part["set"] == "shared sets" and part["cells"][0]["rounds"] == 2
    assert part["cells"][0]["outputs_equal_to_ar"] is True
    lines = "\n".join(results.render_engine_speed(record, "engine-speed.json"))
    assert "| shared sets | code | 0.990 (ar) |" in lines and "1 of 1 cells pass" in lines
    # the same set at the same load again replaces its part
    results.stamp(source, "engine-speed", "bench_gate.py --concurrency 8 --repeats 2", "a machine", "shared sets",
                  commit="def5678", date="2026-12-08", records=tmp_path)
    record = json.loads(dest.read_text())
    assert len(record["parts"]) == 1 and record["meta"]["commit"] == "def5678"
    plain = tmp_path / "peers-run.json"
    plain.write_text(json.dumps({"rows": []}))
    record = json.loads(results.stamp(plain, "peers", "make bench-peers", None, None, records=tmp_path).read_text())
    assert set(record["meta"]) == {"command", "machine", "commit", "date"} and all(record["meta"].values())
