"""Host profile of engine.generate on CUDA (one-off device diagnosis, not part of the project)."""

import cProfile
import pstats
import sys
import time
import io
import torch
from pathlib import Path
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, read_jsonl
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
from adaflash.models.placement import placement

out = Path(sys.argv[1])
place = placement("cuda", "float32")
bundle = load_bundle(Path("models/default"), place=place)
texts = read_jsonl(Path(".gpudata/data/eval/humaneval.jsonl"))[:16]
ids = encode_prompts(bundle.tokenizer, texts, 512)
max_len = context_length([len(i) for i in ids], 64, block_size_of(bundle.drafter))
engine = Engine(bundle.target, bundle.drafter, num_slots=8, max_len=max_len)


def run(mode, c):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    seqs = engine.generate([Request(i, 64, mode=mode) for i in ids], concurrency=c)
    torch.cuda.synchronize()
    w = time.perf_counter() - t0
    return sum(len(s.output) for s in seqs) / w


for mode in ("ar", "ngram", "adaflash"):
    for c in (1, 8):
        run(mode, c)
        print(mode, c, "tok/s", round(run(mode, c), 1), "threads", torch.get_num_threads(), flush=True)
n = torch.get_num_threads()
torch.set_num_threads(1)
print("ar 8 threads=1 tok/s", round(run("ar", 8), 1), flush=True)
torch.set_num_threads(n)
for mode in ("ar", "adaflash"):
    pr = cProfile.Profile()
    pr.enable()
    tps = run(mode, 8)
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumulative").print_stats(40)
    (out / f"cprof-{mode}-c8.txt").write_text(f"tok/s {tps}\n" + s.getvalue())
    print(mode, "profiled tok/s", round(tps, 1), flush=True)
