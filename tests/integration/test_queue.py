"""The admission queue on a real server with small limits: past its size or its longest wait, a request is
refused with UNAVAILABLE naming the limit; the server serves again afterwards."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import fixed_costs, metric_total, scrape, wait_until

from adaflash.models.bundle import save_bundle, tiny_random_bundle
from adaflash_server import shm
from adaflash_server.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationError, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer, free_ports

MAX_ACTIVE, MAX_QUEUED, MAX_WAIT_S = 2, 3, 1.0
LONG = GenerationParams(max_tokens=3000, spec_mode="ar")  # many times MAX_WAIT_S on the tiny models here


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("queue")
    model_dir = save_bundle(tiny_random_bundle(seed=0), root / "models")
    cost = root / "cost.json"
    fixed_costs(MAX_ACTIVE).save(cost)
    cfg = RepositoryConfig(max_active=MAX_ACTIVE, max_queued=MAX_QUEUED, max_queue_wait_s=MAX_WAIT_S,
                           max_batch_size=16, max_len=4096, max_prompt_tokens=64, max_output_tokens=3000)
    repo = build_repository(root / "model_repository", model_dir, "drafter", cfg, cost)
    with TritonServer(ServerConfig(model_repository=repo, state_dir=root / "state")) as server:
        yield server


def _metric(server, name: str) -> float:
    return metric_total(scrape(server.metrics_url), name)


def test_beyond_the_queue_and_its_longest_wait_requests_are_refused_by_name(server):
    """2 long requests run, 3 wait, the 6th is refused at once (queue full); the 3 waiting are refused when
    their wait passes max_queue_wait_s (the running ones take far longer); then the server serves again."""
    outcomes: dict[str, list[str]] = {"running": [], "queued": []}
    lock = threading.Lock()
    close = threading.Event()

    def hold(kind: str) -> None:
        with AdaFlashClient(server.grpc_url, timeout_s=120) as client:
            stream = client.stream("a long one", LONG)
            try:
                next(stream)
                outcome = "first token"
            except GenerationError as exc:
                outcome = exc.message
            with lock:
                outcomes[kind].append(outcome)
            if outcome == "first token":
                close.wait(120)
            stream.close()

    with ThreadPoolExecutor(MAX_ACTIVE + MAX_QUEUED) as pool:
        for _ in range(MAX_ACTIVE):
            pool.submit(hold, "running")
        wait_until(lambda: len(outcomes["running"]) == MAX_ACTIVE, 60, "the long requests to start")
        for _ in range(MAX_QUEUED):
            pool.submit(hold, "queued")
        wait_until(lambda: _metric(server, "adaflash_queued_requests") == MAX_QUEUED, 30, "the queue to fill")
        with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
            with pytest.raises(GenerationError, match=f"UNAVAILABLE: queue full.*max_queued {MAX_QUEUED}"):
                client.generate("one too many", GenerationParams(max_tokens=4))
        wait_until(lambda: len(outcomes["queued"]) == MAX_QUEUED, 60, "the queued requests to be answered")
        close.set()
    assert outcomes["running"] == ["first token"] * MAX_ACTIVE
    assert all(re.search(f"UNAVAILABLE: no sequence slot free.*max_queue_wait_s {MAX_WAIT_S:g}", o)
               for o in outcomes["queued"]), outcomes["queued"]
    wait_until(lambda: _metric(server, "adaflash_active_sequences") == 0, 60, "the cancelled requests to end")
    assert _metric(server, "adaflash_queued_requests") == 0
    with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
        assert client.generate("and again", GenerationParams(max_tokens=4)).num_output_tokens == 4


def _serve(tmp_path):
    """`adaflash serve --tiny-random` as a user runs it, on free ports: (process, ports)."""
    ports = free_ports(3)
    cmd = [sys.executable, "-m", "adaflash.entry", "serve", "--tiny-random", "--state-dir", str(tmp_path), "--openai-port", "0",
           "--grpc-port", str(ports[0]), "--http-port", str(ports[1]), "--metrics-port", str(ports[2]),
           "--max-active", "2", "--max-len", "4096", "--max-prompt-tokens", "64", "--max-output-tokens", "3000"]
    serve = subprocess.Popen(cmd, stdout=(tmp_path / "serve.log").open("w"), stderr=subprocess.STDOUT)
    wait_until(lambda: "Ctrl-C stops the server" in (tmp_path / "serve.log").read_text(), 300, "the server")
    return serve, ports


def test_sigterm_drains_running_requests_before_the_server_exits(tmp_path):
    """`adaflash serve` on SIGTERM: readiness false and new requests refused at once, the running request
    gets every token (Triton's own drain would fail it at its next BLS step), then a clean exit."""
    serve, (grpc_port, http_port, _) = _serve(tmp_path)
    url = f"127.0.0.1:{grpc_port}"
    try:
        result: dict = {}

        def long_request() -> None:
            with AdaFlashClient(url, timeout_s=120) as client:
                stream = client.stream("x", GenerationParams(max_tokens=1500, spec_mode="ar"))
                result["first"] = next(stream)
                result["final"] = list(stream)[-1]

        worker = threading.Thread(target=long_request, daemon=True)
        worker.start()
        wait_until(lambda: "first" in result, 60, "the long request's first token")
        serve.send_signal(signal.SIGTERM)
        wait_until(lambda: _http_status(http_port, "/v2/health/ready") != 200, 5, "readiness to turn false")
        with AdaFlashClient(url, timeout_s=30) as client:
            with pytest.raises(GenerationError, match="adaflash"):
                client.generate("too late", GenerationParams(max_tokens=4))
        worker.join(120)
        assert not worker.is_alive(), "the running request did not end"
        assert result["final"].num_output_tokens == 1500 and result["final"].finish_reason == "length"
        assert serve.wait(60) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def test_a_server_that_dies_is_started_again_and_a_cancelled_stream_does_not_hold_its_exit(tmp_path):
    """`adaflash serve` restarts a tritonserver killed with SIGKILL, on the same ports; it serves again. Then a
    stream the client cancelled is over for the server: the drain that SIGTERM starts must not wait out its
    timeout (60 s here) for it. (One server for both: each start costs half a minute of CI.)"""
    serve, (grpc_port, http_port, metrics_port) = _serve(tmp_path)
    try:
        server_pid = _child(serve.pid, b"tritonserver")
        regions = shm.mapped_regions(server_pid)  # its models' shared memory, which a killed server leaves behind
        os.kill(server_pid, signal.SIGKILL)
        wait_until(lambda: "restarting in" in (tmp_path / "serve.log").read_text(), 30, "the restart notice")
        wait_until(lambda: _http_status(http_port, "/v2/health/ready") == 200, 300, "the restarted server")
        assert _child(serve.pid, b"tritonserver") != server_pid
        assert regions and not any(r.exists() for r in regions), "the killed server's regions are left in /dev/shm"
        with AdaFlashClient(f"127.0.0.1:{grpc_port}", timeout_s=60) as client:
            assert client.generate("again", GenerationParams(max_tokens=4)).num_output_tokens == 4
            stream = client.stream("x", GenerationParams(max_tokens=1500, spec_mode="ar"))
            next(stream)
            stream.close()
        wait_until(lambda: _cancelled(metrics_port) == 1, 30, "the cancel to land")
        started = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(90) == 0
        assert time.monotonic() - started < 30, (tmp_path / "serve.log").read_text()[-2000:]
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def _child(parent: int, name: bytes) -> int:
    """The pid of `parent`'s child process whose program is `name`."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent \
                    and (proc / "cmdline").read_bytes().split(b"\0")[0].endswith(name):
                return int(proc.name)
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no {name.decode()} child of {parent}")


def _http_status(port: int, path: str) -> int | None:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _cancelled(metrics_port: int) -> float:
    return metric_total(scrape(f"http://127.0.0.1:{metrics_port}/metrics"), "adaflash_requests_total",
                        finish_reason="cancelled")
