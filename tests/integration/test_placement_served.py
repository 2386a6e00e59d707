"""A bf16 repository on a real server answers like the bf16 engine (the rest of device and dtype:
tests/unit/test_placement.py)."""

from __future__ import annotations

import tritonclient.grpc as grpcclient

from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request
from adaflash.models.cache import KVCache
from adaflash.models.bundle import load_bundle, save_bundle
from adaflash.models.placement import placement
from adaflash_server.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer


def test_a_bfloat16_repository_serves_like_the_bfloat16_engine(trained_tiny, tmp_path) -> None:
    """The target (in the orchestrator) and the drafter model in bf16 (on the CPU here; the GPU variant is in
    tests/integration/test_gpu_served.py), with caches paged from a budget of two sequences of max_len for four at
    once: ar one request at a time runs the same shapes as the engine, so the text is equal; adaflash drafts from
    features that cross the wire in bf16 (the drafter model runs)."""
    model_dir = save_bundle(trained_tiny, tmp_path / "models")
    half = placement("cpu", "bfloat16")
    per_token = sum(c.k.nbytes + c.v.nbytes for c in (KVCache(trained_tiny.target.config, 1, 1, half),
                                                      KVCache(trained_tiny.drafter.config, 1, 1, half)))
    cfg = RepositoryConfig(max_active=4, max_batch_size=8, max_len=512, max_prompt_tokens=128, max_output_tokens=256,
                           device="cpu", dtype="bfloat16", kv_cache_memory=str(2 * 512 * per_token), kv_page=32,
                           drafter_in_orchestrator=False)
    repo = build_repository(tmp_path / "model_repository", model_dir, "drafter", cfg)
    assert "kv_pages\" value: { string_value: \"32\"" in (repo / "adaflash" / "config.pbtxt").read_text()
    bundle = load_bundle(model_dir, None, placement("cpu", "bfloat16"))
    prompts = ["def add(a, b):", "The capital of France is", "1, 2, 3, 4,"]
    engine = Engine(bundle.target, None, num_slots=1, max_len=512)
    expected = [bundle.tokenizer.decode(engine.generate([Request(bundle.tokenizer.encode(p).ids, 24)])[0].output)
                for p in prompts]
    with TritonServer(ServerConfig(model_repository=repo, state_dir=tmp_path / "state")) as server:
        client = AdaFlashClient(server.grpc_url, timeout_s=120)
        for prompt, text in zip(prompts, expected):
            assert client.generate(prompt, GenerationParams(max_tokens=24, spec_mode="ar")).text == text
        drafted = [client.generate(p, GenerationParams(max_tokens=24, spec_mode="adaflash")) for p in prompts]
        stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics(model_name="drafter")
    assert all(c.text for c in drafted)
    assert sum(s.inference_count for s in stats.model_stats) > 0
