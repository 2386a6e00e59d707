"""The embedded default models: transformers parity of the target, drafters in the published format,
and a real server on them whose adaflash text equals plain greedy decoding.

These run once the models are committed (`make models` writes them); before that there is
nothing to check and the module is skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash.decoding.engine import Engine, Request
from adaflash.evaluation.prompts import eval_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import DFlashDrafter
from adaflash.models.target import Transformer
from adaflash_server.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer

MODELS = Path(__file__).resolve().parent.parent / DEFAULT_MODEL_DIR
DRAFTERS = ("drafter", "drafter-dflash", "drafter-osd")
pytestmark = pytest.mark.skipif(not (MODELS / "target" / "config.json").exists(), reason="models/default not built")


def test_target_logits_match_transformers():
    ids = torch.tensor([[5, 300, 1200, 42, 7, 999, 4000, 17, 256, 8000]])
    hf = AutoModelForCausalLM.from_pretrained(MODELS / "target", torch_dtype=torch.float32).eval()
    runner = Transformer.from_pretrained(MODELS / "target")
    with torch.no_grad():
        ref = hf(ids).logits[0]
    ours = runner.forward(runner.new_cache(1, 64), [0], [ids[0].tolist()], logit_rows=torch.arange(ids.shape[1])).logits
    assert (ours - ref).abs().max().item() < 1e-3


@pytest.mark.parametrize("name", DRAFTERS)
def test_drafters_load_in_the_published_format_and_fit_the_target(name):
    drafter = DFlashDrafter.from_pretrained(MODELS / name)
    drafter.check_target(Transformer.from_pretrained(MODELS / "target"))
    assert drafter.config.block_size == 16
    if name == "drafter":  # the served drafter carries the AdaFlash heads
        assert drafter.config.length_head and drafter.config.position_head


def test_server_on_the_default_models_streams_the_greedy_text(tmp_path):
    bundle = load_bundle(MODELS, drafter=None)
    prompts = [texts[0][-300:] for texts in eval_prompts(Path(__file__).parent / "fixtures" / "corpus", 1).values()]
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
