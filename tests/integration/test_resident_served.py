"""Resident memory of the served path against real processes: benchmarks/bench_memory.py at toy scale (a real
`adaflash serve` on the tiny random models, a few requests) reads every process of the server; the launcher, which
lives as long as its server and runs no model, imports no torch; the interpreter that builds the repository for
`adaflash serve` writes what `build_repository` writes, and says why it failed when it does. The in-process parts:
tests/unit/test_resident.py."""

from __future__ import annotations

import filecmp
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from adaflash_server.repository import RepositoryConfig, build_apart, build_repository

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
def script(name: str) -> ModuleType:
    """benchmarks/<name>.py loaded from its file under its own name (tests/integration/test_benchmarks_served.py)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """bench_memory's report on a served `adaflash serve --tiny-random`: six requests from two users."""
    out = tmp_path_factory.mktemp("memory") / "memory.json"
    assert script("bench_memory").main(["--requests", "6", "--concurrency", "2", "--max-tokens", "4",
                                        "--serve-arg=--max-active", "--serve-arg=2", "--settle-s", "0",
                                        "--mappings", "3", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_bench_memory_reads_every_process_of_the_server(report):
    assert {"model_dir", "env", "serve_args", "modes", "concurrency", "max_tokens", "ready_s", "started",
            "after_load", "load"} <= report.keys()
    assert report["load"]["requests"] == 6 and report["load"]["tokens"] > 0
    for snapshot in (report["started"], report["after_load"]):
        rows = {r["role"]: r for r in snapshot["processes"]}
        assert {"launcher", "tritonserver", "model adaflash", "watchdog"} <= rows.keys()  # the drafter's: where it runs
        assert all(r["rss_kb"] > 0 and "pss_kb" in r and len(r["largest_mappings"]) <= 3
                   for r in snapshot["processes"])
        assert snapshot["total"]["rss_kb"] == sum(r["rss_kb"] for r in snapshot["processes"])
        assert all(r["torch"] for r in snapshot["processes"] if r["role"].startswith("model "))
        assert not rows["tritonserver"]["torch"]


def test_the_launcher_of_a_real_server_holds_no_torch(report):
    launcher = next(r for r in report["after_load"]["processes"] if r["role"] == "launcher")
    assert not launcher["torch"]


@pytest.mark.parametrize("module", [
    "adaflash_server.launcher",
    "adaflash_server.repository",
    "adaflash_server.openai_front",
    "adaflash_server.serve",
    "adaflash.entry",
])
def test_the_launchers_modules_import_no_torch(module: str):
    """Each in a fresh interpreter: what the launcher's process loads when it imports them (the `adaflash` command's
    entry, `adaflash.entry`, loads the core's commands, and torch with them, only for a command of the core)."""
    done = subprocess.run([sys.executable, "-c", f"import sys, {module}; print('torch' in sys.modules)"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_builders_interpreter_writes_what_build_repository_writes(tmp_path):
    cfg = RepositoryConfig(max_active=4, max_len=512, max_prompt_tokens=200, max_output_tokens=200, device="cpu")
    apart, models = build_apart(tmp_path / "apart" / "model_repository", None, "drafter", cfg)
    assert models == tmp_path / "apart" / "models" / "tiny-random"
    here = build_repository(tmp_path / "here" / "model_repository", models, "drafter", cfg)
    compared = filecmp.dircmp(apart, here)
    assert sorted(compared.common_dirs) == ["adaflash", "drafter"] and not compared.left_only + compared.right_only
    for model in compared.common_dirs:
        assert (apart / model / "config.pbtxt").read_text() == (here / model / "config.pbtxt").read_text()


def test_the_builders_interpreter_says_why_it_failed(tmp_path, capfd):
    with pytest.raises(SystemExit) as failed:
        build_apart(tmp_path / "model_repository", None, "drafter", RepositoryConfig(kv_cache_memory="1KiB"))
    assert failed.value.code == 1
    assert "error: kv_cache_memory: 1KiB holds" in capfd.readouterr().err
