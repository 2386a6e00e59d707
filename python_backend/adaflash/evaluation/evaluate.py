"""Quality of the default models per domain: the target's held-out perplexity and repetition,
and the acceptance (tau) of drafters against the prompt-lookup baseline.

`adaflash evaluate` runs it all on the shared evaluation sets and writes one JSON report with its `meta`: the
command, the machine, the commit and the date. `make evaluate` writes it as benchmarks/results/quality.json, from
which `make results` (benchmarks/results.py) renders the quality section of docs/results.md, so the tables there
always come from one run of one command.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from adaflash.cli_args import split_csv
from adaflash.decoding.engine import Engine
from adaflash_contract.modes import REFERENCE_MODE, parse_mode
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request, Sequence, context_length
from adaflash.evaluation.bench import Contender, compare, summarize
from adaflash.evaluation.prompts import EVAL_SETS, eval_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import DFlashDrafter, block_size_of
from adaflash.models.placement import CPU, Placement, place_of
from adaflash.models.target import Transformer
from adaflash.corpus import DOMAINS
from adaflash.heldout import heldout_loss


@dataclass
class Variant:
    """One way of drafting: a mode, and for drafter modes which drafter at which block size."""
    mode: str
    drafter: str | None = None
    block_size: int | None = None

    @property
    def name(self) -> str:
        block = "" if self.block_size is None else f"@{self.block_size}"
        return self.mode if self.drafter is None else f"{self.mode}:{self.drafter}{block}"


@dataclass
class Throughput:
    """Greedy decoding speed of variants at several concurrencies, on the evaluation prompts."""
    variants: list[Variant]
    concurrencies: list[int]
    max_tokens: int
    per_domain: int  # prompts per domain: the highest concurrency needs at least that many in all


def is_repetitive(output: list[int], window: int = 128, max_period: int = 16) -> bool:
    """Whether the last `window` tokens repeat with a period of at most `max_period` tokens."""
    if len(output) < window:
        return False
    tail = output[-window:]
    return any(all(tail[i] == tail[i - p] for i in range(p, window)) for p in range(1, max_period + 1))


def with_block_size(drafter: DFlashDrafter, block_size: int | None) -> DFlashDrafter:
    """Run a drafter at another block size than it was trained at (it drafts block_size - 1 tokens)."""
    if block_size is not None and block_size != drafter.config.block_size:
        drafter.config = dataclasses.replace(drafter.config, block_size=block_size)
    return drafter


def engine_for(model_dir: Path, target: Transformer, v: Variant, prompts: list[list[int]], max_tokens: int,
               concurrency: int) -> Engine:
    """An engine with the variant's drafter (loaded afresh: block sizes differ per variant) or none."""
    drafter = None if v.drafter is None else with_block_size(
        DFlashDrafter.from_pretrained(model_dir / v.drafter, place_of(target)), v.block_size)
    return Engine(target, drafter, num_slots=concurrency,
                  max_len=context_length([len(p) for p in prompts], max_tokens, block_size_of(drafter)))


def evaluate(model_dir: Path, data_dir: Path, variants: list[Variant], per_domain: int, max_tokens: int,
             temperatures: list[float], concurrency: int, max_prompt_tokens: int, seed: int,
             progress: bool = True, throughput: Throughput | None = None, place: Placement = CPU) -> dict:
    bundle = load_bundle(model_dir, None, place)
    target, tok = bundle.target, bundle.tokenizer
    texts = eval_prompts(data_dir, per_domain)
    domains = [d for d in DOMAINS for _ in texts[d]]
    prompts = [tok.encode(t).ids[-max_prompt_tokens:] for d in DOMAINS for t in texts[d]]
    command = command_line(model_dir, data_dir, variants, per_domain, max_tokens, temperatures, concurrency,
                           max_prompt_tokens, seed, throughput, place)
    report: dict = {"meta": run_meta(command, place),
                    "model_dir": str(model_dir), "per_domain_prompts": per_domain, "max_tokens": max_tokens,
                    "concurrency": concurrency, "eval_sets": EVAL_SETS,
                    "heldout_loss_nats": heldout_loss(target, tok, data_dir, context=target.config.max_position_embeddings),
                    "runs": []}
    engines: dict[tuple[str | None, int | None], Engine] = {}
    reference = None
    for temperature in temperatures:
        sampling = SamplingParams(temperature=temperature, seed=seed)
        for v in [Variant(REFERENCE_MODE)] + [v for v in variants if v.mode != REFERENCE_MODE]:
            if temperature > 0 and v.mode == REFERENCE_MODE:
                continue  # tau of plain decoding is 1 by definition
            key = (v.drafter, v.block_size)
            if key not in engines:
                engines[key] = engine_for(model_dir, target, v, prompts, max_tokens, concurrency)
            t0 = time.perf_counter()
            requests = [Request(p, max_tokens, mode=v.mode, sampling=sampling) for p in prompts]
            seqs = engines[key].generate(requests, concurrency)
            wall = time.perf_counter() - t0
            if temperature == 0 and v.mode == REFERENCE_MODE:
                reference = [s.output for s in seqs]
            ref = reference if temperature == 0 else None
            run = {"variant": v.name, "temperature": temperature, **summarize(seqs, wall, ref),
                   "per_domain": {d: summarize([s for s, sd in zip(seqs, domains) if sd == d], 0.0,
                                               None if ref is None else [r for r, sd in zip(ref, domains) if sd == d])
                                  for d in DOMAINS}}
            if v.mode == REFERENCE_MODE:
                run["repetition"] = {d: _repetition([s for s, sd in zip(seqs, domains) if sd == d], max_tokens)
                                     for d in DOMAINS}
                run["samples"] = {d: [{"prompt_tail": texts[d][i][-160:], "output": tok.decode(seqs[domains.index(d) + i].output)}
                                      for i in range(min(2, len(texts[d])))] for d in DOMAINS}
            report["runs"].append(run)
            if progress:
                print(f"T={temperature} {v.name:<28} tau={run['tau']} equal={run['greedy_equal_to_ar']} "
                      f"({wall:.0f} s)", flush=True)
    if throughput is not None:
        engines.clear()
        texts = eval_prompts(data_dir, throughput.per_domain)
        ids = [tok.encode(t).ids[-max_prompt_tokens:] for d in DOMAINS for t in texts[d]]
        report["throughput"] = measure_throughput(model_dir, target, ids, throughput, progress)
    return report


def measure_throughput(model_dir: Path, target: Transformer, prompts: list[list[int]], spec: Throughput,
                       progress: bool) -> dict:
    """Output tokens/s per variant and concurrency (`bench.compare`). Every engine has the same slots and
    length, so they can share the target's cache."""
    slots = max(spec.concurrencies)
    engines: dict[tuple, Engine] = {}
    contenders = []
    for v in [Variant(REFERENCE_MODE)] + [v for v in spec.variants if v.mode != REFERENCE_MODE]:
        key = (v.drafter, v.block_size)
        if key not in engines:
            engines[key] = engine_for(model_dir, target, v, prompts, spec.max_tokens, slots)
        contenders.append(Contender(v.name, v.mode, engines[key]))
    rows, _ = compare(contenders, prompts, [None] * len(prompts), spec.concurrencies, spec.max_tokens,
                      SamplingParams(), progress, label="variant")
    return {"max_tokens": spec.max_tokens, "prompts": len(prompts), "rows": rows}


def _repetition(seqs: list[Sequence], max_tokens: int) -> dict:
    full = [s for s in seqs if len(s.output) == max_tokens]
    return {"outputs": len(seqs), "reached_max_tokens": len(full),
            "repetitive_share": round(sum(is_repetitive(s.output) for s in seqs) / len(seqs), 3)}


def command_line(model_dir: Path, data_dir: Path, variants: list[Variant], per_domain: int, max_tokens: int,
                 temperatures: list[float], concurrency: int, max_prompt_tokens: int, seed: int,
                 throughput: Throughput | None, place: Placement) -> str:
    """The `adaflash evaluate` command that runs exactly this evaluation (every option spelled out)."""
    def names(vs: list[Variant]) -> str:
        return ",".join(v.name for v in vs)

    parts = ["adaflash evaluate", f"--model-dir {model_dir}", f"--data {data_dir}", f"--per-domain {per_domain}",
             f"--max-tokens {max_tokens}", "--temperatures " + ",".join(f"{t:g}" for t in temperatures),
             f"--concurrency {concurrency}", f"--max-prompt-tokens {max_prompt_tokens}", f"--seed {seed}",
             f"--variants {names(variants)}"]
    if throughput is not None:
        parts += [f"--throughput-variants {names(throughput.variants)}",
                  "--throughput-concurrency " + ",".join(map(str, throughput.concurrencies)),
                  f"--throughput-max-tokens {throughput.max_tokens}",
                  f"--throughput-per-domain {throughput.per_domain}"]
    parts += [f"--device {place.device}", f"--dtype {place.dtype_name}"]
    return " ".join(parts)


def run_meta(command: str, place: Placement) -> dict:
    """What benchmarks/results.py requires of a record: the command, the machine, the commit and the date."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    device = torch.cuda.get_device_name(place.device) if place.device.type == "cuda" else "CPU"
    machine = (f"{cpu}, {os.cpu_count()} cores, {device}, torch {torch.__version__}, {place.dtype_name}, "
               f"{torch.get_num_threads()} threads")
    return {"command": command, "machine": machine, "commit": _commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat()}


def _commit() -> str:
    """This checkout's commit (`with uncommitted changes` when tracked files differ from it), else `unknown`."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=here, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes" if dirty else "")


def parse_variants(text: str, default_drafter: str) -> list[Variant]:
    """'ngram,dflash,dflash@8,dflash:drafter-x@16' -> variants (drafter defaults to `default_drafter`)."""
    out = []
    for item in split_csv(text):
        head, _, block = item.partition("@")
        mode, _, drafter = head.partition(":")
        needs = parse_mode(mode).drafter is not None
        out.append(Variant(mode, (drafter or default_drafter) if needs else None,
                           int(block) if block and needs else None))
    return out
