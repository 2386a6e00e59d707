import time
import sys
from pathlib import Path
from collections import defaultdict
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, read_jsonl
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of

b = load_bundle(Path("models/default"))
dom, c = sys.argv[1], int(sys.argv[2])
texts = read_jsonl(Path(f"../shared/data/eval/heldout_{dom}.jsonl"))[:64]
ids = encode_prompts(b.tokenizer, texts, 400)
eng = Engine(
    b.target, b.drafter, num_slots=c, max_len=context_length([len(i) for i in ids], 96, block_size_of(b.drafter))
)
gate = eng.scheduler.gate
log = []
obs0 = gate.observe


def observe(arm, tokens, ms):
    log.append(
        (
            len([s for s in eng.scheduler.running.values() if not s.finished]).bit_length(),
            arm.value,
            gate.arm.value,
            gate._warmup,
            tokens,
            ms,
        )
    )
    return obs0(arm, tokens, ms)


gate.observe = observe
for r in range(3):
    log.clear()
    t0 = time.perf_counter()
    seqs = eng.generate([Request(i, 96, mode="adaflash") for i in ids], concurrency=c)
    wall = (time.perf_counter() - t0) * 1000
    tot = defaultdict(lambda: [0, 0.0, 0])
    for bucket, arm, cur, warm, tok, ms in log:
        key = (bucket, arm, "warmup" if (warm and arm == cur) else "measured")
        tot[key][0] += tok
        tot[key][1] += ms
        tot[key][2] += 1
    print("round", r, "wall ms %.0f" % wall, "observed ms %.0f" % sum(x[5] for x in log))
    for k in sorted(tot):
        t, ms, n = tot[k]
        print("  ", k, "calls", n, "tokens", t, "ms %.0f" % ms, "rate %.3f" % (t / ms if ms else 0))
