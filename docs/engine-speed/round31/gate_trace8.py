"""Round 31: why the gate decodes broad translation at 8 sequences plainly while planning every step runs faster: every
block the gate ends (its load, arm, rate, the arms' running rates after it, the leader) with the calls it observed at
that load (milliseconds, tokens; `+n`: the drafter first appended n positions in that call; `w`: the unmeasured first
call after a change of arm), over three runs of the held-out translation prompts at 8 sequences.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round31/gate_trace8.py broad:translation 8
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import MAX_TOKENS, load  # noqa: E402

from adaflash.decoding import gate  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402


def main() -> None:
    cell = load(sys.argv[1])
    concurrency = int(sys.argv[2])
    engine = cell.engine()
    backend, the_gate = engine.backend, engine.scheduler.gate
    calls: dict[int, list[str]] = {}
    flushed = [0]
    original_flush, original_end, original_observe = backend.flush_context, gate._Load.end_block, the_gate.observe

    def flush(seqs):
        flushed[0] += sum(sum(p.shape[0] for p in s.pending_context) for s in seqs)
        original_flush(seqs)

    def observe(arm, tokens, ms):
        load = the_gate._load
        if load is not None and arm is load.arm and ms > 0:
            calls.setdefault(id(load), []).append(f"{ms:.1f}/{tokens}{'+' + str(flushed[0]) if flushed[0] else ''}"
                                                  f"{'w' if load.warmup else ''}")
        flushed[0] = 0
        original_observe(arm, tokens, ms)

    def end_block(self: gate._Load) -> None:
        arm, rate = self.arm, self.block.tokens / self.block.ms
        original_end(self)
        print(f"load {self.sequences:2d} {arm.value:5s} block {rate:.3f} tok/ms ({' '.join(calls.pop(id(self), []))})"
              f" -> rates {', '.join(f'{a.value} {r:.3f}' for a, r in self.rates.items() if r)} "
              f"lead {self.leading and self.leading.value}", flush=True)

    backend.flush_context, gate._Load.end_block, the_gate.observe = flush, end_block, observe
    for run in range(3):
        print(f"== run {run}", flush=True)
        engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in cell.ids], concurrency=concurrency)


if __name__ == "__main__":
    main()
