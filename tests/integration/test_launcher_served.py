"""The launcher runs the real bundled tritonserver: serve a one-model repository, fail fast on a broken one."""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from helpers import ECHO_CONFIG, ECHO_MODEL, echo_repository

from adaflash.serving.threads import TARGET_SPIN_COUNT, openmp_wait_env
from adaflash_server import ServerConfig, TritonServer, TritonServerError

SPIN_MODEL = """\
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from adaflash.serving.threads import spin_target_threads

PASSIVE = os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"  # what every model process starts with
spin_target_threads()
SPIN = int(os.environ.get("GOMP_SPINCOUNT", "-1"))  # what the target's process runs with


class TritonPythonModel:
    def execute(self, requests):
        seen = np.array([int(PASSIVE), SPIN], dtype=np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", seen)]) for _ in requests]
"""


def port_is_free(port: int) -> bool:
    """Nothing listens there and a server could bind it (TIME_WAIT leftovers allowed, as servers do)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        pass
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
    return True


def scrape_until(url: str, line: str, timeout_s: float = 10.0) -> str:
    """The Prometheus text at `url` once it holds `line`. Triton can record a request's statistics
    just after the client has its response, so a scrape right after an infer may still show 0."""
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200
            text = response.read().decode()
        if line in text.splitlines() or time.monotonic() > deadline:
            assert line in text.splitlines()
            return text
        time.sleep(0.1)


def test_serves_infers_exports_metrics_and_stops(tmp_path: Path) -> None:
    server = TritonServer(ServerConfig(echo_repository(tmp_path / "repo"), state_dir=tmp_path / "state"))
    with server:
        pid = server.pid
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = np.array([3, -1, 0, 2**31 - 1], dtype=np.int32)
        inp = grpcclient.InferInput("IN", list(x.shape), "INT32")
        inp.set_data_from_numpy(x)
        out = client.infer("echo", [inp]).as_numpy("OUT")
        client.close()
        np.testing.assert_array_equal(out, x)
        assert out.dtype == np.int32

        metrics = scrape_until(server.metrics_url, 'nv_inference_request_success{model="echo",version="1"} 1')
        assert "# TYPE nv_inference_request_success counter" in metrics

    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    ports = (server.config.grpc_port, server.config.http_port, server.config.metrics_port)
    assert all(port_is_free(p) for p in ports)
    assert server.stop() is None  # idempotent
    assert "successfully loaded 'echo'" in server.log_path.read_text()


@pytest.mark.parametrize("chosen, expected", [(None, [1, TARGET_SPIN_COUNT]), ("1234", [0, 1234])],
                         ids=["default", "caller"])
def test_model_processes_get_their_openmp_wait_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   chosen: str | None, expected: list[int]) -> None:
    """Idle OpenMP threads of model processes sleep, the target's spin briefly (waking sleeping threads for
    every parallel region slowed its served forwards; docs/history.md), and a caller's own OpenMP setting
    is left alone."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    if chosen is not None:
        monkeypatch.setenv("GOMP_SPINCOUNT", chosen)
    with TritonServer(ServerConfig(echo_repository(tmp_path / "repo", model=SPIN_MODEL), state_dir=tmp_path / "s")) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.zeros(1, dtype=np.int32))
        assert client.infer("echo", [inp]).as_numpy("OUT").tolist() == expected
        client.close()
    assert openmp_wait_env({"OMP_WAIT_POLICY": "PASSIVE"}) == {}


@pytest.mark.parametrize(
    "config, model, expected",
    [
        (ECHO_CONFIG, "def execute(:\n", "SyntaxError"),
        (ECHO_CONFIG.replace("TYPE_INT32", "TYPE_NOPE", 1), ECHO_MODEL, "failed to read text proto"),
    ],
    ids=["model-syntax-error", "config-parse-error"],
)
def test_broken_repository_fails_fast_with_log_tail(tmp_path: Path, config: str, model: str, expected: str) -> None:
    server = TritonServer(ServerConfig(echo_repository(tmp_path / "repo", config, model), state_dir=tmp_path / "state"))
    started = time.monotonic()
    with pytest.raises(TritonServerError, match="exited with code 1 during startup") as error:
        server.start()
    assert time.monotonic() - started < 20
    assert expected in str(error.value)
    assert str(server.log_path) in str(error.value)
    assert server.pid is None
