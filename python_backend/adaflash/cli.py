"""`adaflash` command line.

The core's commands: `generate` (one completion), `bench` (modes x concurrencies in process),
`evaluate` (quality and speed of the models on the evaluation sets), `plan-memory` (memory arithmetic from
config.json files). Commands of the other
packages register through the `adaflash.commands` entry points (`serve` and `publish-drafter`
from adaflash_server, `sweep` from adaflash_tools), so the core imports neither; one whose
optional extra is not installed is left out.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib.metadata import entry_points
from pathlib import Path

import torch

from adaflash.cli_args import DEFAULT_MODEL_DIR, add_placement_args, csv_list, json_object, positive_int
from adaflash.cli_memory import add_plan_memory
from adaflash.decoding.engine import Engine
from adaflash_contract.modes import MODE_NAMES, parse_mode
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request, context_length, tau
from adaflash.evaluation.bench import is_wrong, run_bench
from adaflash.evaluation.evaluate import Throughput, evaluate, parse_variants
from adaflash.evaluation.prompts import PACKAGED_DATA, SPLITS, encode_prompts, eval_set_prompts, load_prompts
from adaflash.models.bundle import Bundle, load_bundle, tiny_random_bundle
from adaflash.models.chat_template import ChatTemplate, load_chat_template
from adaflash.models.backends import DRAFTER_BACKENDS, on_backend
from adaflash.models.drafter import block_size_of
from adaflash.models.placement import Placement, placement


def _add_model_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-dir", type=Path, help="folder with target/ and drafter folders (Hugging Face format)")
    src.add_argument("--tiny-random", action="store_true", help="seeded tiny random target and drafter, in memory")
    p.add_argument("--drafter", default="drafter", help="drafter folder name inside --model-dir (default: drafter)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--drafter-backend", choices=DRAFTER_BACKENDS, default="torch",
                   help="what runs the drafter's block forward: torch, or onnx (ONNX Runtime on a graph exported at "
                        "load; CPU float32, the onnx extra)")
    add_placement_args(p)


def _placement(args: argparse.Namespace) -> Placement:
    try:
        return placement(args.device, args.dtype)
    except ValueError as exc:
        raise SystemExit(f"error: --{exc}") from None


def _bundle(args: argparse.Namespace, needs_drafter: bool) -> Bundle:
    if args.tiny_random:
        bundle = tiny_random_bundle(seed=args.seed, place=_placement(args))
    else:
        bundle = load_bundle(args.model_dir, args.drafter if needs_drafter else None, _placement(args))
    if needs_drafter:
        try:
            bundle.drafter = on_backend(bundle.drafter, bundle.target, args.drafter_backend)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
    return bundle


def _add_chat_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat", action="store_true",
                   help="each prompt as the one user message of a conversation in the target's chat template (its "
                        "tokenizer_config.json or chat_template.jinja): the text chat targets and their drafters "
                        "were trained on")
    p.add_argument("--chat-kwargs", type=json_object, default={},
                   help='with --chat: the template\'s switches, a JSON object (Qwen3: \'{"enable_thinking": false}\')')


def _chat_template(args: argparse.Namespace) -> ChatTemplate | None:
    """The target's chat template when --chat asks for it; exits naming the flag when the target has none."""
    if not args.chat:
        if args.chat_kwargs:
            raise SystemExit("error: --chat-kwargs: only read with --chat")
        return None
    chat = None if args.tiny_random else load_chat_template(args.model_dir / "target", **args.chat_kwargs)
    if chat is None:
        where = "the tiny random target" if args.tiny_random else str(args.model_dir / "target")
        raise SystemExit(f"error: --chat: {where} has no chat template (chat_template in tokenizer_config.json, "
                         "or chat_template.jinja)")
    return chat


def cmd_generate(args: argparse.Namespace) -> int:
    chat = _chat_template(args)
    bundle = _bundle(args, needs_drafter=parse_mode(args.mode).drafter is not None)
    ids = bundle.tokenizer.encode(args.prompt).ids if chat is None else chat.encode_user(bundle.tokenizer, args.prompt)
    engine = Engine(bundle.target, bundle.drafter, num_slots=1,
                    max_len=context_length([len(ids)], args.max_tokens, block_size_of(bundle.drafter)))
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    seq = engine.generate([Request(ids, args.max_tokens, mode=args.mode, sampling=sampling)])[0]
    text = bundle.tokenizer.decode(seq.output)
    stats = {
        "tokens": len(seq.output),
        "finish_reason": seq.finish_reason,
        "target_forwards": seq.target_forwards,
        "tau": tau(seq.steps, 4),
        "accepted_per_step": [st.accepted for st in seq.steps],
        "draft_len_per_step": [st.draft_len for st in seq.steps],
    }
    if args.json:
        print(json.dumps({"text": text, "token_ids": seq.output, "mode": args.mode, **stats}, ensure_ascii=False))
    else:
        print(text)
        print(f"[{args.mode}] tokens={stats['tokens']} forwards={stats['target_forwards']} tau={stats['tau']} "
              f"finish={stats['finish_reason']}", file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    needs_drafter = any(parse_mode(m).drafter is not None for m in args.modes)
    chat = _chat_template(args)
    bundle = _bundle(args, needs_drafter)
    if args.eval_data:
        prompts = eval_set_prompts(args.eval_data, args.per_domain, training_template=chat is None)
    else:
        prompts = load_prompts(args.prompts, args.num_prompts, args.split)
    if args.each_domain and all(p.domain is None for p in prompts):
        raise SystemExit("error: --each-domain: the prompts name no domain")
    ids = encode_prompts(bundle.tokenizer, prompts, args.max_prompt_tokens, chat)
    max_len = context_length([len(i) for i in ids], args.max_tokens, block_size_of(bundle.drafter))
    engine = Engine(bundle.target, bundle.drafter if needs_drafter else None, num_slots=max(args.concurrency),
                    max_len=max_len, copies=not args.no_copies, plan_gate=not args.no_plan_gate)
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    rows, ok = run_bench(engine, ids, [p.domain for p in prompts], args.modes, args.concurrency, args.max_tokens, sampling,
                         passes=args.passes, each_domain=args.each_domain, tie_tolerance=args.tie_tolerance)
    report = {
        "model": "tiny-random" if args.tiny_random else str(args.model_dir),
        "drafter": None if args.tiny_random else args.drafter,
        "drafter_backend": args.drafter_backend if needs_drafter else None,
        "num_prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "passes": args.passes,
        "each_domain": args.each_domain,
        "adaflash_copies": not args.no_copies,
        "adaflash_plan_gate": not args.no_plan_gate,
        "chat": chat is not None,
        "chat_kwargs": args.chat_kwargs,
        "temperature": args.temperature,
        "tie_tolerance": args.tie_tolerance,
        "device": str(engine.backend.place.device), "dtype": engine.backend.place.dtype_name,
        "machine": {"cpu_threads": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__},
        "cost_model_ms": engine.cost.to_json() if engine.cost else None,
        "rows": rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if not ok:
        bad = sorted({f"{r['mode']}@{r['concurrency']}" for r in rows if is_wrong(r)})
        print(f"error: greedy output differs from ar for {', '.join(bad)}; no speed reported for them", file=sys.stderr)
        return 1
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    variants = parse_variants(args.variants, args.drafter)
    throughput = None if not args.throughput_variants else Throughput(
        parse_variants(args.throughput_variants, args.drafter), args.throughput_concurrency, args.throughput_max_tokens,
        args.throughput_per_domain)
    report = evaluate(args.model_dir, args.data, variants, args.per_domain, args.max_tokens, args.temperatures,
                      args.concurrency, args.max_prompt_tokens, args.seed, throughput=throughput,
                      place=_placement(args))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    unequal = [r["variant"] for r in report["runs"] + report.get("throughput", {}).get("rows", [])
               if r["greedy_equal_to_ar"] is False]
    if unequal:
        print(f"error: greedy output differs from ar for {', '.join(unequal)}", file=sys.stderr)
        return 1
    return 0


def _add_plugins(sub: argparse._SubParsersAction) -> None:
    """The commands other packages register; one whose optional extra is missing fails to import and is left out."""
    for entry in entry_points(group="adaflash.commands"):
        try:
            register = entry.load()
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0].startswith("adaflash"):
                raise  # our own code is broken: say so instead of hiding the command
            continue  # an optional extra (serve, load) is not installed
        register(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adaflash", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate one completion and print it")
    _add_model_args(gen)
    gen.add_argument("--mode", choices=MODE_NAMES, default="adaflash")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--json", action="store_true", help="print one JSON object with text and statistics")
    _add_chat_args(gen)
    gen.set_defaults(func=cmd_generate)

    bench = sub.add_parser("bench", help="throughput, tau and greedy equality per mode and concurrency")
    _add_model_args(bench)
    bench.add_argument("--modes", type=csv_list(str, MODE_NAMES), default=["ar", "ngram", "dflash", "adaflash"])
    bench.add_argument("--concurrency", type=csv_list(int), default=[1, 8, 32])
    bench.add_argument("--prompts", type=Path, help="JSON lines with 'prompt' (and optional 'id', 'domain')")
    bench.add_argument("--num-prompts", type=int)
    bench.add_argument("--split", choices=SPLITS, help="only the prompts of this split (the broad mix has tune "
                                                       "and holdout rows: tune on tune, report holdout)")
    bench.add_argument("--eval-data", type=Path,
                       help="instead of --prompts: a data folder holding eval/ (python_backend/adaflash/data: the packaged "
                            "sample, 16 rows per set); its evaluation sets, --per-domain each")
    bench.add_argument("--per-domain", type=int, default=8)
    bench.add_argument("--max-prompt-tokens", type=int, default=512)
    bench.add_argument("--json", required=True, help="where to write the report")
    bench.add_argument("--passes", type=positive_int, default=1,
                       help="run every prompt this many times per mode (interleaved); the figures sum the passes")
    bench.add_argument("--each-domain", action="store_true",
                       help="run every domain as a workload of its own (rows per domain) instead of one mixed workload")
    bench.add_argument("--tie-tolerance", type=float, default=0.0,
                       help="greedy outputs may depart from ar's where the target's logits of the two tokens are "
                            "within this fraction of the largest logit (GPUs round a verify and a decode "
                            "differently: ~0.03 in bf16); 0 asks for equality")
    bench.add_argument("--no-copies", action="store_true",
                       help="adaflash drafts only with the drafter (no copies of the context): an ablation")
    bench.add_argument("--no-plan-gate", action="store_true",
                       help="adaflash plans every step, never decoding plainly for a while where planning loses "
                            "(decoding/gate.py): an ablation")
    _add_chat_args(bench)
    bench.set_defaults(func=cmd_bench)
    ev = sub.add_parser("evaluate", help="per-domain perplexity, repetition and tau of the models on the eval sets")
    ev.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    ev.add_argument("--data", type=Path, default=PACKAGED_DATA,
                    help="a data folder holding eval/ (default: the packaged sample, the first 16 rows of each "
                         "evaluation set; a full data folder of the same layout for more)")
    ev.add_argument("--drafter", default="drafter", help="drafter used by variants that name none")
    ev.add_argument("--variants", default="ngram,dflash,dflash@8",
                    help="comma list of mode[:drafter][@block_size]; ar always runs as the reference")
    ev.add_argument("--per-domain", type=int, default=10, help="prompts per domain")
    ev.add_argument("--max-tokens", type=int, default=256)
    ev.add_argument("--temperatures", type=csv_list(float), default=[0.0, 1.0])
    ev.add_argument("--concurrency", type=int, default=1)
    ev.add_argument("--max-prompt-tokens", type=int, default=512)
    ev.add_argument("--seed", type=int, default=0)
    add_placement_args(ev)
    ev.add_argument("--throughput-variants", default="",
                    help="also measure greedy speed of these variants (same syntax; e.g. "
                         "ngram,dflash:drafter-dflash,adaflash-published,adaflash)")
    ev.add_argument("--throughput-concurrency", type=csv_list(int), default=[1, 8, 32, 64])
    ev.add_argument("--throughput-max-tokens", type=int, default=128)
    ev.add_argument("--throughput-per-domain", type=int, default=16, help="prompts per domain for the speed runs")
    ev.add_argument("--json", default="bench-out/evaluate.json",
                    help="the report; benchmarks/results/quality.json is the committed one `make results` renders")
    ev.set_defaults(func=cmd_evaluate)
    add_plan_memory(sub)
    _add_plugins(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    conc = getattr(args, "concurrency", None)
    if conc is not None and min(conc if isinstance(conc, list) else [conc]) < 1:
        build_parser().error("--concurrency values must be >= 1")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
