"""Our greedy decoding speed next to the engines people would otherwise use, in one run on one machine.

Why: a speed of our engine means little alone; what matters is how it compares to transformers'
`generate` (greedy, and its prompt lookup) and to llama.cpp (plain decoding in f32 and f16, its prompt
lookup, its DFlash with our `drafter-dflash`) on the same target, the same prompts and the same CPU
threads, measured in the same run as our `ar`, `ngram`, `dflash` and `adaflash` rather than taken from
figures of other days and machines. Speed only counts for the right output, so every peer's greedy
output is compared with our `ar` output (count of equal prompts); our own modes go through
`bench.compare`, which withholds the speed of a mode that differs from `ar`.

llama.cpp is built from the `llama-cpp-python` source package (it vendors llama.cpp with DFlash), and
the target and the DFlash drafter are converted to GGUF with its own converter; source, build and
GGUF files are kept under --work and reused by later runs. Its command-line tools take text, not
token ids: they get the text of our prompt ids, `llama-tokenize` checks that it gives the same ids,
and their output text is compared with the text of our `ar` output. Its speeds come from its own
timing lines: prefill plus generation (comparable with ours and transformers', which time each prompt's
whole `generate`), and generation alone.

Every engine gets the same CPU threads (--threads). Give the benchmark the machine to itself: under other
load, thread pools that wait for each other at every operation (llama.cpp's spin, torch's too) slow down
by far more than their share of the CPU, and the engines run one after the other, not interleaved.

    .venv/bin/python benchmarks/bench_peers.py --json bench-out/peers.json    # or: make bench-peers
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash_contract.modes import REFERENCE_MODE
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request
from adaflash.evaluation.evaluate import Throughput, Variant, engine_for, measure_throughput, parse_variants
from adaflash.evaluation.prompts import PACKAGED_DATA, encode_prompts, load_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.checkpoint import read_config
from adaflash.models.drafter import DrafterConfig
from adaflash.models.target import Transformer

DEFAULT_PROMPTS = PACKAGED_DATA / "eval" / "humaneval.jsonl"  # 16 code prompts (the packaged evaluation sample)
LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors llama.cpp 0c1e570, which has DFlash
LLAMA_BINARIES = ("llama-bench", "llama-completion", "llama-lookup", "llama-speculative-simple", "llama-tokenize")
# No HTTPS (nothing is downloaded by the tools), no tests, no server: only the binaries above.
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_SERVER=OFF")
GGUF_TYPES = ("f32", "f16")

# Runs llama.cpp's converter with one change: a byte-level BPE tokenizer with GPT-2's split pattern whose
# hash is missing from the converter's table (our target's) is converted as `gpt-2`; any other
# unrecognised tokenizer still fails. argv: the vendored llama.cpp folder, then the converter's arguments.
CONVERT_SHIM = """
import json, sys
from pathlib import Path
tree, args = sys.argv[1], sys.argv[2:]
sys.path.insert(0, tree)
import convert_hf_to_gguf
from conversion.base import TextModel
recognised = TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return recognised(self, tokenizer)
    except NotImplementedError:
        pre = json.loads((Path(self.dir_model) / "tokenizer.json").read_text())["pre_tokenizer"]
        if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
            return "gpt-2"
        raise
TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = ["convert_hf_to_gguf.py", *args]
convert_hf_to_gguf.main()
"""


class PeerUnavailable(Exception):
    """A peer that cannot run here; the message is the reason recorded in the report."""


@dataclass
class Row:
    """One (engine, method): speed, and how many prompts' greedy output equals our `ar` output.

    `tokens_per_s` is comparable across engines: output tokens over the seconds of prefill and generation,
    prompt by prompt (model loading and, for llama.cpp, process start excluded). llama.cpp also reports
    generation alone (`generation_tokens_per_s`, its own figure; what llama-bench measures too).
    """

    engine: str
    method: str
    dtype: str
    tokens_per_s: float | None
    equal_to_ar: int | None  # None: not counted (llama-bench has no prompts; a mode of ours that differed)
    prompts: int
    generation_tokens_per_s: float | None = None
    tau: float | None = None  # tokens per target forward in generation (speculative methods)
    speedup_vs_ar: float | None = None
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    """The prompts every engine decodes: our token ids, their text, and our `ar` output for each."""

    ids: list[list[int]]
    texts: list[str]
    max_tokens: int
    reference: list[list[int]]
    reference_texts: list[str]
    stop_texts: list[str]  # the target's stop tokens as text, where llama.cpp's text output ends


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help="holds target/ and the drafter folders")
    p.add_argument("--drafter", default="drafter", help="drafter folder of our adaflash mode")
    p.add_argument("--dflash-drafter", default="drafter-dflash",
                   help="plain DFlash drafter folder: our dflash mode and llama.cpp's DFlash")
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                   help="JSON lines with 'prompt' (default: HumanEval's first 16, packaged)")
    p.add_argument("--limit", type=int, default=16, help="number of prompts (the first ones; domains in turn)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=2, help="CPU threads of every engine (torch and llama.cpp)")
    p.add_argument("--lookup-tokens", type=int, default=10,
                   help="prompt lookup draft length of transformers and llama.cpp")
    p.add_argument("--work", type=Path, default=Path("bench-out/peers"),
                   help="llama.cpp source, build and GGUF files (reused by later runs)")
    p.add_argument("--json", type=Path, default=Path("bench-out/peers.json"))
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--skip-llamacpp", action="store_true")
    return p.parse_args(argv)


# Our engine ----------------------------------------------------------------------------------------------


def reference_outputs(model_dir: Path, target: Transformer, ids: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Our `ar` greedy output per prompt: what every peer is compared with (this pass also warms torch up)."""
    engine = engine_for(model_dir, target, Variant(REFERENCE_MODE), ids, max_tokens, concurrency=1)
    seqs = engine.generate([Request(p, max_tokens, mode=REFERENCE_MODE, sampling=SamplingParams()) for p in ids], 1)
    return [s.output for s in seqs]


def our_rows(model_dir: Path, target: Transformer, ids: list[list[int]], max_tokens: int, drafter: str,
             dflash_drafter: str) -> tuple[list[Row], bool]:
    """`ar`, `ngram`, `dflash` (with the drafter llama.cpp gets too) and `adaflash` through `bench.compare`
    at concurrency 1; returns (rows, ok), ok False if a mode's greedy output differs from `ar`."""
    variants = parse_variants(f"ngram,dflash:{dflash_drafter},adaflash:{drafter}", drafter)
    report = measure_throughput(model_dir, target, ids, Throughput(variants, [1], max_tokens, len(ids)), progress=True)
    rows = [Row("ours", r["variant"], "f32", r["output_tokens_per_s"],
                len(ids) if r["greedy_equal_to_ar"] else None, len(ids), tau=r["tau"],
                details={"mean_draft_len": r["mean_draft_len"], "greedy_equal_to_ar": r["greedy_equal_to_ar"]})
            for r in report["rows"]]
    return rows, all(r["greedy_equal_to_ar"] is not False for r in report["rows"])


# transformers --------------------------------------------------------------------------------------------


def transformers_rows(target_dir: Path, work: Workload, lookup_tokens: int) -> list[Row]:
    """`generate` greedy and with prompt lookup on the same ids, fp32, one prompt at a time (each method
    is warmed up on the first prompt first)."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise PeerUnavailable(f"transformers is not installed ({exc}); it is in the dev extra") from exc
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    methods = {"generate greedy": {}, f"generate prompt lookup {lookup_tokens}": {"prompt_lookup_num_tokens": lookup_tokens}}
    rows = []
    for method, extra in methods.items():
        with torch.inference_mode():
            hf_generate(model, work.ids[0], 4, extra)
            start = time.perf_counter()
            outputs = [hf_generate(model, ids, work.max_tokens, extra) for ids in work.ids]
            wall = time.perf_counter() - start
        equal = sum(o == r for o, r in zip(outputs, work.reference))
        tokens = sum(len(o) for o in outputs)
        rows.append(Row("transformers", method, "f32", round(tokens / wall, 2), equal, len(outputs)))
        print(f"transformers {method:<28} tok/s={tokens / wall:.1f}  equal={equal}/{len(outputs)}", flush=True)
    return rows


def hf_generate(model: torch.nn.Module, ids: list[int], max_tokens: int, extra: dict) -> list[int]:
    """Greedy output ids of one prompt before the first stop token, as our engine reports them."""
    eos = model.generation_config.eos_token_id
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_tokens, do_sample=False, pad_token_id=eos, **extra)
    stops = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    new = out[0, len(ids):].tolist()
    return next((new[:i] for i, t in enumerate(new) if t in stops), new)


# llama.cpp: source, build, conversion --------------------------------------------------------------------


def llama_source(work: Path) -> Path:
    """The vendored llama.cpp folder of the llama-cpp-python sdist, downloaded and unpacked once."""
    unpacked = work / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    tree = unpacked / "vendor" / "llama.cpp"
    if tree.is_dir():
        return tree
    archive = work / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not archive.exists():
        run_logged("download", [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(work)], work / "download.log")
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    return tree


def build_llama(tree: Path, work: Path) -> tuple[Path, float | None]:
    """The binaries (built once; returns their folder and the build's seconds, None when reused)."""
    bin_dir = work / "build" / "bin"
    if all((bin_dir / b).exists() for b in LLAMA_BINARIES):
        return bin_dir, None
    if shutil.which("cmake") is None:
        raise PeerUnavailable("cmake is not installed")
    start = time.perf_counter()
    log = work / "build.log"
    run_logged("cmake configure", ["cmake", "-S", str(tree), "-B", str(work / "build"), *CMAKE_FLAGS], log)
    run_logged("build", ["cmake", "--build", str(work / "build"), "-j", str(os.cpu_count() or 1),
                "--target", *LLAMA_BINARIES], log)
    return bin_dir, round(time.perf_counter() - start, 1)


def convert(tree: Path, hf_dir: Path, out: Path, outtype: str, target_dir: Path | None = None) -> Path:
    """A GGUF of `hf_dir` (a DFlash drafter takes its vocabulary from `target_dir`), rebuilt when the
    checkpoint is newer than it."""
    weights = hf_dir / "model.safetensors"
    if out.exists() and out.stat().st_mtime >= weights.stat().st_mtime:
        return out
    if importlib.util.find_spec("sentencepiece") is None:  # imported before it finds there is no tokenizer.model
        raise PeerUnavailable("llama.cpp's converter needs sentencepiece: pip install -e '.[peers]'")
    target = [] if target_dir is None else ["--target-model-dir", str(target_dir)]
    run_logged(f"conversion of {hf_dir} to {outtype}", [sys.executable, "-c", CONVERT_SHIM, str(tree), str(hf_dir), "--outtype", outtype,
                "--outfile", str(out), *target], out.with_suffix(".log"))
    return out


def run_logged(step: str, cmd: list[str], log: Path) -> None:
    """Run a preparation step with its output appended to `log`; a failure names the step and the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            raise PeerUnavailable(f"llama.cpp {step} failed: see {log}")


# llama.cpp: runs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaRun:
    """One llama.cpp tool on one prompt: its output text, and tokens and seconds by its own timing lines."""

    text: str
    tokens: int  # generated tokens, a stop token included
    decode_tokens: int  # those its generation timing covers
    decode_s: float
    prefill_s: float
    accepted: int = 0  # draft tokens the target accepted (speculative tools)


def completion_run(stdout: str, stderr: str) -> LlamaRun:
    """llama-completion (prompt not echoed; it ends the text with a blank line, after ` [end of text]` at
    a stop token) and llama_perf's prefill and generation lines (generation: one run per token after the
    first, which comes from the prefill)."""
    prefill = re.search(r"prompt eval time =\s*([\d.]+) ms", stderr)
    decode = re.search(r"\s{2}eval time =\s*([\d.]+) ms /\s*(\d+) runs", stderr)
    if prefill is None or decode is None:
        raise PeerUnavailable(f"llama-completion printed no timings: {stderr[-500:]}")
    text = stdout.removesuffix("\n\n").removesuffix(" [end of text]\n")
    runs = int(decode.group(2))
    return LlamaRun(text, runs + 1, runs, float(decode.group(1)) / 1e3, float(prefill.group(1)) / 1e3)


def speculative_run(stdout: str, stderr: str, prompt: str, stop_texts: list[str]) -> LlamaRun:
    """llama-lookup and llama-speculative-simple: the text after the echoed prompt (they end it with two
    blank lines; llama-lookup also prints the stop token), and their `encoded`, `decoded` and `n_accept` lines."""
    prefill = re.search(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", stderr)
    decode = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", stderr)
    accepted = re.search(r"n_accept\s+=\s+(\d+)", stderr)
    start = stdout.find(prompt)
    if prefill is None or decode is None or accepted is None or start < 0:
        raise PeerUnavailable(f"unexpected llama.cpp output: {stderr[-500:]}")
    text = stdout[start + len(prompt):].removesuffix("\n\n\n\n")
    for stop in stop_texts:
        text = text.split(stop)[0]
    tokens = int(decode.group(1))
    return LlamaRun(text, tokens, tokens, float(decode.group(2)), float(prefill.group(1)), int(accepted.group(1)))


@dataclass(frozen=True)
class LlamaMethod:
    """A row of llama.cpp: which tool, on which GGUF, with which extra arguments."""

    method: str
    dtype: str
    binary: str
    args: tuple[str, ...]


def llama_methods(models: dict[str, Path], drafters: dict[str, Path], lookup_tokens: int,
                  dflash_draft: int) -> list[LlamaMethod]:
    """Plain decoding (llama-completion), prompt lookup (llama-lookup, n-grams of 1 to 4 tokens) and DFlash
    (llama-speculative-simple) on each GGUF type, the drafter converted to the target's type."""
    methods = []
    for dtype in GGUF_TYPES:
        methods += [
            LlamaMethod("plain", dtype, "llama-completion", ("-m", str(models[dtype]), "--no-display-prompt", "-no-cnv")),
            LlamaMethod(f"prompt lookup {lookup_tokens}", dtype, "llama-lookup",
                        ("-m", str(models[dtype]), "--spec-draft-n-max", str(lookup_tokens))),
            LlamaMethod(f"dflash {dflash_draft}", dtype, "llama-speculative-simple",
                        ("-m", str(models[dtype]), "-md", str(drafters[dtype]), "--spec-type", "draft-dflash",
                         "--spec-draft-n-max", str(dflash_draft))),
        ]
    return methods


def run_llama(bin_dir: Path, m: LlamaMethod, prompt_file: Path, prompt: str, work: Workload, threads: int) -> LlamaRun:
    """One greedy generation; the prompt is read verbatim from a file (`-f` would drop its final newline)."""
    cmd = [str(bin_dir / m.binary), *m.args, "-bf", str(prompt_file), "--no-escape", "-n", str(work.max_tokens),
           "-t", str(threads), "-tb", str(threads), "--temp", "0", "--top-k", "1", "--seed", "0"]
    if m.binary == "llama-speculative-simple":
        cmd += ["-td", str(threads)]
    for attempt in range(PARSE_ATTEMPTS):
        done = run_tool(cmd)
        try:
            if m.binary == "llama-completion":
                return completion_run(done.stdout, done.stderr)
            return speculative_run(done.stdout, done.stderr, prompt, work.stop_texts)
        except PeerUnavailable:
            if attempt == PARSE_ATTEMPTS - 1:
                raise


# llama.cpp logs from a thread, which now and then loses its last lines (the timings) when a tool exits: such a run
# is repeated rather than the whole peer skipped.
PARSE_ATTEMPTS = 3


def run_tool(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run one llama.cpp tool; a failure makes llama.cpp a skipped peer, with the end of what it said."""
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if done.returncode != 0:
        raise PeerUnavailable(f"{Path(cmd[0]).name} failed ({done.returncode}): {done.stderr[-500:]}")
    return done


def same_output(text: str, reference: list[int], reference_text: str, max_tokens: int) -> bool:
    """Whether llama.cpp's text is our `ar` output: equal text, or for an output cut at `max_tokens`
    the same start (its speculative tools may commit a few tokens past the limit)."""
    return text == reference_text or (len(reference) == max_tokens and text.startswith(reference_text))


def llama_method_row(bin_dir: Path, m: LlamaMethod, work: Workload, files: list[Path], threads: int) -> Row:
    """Every prompt through one method, with speeds from its own timing lines; tau counts each target
    forward of generation as one token plus the drafts it accepted."""
    runs = [run_llama(bin_dir, m, f, t, work, threads) for f, t in zip(files, work.texts)]
    tokens, decode_tokens = sum(r.tokens for r in runs), sum(r.decode_tokens for r in runs)
    accepted = sum(r.accepted for r in runs)
    decode_s, prefill_s = sum(r.decode_s for r in runs), sum(r.prefill_s for r in runs)
    equal = sum(same_output(r.text, ref, ref_text, work.max_tokens)
                for r, ref, ref_text in zip(runs, work.reference, work.reference_texts))
    row = Row("llama.cpp", m.method, m.dtype, round(tokens / (prefill_s + decode_s), 2), equal, len(runs),
              generation_tokens_per_s=round(decode_tokens / decode_s, 2), tau=round(tokens / (tokens - accepted), 3),
              details={"binary": m.binary, "args": list(m.args), "generated_tokens": tokens,
                       "prefill_s": round(prefill_s, 4), "generation_s": round(decode_s, 4)})
    print(f"llama.cpp {m.method:<20} {m.dtype}  tok/s={row.tokens_per_s}  generation tok/s={row.generation_tokens_per_s}"
          f"  tau={row.tau}  equal={equal}/{len(runs)}", flush=True)
    return row


def prompt_ids_equal(bin_dir: Path, model: Path, files: list[Path], ids: list[list[int]]) -> int:
    """How many prompts llama.cpp tokenizes to our ids (it is given their text)."""
    equal = 0
    for f, ours in zip(files, ids):
        done = run_tool([str(bin_dir / "llama-tokenize"), "-m", str(model), "-f", str(f), "--ids", "--no-escape",
                         "--log-disable"])
        equal += json.loads(done.stdout.strip().splitlines()[-1]) == ours
    return equal


def llama_bench(bin_dir: Path, models: dict[str, Path], max_tokens: int, threads: int) -> tuple[list[Row], str]:
    """llama-bench's token generation speed of each GGUF (no prompt, batch 1), and the build's commit."""
    rows, commit = [], "unknown"
    for dtype, model in models.items():
        done = run_tool([str(bin_dir / "llama-bench"), "-m", str(model), "-p", "0", "-n", str(max_tokens),
                         "-t", str(threads), "-r", "3", "-o", "json"])
        result = json.loads(done.stdout)[0]
        commit = result["build_commit"]
        rows.append(Row("llama.cpp", f"llama-bench tg{max_tokens}", dtype, None, None, 0,
                        generation_tokens_per_s=round(result["avg_ts"], 2),
                        details={"stddev_ts": round(result["stddev_ts"], 2)}))
    return rows, commit


def llamacpp_rows(args: argparse.Namespace, work: Workload, facts: dict) -> list[Row]:
    """Build, convert, then every llama.cpp method on the workload; what the report should say about the
    build (commit, seconds, flags, prompt ids) goes into `facts`."""
    args.work.mkdir(parents=True, exist_ok=True)
    tree = llama_source(args.work)
    bin_dir, build_s = build_llama(tree, args.work)
    target_dir, drafter_dir = args.model_dir / "target", args.model_dir / args.dflash_drafter
    gguf = args.work / "gguf"
    start = time.perf_counter()
    models = {t: convert(tree, target_dir, gguf / f"target-{t}.gguf", t) for t in GGUF_TYPES}
    drafters = {t: convert(tree, drafter_dir, gguf / f"{args.dflash_drafter}-{t}.gguf", t, target_dir)
                for t in GGUF_TYPES}
    convert_s = round(time.perf_counter() - start, 1)
    files = write_prompt_files(args.work / "prompts", work.texts)
    rows, commit = llama_bench(bin_dir, models, work.max_tokens, args.threads)
    facts.update({"llama_cpp_python": LLAMA_CPP_PYTHON, "commit": commit, "build_s": build_s, "convert_s": convert_s,
                  "cmake_flags": CMAKE_FLAGS, "input": "prompt text (its tools take no token ids); output compared as text",
                  "prompt_ids_equal": prompt_ids_equal(bin_dir, models["f32"], files, work.ids)})
    block_size = DrafterConfig.from_hf(read_config(drafter_dir)).block_size
    for m in llama_methods(models, drafters, args.lookup_tokens, block_size - 1):
        rows.append(llama_method_row(bin_dir, m, work, files, args.threads))
    return rows


def write_prompt_files(folder: Path, texts: list[str]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"{i}.txt" for i in range(len(texts))]
    for f, t in zip(files, texts):
        f.write_text(t, encoding="utf-8")
    return files


# Report --------------------------------------------------------------------------------------------------


def add_speedups(rows: list[Row]) -> None:
    """Speed ratio of every row to our `ar` measured in this run."""
    ar = next(r.tokens_per_s for r in rows if r.engine == "ours" and r.method == REFERENCE_MODE)
    for r in rows:
        r.speedup_vs_ar = round(r.tokens_per_s / ar, 2) if ar and r.tokens_per_s else None


def markdown(rows: list[Row]) -> str:
    """The table: tok/s with prefill (comparable across engines) and its ratio to our `ar`, llama.cpp's own
    generation-only figure, tau, and the prompts whose output equals our `ar` output."""
    lines = ["| engine | method | dtype | tok/s | x ar | generation tok/s | tau | equal to ar |",
             "|---|---|---|--:|--:|--:|--:|--:|"]
    for r in rows:
        cells = [r.engine, r.method, r.dtype, _cell(r.tokens_per_s, ".1f"), _cell(r.speedup_vs_ar, ".2f"),
                 _cell(r.generation_tokens_per_s, ".1f"), _cell(r.tau, ".2f"),
                 "-" if r.equal_to_ar is None else f"{r.equal_to_ar}/{r.prompts}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def machine(threads: int) -> dict:
    """Where the figures come from: they only compare within one machine."""
    cpuinfo = Path("/proc/cpuinfo")
    names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M) if cpuinfo.exists() else []
    return {"cpu_model": names[0] if names else platform.processor(), "cpu_count": os.cpu_count(),
            "threads": threads, "torch_threads": torch.get_num_threads(), "platform": platform.platform()}


def run_peer(name: str, skip: bool, peer: Callable[[], list[Row]], skipped: dict[str, str]) -> list[Row]:
    """A peer's rows, or none with the reason recorded in `skipped`."""
    if skip:
        skipped[name] = "skipped by option"
        return []
    try:
        return peer()
    except PeerUnavailable as exc:
        skipped[name] = str(exc)
        print(f"{name} skipped: {exc}", file=sys.stderr)
        return []


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    prompts = load_prompts(args.prompts, args.limit)
    bundle = load_bundle(args.model_dir, None)
    tokenizer = bundle.tokenizer
    ids = encode_prompts(tokenizer, prompts, args.max_prompt_tokens)
    reference = reference_outputs(args.model_dir, bundle.target, ids, args.max_tokens)
    work = Workload(ids, [tokenizer.decode(i) for i in ids], args.max_tokens, reference,
                    [tokenizer.decode(r) for r in reference],
                    [tokenizer.id_to_token(i) for i in bundle.target.config.eos_token_ids])
    rows, ok = our_rows(args.model_dir, bundle.target, ids, args.max_tokens, args.drafter, args.dflash_drafter)
    skipped: dict[str, str] = {}
    rows += run_peer("transformers", args.skip_transformers,
                     lambda: transformers_rows(args.model_dir / "target", work, args.lookup_tokens), skipped)
    llamacpp: dict = {}
    rows += run_peer("llama.cpp", args.skip_llamacpp, lambda: llamacpp_rows(args, work, llamacpp), skipped)
    add_speedups(rows)
    table = markdown(rows)
    print(table)
    report = {
        "command": " ".join(sys.argv if argv is None else [Path(__file__).name, *argv]),
        "model_dir": str(args.model_dir),
        "prompts": str(args.prompts),
        "num_prompts": len(ids),
        "max_tokens": args.max_tokens,
        "concurrency": 1,
        "machine": machine(args.threads),
        "versions": {"torch": torch.__version__, "transformers": installed_version("transformers"),
                     "llama.cpp": llamacpp.get("commit")},
        "llamacpp": llamacpp,
        "skipped": skipped,
        "rows": [asdict(r) for r in rows],
        "table": table,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    if not ok:
        print("error: one of our modes' greedy output differs from ar; no speed reported for it", file=sys.stderr)
    return 0 if ok else 1


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
