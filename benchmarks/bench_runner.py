"""Time the lean target runner against Hugging Face transformers on the steps the engine issues most.

Why: `adaflash.models.target.Transformer` exists so that a decode step (1 new token) and a verify step
(k+1 new tokens) against a warm KV cache cost less than the general-purpose transformers forward.
This script measures both on the same checkpoint and the same inputs (fp32, CPU, default torch
threads) and checks that they return the same logits, so a speedup cannot come from computing
something else. Every repetition sees the same cached context: after each timed call the new
tokens are rolled back (runner: `cache.truncate`, transformers: `DynamicCache.crop`), outside
the timed region, and the two take turns run by run so that background load hits both alike.

    python benchmarks/bench_runner.py --json bench-out/runner-vs-transformers.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from torch import Tensor
from transformers import AutoModelForCausalLM, DynamicCache, Qwen3Config, Qwen3ForCausalLM

from adaflash.models.target import Transformer

# Shape of the project's planned default target model.
DEFAULT_SHAPE = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    tie_word_embeddings=False,
)
WARMUP = 2
MAX_LOGIT_DIFF = 1e-3


@dataclass
class Case:
    name: str
    batch: int
    new_tokens: int


CASES = [Case("decode", 1, 1), Case("decode", 32, 1), Case("verify", 1, 16), Case("verify", 32, 16)]


@dataclass
class Result:
    name: str
    batch: int
    new_tokens: int
    runner_ms: float
    transformers_ms: float
    speedup: float
    max_abs_logit_diff: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, help="existing Hugging Face checkpoint (default: a random Qwen3 one)")
    p.add_argument("--context", type=int, default=256, help="tokens already in the KV cache")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions per case (median reported)")
    p.add_argument("--json", type=Path, help="write the results here")
    return p.parse_args(argv)


def save_random_checkpoint(path: Path) -> None:
    """A seed-0 random Qwen3 with the default target's shape: speed depends on shape, not on weights."""
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**DEFAULT_SHAPE)).save_pretrained(path)


def checkpoint_shape(runner: Transformer) -> dict:
    cfg = runner.config
    return {key: getattr(cfg, key) for key in DEFAULT_SHAPE}


@dataclass
class Contender:
    """One implementation primed with a cached context: `step` is the timed forward, `reset` rolls it back."""

    step: Callable[[], Tensor]  # returns logits [B*n, vocab]
    reset: Callable[[], None]


def prime_runner(runner: Transformer, contexts: Tensor, new: Tensor) -> Contender:
    """Prefill one slot per sequence; each step appends the new tokens with `forward`."""
    batch, context = contexts.shape
    cache = runner.new_cache(num_slots=batch, max_len=context + new.shape[1])
    slots = list(range(batch))
    runner.forward(cache, slots, contexts.tolist())
    new_tokens = new.tolist()

    def step() -> Tensor:
        return runner.forward(cache, slots, new_tokens).logits

    def reset() -> None:
        for slot in slots:
            cache.truncate(slot, context)

    return Contender(step, reset)


def prime_transformers(model: torch.nn.Module, contexts: Tensor, new: Tensor) -> Contender:
    """Prefill a DynamicCache once; each step runs the model on the new tokens.

    `cache=` is the transformers 5 name of `past_key_values`.
    """
    batch, context = contexts.shape
    cache = DynamicCache(config=model.config)
    model(contexts, cache=cache, use_cache=True)

    def step() -> Tensor:
        return model(new, cache=cache, use_cache=True).logits.reshape(batch * new.shape[1], -1)

    def reset() -> None:
        cache.crop(-new.shape[1])  # transformers 5: a negative count of tokens to drop
        assert cache.get_seq_length() == context

    return Contender(step, reset)


def median_ms(contenders: list[Contender], reps: int) -> list[tuple[float, Tensor]]:
    """Median wall time of each contender's `step` over `reps` runs after `WARMUP` runs, and its last logits.

    The contenders take turns run by run, so that load from other processes falls on both alike.
    """
    times: list[list[float]] = [[] for _ in contenders]
    last: list[Tensor] = []
    for i in range(WARMUP + reps):
        last = []
        for c, ms in zip(contenders, times):
            start = time.perf_counter()
            last.append(c.step())
            elapsed = time.perf_counter() - start
            c.reset()
            if i >= WARMUP:
                ms.append(elapsed * 1e3)
    return [(statistics.median(ms), out) for ms, out in zip(times, last)]


def run_case(case: Case, runner: Transformer, hf: torch.nn.Module, context: int, reps: int) -> Result:
    g = torch.Generator().manual_seed(1)
    vocab = runner.config.vocab_size
    contexts = torch.randint(0, vocab, (case.batch, context), generator=g)
    new = torch.randint(0, vocab, (case.batch, case.new_tokens), generator=g)
    contenders = [prime_runner(runner, contexts, new), prime_transformers(hf, contexts, new)]
    (runner_ms, runner_logits), (hf_ms, hf_logits) = median_ms(contenders, reps)
    diff = (runner_logits - hf_logits).abs().max().item()
    return Result(case.name, case.batch, case.new_tokens, runner_ms, hf_ms, hf_ms / runner_ms, diff)


def print_table(results: list[Result]) -> None:
    print(f"{'case':<8}{'batch':>6}{'new':>5}{'runner ms':>12}{'hf ms':>10}{'speedup':>9}{'max|dlogit|':>13}")
    for r in results:
        print(
            f"{r.name:<8}{r.batch:>6}{r.new_tokens:>5}{r.runner_ms:>12.2f}{r.transformers_ms:>10.2f}"
            f"{r.speedup:>9.2f}{r.max_abs_logit_diff:>13.2e}"
        )


def benchmark(model_dir: Path, context: int, reps: int) -> dict:
    runner = Transformer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), transformers {transformers.__version__} "
        f"(attention: {hf.config._attn_implementation}), context {context}, median of {reps}"
    )
    with torch.inference_mode():
        results = [run_case(case, runner, hf, context, reps) for case in CASES]
    print_table(results)
    return {
        "checkpoint": checkpoint_shape(runner),
        "context": context,
        "cases": [asdict(r) for r in results],
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model_dir is not None:
        report = benchmark(args.model_dir, args.context, args.reps)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            save_random_checkpoint(Path(tmp))
            report = benchmark(Path(tmp), args.context, args.reps)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    worst = max(case["max_abs_logit_diff"] for case in report["cases"])
    if worst > MAX_LOGIT_DIFF:
        print(f"FAIL: runner logits differ from transformers by {worst:.2e} > {MAX_LOGIT_DIFF:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
