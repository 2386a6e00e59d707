"""`adaflash serve`: build the model repository for a model folder, start Triton, say how to call it.

Without a model folder it serves `models/default` when that exists, otherwise the seeded
tiny random models (and says so), so a fresh clone serves something at once.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from pathlib import Path

from adaflash_server.launcher import ServerConfig, TritonServer
from adaflash_server.repository import RepositoryConfig, build_repository, tiny_model_dir

DEFAULT_MODELS = Path("models/default")


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model-dir", type=Path, help=f"folder with target/ and drafters (default: {DEFAULT_MODELS})")
    src.add_argument("--tiny-random", action="store_true", help="serve seeded tiny random models")
    p.add_argument("--drafter", default="drafter", help="drafter folder name in the model folder ('' for none)")
    p.add_argument("--state-dir", type=Path, default=Path(".serve"), help="generated repository, logs, tiny models")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--cost-table", type=Path, help="reuse a measured verify/draft cost table (JSON)")
    for f in fields(RepositoryConfig):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)


def _model_dir(args: argparse.Namespace) -> Path:
    if args.model_dir:
        return args.model_dir
    if not args.tiny_random and (DEFAULT_MODELS / "target" / "config.json").exists():
        return DEFAULT_MODELS
    if not args.tiny_random:
        print(f"{DEFAULT_MODELS} does not exist yet: serving the seeded tiny random models instead "
              "(their text is noise; use --model-dir for real models)", flush=True)
    return tiny_model_dir(args.state_dir)


def run(args: argparse.Namespace) -> int:
    model_dir = _model_dir(args)
    cfg = RepositoryConfig(**{k: getattr(args, k) for k in asdict(RepositoryConfig())})
    print(f"building the model repository for {model_dir} (measuring this machine's verify costs)", flush=True)
    repo = build_repository(args.state_dir / "model_repository", model_dir, args.drafter or None, cfg, args.cost_table)
    server = TritonServer(ServerConfig(model_repository=repo, grpc_port=args.grpc_port, http_port=args.http_port,
                                       metrics_port=args.metrics_port, state_dir=args.state_dir / "server"))
    server.start()
    print(f"""
Triton is serving the `adaflash` ensemble (log: {server.log_path})
  gRPC     {server.grpc_url}
  metrics  {server.metrics_url}
Try:
  .venv/bin/adaflash-client "def fibonacci(n):" --url {server.grpc_url} --stream --max-tokens 64 --spec-mode {cfg.default_spec_mode}
Ctrl-C stops the server.""", flush=True)
    return server.wait()
