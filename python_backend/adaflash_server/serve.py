"""`adaflash serve`: build the model repository for a model folder, start Triton, say how to call it;
`adaflash publish-drafter`: hot-swap the drafter of a running server.

Without a model folder it serves `models/default` when that exists, otherwise the seeded
tiny random models (and says so), so a fresh clone serves something at once. Both commands
reach the `adaflash` CLI through the `adaflash.commands` entry points (`register`, `register_publish`).

The launcher lives as long as its server and runs no model, so nothing of its own imports torch: the repository is
built in a short-lived interpreter (`repository.build_apart`); tests/integration/test_resident_served.py holds its
modules to that.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path

from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash_contract.connection import add_connection_arguments, headers_from_args, tls_from_args
from adaflash_server.launcher import ServerConfig, TritonServer, connect
from adaflash_server.openai_front import DEFAULT_PORT as OPENAI_PORT
from adaflash_server.openai_front import FrontServer, add_body_limit_argument
from adaflash_server.repository import (
    RepositoryConfig,
    add_config_arguments,
    build_apart,
    build_repository,
    config_from_arguments,
    drafter_models,
    publish_drafter,
    tiny_model_dir,
)
from adaflash_server.security import (
    ServerTls,
    add_api_key_argument,
    add_tls_arguments,
    api_key_from_args,
    server_tls_from_args,
)


def register(sub: argparse._SubParsersAction) -> None:
    """The `adaflash serve` command (entry point `adaflash.commands`)."""
    p = sub.add_parser("serve", help="serve the models with Triton over gRPC (builds the model repository)")
    add_arguments(p)
    p.set_defaults(func=run)


def register_publish(sub: argparse._SubParsersAction) -> None:
    """The `adaflash publish-drafter` command (entry point `adaflash.commands`)."""
    p = sub.add_parser("publish-drafter", help="hot-swap the drafter of a running server: adds it as a new drafter "
                                                "model `drafter_<n>`, which serves new requests")
    add_publish_arguments(p)
    p.set_defaults(func=publish)


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model-dir", type=Path, help=f"folder with target/ and drafters (default: {DEFAULT_MODEL_DIR})")
    src.add_argument("--tiny-random", action="store_true", help="serve seeded tiny random models")
    p.add_argument("--drafter", default="drafter", help="drafter folder name in the model folder ('' for none)")
    p.add_argument("--state-dir", type=Path, default=Path(".serve"), help="generated repository, logs, tiny models")
    p.add_argument("--host", default=ServerConfig.host,
                   help="IPv4 address the ports bind to; 0.0.0.0: every interface (a container's published ports)")
    p.add_argument("--http-host", help="address of Triton's HTTP endpoint, which has no TLS (default: --host; with "
                                        "--tls-cert and a non-loopback --host it must be named)")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--openai-port", type=int, default=OPENAI_PORT,
                   help="the OpenAI-compatible HTTP endpoint (/v1/completions, /v1/chat/completions); 0: none")
    add_tls_arguments(p.add_argument_group("TLS on gRPC and the OpenAI endpoint"), own_clients=True)
    add_api_key_argument(p)
    add_body_limit_argument(p)
    p.add_argument("--cost-table", type=Path, help="reuse a measured verify/draft cost table (JSON)")
    p.add_argument("--drain-timeout-s", type=float, default=ServerConfig.drain_timeout_s,
                   help="on SIGTERM or Ctrl-C: stop admitting, let running requests finish for this long, then exit")
    add_config_arguments(p)


def model_dir_to_serve(model_dir: Path | None, tiny_random: bool) -> Path | None:
    """`model_dir` when given; else DEFAULT_MODEL_DIR when it holds a target; else None: the seeded tiny random
    models (written under the state folder), saying so unless they were asked for."""
    if model_dir:
        return model_dir
    if not tiny_random and (DEFAULT_MODEL_DIR / "target" / "config.json").exists():
        return DEFAULT_MODEL_DIR
    if not tiny_random:
        print(f"{DEFAULT_MODEL_DIR} does not exist yet: serving the seeded tiny random models instead "
              "(their text is noise; use --model-dir for real models)", file=sys.stderr, flush=True)
    return None


def run(args: argparse.Namespace) -> int:
    model_dir = model_dir_to_serve(args.model_dir, args.tiny_random)
    cfg = config_from_arguments(args)
    print(f"building the model repository for {model_dir or 'the seeded tiny random models'} (the target measures "
          "its verify costs when it starts)", flush=True)
    repo = build(args.state_dir, model_dir, args.drafter or None, cfg, args.cost_table)
    server = TritonServer(server_config(args, repo))
    server.start()
    api_key = api_key_from_args(args)
    front = _start_front(server, args.openai_port, api_key, args.max_request_bytes)
    tls = server.config.tls
    client = f"--url {server.grpc_url}{_client_flags(tls)}"
    openai = f"{front.url}{' (API key required)' if api_key else ''}" if front else "off (--openai-port 0)"
    print(f"""
Triton is serving the `adaflash` model (log: {server.log_path})
  gRPC     {server.grpc_url}{_tls_note(tls)}
  HTTP     {server.http_url} (Triton's own; no TLS)
  metrics  {server.metrics_url}
  OpenAI   {openai}
Try:
  .venv/bin/adaflash-client "def fibonacci(n):" {client} --stream --max-tokens 64 --spec-mode {cfg.default_spec_mode}
Swap in another drafter without a restart (running requests finish on the old one):
  .venv/bin/adaflash publish-drafter <drafter folder> --repository {repo} {client}
Ctrl-C stops the server.""", flush=True)
    try:
        return server.wait()
    finally:
        if front:
            front.stop()


def build(state_dir: Path, model_dir: Path | None, drafter: str | None, cfg: RepositoryConfig,
          cost_table: Path | None) -> Path:
    """The model repository under `state_dir` (on the tiny random models when `model_dir` is None): built apart
    (`build_apart`) so that torch stays out of the launcher, unless this process imported it already (the
    `adaflash` CLI's own imports), where building here costs nothing more and saves the apart interpreter's start."""
    out = state_dir / "model_repository"
    if "torch" not in sys.modules:
        return build_apart(out, model_dir, drafter, cfg, cost_table)[0]
    return build_repository(out, model_dir or tiny_model_dir(state_dir), drafter, cfg, cost_table)


def server_config(args: argparse.Namespace, repo: Path) -> ServerConfig:
    """Where `adaflash serve` listens: ports and address as given, so a container binding 0.0.0.0 is reachable
    through its published ports while a plain `make serve` stays on loopback; and with what TLS."""
    return ServerConfig(model_repository=repo, host=args.host, http_host=http_host(args), grpc_port=args.grpc_port,
                        http_port=args.http_port, metrics_port=args.metrics_port, tls=server_tls_from_args(args),
                        drain_timeout_s=args.drain_timeout_s, state_dir=args.state_dir / "server")


def http_host(args: argparse.Namespace) -> str:
    """Where Triton's HTTP endpoint binds. It has no TLS of its own, so with TLS asked for, a non-loopback --host
    does not take it along: --http-host has to name its address, so that plaintext inference never sits beside the
    TLS endpoints unasked (a demanding operator would rather be stopped than find out later)."""
    if args.http_host:
        return args.http_host
    if args.tls_cert is not None and not _is_loopback(args.host):
        raise SystemExit(f"error: Triton's HTTP endpoint has no TLS; with --tls-cert and --host {args.host}, name "
                         "its address: --http-host 127.0.0.1 (this machine only: a container's own healthcheck) or "
                         f"--http-host {args.host} (plaintext, e.g. behind a TLS-terminating proxy)")
    return args.host


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tls_note(tls: ServerTls | None) -> str:
    if tls is None:
        return ""
    return " (TLS, client certificates required)" if tls.mutual else " (TLS)"


def _client_flags(tls: ServerTls | None) -> str:
    """The client options that reach this server: its own certificate verifies it (gRPC trusts a leaf)."""
    if tls is None:
        return ""
    flags = f" --ssl --root-cert {tls.cert}"
    if tls.server_name:
        flags += f" --server-name {tls.server_name}"
    if tls.mutual:
        flags += " --client-cert <client.pem> --client-key <client.key>"
    return flags


def _start_front(server: TritonServer, port: int, api_key: str | None,
                 max_request_bytes: int | None = None) -> FrontServer | None:
    """The OpenAI endpoint on the server's host, once Triton is ready (it reads the target's description from it),
    with the server's TLS on both of its sides; a front that cannot start stops the server too, rather than leave
    it running in its own session."""
    if not port:
        return None
    try:
        return FrontServer(server.grpc_url, server.config.host, port, grpc_tls=server.client_tls,
                           https=server.config.tls, api_key=api_key, max_request_bytes=max_request_bytes).start()
    except BaseException:
        server.stop()
        raise


def add_publish_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("drafter_dir", type=Path, help="drafter folder (published format) to serve from now on")
    p.add_argument("--repository", type=Path, default=Path(".serve/model_repository"),
                   help="the running server's model repository (default: the one `adaflash serve` builds)")
    p.add_argument("--url", default="127.0.0.1:8001", help="the running server's gRPC address")
    add_connection_arguments(p)


def publish(args: argparse.Namespace) -> int:
    """Write the drafter as a new drafter model, have Triton load it and wait until it serves; then unload
    drafters older than the one it replaces (requests still on those finish as plain decoding)."""
    name = publish_drafter(args.repository, args.drafter_dir)
    headers = headers_from_args(args)
    client = connect(args.url, tls_from_args(args))
    client.load_model(name, headers=headers)
    if not client.is_model_ready(name, headers=headers):
        print(f"{name} was written but is not ready; see the server log", flush=True)
        return 1
    for old in drafter_models(args.repository)[:-2]:
        client.unload_model(old, headers=headers)
    print(f"{name} ({args.drafter_dir}) serves new requests; running ones finish on the drafter they started with",
          flush=True)
    return 0
