"""`adaflash plan-memory`: the memory arithmetic of a model folder's target and drafter (`models/memory.py`).

Only the config.json files are read, never the weights, so a folder of configs is enough: a GPU deployment can
be sized before its checkpoints are downloaded or a GPU is at hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from adaflash.cli_args import DEFAULT_MODEL_DIR, byte_size
from adaflash.models.checkpoint import read_config
from adaflash.models.drafter import DrafterConfig
from adaflash.models.memory import (MemoryPlan, cache_bytes_for, device_cache_budget, gib, plan_memory,
                                    slots_for_budget, tokens_for_budget)
from adaflash.models.placement import DTYPES
from adaflash.models.target import TargetConfig

def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def add_plan_memory(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan-memory", help="weights, caches and the slots a memory budget holds, from config.json")
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR,
                   help="folder with target/ and drafter folders; only their config.json files are read")
    p.add_argument("--drafter", default="drafter", help="drafter folder name inside --model-dir ('' for none)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--device-memory", type=byte_size,
                        help="the device's memory (e.g. 139GiB): the caches get --memory-fraction of it, less the "
                             "weights and activations")
    budget.add_argument("--kv-cache-memory", type=byte_size, help="bytes for the target KV and drafter context")
    p.add_argument("--memory-fraction", type=_fraction, default=0.9, help="share of --device-memory to use")
    p.add_argument("--slots", type=_positive, default=64, help="sequences at once (the repository's max_active)")
    p.add_argument("--max-len", type=_positive, default=2048, help="tokens per sequence (the repository's max_len)")
    p.add_argument("--prefill-tokens", type=_positive, default=4096,
                   help="prompt tokens one step prefills at most (the scheduler's budget), for the activations")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=cmd_plan_memory)


def read_plan(model_dir: Path, drafter: str, dtype: str, slots: int, max_len: int, prefill_tokens: int) -> MemoryPlan:
    for folder in ["target", drafter] if drafter else ["target"]:
        if not (model_dir / folder / "config.json").is_file():
            raise FileNotFoundError(f"{model_dir / folder / 'config.json'} not found")
    target = TargetConfig.from_hf(read_config(model_dir / "target"))
    draft = DrafterConfig.from_hf(read_config(model_dir / drafter)) if drafter else None
    return plan_memory(target, draft, dtype, slots, max_len, prefill_tokens)


def _budget(args: argparse.Namespace, plan: MemoryPlan) -> dict | None:
    """The cache budget the options give, with how it was reached; ValueError names the option at fault."""
    if args.kv_cache_memory is not None:
        budget, source = args.kv_cache_memory, f"--kv-cache-memory {gib(args.kv_cache_memory)}"
    elif args.device_memory is not None:
        try:
            budget = device_cache_budget(plan, args.device_memory, args.memory_fraction)
        except ValueError as exc:
            raise ValueError(f"--device-memory: {exc}") from None
        source = (f"{args.memory_fraction:g} x --device-memory {gib(args.device_memory)} - weights - activations")
    else:
        return None
    tokens, slots = tokens_for_budget(plan, budget), slots_for_budget(plan, budget)
    if slots < 1:
        option = "--kv-cache-memory" if args.kv_cache_memory is not None else "--device-memory"
        raise ValueError(f"{option}: {budget:,} bytes for the caches hold {tokens:,} tokens, less than one sequence of "
                         f"--max-len {plan.max_len:,}")
    return {"source": source, "bytes": budget, "tokens": tokens, "slots": slots}


def report(plan: MemoryPlan, budget: dict | None) -> dict:
    """Everything the table shows, in bytes and parameter counts."""
    tokens = plan.slots * plan.max_len
    return {
        "dtype": plan.dtype, "bytes_per_element": plan.itemsize, "slots": plan.slots, "max_len": plan.max_len,
        "parameters": {"target": {**plan.target_parameters, "total": sum(plan.target_parameters.values())},
                       "drafter": {**plan.drafter_parameters, "total": sum(plan.drafter_parameters.values())},
                       "token_heads": plan.token_heads_parameters},
        "weights": {"target_model": plan.target_weight_bytes, "drafter_model": plan.drafter_model_weight_bytes,
                    "total": plan.weight_bytes},
        "per_token": {"target_kv": plan.target_kv_per_token, "drafter_context": plan.drafter_context_per_token,
                      "caches": plan.cache_bytes_per_token, "features": plan.features_per_token},
        "caches": {"target_kv": tokens * plan.target_kv_per_token,
                   "drafter_context": tokens * plan.drafter_context_per_token, "total": cache_bytes_for(plan, tokens)},
        "activations": plan.activation_bytes,
        "total": plan.total_bytes,
        "budget": budget,
    }


def _row(label: str, params: int | None, n: int, in_gib: bool = True) -> str:
    count = "" if params is None else f"{params:,}"
    return f"  {label:<44}{count:>16}{n:>18,}" + (f"{n / 2**30:>10.2f}" if in_gib else "")


def table(plan: MemoryPlan, budget: dict | None) -> str:
    r, size = report(plan, budget), plan.itemsize
    lines = [f"{'':<46}{'parameters':>16}{'bytes':>18}{'GiB':>10}", f"weights ({plan.dtype}, {size} bytes each)"]
    lines += [_row(f"target: {part}", n, n * size) for part, n in plan.target_parameters.items()]
    lines.append(_row("target model (one copy of the target)", r["parameters"]["target"]["total"],
                      plan.target_weight_bytes))
    if plan.drafter_parameters:
        lines += [_row(f"drafter: {part}", n, n * size) for part, n in plan.drafter_parameters.items()]
        lines.append(_row("drafter: target's embed_tokens + lm_head", plan.token_heads_parameters,
                          plan.token_heads_parameters * size))
        lines.append(_row("drafter model", plan.drafter_model_weight_bytes // size, plan.drafter_model_weight_bytes))
    lines.append(_row("weights, total", plan.weight_bytes // size, plan.weight_bytes))
    lines.append("per token (bytes)")
    lines.append(_row("target KV", None, plan.target_kv_per_token, in_gib=False))
    if plan.drafter_parameters:
        lines.append(_row("drafter context", None, plan.drafter_context_per_token, in_gib=False))
        lines.append(_row("features target -> drafter (each hop)", None, plan.features_per_token, in_gib=False))
    lines.append(f"caches allocated up front: {plan.slots:,} slots x {plan.max_len:,} tokens")
    lines.append(_row("target KV", None, r["caches"]["target_kv"]))
    if plan.drafter_parameters:
        lines.append(_row("drafter context", None, r["caches"]["drafter_context"]))
    lines.append(_row("activations (estimate from shapes)", None, plan.activation_bytes))
    lines.append(_row("weights + caches + activations", None, plan.total_bytes))
    if budget is not None:
        lines.append(f"cache budget: {budget['source']}")
        lines.append(_row("bytes for the caches", None, budget["bytes"]))
        lines.append(f"  tokens that fit: {budget['tokens']:,}; slots of {plan.max_len:,} tokens: {budget['slots']:,}")
    return "\n".join(lines)


def cmd_plan_memory(args: argparse.Namespace) -> int:
    try:
        plan = read_plan(args.model_dir, args.drafter, args.dtype, args.slots, args.max_len, args.prefill_tokens)
        budget = _budget(args, plan)
    except (FileNotFoundError, ValueError) as exc:
        print(f"adaflash plan-memory: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report(plan, budget), indent=1) if args.json else table(plan, budget))
    return 0
