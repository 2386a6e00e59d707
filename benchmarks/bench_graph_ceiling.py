"""How fast a decode step's layers could run on a GPU without the host: the real forward, the same layers with
every index already on the device, and those layers replayed as one CUDA graph. Why: a small model's step on a
GPU is bound by the host issuing operations (docs/history.md, round 22), and whether graphed steps are worth
building depends on what a replay costs against the eager forward. A ceiling, not a decoder: every call
rewrites the same cache positions.

    PYTHONPATH=python_backend python benchmarks/bench_graph_ceiling.py OUT.json [--sequences 1,8,32 --context 300]

On a machine without CUDA it runs the eager parts only (so that it is checked before it is carried to a GPU).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from adaflash.cli_args import csv_list
from adaflash.models.bundle import load_bundle
from adaflash.models.placement import placement
from adaflash.models.target import ForwardBatch

REPEATS = 50


def timed(fn, sync, repeats: int = REPEATS) -> float:
    """Milliseconds per call of `fn`, `repeats` calls after five unmeasured."""
    for _ in range(5):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1000 / repeats


def probe(model_dir: Path, device: str, dtype: str, sequences: int, context: int, repeats: int = REPEATS) -> dict:
    place = placement(device, dtype)
    target = load_bundle(model_dir, place=place).target
    cuda = place.device.type == "cuda"
    sync = place.synchronize
    slots = list(range(sequences))
    cache = target.new_cache(sequences, context + 64)
    target.forward(cache, slots, [list(range(100, 100 + context))] * sequences)

    def full_forward() -> None:  # the real call: host-built indices, then the layers and the LM head
        target.forward(cache, slots, [[5]] * sequences).logits.argmax(-1)
        for s in slots:
            cache.truncate(s, context)

    for s in slots:
        cache.reserve(s, context + 1)
    fb = ForwardBatch.build(cache, slots, [context] * sequences, [1] * sequences, place.device)
    ids = torch.full((sequences,), 5, dtype=torch.long, device=place.device)

    def layers() -> torch.Tensor:  # the device's part alone, every index already on the device
        return target.forward_batch(fb, ids, cache).logits

    row = {"device": str(place.device), "dtype": dtype, "sequences": sequences, "context": context}
    with torch.inference_mode():
        row["full_forward_ms"] = round(timed(full_forward, sync, repeats), 4)
        row["layers_eager_ms"] = round(timed(layers, sync, repeats), 4)
        eager = layers().clone()
        if cuda:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    layers()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = layers()
            graph.replay()
            sync()
            row["graph_equal_to_eager"] = bool(torch.equal(out, eager))
            row["graph_max_abs_diff"] = float((out.float() - eager.float()).abs().max())
            row["layers_graph_ms"] = round(timed(graph.replay, sync, repeats), 4)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", type=Path, help="write the rows here")
    p.add_argument("--model-dir", type=Path, default=Path("models/default"), help="holds target/")
    p.add_argument("--sequences", type=csv_list(int), default=[1, 8, 32], help="batch sizes, one probe each")
    p.add_argument("--context", type=int, default=300, help="cached positions per sequence")
    p.add_argument("--repeats", type=int, default=REPEATS, help="timed calls per figure")
    args = p.parse_args(argv)
    out = args.json
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for dtype in ("float32", "bfloat16") if device == "cuda" else ("float32",):
        for sequences in args.sequences:
            try:
                rows.append(probe(args.model_dir, device, dtype, sequences, args.context, args.repeats))
            except Exception as exc:  # a failed capture is a finding: report it and go on
                rows.append({"dtype": dtype, "sequences": sequences, "error": f"{type(exc).__name__}: {exc}"})
            print(rows[-1], flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
