"""Hot swap: a drafter published to a running server serves new requests; requests in flight finish exactly."""

from __future__ import annotations

import dataclasses
import threading
import re
import time
import urllib.request

import pytest
import torch
import tritonclient.grpc as grpcclient
from helpers import wait_until

from adaflash.cli import main
from adaflash.decoding.engine import Engine, Request
from adaflash.evaluation.prompts import load_prompts
from adaflash.models.bundle import load_bundle, save_bundle
from adaflash.models.drafter import DFlashDrafter
from adaflash_server.repository import RepositoryConfig, build_repository, drafter_models, publish_drafter
from adaflash_client import AdaFlashClient, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer

MAX_TOKENS = 200
REQUEST_TIMEOUT_S = 120
POLL_TIMEOUT_S = REQUEST_TIMEOUT_S + 60  # a stuck request reports its own timeout before a poll gives up


def _drafts(server: TritonServer, model: str) -> float:
    """The sequences the orchestrator sent `model` to draft, wherever the drafter runs (its counters)."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    found = re.search(rf'^adaflash_model_call_sequences_total{{model="{model}",op="draft"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("here", [True, False], ids=["drafter-in-orchestrator", "drafter-model"])
def test_published_drafter_takes_over_without_dropping_requests(trained_tiny, tmp_path, here):
    """Whether the first drafter runs beside the target or as a model of its own, a published one is a model that
    takes over new sequences."""
    model_dir = save_bundle(trained_tiny, tmp_path / "models")
    # The next version: the same drafter given a per-position length head (different weights and config).
    cfg = dataclasses.replace(trained_tiny.drafter.config, position_head=True, position_head_dim=16)
    torch.manual_seed(1)
    v2 = DFlashDrafter(cfg)
    v2.load_state_dict(trained_tiny.drafter.state_dict(), strict=False)
    v2.save_pretrained(model_dir / "drafter-v2", dtype=torch.float32)
    repo = build_repository(tmp_path / "repo", model_dir, "drafter",
                            RepositoryConfig(max_active=16, max_batch_size=16, max_len=1024, max_prompt_tokens=400,
                                             max_output_tokens=600, drafter_in_orchestrator=here))
    prompts = [p.text[-160:] for p in load_prompts(None, 8)]
    bundle = load_bundle(model_dir, None)
    engine = Engine(bundle.target, None, num_slots=8, max_len=1024)
    reference = {p: bundle.tokenizer.decode(s.output) for p, s in zip(prompts, engine.generate(
        [Request(bundle.tokenizer.encode(p).ids, MAX_TOKENS) for p in prompts], concurrency=8))}

    with TritonServer(ServerConfig(model_repository=repo, state_dir=tmp_path / "state")) as server:
        results: list[tuple[str, str, float, float]] = []  # prompt, text, started, finished
        errors: list[Exception] = []
        stop = threading.Event()

        def traffic(prompt: str) -> None:
            client = AdaFlashClient(server.grpc_url, timeout_s=REQUEST_TIMEOUT_S)
            while not stop.is_set():
                started = time.monotonic()
                try:
                    text = client.generate_streaming(prompt, GenerationParams(max_tokens=MAX_TOKENS,
                                                                              spec_mode="dflash")).text
                except Exception as exc:  # noqa: BLE001 - collected and asserted below
                    errors.append(exc)
                    return
                results.append((prompt, text, started, time.monotonic()))

        # Daemons: a failing assertion leaves them running, and the test process must not wait on them.
        threads = [threading.Thread(target=traffic, args=(p,), daemon=True) for p in prompts]
        for t in threads:
            t.start()
        control = grpcclient.InferenceServerClient(server.grpc_url)
        wait_until(lambda: errors or len(results) >= 8, POLL_TIMEOUT_S, "8 requests to finish before the swap")
        assert not errors, errors
        swap_started = time.monotonic()
        v1_before = _drafts(server, "drafter")
        assert main(["publish-drafter", str(model_dir / "drafter-v2"), "--repository", str(repo),
                     "--url", server.grpc_url]) == 0
        swapped = time.monotonic()
        assert drafter_models(repo) == ["drafter", "drafter_2"]
        assert control.is_model_ready("drafter_2") and control.is_model_ready("drafter") is not here
        assert _drafts(server, "drafter") >= v1_before  # the running drafter was not reloaded
        v2_at_swap = _drafts(server, "drafter_2")
        wait_until(lambda: errors or any(start > swapped for _, _, start, _ in results), POLL_TIMEOUT_S,
                   "a request started after the swap to finish")
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(timeout=REQUEST_TIMEOUT_S)
        assert not any(t.is_alive() for t in threads), "a traffic thread's last request never finished"

        assert not errors, errors
        assert all(text == reference[p] for p, text, _, _ in results)
        spanning = [r for r in results if r[2] < swap_started and r[3] > swap_started]
        assert spanning, "no request was running when the swap began"
        wait_until(lambda: _drafts(server, "drafter_2") > v2_at_swap, 10,  # counters reach /metrics within a flush
                   "requests after the swap to draft with the new drafter")

    with pytest.raises(ValueError, match="block_size"):
        other = dataclasses.replace(trained_tiny.drafter.config, block_size=8)
        DFlashDrafter(other).save_pretrained(model_dir / "drafter-b8", dtype=torch.float32)
        publish_drafter(repo, model_dir / "drafter-b8")
