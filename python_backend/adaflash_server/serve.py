"""`adaflash serve`: build the model repository for a model folder, start Triton, say how to call it.

Without a model folder it serves `models/default` when that exists, otherwise the seeded
tiny random models (and says so), so a fresh clone serves something at once.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from pathlib import Path

from adaflash_server.launcher import ServerConfig, TritonServer
from adaflash_build.repository import (RepositoryConfig, build_repository, drafter_models, publish_drafter,
                                        tiny_model_dir)

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
Swap in another drafter without a restart (running requests finish on the old one):
  .venv/bin/adaflash publish-drafter <drafter folder> --repository {repo} --url {server.grpc_url}
Ctrl-C stops the server.""", flush=True)
    return server.wait()


def add_publish_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("drafter_dir", type=Path, help="drafter folder (published format) to serve from now on")
    p.add_argument("--repository", type=Path, default=Path(".serve/model_repository"),
                   help="the running server's model repository (default: the one `adaflash serve` builds)")
    p.add_argument("--url", default="127.0.0.1:8001", help="the running server's gRPC address")


def publish(args: argparse.Namespace) -> int:
    """Write the drafter as a new drafter model, have Triton load it and wait until it serves; then unload
    drafters older than the one it replaces (requests still on those finish as plain decoding)."""
    import tritonclient.grpc as grpcclient

    name = publish_drafter(args.repository, args.drafter_dir)
    client = grpcclient.InferenceServerClient(args.url)
    client.load_model(name)
    if not client.is_model_ready(name):
        print(f"{name} was written but is not ready; see the server log", flush=True)
        return 1
    for old in drafter_models(args.repository)[:-2]:
        client.unload_model(old)
    print(f"{name} ({args.drafter_dir}) serves new requests; running ones finish on the drafter they started with",
          flush=True)
    return 0
