"""Every benchmark script runs: each one in process at toy scale (the tiny random models written as a model folder, a
couple of prompts, a few tokens or rounds), its report read back from its --json. Speed is never asserted here (speed
claims live in the scripts' own runs: `make bench`, `bench-peers`, `gpu-check`); what is asserted is that a script
still runs against the core as it is now and reports what it says it reports. The scripts that start a server or
processes of their own run in tests/integration/test_benchmarks_served.py. GPU-only parts (CUDA graphs recorded,
device profiles) are left out on a machine without CUDA; every script's CPU path runs."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from adaflash.models.bundle import save_bundle, tiny_random_bundle

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
# How each file of benchmarks/ is run besides its make target: here, in the served file, or by another test.
IN_PROCESS = ("bench_detokenize", "bench_gate", "bench_graph_ceiling", "bench_graphs", "bench_layout",
              "bench_onnx_drafter", "bench_peers", "bench_runner", "bench_step", "bench_verify")
SERVED = ("bench_grpc", "bench_threads")  # tests/integration/test_benchmarks_served.py
ELSEWHERE = {"results.py": "tests/unit/test_results.py", "gpu_check.sh": "make gpu-check; its flags: below",
             "bench_memory.py": "tests/integration/test_resident_served.py",
             "bench_scale.py": "tests/unit/test_scale_fixture.py", "scale_fixture.py": "tests/unit/test_scale_fixture.py"}


@cache
def script(name: str) -> ModuleType:
    """benchmarks/<name>.py (a script, not a package), loaded from its file under its own name; benchmarks/ joins
    the path because scripts import each other (`from bench_step import ...`)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run(name: str, argv: list[str], out: Path, code: int = 0) -> dict:
    """`main(argv)` of a script, its exit status checked, and the JSON it wrote to `out`."""
    assert script(name).main([str(a) for a in argv]) == code
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """tiny_random_bundle(seed=0) as a model folder: target/ (with its tokenizer), drafter/ and drafter-dflash/."""
    bundle = tiny_random_bundle(seed=0)
    root = save_bundle(bundle, tmp_path_factory.mktemp("bench") / "models")
    return save_bundle(bundle, root, drafter="drafter-dflash")


def test_every_benchmark_file_is_run_by_a_test():
    """A script that stays is maintained: each file of benchmarks/ is run here, by the served tests, or by
    another test, so that a script the core left behind fails a test rather than its next user."""
    files = sorted(p.name for pattern in ("*.py", "*.sh") for p in BENCHMARKS.glob(pattern))
    assert files == sorted([f"{n}.py" for n in IN_PROCESS + SERVED] + list(ELSEWHERE))
    served = (ROOT / "tests" / "integration" / "test_benchmarks_served.py").read_text()
    assert all(f'"{n}"' in served for n in SERVED)


def test_gpu_check_parses_and_passes_only_flags_its_scripts_take(capsys):
    """gpu_check.sh runs on a GPU host only (`make gpu-check`): here its syntax, that every script it names exists,
    and that each option it gives a script is one the script's --help lists."""
    text = (BENCHMARKS / "gpu_check.sh").read_text()
    subprocess.run(["bash", "-n", str(BENCHMARKS / "gpu_check.sh")], check=True)
    calls = re.findall(r"benchmarks/(bench_\w+)\.py((?:\\\n|[^\n])*)", text)  # a call with its continued lines
    assert {name for name, _ in calls} == {"bench_step", "bench_graph_ceiling", "bench_graphs", "bench_gate"}
    for name, rest in calls:
        flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest.split("2>&1")[0]))
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            script(name).main(["--help"])
        assert done.value.code == 0
        listed = capsys.readouterr().out
        assert [f for f in sorted(flags) if not re.search(rf"(?<![\w-]){f}(?![\w-])", listed)] == [], name


def test_bench_detokenize(models, tmp_path):
    report = run("bench_detokenize", ["--tokenizer-dir", models / "target", "--tokens", 64,
                                      "--json", tmp_path / "r.json"], tmp_path / "r.json")
    assert report["tokens"] == 64 and report["texts_equal"] is True
    assert {"whole_output_s", "windowed_s", "speedup"} <= report.keys()


def test_bench_gate(models, tmp_path):
    report = run("bench_gate", ["--model-dir", models, "--domains", "code", "--per-domain", 2, "--concurrency", "1,2",
                                "--max-tokens", 8, "--repeats", 2, "--json", tmp_path / "r.json"], tmp_path / "r.json")
    assert {"args", "device", "dtype", "gate_at_the_end", "rows", "summary"} <= report.keys()
    assert {r["variant"] for r in report["rows"]} == set(script("bench_gate").VARIANTS)
    assert all(r["greedy_equal_to_ar"] for r in report["rows"])  # fp32 on the CPU: equal, not only up to ties
    assert [(s["domain"], s["concurrency"]) for s in report["summary"]] == [("code", 1), ("code", 2)]


def test_bench_graph_ceiling(models, tmp_path):
    report = run("bench_graph_ceiling", [tmp_path / "r.json", "--model-dir", models, "--sequences", "1,2",
                                         "--context", 16, "--repeats", 2], tmp_path / "r.json")
    assert {"torch", "rows"} <= report.keys()
    assert [r.get("error") for r in report["rows"]] == [None, None]  # a probe that raised is reported, not raised
    assert all({"full_forward_ms", "layers_eager_ms"} <= r.keys() for r in report["rows"])


def test_bench_graphs(models, tmp_path):
    """Without CUDA the graphed arm runs its padded steps eagerly: its outputs must still equal the eager arm's."""
    report = run("bench_graphs", ["--model-dir", models, "--concurrency", 1, "--modes", "ar,adaflash", "--max-tokens", 8,
                                  "--passes", 1, "--json", tmp_path / "r.json"], tmp_path / "r.json")
    assert {"torch", "device", "dtype", "max_tokens", "passes", "rows"} <= report.keys()
    assert [r["mode"] for r in report["rows"]] == ["ar", "adaflash"]
    assert all(r["graphs_equal_to_eager"] == r["prompts"] == r["eager_equal_to_plain"] for r in report["rows"])


def test_bench_layout(tmp_path):
    report = run("bench_layout", ["--rows", "1,4", "--weights", "qkv,o", "--cache-mb", 1, "--json", tmp_path / "r.json"],
                 tmp_path / "r.json")
    assert {"threads", "torch", "platform", "cpu", "rows"} <= report.keys()
    assert [(r["weight"], r["rows"]) for r in report["rows"]] == [("qkv", 1), ("qkv", 4), ("o", 1), ("o", 4)]


def test_bench_onnx_drafter(models, tmp_path):
    pytest.importorskip("onnxruntime", reason="the onnx extra (pip install -e '.[onnx]') is not installed")
    report = run("bench_onnx_drafter", ["--model-dir", models, "--threads", 1, "--context", 16, "--batches", 1,
                                        "--trials", 1, "--prompts", 2, "--max-tokens", 8, "--concurrency", 1,
                                        "--modes", "adaflash", "--rounds", 1, "--json", tmp_path / "r.json"],
                 tmp_path / "r.json")
    assert {"model_dir", "drafter", "context", "machine", "runs"} <= report.keys()
    (run_,) = report["runs"]
    assert run_["forward"] and run_["end_to_end"][0]["equal_to_ar"] is True
    assert run_["cost_table_draft_ms"].keys() == {"torch", "onnx"}


def test_bench_peers_ours_and_transformers(models, tmp_path):
    """Our modes and transformers' generate on the tiny models; llama.cpp is built from source (minutes), so it is
    skipped here (`make bench-peers` runs it) and its output parsing is checked on its own below."""
    report = run("bench_peers", ["--model-dir", models, "--limit", 2, "--max-tokens", 8, "--threads", 1,
                                 "--skip-llamacpp", "--work", tmp_path / "peers", "--json", tmp_path / "r.json"],
                 tmp_path / "r.json")
    assert {"command", "model_dir", "prompts", "num_prompts", "machine", "versions", "llamacpp", "skipped", "rows",
            "table"} <= report.keys()
    assert report["skipped"] == {"llama.cpp": "skipped by option"} and report["num_prompts"] == 2
    ours = [r["method"] for r in report["rows"] if r["engine"] == "ours"]
    assert ours == ["ar", "ngram", "dflash:drafter-dflash", "adaflash:drafter"]
    assert all(r["equal_to_ar"] == 2 for r in report["rows"])  # transformers' greedy output too, where installed


def test_bench_peers_reads_llama_cpp_output():
    peers = script("bench_peers")
    perf = ("llama_perf_context_print: prompt eval time =      12.50 ms /    10 tokens\n"
            "llama_perf_context_print:        eval time =      30.00 ms /     6 runs\n")
    assert peers.completion_run("def f(x): [end of text]\n\n\n", perf) == peers.LlamaRun("def f(x):", 7, 6, 0.03,
                                                                                           0.0125)
    assert peers.completion_run("def f(x):\n\n", perf).text == "def f(x):"
    spec = "encoded   10 tokens in    0.020 seconds\ndecoded    8 tokens in    0.040 seconds\nn_accept  = 5\n"
    done = peers.speculative_run("PROMPT return x<|end|>\n\n\n\n", spec, "PROMPT", ["<|end|>"])
    assert done == peers.LlamaRun(" return x", 8, 8, 0.04, 0.02, 5)
    with pytest.raises(peers.PeerUnavailable):
        peers.speculative_run("no prompt here", spec, "PROMPT", [])
    assert peers.same_output("ab", [1, 2], "ab", 8) and peers.same_output("abc", [1, 2], "ab", 2)
    assert not peers.same_output("abc", [1, 2], "ab", 8)
    methods = peers.llama_methods({"f32": Path("t32"), "f16": Path("t16")}, {"f32": Path("d32"), "f16": Path("d16")},
                                  10, 15)
    assert [(m.binary, m.dtype) for m in methods] == [(b, t) for t in peers.GGUF_TYPES for b in (
        "llama-completion", "llama-lookup", "llama-speculative-simple")]


def test_bench_runner(models, tmp_path):
    """The runner against transformers on the tiny target's checkpoint: the same logits (exit 0) at every case."""
    pytest.importorskip("transformers")
    report = run("bench_runner", ["--model-dir", models / "target", "--context", 16, "--reps", 1,
                                  "--json", tmp_path / "r.json"], tmp_path / "r.json")
    assert {"checkpoint", "context", "cases", "torch", "transformers"} <= report.keys()
    assert len(report["cases"]) == len(script("bench_runner").CASES)


def test_bench_step(models, tmp_path):
    report = run("bench_step", ["--model-dir", models, "--prompts", 2, "--max-tokens", 8, "--modes", "ar,adaflash",
                                "--profile-steps", 2, "--repeats", 1, "--json", tmp_path / "r.json"], tmp_path / "r.json")
    assert {"revision", "torch", "device", "dtype", "concurrency", "prompts", "modes"} <= report.keys()
    assert report["modes"].keys() == {"ar", "adaflash"}
    for mode in report["modes"].values():
        assert {"step_ms_median", "forward_ms_median", "tokens_per_s_unclocked", "profile", "host_profile"} <= mode.keys()


def test_bench_verify(models, tmp_path):
    report = run("bench_verify", ["--model-dir", models, "--batches", "1,2", "--contexts", 16, "--reps", 1,
                                  "--json", tmp_path / "r.json"], tmp_path / "r.json")
    assert {"revision", "torch", "threads", "platform", "rows"} <= report.keys()
    assert len(report["rows"]) == 2 * len(script("bench_verify").TOKENS_PER_SEQ)
