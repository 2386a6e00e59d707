"""Faults: a model process killed with SIGKILL is noticed, readiness turns false, the model is reloaded and
the server serves again without an operator (before, every later request failed while it reported ready)."""

from __future__ import annotations

import os
import signal
import urllib.error
import urllib.request

import pytest
from helpers import fixed_costs, wait_until

from adaflash.models.bundle import save_bundle, tiny_random_bundle
from adaflash_build.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationParams
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
