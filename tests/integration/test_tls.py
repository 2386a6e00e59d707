"""TLS, headers and the API key against a real server: one tritonserver with mutual TLS on gRPC whose inference
requires a header (Triton's own `--grpc-restricted-protocol`, so that headers are seen to arrive), and the OpenAI
front over HTTPS with an API key. The client library, the `adaflash-client` CLI and the official `openai` SDK get
through; plain-text, certificate-less, header-less and key-less callers do not. Certificates are made here with the
`openssl` CLI (a CA, a server certificate for 127.0.0.1, a client certificate)."""

from __future__ import annotations

import argparse
import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest
from helpers import fixed_costs

from adaflash.models.bundle import save_bundle, tiny_random_bundle
from adaflash_server.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationError, GenerationParams, Tls
from adaflash_client import cli as client_cli
from adaflash_server import serve
from adaflash_server.launcher import ServerConfig, TritonServer, TritonServerError, free_ports, server_command
from adaflash_server.openai_front import FrontServer
from adaflash_server.security import ServerTls

OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="needs the openssl CLI to make the test certificates")

# Triton refuses inference without this header (`served`): its restricted protocols name a key K, sent as
# `triton-grpc-protocol-K`.
RESTRICTION = ("x-adaflash-tenant", "t1")
HEADER = (f"triton-grpc-protocol-{RESTRICTION[0]}", RESTRICTION[1])
API_KEY = "sk-adaflash-test"
MODEL = "tiny"
MAX_TOKENS = 4


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True)


def _issue(cwd: Path, name: str, extensions: str) -> None:
    """`name`.pem and `name`.key, an EC key and a certificate the CA issued with these X.509v3 extensions."""
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(cwd, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=adaflash test {name}")
    _openssl(cwd, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> SimpleNamespace:
    """A CA; a server certificate for 127.0.0.1 that also allows client authentication (under mutual TLS the
    server's own clients present it); a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    _openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=adaflash test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _issue(d, "server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    _issue(d, "client", "extendedKeyUsage=clientAuth\n")
    return SimpleNamespace(ca=d / "ca.pem", server=ServerTls(d / "server.pem", d / "server.key", client_ca=d / "ca.pem"),
                           client=Tls(root_cert=d / "ca.pem", client_cert=d / "client.pem", client_key=d / "client.key"))


@pytest.fixture(scope="module")
def served(pki, tmp_path_factory):
    """The tiny random models under mutual TLS, inference restricted to callers sending HEADER, and the OpenAI front
    over HTTPS with API_KEY."""
    root = tmp_path_factory.mktemp("tls")
    model_dir = save_bundle(tiny_random_bundle(seed=0), root / MODEL)
    costs = root / "cost.json"
    fixed_costs(4).save(costs)
    cfg = RepositoryConfig(max_active=4, max_batch_size=4, max_len=256, max_prompt_tokens=64, max_output_tokens=64)
    repo = build_repository(root / "model_repository", model_dir, "drafter", cfg, costs)
    restricted = f"--grpc-restricted-protocol=inference:{RESTRICTION[0]}={RESTRICTION[1]}"
    config = ServerConfig(model_repository=repo, state_dir=root / "state", tls=pki.server, extra_args=[restricted])
    with TritonServer(config) as server:
        front = FrontServer(server.grpc_url, "127.0.0.1", free_ports(1)[0], grpc_tls=server.client_tls,
                            headers=dict([HEADER]), https=pki.server, api_key=API_KEY).start()
        try:
            yield server, front
        finally:
            front.stop()


def _https_context(pki, client_cert: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca)
    if client_cert:
        context.load_cert_chain(pki.client.client_cert, pki.client.client_key)
    return context


def _sdk(served, pki, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[1].url, api_key=api_key, max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpxClient(verify=_https_context(pki)))


def test_a_grpc_stream_round_trips_over_mutual_tls(served, pki):
    with AdaFlashClient(served[0].grpc_url, timeout_s=60, tls=pki.client, headers=dict([HEADER])) as client:
        assert client.server_ready() and client.model_ready()
        chunks = []
        completion = client.generate_streaming("hello", GenerationParams(max_tokens=MAX_TOKENS), chunks.append)
    assert (completion.num_output_tokens, completion.finish_reason) == (MAX_TOKENS, "length")
    assert len(chunks) > 1


@pytest.mark.parametrize("tls", [None, "no client certificate"])
def test_plaintext_and_certificate_less_grpc_clients_are_refused(served, pki, tls):
    tls = None if tls is None else Tls(root_cert=pki.ca)
    with AdaFlashClient(served[0].grpc_url, timeout_s=30, tls=tls, headers=dict([HEADER])) as client:
        assert not client.server_ready()
        with pytest.raises(GenerationError) as refused:
            client.generate("hello", GenerationParams(max_tokens=MAX_TOKENS))
    assert refused.value.status == "StatusCode.UNAVAILABLE"


def test_headers_travel_as_grpc_metadata(served, pki):
    """Without the header the server's restricted inference refuses the request (and says why): so the header did
    arrive in the round trip above."""
    with AdaFlashClient(served[0].grpc_url, timeout_s=30, tls=pki.client) as client:
        with pytest.raises(GenerationError, match=f"expecting header '{HEADER[0]}'"):
            client.generate("hello", GenerationParams(max_tokens=MAX_TOKENS))


def test_the_cli_connects_with_tls_and_headers(served, pki, capsys):
    code = client_cli.main(["hello", "--url", served[0].grpc_url, "--ssl", "--root-cert", str(pki.ca),
                            "--client-cert", str(pki.client.client_cert), "--client-key", str(pki.client.client_key),
                            "--header", "=".join(HEADER), "--max-tokens", str(MAX_TOKENS), "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == MAX_TOKENS


def test_the_openai_sdk_over_https_with_the_key(served, pki):
    sdk = _sdk(served, pki, API_KEY)
    assert served[1].url.startswith("https://")
    assert [m.id for m in sdk.models.list()] == [MODEL]
    chunks = list(sdk.completions.create(model=MODEL, prompt="hello", max_tokens=MAX_TOKENS, temperature=0,
                                         stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_a_wrong_api_key_is_an_openai_401(served, pki):
    with pytest.raises(openai.AuthenticationError) as refused:
        _sdk(served, pki, "sk-wrong").completions.create(model=MODEL, prompt="hello", max_tokens=MAX_TOKENS)
    assert (refused.value.status_code, refused.value.code, refused.value.type) == (
        401, "invalid_api_key", "invalid_request_error")


def test_a_missing_api_key_is_an_openai_401_on_every_route(served, pki):
    for path in ("/models", "/completions", "/no-such-route"):
        request = urllib.request.Request(f"{served[1].url}{path}", data=b"{}" if path != "/models" else None)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30, context=_https_context(pki))
        assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"] == "Bearer"
        error = json.loads(refused.value.read())["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


def test_https_without_a_client_certificate_is_refused(served, pki):
    request = urllib.request.Request(f"{served[1].url}/models", headers={"Authorization": f"Bearer {API_KEY}"})
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(request, timeout=30, context=_https_context(pki, client_cert=False)).read()


# ---------------------------------------------------------------------------------------------
# The options, without a server


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_serve_passes_tls_to_tritonserver(pki):
    tls = pki.server
    args = _serve_args("--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-client-ca", str(tls.client_ca))
    config = serve.server_config(args, Path("repo"))
    assert config.tls == ServerTls(str(tls.cert), str(tls.key), str(tls.client_ca))
    argv = server_command(Path("triton"), Path("backends"), config)
    assert {"--grpc-use-ssl-mutual=true", f"--grpc-server-cert={tls.cert}", f"--grpc-server-key={tls.key}",
            f"--grpc-root-cert={tls.client_ca}"} <= set(argv)
    assert "--http-address=127.0.0.1" in argv


def test_serve_keeps_plaintext_http_off_other_interfaces_unless_named(pki):
    tls = ["--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)]
    with pytest.raises(SystemExit, match="--http-host"):
        serve.server_config(_serve_args("--host", "0.0.0.0", *tls), Path("repo"))
    config = serve.server_config(_serve_args("--host", "0.0.0.0", "--http-host", "127.0.0.1", *tls), Path("repo"))
    argv = server_command(Path("triton"), Path("backends"), config)
    assert {"--grpc-address=0.0.0.0", "--http-address=127.0.0.1"} <= set(argv)
    with pytest.raises(SystemExit, match="go together"):
        serve.server_config(_serve_args("--tls-cert", str(pki.server.cert)), Path("repo"))


def test_a_wildcard_host_needs_a_name_for_the_servers_own_clients(pki, tmp_path):
    config = ServerConfig(tmp_path, host="0.0.0.0", tls=pki.server, state_dir=tmp_path)
    with pytest.raises(TritonServerError, match="server_name"):
        TritonServer(config)
    named = ServerConfig(tmp_path, host="0.0.0.0", tls=ServerTls(pki.server.cert, pki.server.key, server_name="x"),
                         state_dir=tmp_path)
    assert TritonServer(named).client_tls == Tls(root_cert=pki.server.cert, server_name="x")


def test_the_connection_options_survive_the_trip_to_a_child_process(pki):
    """`adaflash sweep` hands them to its Locust processes as command-line options."""
    argv = ["p", "--root-cert", str(pki.ca), "--server-name", "llm.internal", "--header", "a=b=c", "--header", "x=y"]
    args = client_cli.parse_args(argv)
    assert client_cli.tls_from_args(args) == Tls(root_cert=str(pki.ca), server_name="llm.internal")
    assert client_cli.headers_from_args(args) == {"a": "b=c", "x": "y"}
    again = client_cli.parse_args(["p", *client_cli.connection_argv(args)])
    assert (client_cli.tls_from_args(again), client_cli.headers_from_args(again)) == (
        client_cli.tls_from_args(args), client_cli.headers_from_args(args))
