"""Faults: a model process killed with SIGKILL is noticed, readiness turns false, the model is reloaded and
the server serves again without an operator (before, every later request failed while it reported ready);
a drafter that fails leaves the requests in flight decoding plainly, with the same text."""

from __future__ import annotations

import os
import signal
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import fixed_costs, wait_until

from adaflash.models.bundle import save_bundle, tiny_random_bundle
from adaflash_build.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationError, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer, stub_pids

MODELS = ["target", "drafter", "orchestrator", "preprocessing", "postprocessing"]
DRAFTER = "drafter"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    model_dir = save_bundle(tiny_random_bundle(seed=0), root / "models")
    cost = root / "cost.json"
    fixed_costs(4).save(cost)
    cfg = RepositoryConfig(max_active=4, max_batch_size=8, max_len=512, max_prompt_tokens=64, max_output_tokens=256)
    repo = build_repository(root / "model_repository", model_dir, "drafter", cfg, cost)
    with TritonServer(ServerConfig(model_repository=repo, state_dir=root / "state")) as server:
        yield server


def _ready(server) -> bool:
    try:
        return urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=2).status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.parametrize("model", MODELS)
def test_a_killed_model_process_is_reloaded_and_readiness_tells_the_truth(server, model):
    with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
        before = client.generate("canary", GenerationParams(max_tokens=8, spec_mode="adaflash")).text
    killed = stub_pids(server.pid)[model][0]
    os.kill(killed, signal.SIGKILL)
    if model == DRAFTER:  # requests go on without it while it reloads (it may be back before this one ends)
        with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
            assert client.generate("canary", GenerationParams(max_tokens=8, spec_mode="adaflash")).text == before
    else:
        wait_until(lambda: not _ready(server), 5, f"readiness to turn false after {model} died")
    wait_until(lambda: _ready(server) and killed not in stub_pids(server.pid).get(model, [killed]), 120,
               f"{model} to be reloaded and the server ready again")
    with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
        after = client.generate("canary", GenerationParams(max_tokens=8, spec_mode="adaflash"))
    assert after.num_output_tokens == 8 and after.text == before  # greedy: the same answer as before the fault


def test_a_request_inside_the_orchestrator_when_it_dies_ends_with_an_error_not_a_hang(server):
    """Triton never ends a decoupled model's requests when its process dies (before, the client waited for
    its own timeout); the healer restarts the server, which ends them, and it serves again."""
    errors: list[GenerationError] = []

    def long_stream() -> None:
        with AdaFlashClient(server.grpc_url, timeout_s=90) as client:
            try:
                for _ in client.stream("a long one", GenerationParams(max_tokens=250, spec_mode="ar")):
                    started.set()
            except GenerationError as error:
                errors.append(error)

    started = threading.Event()
    worker = threading.Thread(target=long_stream, daemon=True)
    worker.start()
    assert started.wait(60), "no first token"
    os.kill(stub_pids(server.pid)["orchestrator"][0], signal.SIGKILL)
    worker.join(60)
    assert not worker.is_alive(), "the request inside the dead orchestrator never ended"
    assert len(errors) == 1 and "DEADLINE_EXCEEDED" not in str(errors[0].status), errors
    wait_until(lambda: _ready(server), 120, "the restarted server")
    with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
        assert client.generate("canary", GenerationParams(max_tokens=8)).num_output_tokens == 8


def test_requests_decode_plainly_when_the_drafter_never_answers_in_time(tmp_path):
    """The drafter-failure fallback through a live server: every draft call outlives `drafter_timeout_s`, so
    each drafting sequence stops drafting and finishes as plain decoding, with the same text as `ar`."""
    model_dir = save_bundle(tiny_random_bundle(seed=0), tmp_path / "models")
    cost = tmp_path / "cost.json"
    fixed_costs(4).save(cost)
    cfg = RepositoryConfig(max_active=4, max_batch_size=8, max_len=512, max_prompt_tokens=64, max_output_tokens=256,
                           drafter_timeout_s=1e-6)
    repo = build_repository(tmp_path / "model_repository", model_dir, "drafter", cfg, cost)
    prompts = ["the drafter is gone", "so the target decodes alone", "four at once", "and all must finish"]
    with TritonServer(ServerConfig(model_repository=repo, state_dir=tmp_path / "state")) as server:
        def run(prompt: str, mode: str):
            with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
                return client.generate(prompt, GenerationParams(max_tokens=24, spec_mode=mode))

        plain = [run(p, "ar") for p in prompts]
        with ThreadPoolExecutor(len(prompts)) as pool:
            drafted = list(pool.map(run, prompts, ["dflash"] * len(prompts)))
    for ar, got in zip(plain, drafted):
        assert got.finish_reason == ar.finish_reason and got.text == ar.text
        assert got.num_output_tokens == ar.num_output_tokens
        assert not any(got.draft_len_per_step)  # no draft ever reached verification
