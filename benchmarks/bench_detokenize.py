"""Detokenisation cost of one streamed output: decoding the whole output for every response (the rule
before) against `Detokenizer`'s window, with one response per token; both texts must be equal.

    .venv/bin/python benchmarks/bench_detokenize.py --tokens 2000 [--json bench-out/detokenize.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash.evaluation.prompts import PACKAGED_DATA
from adaflash.models.tokenizer import load_tokenizer
from adaflash.serving.api import REPLACEMENT, Detokenizer


def whole_output_delta(tokenizer, ids: list[int], sent_len: int, final: bool) -> str:
    def stable(text: str, final: bool) -> str:
        return text if final else text.rstrip(REPLACEMENT)

    before = stable(tokenizer.decode(ids[:sent_len]), False) if sent_len else ""
    return stable(tokenizer.decode(ids), final)[len(before):]


def stream(delta, ids: list[int]) -> tuple[str, float]:
    start = time.perf_counter()
    text = "".join(delta(ids[:n], n - 1, n == len(ids)) for n in range(1, len(ids) + 1))
    return text, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer-dir", default=str(DEFAULT_MODEL_DIR / "target"))
    p.add_argument("--text", default=str(PACKAGED_DATA / "README.md"),
                   help="a file whose tokens stand in for an output (default: prose, the packaged data's README)")
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer_dir)
    ids = []
    with open(args.text) as f:
        text = f.read()
    while len(ids) < args.tokens:
        ids += tokenizer.encode(text).ids
    ids = ids[:args.tokens]
    whole, whole_s = stream(lambda i, s, f: whole_output_delta(tokenizer, i, s, f), ids)
    windowed, windowed_s = stream(Detokenizer(tokenizer).delta, ids)
    result = {"tokens": len(ids), "whole_output_s": round(whole_s, 4), "windowed_s": round(windowed_s, 4),
              "speedup": round(whole_s / windowed_s, 1), "texts_equal": whole == windowed}
    print(json.dumps(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["texts_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
