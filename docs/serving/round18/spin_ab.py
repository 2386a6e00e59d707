"""One-off A/B: the served target's OpenMP spin count, bench_grpc's rounds with a server per setting."""
import argparse, asyncio, json, os, sys, tempfile
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
import bench_grpc as B
import adaflash.serving.threads as T
from adaflash.decoding.engine import Engine
from adaflash.evaluation.prompts import load_prompts
from adaflash.models.bundle import load_bundle
from adaflash_build.repository import build_repository
from adaflash_server.launcher import ServerConfig, TritonServer

spins = [int(s) for s in os.environ.get("SPINS", "3000,30000,300000").split(",")]
args = B.parse_args(["--model-dir", "models/default", "--concurrency", os.environ.get("CONC", "1,8,32,64"),
                     "--modes", os.environ.get("MODES", "ar,adaflash"), "--reps", os.environ.get("REPS", "3")])
prompts = [p.text[-B.PROMPT_CHARS:] for p in load_prompts(None, None)]
with tempfile.TemporaryDirectory() as tmp:
    work = Path(tmp)
    bundle = load_bundle(args.model_dir, "drafter")
    cost = B.measured_costs(bundle); cost.save(work / "cost.json")
    engine = Engine(bundle.target, bundle.drafter, num_slots=64, max_len=B.REPOSITORY.max_len, cost_model=cost)
    with ExitStack() as stack:
        servers = {}
        for s in spins:
            T.TARGET_SPIN_COUNT = s
            repo = build_repository(work / f"repo{s}", args.model_dir, "drafter", replace(B.REPOSITORY, target_in_orchestrator=True), work / "cost.json")
            servers[f"spin{s}"] = stack.enter_context(TritonServer(ServerConfig(model_repository=repo, state_dir=work / f"state{s}")))
        rows = asyncio.run(B.alternated_runs(servers, engine, bundle, prompts, args))
    B.print_table(rows)
    Path(os.environ["OUT"]).write_text(json.dumps({"spins": spins, "rows": rows}, indent=1) + "\n")
