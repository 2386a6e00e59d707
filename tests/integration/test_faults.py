"""Faults: a request inside the `adaflash` model (the orchestrator) when its process dies ends (the server is
restarted); a drafter that fails leaves the requests in flight decoding plainly, with the same text. SIGKILL of each model process
under traffic is the reliability suite's `faults` scenario (tests/integration/test_reliability_served.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import fixed_costs, kill_mid_stream, wait_until

from adaflash.models.bundle import save_bundle, tiny_random_bundle
from adaflash_server.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationParams
from adaflash_tools.reliability import ready
from adaflash_server.launcher import ServerConfig, TritonServer



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


def test_a_request_inside_the_orchestrator_when_it_dies_ends_with_an_error_not_a_hang(server):
    """Triton never ends a decoupled model's requests when its process dies (before, the client waited for
    its own timeout); the healer restarts the server, which ends them, and it serves again."""
    errors = kill_mid_stream(server, "adaflash")
    assert len(errors) == 1 and "DEADLINE_EXCEEDED" not in str(errors[0].status), errors
    wait_until(lambda: ready(server), 120, "the restarted server")
    with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
        assert client.generate("canary", GenerationParams(max_tokens=8)).num_output_tokens == 8


def test_requests_decode_plainly_when_the_drafter_never_answers_in_time(tmp_path):
    """The drafter-failure fallback through a live server: every draft call outlives `drafter_timeout_s`, so
    each drafting sequence stops drafting and finishes as plain decoding, with the same text as `ar`."""
    model_dir = save_bundle(tiny_random_bundle(seed=0), tmp_path / "models")
    cost = tmp_path / "cost.json"
    fixed_costs(4).save(cost)
    cfg = RepositoryConfig(max_active=4, max_batch_size=8, max_len=512, max_prompt_tokens=64, max_output_tokens=256,
                           drafter_timeout_s=1e-6, drafter_in_orchestrator=False)  # a model's call can time out
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
