"""TLS and the API key of the server's endpoints (`adaflash serve`, `adaflash openai-front`): what each endpoint is
given and the options that give it.

TLS covers Triton's gRPC endpoint (tritonserver's own `--grpc-use-ssl`) and the OpenAI-compatible endpoint (uvicorn);
with a client CA, both require a client certificate issued by it (mutual TLS). Triton's HTTP endpoint has no TLS of
its own, nor do its metrics: `adaflash serve` keeps HTTP off non-loopback addresses unless told (`serve.http_host`).
The API key guards the OpenAI endpoint only; gRPC callers are told apart by client certificates.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from adaflash_contract.cli_args import existing_file

API_KEY_ENV = "ADAFLASH_API_KEY"


@dataclass(frozen=True)
class ServerTls:
    """The server side of TLS (PEM files): its certificate (chain) and key, and the CA that issues the client
    certificates it requires (None: none required). `server_name`: a name in the certificate for the server's own
    clients to check it against, when the address it binds is not one (0.0.0.0)."""

    cert: str | Path
    key: str | Path
    client_ca: str | Path | None = None
    server_name: str | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None


def add_tls_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, own_clients: bool) -> None:
    """The server-side TLS options; `own_clients` adds --tls-server-name, for a command whose own clients (the
    readiness probe, drain, self-healing, the OpenAI front) connect to the gRPC endpoint it serves."""
    p.add_argument("--tls-cert", type=existing_file, help="PEM certificate (chain) to serve TLS with; with --tls-key")
    p.add_argument("--tls-key", type=existing_file, help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", type=existing_file,
                   help="PEM CA certificate(s): require client certificates issued by it (mutual TLS)")
    if own_clients:
        p.add_argument("--tls-server-name", help="a name in --tls-cert, which the server's own clients check it "
                                                 "against (default: --host; needed when --host is 0.0.0.0)")


def server_tls_from_args(args: argparse.Namespace) -> ServerTls | None:
    """The ServerTls of `add_tls_arguments`' options, None without a certificate; SystemExit for an incomplete set."""
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None or getattr(args, "tls_server_name", None):
            raise SystemExit("error: --tls-client-ca and --tls-server-name need --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise SystemExit("error: --tls-cert and --tls-key go together")
    return ServerTls(args.tls_cert, args.tls_key, args.tls_client_ca, getattr(args, "tls_server_name", None))


def add_api_key_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", help=f"require `Authorization: Bearer <key>` on the OpenAI endpoint (default: "
                                     f"${API_KEY_ENV}, which keeps the key out of the process list)")


def api_key_from_args(args: argparse.Namespace) -> str | None:
    """--api-key, else the environment's; an empty key is no key."""
    return args.api_key or os.environ.get(API_KEY_ENV) or None
