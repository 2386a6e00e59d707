"""How a gRPC client reaches the server beyond its address: TLS (paths only), headers, and the options that give
them, shared by every command that is a client of the server (the client CLI, `adaflash sweep` and its Locust
users, `adaflash publish-drafter`, `adaflash openai-front`) and by the server's own clients (readiness probe, drain,
the OpenAI front).

No transport here: `grpc_options` spells a `Tls` as the keyword arguments tritonclient's InferenceServerClient takes,
sync (`tritonclient.grpc`) and asyncio (`tritonclient.grpc.aio`) alike; tritonclient itself is imported only when a
channel option has to repeat its defaults.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaflash_contract.cli_args import existing_file


@dataclass(frozen=True)
class Tls:
    """TLS for the gRPC connection (PEM files).

    `root_cert`: the CA certificate(s) to verify the server with (None: gRPC's bundled public roots); the
    server's own certificate works too, as gRPC accepts a trusted leaf. `client_cert` and `client_key`: this
    client's identity, for a server that asks for one (mutual TLS). `server_name`: the name the server's
    certificate is checked against when the URL's host is not in it (an IP address, a port forward).
    """

    root_cert: str | Path | None = None
    client_cert: str | Path | None = None
    client_key: str | Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("a client certificate needs its key and a key its certificate")


def grpc_options(tls: Tls | None, channel_args: Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
    """tritonclient's InferenceServerClient keyword arguments (sync or aio) for `tls` (None: plaintext) and extra
    gRPC channel options. Without either, tritonclient's own channel options stay untouched; with them, they are
    repeated (any channel_args given replace them all)."""
    options: dict[str, Any] = {}
    if tls is not None:
        options.update(ssl=True, root_certificates=tls.root_cert, private_key=tls.client_key,
                       certificate_chain=tls.client_cert)
    extra = [*channel_args, *([("grpc.ssl_target_name_override", tls.server_name)]
                              if tls is not None and tls.server_name is not None else [])]
    if extra:
        options["channel_args"] = [*_tritonclient_channel_args(), *extra]
    return options


def _tritonclient_channel_args() -> list[tuple[str, Any]]:
    """The channel options tritonclient sets when given none (its message limits and keepalive)."""
    import tritonclient.grpc as grpcclient  # late: the contract needs no transport

    keepalive = grpcclient.KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
    ]


def grpc_metadata(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """Headers as gRPC metadata: names lower-cased, as gRPC requires (HTTP/2 treats them alike); None for none."""
    return {name.lower(): value for name, value in (headers or {}).items()} or None


def add_connection_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How to reach a server beyond its address, for every command that is a gRPC client of it (the client CLI,
    `adaflash sweep` and its Locust users, `adaflash publish-drafter`, `adaflash openai-front`)."""
    p.add_argument("--ssl", action="store_true", help="connect with TLS (implied by the four options below)")
    p.add_argument("--root-cert", type=existing_file,
                   help="PEM CA certificate(s) to verify the server with (default: gRPC's public roots)")
    p.add_argument("--client-cert", type=existing_file,
                   help="PEM certificate of this client, for a server that requires one (mutual TLS); "
                        "with --client-key")
    p.add_argument("--client-key", type=existing_file, help="PEM key of --client-cert")
    p.add_argument("--server-name", help="the name to check the server's certificate against when the URL's host "
                                         "is not in it (an IP address, a port forward)")
    p.add_argument("--header", type=header, action="append", metavar="NAME=VALUE",
                   help="gRPC metadata sent with every call (repeatable)")


def header(text: str) -> tuple[str, str]:
    """An argparse `type` for NAME=VALUE (the value may hold '=')."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def tls_from_args(args: argparse.Namespace) -> Tls | None:
    """The TLS of `add_connection_arguments`' options, None without any of them; an incomplete client identity
    exits with status 2, as argparse does for an invalid argument."""
    if not (args.ssl or args.root_cert or args.client_cert or args.client_key or args.server_name):
        return None
    try:
        return Tls(args.root_cert, args.client_cert, args.client_key, args.server_name)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def headers_from_args(args: argparse.Namespace) -> dict[str, str]:
    return dict(args.header or [])


def connection_argv(args: argparse.Namespace) -> list[str]:
    """`add_connection_arguments`' options as given, for a child process that takes them too (the sweep's Locust)."""
    argv = ["--ssl"] if args.ssl else []
    for flag, value in (("--root-cert", args.root_cert), ("--client-cert", args.client_cert),
                        ("--client-key", args.client_key), ("--server-name", args.server_name)):
        if value is not None:
            argv += [flag, str(value)]
    for name, value in args.header or []:
        argv += ["--header", f"{name}={value}"]
    return argv
