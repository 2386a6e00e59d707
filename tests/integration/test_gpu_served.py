"""On a CUDA GPU (`make gpu-check`; skipped elsewhere): a repository served on the device answers like the
engine there (the models and the engine on the device: tests/unit/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from test_gpu import CUDA

from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request
from adaflash.models.bundle import load_bundle, save_bundle
from adaflash_server.repository import RepositoryConfig, build_repository

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check)")


def test_a_repository_served_on_cuda_answers_like_the_engine_on_cuda(trained_tiny, tmp_path) -> None:
    """ar, one request at a time: the served forward and the in-process one run the same shapes on the same
    device, so the text is equal; adaflash answers through the GPU drafter. Needs the serve extra (a GPU host
    without Triton runs the rest)."""
    pytest.importorskip("tritonclient")
    pytest.importorskip("pytriton")
    from adaflash_client import AdaFlashClient, GenerationParams
    from adaflash_server.launcher import ServerConfig, TritonServer

    model_dir = save_bundle(trained_tiny, tmp_path / "models")
    cfg = RepositoryConfig(max_active=8, max_batch_size=8, max_len=512, max_prompt_tokens=128, max_output_tokens=256,
                           device="cuda:0")
    repo = build_repository(tmp_path / "model_repository", model_dir, "drafter", cfg)
    bundle = load_bundle(model_dir, None, CUDA)
    prompts = ["def add(a, b):", "The capital of France is", "1, 2, 3, 4,"]
    engine = Engine(bundle.target, None, num_slots=1, max_len=512)
    expected = [bundle.tokenizer.decode(engine.generate([Request(bundle.tokenizer.encode(p).ids, 24)])[0].output)
                for p in prompts]
    with TritonServer(ServerConfig(model_repository=repo, state_dir=tmp_path / "state")) as server:
        client = AdaFlashClient(server.grpc_url, timeout_s=120)
        for prompt, text in zip(prompts, expected):
            assert client.generate(prompt, GenerationParams(max_tokens=24, spec_mode="ar")).text == text
            assert client.generate(prompt, GenerationParams(max_tokens=24, spec_mode="adaflash")).text
