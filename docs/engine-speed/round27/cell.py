"""Round 27's records share this: one domain's shared prompts (bench_gate's template and 400-token cut, 96 new
tokens), engines sized for them, and a run's tokens per second. Run as scripts, the records import it from their
own folder."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models.bundle import Bundle, load_bundle
from adaflash.models.drafter import block_size_of

MAX_TOKENS = 96


@dataclass
class Cell:
    bundle: Bundle
    ids: list[list[int]]  # the prompts' tokens
    max_len: int

    def engine(self) -> Engine:
        return Engine(self.bundle.target, self.bundle.drafter, num_slots=64, max_len=self.max_len)

    def tokens_per_s(self, engine: Engine, mode: str, concurrency: int) -> float:
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in self.ids], concurrency=concurrency)
        return sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)


def load_cell(domain: str, per_domain: int = 64) -> Cell:
    bundle = load_bundle(Path("models/default"))
    prompts = eval_set_prompts(Path("../shared/data"), per_domain, training_template=True)
    ids = encode_prompts(bundle.tokenizer, [p for p in prompts if p.domain == domain], 400, None)
    return Cell(bundle, ids, context_length([len(i) for i in ids], MAX_TOKENS, block_size_of(bundle.drafter)))
