"""One-off A/B of end-to-end decoding on CUDA (old vs new core by PYTHONPATH); not part of the project."""

import hashlib
import json
import sys
import time
from pathlib import Path
import adaflash
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, read_jsonl
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
from adaflash.models.placement import placement

label, out = sys.argv[1], Path(sys.argv[2])
dev = sys.argv[3] if len(sys.argv) > 3 else "cuda"
place = placement(dev, "float32")
bundle = load_bundle(Path("models/default"), place=place)
texts = read_jsonl(Path(".gpudata/data/eval/humaneval.jsonl"))[:16]
ids = encode_prompts(bundle.tokenizer, texts, 512)
max_len = context_length([len(i) for i in ids], 64, block_size_of(bundle.drafter))
engine = Engine(bundle.target, bundle.drafter, num_slots=8, max_len=max_len)
rows = []
for c, n in ((8, 16), (1, 8)):
    for mode in ("ar", "ngram", "adaflash"):
        tps, outs = [], None
        for r in range(3):
            place.synchronize()
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, 64, mode=mode) for i in ids[:n]], concurrency=c)
            place.synchronize()
            w = time.perf_counter() - t0
            outs = [s.output for s in seqs]
            if r:
                tps.append(sum(map(len, outs)) / w)
        digest = hashlib.sha1(json.dumps(outs).encode()).hexdigest()[:10]
        rows.append({"core": label, "c": c, "mode": mode, "tok_s": [round(t, 1) for t in tps], "outputs": digest})
        print(label, c, mode, rows[-1]["tok_s"], digest, flush=True)
out.write_text(json.dumps({"core": label, "path": adaflash.__file__, "rows": rows}, indent=1))
