"""The target as a Triton model of its own (`target_in_orchestrator=False`, the layout a TensorRT-LLM-style
separate target keeps): served text equals the engine's, one `target` execute per step call, and a target
process killed mid-request ends its requests with an error, not a hang, before the server serves again.
(The default layout, the target in the orchestrator's process, is what tests/integration/test_server.py serves.)"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import fixed_costs, kill_mid_stream, metric_total, scrape, wait_until

from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request
from adaflash.models.bundle import load_bundle, save_bundle
from adaflash_server.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationParams
from adaflash_tools.reliability import ready
from adaflash_server.launcher import ServerConfig, TritonServer, stub_pids

MAX_TOKENS = 24
PROMPTS = ["the target runs apart", "in a process of its own", "called once per step", "for every sequence",
           "with the drafter beside it", "and the orchestrator between"]


@pytest.fixture(scope="module")
def served(trained_tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("target-model")
    model_dir = save_bundle(trained_tiny, root / "models")
    cost = root / "cost.json"
    fixed_costs(8).save(cost)
    cfg = RepositoryConfig(max_active=8, max_batch_size=8, max_len=512, max_prompt_tokens=64, max_output_tokens=256,
                           target_in_orchestrator=False)
    repo = build_repository(root / "model_repository", model_dir, "drafter", cfg, cost)
    with TritonServer(ServerConfig(model_repository=repo, state_dir=root / "state")) as server:
        with AdaFlashClient(server.grpc_url, timeout_s=120) as client:  # the orchestrator asks for the cost table
            client.generate("warm-up", GenerationParams(max_tokens=2))
        yield server, model_dir


@pytest.fixture(scope="module")
def reference(served) -> list[str]:
    bundle = load_bundle(served[1], drafter=None)
    engine = Engine(bundle.target, None, num_slots=len(PROMPTS), max_len=512)
    seqs = engine.generate([Request(bundle.tokenizer.encode(p).ids, MAX_TOKENS) for p in PROMPTS])
    return [bundle.tokenizer.decode(s.output) for s in seqs]


def test_plain_decoding_runs_several_steps_per_target_call(served, reference):
    """A served `ar` request is decoded in runs: fewer calls to the target model than target forwards, each a
    round trip the step loop saves, and the text is plain decoding's. (With the target in the orchestrator's
    process a call costs the loop little, and runs are as long as that little is worth: often one step.)"""
    server = served[0]

    def counts() -> tuple[float, float]:
        samples = scrape(server.metrics_url)
        return (metric_total(samples, "adaflash_model_calls_total", model="target", op="step"),
                metric_total(samples, "adaflash_target_forwards_total", spec_mode="ar"))

    before = counts()
    with AdaFlashClient(server.grpc_url, timeout_s=120) as client:
        completion = client.generate_streaming(PROMPTS[0], GenerationParams(max_tokens=MAX_TOKENS, spec_mode="ar"))
    assert completion.text == reference[0] and completion.target_forwards == MAX_TOKENS
    # (the calls' counts reach Triton no later than the finished request's: a flush writes them in the order gathered)
    wait_until(lambda: counts()[1] - before[1] == MAX_TOKENS, 30, "the request's forwards in the metrics")
    calls = counts()[0] - before[0]
    assert 2 <= calls < MAX_TOKENS / 2, f"{calls:g} target calls for {MAX_TOKENS} forwards"


def _executions(server: TritonServer, model: str) -> int:
    with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/stats", timeout=10) as r:
        return int(json.load(r)["model_stats"][0]["execution_count"])


@pytest.mark.parametrize("mode", ["ar", "ngram", "dflash", "adaflash"])
def test_served_text_equals_the_engine_with_one_target_execute_per_call(served, reference, mode):
    server = served[0]

    def calls() -> float:
        return metric_total(scrape(server.metrics_url), "adaflash_model_calls_total", model="target")

    before_calls, before_executions = calls(), _executions(server, "target")
    params = GenerationParams(max_tokens=MAX_TOKENS, spec_mode=mode)
    with AdaFlashClient(server.grpc_url, timeout_s=120) as client, ThreadPoolExecutor(len(PROMPTS)) as pool:
        done = list(pool.map(lambda p: client.generate_streaming(p, params), PROMPTS))
    assert [c.text for c in done] == reference
    assert "target" in stub_pids(server.pid)
    # (the calls' metrics leave the orchestrator from its outbox thread, after the responses)
    wait_until(lambda: calls() - before_calls == _executions(server, "target") - before_executions, 30,
               "a target execute for each call the orchestrator counted")
    assert calls() - before_calls >= MAX_TOKENS / 8


def test_a_target_process_killed_mid_request_ends_it_with_an_error_then_serves_again(served):
    """The orchestrator's call to the dead target fails (or times out) and ends the request with the error; the
    healer restarts the server, which serves the same text as before."""
    server = served[0]
    with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
        canary = client.generate("canary", GenerationParams(max_tokens=8)).text
    errors = kill_mid_stream(server, "target")
    assert len(errors) == 1 and "DEADLINE_EXCEEDED" not in str(errors[0].status), errors
    wait_until(lambda: ready(server) and "target" in stub_pids(server.pid), 120, "the restarted server")
    with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
        assert client.generate("canary", GenerationParams(max_tokens=8)).text == canary
