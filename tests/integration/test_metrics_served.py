"""The operators' series on a real server's /metrics (docs/metrics.md): each finished request's latency histograms
per spec_mode, and the KV cache gauges of the target (in the orchestrator's process) and of the drafter model, on a
paged cache: blocks held while a request runs, consistent with the free and max ones, all back when it ends."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import fixed_costs, metric_total, scrape, wait_until

from adaflash.models.bundle import save_bundle, tiny_random_bundle
from adaflash.models.cache import KVCache
from adaflash.models.placement import CPU
from adaflash_client import AdaFlashClient, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer
from adaflash_server.repository import RepositoryConfig, build_repository

MAX_ACTIVE, MAX_LEN, PAGE = 4, 512, 16
HISTOGRAMS = ("adaflash_time_to_first_token_seconds", "adaflash_e2e_request_latency_seconds",
              "adaflash_request_time_per_output_token_seconds", "adaflash_inter_token_latency_seconds")
MODELS = ("target", "drafter")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The tiny random models with caches paged from a budget of two sequences of max_len for four at once."""
    root = tmp_path_factory.mktemp("metrics")
    bundle = tiny_random_bundle(seed=0)
    model_dir = save_bundle(bundle, root / "models")
    cost = root / "cost.json"
    fixed_costs(MAX_ACTIVE).save(cost)
    per_token = sum(KVCache(c, 1, 1, CPU).nbytes for c in (bundle.target.config, bundle.drafter.config))
    cfg = RepositoryConfig(max_active=MAX_ACTIVE, max_batch_size=8, max_len=MAX_LEN, max_prompt_tokens=64,
                           max_output_tokens=400, kv_cache_memory=str(2 * MAX_LEN * per_token), kv_page=PAGE)
    repo = build_repository(root / "model_repository", model_dir, "drafter", cfg, cost)
    with TritonServer(ServerConfig(model_repository=repo, state_dir=root / "state")) as server:
        yield server


def _counts(server, name: str, mode: str) -> tuple[float, float]:
    """A histogram's observations and their sum, for one spec_mode."""
    samples = scrape(server.metrics_url)
    return metric_total(samples, f"{name}_count", spec_mode=mode), metric_total(samples, f"{name}_sum", spec_mode=mode)


@pytest.mark.parametrize("mode", ["ar", "adaflash"])
def test_each_completed_request_observes_its_latencies_once(server, mode):
    """Three requests: each histogram of the mode counts each once (the gaps: each request with a gap to
    measure), and the server's times fit inside the client's."""
    before = {name: _counts(server, name, mode) for name in HISTOGRAMS}
    with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
        done = [client.generate_streaming(f"request {i} of the metrics", GenerationParams(max_tokens=24,
                                                                                        spec_mode=mode))
                for i in range(3)]
    expected = {HISTOGRAMS[0]: 3, HISTOGRAMS[1]: 3,
                HISTOGRAMS[2]: sum(c.num_output_tokens > 1 for c in done),
                HISTOGRAMS[3]: sum(bool(c.accepted_per_step) for c in done)}

    def moved() -> dict[str, float]:
        return {name: _counts(server, name, mode)[0] - before[name][0] for name in HISTOGRAMS}

    # (the observations are made as the final response has left, from the outbox thread or the loop's)
    wait_until(lambda: moved() == expected, 10, f"one observation per request in {mode}'s histograms")
    ttft, e2e = (_counts(server, name, mode)[1] - before[name][1] for name in HISTOGRAMS[:2])
    assert 0 < ttft <= e2e <= sum(c.latency_s for c in done)
    assert ttft <= sum(c.time_to_first_token_s for c in done)


def _gauges(server) -> dict[str, dict[str, float]]:
    """Per model: its block gauges by kv_cache_block_type, its bytes by kind, usage and open slots."""
    samples = scrape(server.metrics_url)
    out: dict[str, dict[str, float]] = {m: {} for m in MODELS}
    for name, labels, value in samples:
        model = labels.get("model")
        if model not in out:
            continue
        if name == "adaflash_kv_cache_blocks":
            out[model][labels["kv_cache_block_type"]] = value
        elif name == "adaflash_kv_cache_bytes":
            out[model][f"bytes_{labels['kind']}"] = value
        elif name in ("adaflash_kv_cache_usage_perc", "adaflash_open_slots"):
            out[model][name.removeprefix("adaflash_")] = value
    return out


def _consistent(gauges: dict[str, float]) -> bool:
    """One model's gauges as one reading (the reporter sets them one by one: a scrape may fall between)."""
    keys = {"max", "free", "used", "tokens_per", "bytes_used", "bytes_total", "kv_cache_usage_perc", "open_slots"}
    return (gauges.keys() == keys and gauges["tokens_per"] == PAGE and gauges["used"] + gauges["free"] == gauges["max"]
            and gauges["bytes_used"] * gauges["max"] == gauges["used"] * gauges["bytes_total"]  # no scratch on a CPU
            and abs(gauges["kv_cache_usage_perc"] - gauges["used"] / gauges["max"]) < 1e-9)


def test_kv_cache_gauges_show_the_blocks_a_running_request_holds_and_get_them_back(server):
    """dflash requests run (and are sent again until seen, with a deadline) until both caches report blocks held
    in a reading that adds up; after them every block is free again."""
    seen, stop = threading.Event(), time.monotonic() + 30

    def keep_running() -> None:
        with AdaFlashClient(server.grpc_url, timeout_s=60) as client:
            while not seen.is_set() and time.monotonic() < stop:
                client.generate("a long one " * 4, GenerationParams(max_tokens=400, spec_mode="dflash"))

    worker = threading.Thread(target=keep_running, daemon=True)
    worker.start()
    try:
        def holding() -> bool:
            gauges = _gauges(server)
            return all(_consistent(gauges[m]) and gauges[m]["used"] > 0 and gauges[m]["open_slots"] > 0
                       for m in MODELS)

        wait_until(holding, 30, "blocks held in both caches while a request runs", interval_s=0.1)
    finally:
        seen.set()
        worker.join(90)
    assert not worker.is_alive()
    gauges = _gauges(server)
    assert gauges["target"]["max"] == gauges["drafter"]["max"] < MAX_ACTIVE * MAX_LEN / PAGE  # paged: fewer

    def all_free() -> bool:
        gauges = _gauges(server)
        return all(_consistent(gauges[m]) and gauges[m]["used"] == gauges[m]["open_slots"] == 0 for m in MODELS)

    wait_until(all_free, 10, "every block free once the requests ended")
