"""A real server on the embedded default models whose adaflash (and dflash) text equals plain greedy decoding.

Runs once the models are committed (`make models` writes them); before that the module is skipped. The in-process
checks of the same models are tests/unit/test_default_models.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_default_models import MODELS

from adaflash.decoding.engine import Engine, Request
from adaflash.evaluation.prompts import eval_prompts
from adaflash.models.bundle import load_bundle
from adaflash_server.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer

pytestmark = pytest.mark.skipif(not (MODELS / "target" / "config.json").exists(), reason="models/default not built")


def test_server_on_the_default_models_streams_the_greedy_text(tmp_path):
    bundle = load_bundle(MODELS, drafter=None)
    prompts = [texts[0][-300:] for texts in eval_prompts(Path(__file__).parents[1] / "fixtures" / "corpus", 1).values()]
    engine = Engine(bundle.target, None, num_slots=4, max_len=512)
    seqs = engine.generate([Request(bundle.tokenizer.encode(p).ids, 48) for p in prompts])
    reference = [bundle.tokenizer.decode(s.output) for s in seqs]
    cfg = RepositoryConfig(max_active=4, max_batch_size=4, max_len=1024, max_prompt_tokens=400, max_output_tokens=200)
    repo = build_repository(tmp_path / "model_repository", MODELS, "drafter", cfg)
    with TritonServer(ServerConfig(model_repository=repo, state_dir=tmp_path / "state")) as server:
        client = AdaFlashClient(server.grpc_url, timeout_s=120)
        for mode in ("adaflash", "dflash"):
            texts = [client.generate_streaming(p, GenerationParams(max_tokens=48, spec_mode=mode)).text for p in prompts]
            assert texts == reference, mode
