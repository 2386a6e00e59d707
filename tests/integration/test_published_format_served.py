"""Checkpoints in the published formats, served unchanged by a real server: the served text of every mode equals
plain greedy decoding of the same checkpoint. The checkpoints and the in-process check are
tests/unit/test_published_format.py."""

from __future__ import annotations

from helpers import fixed_costs
from test_published_format import MAX_TOKENS, PROMPTS
import test_published_format

from adaflash.models.bundle import load_bundle
from adaflash_server.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer


# The fixtures of the module it was split from, for pytest to find here too.
published_models, greedy = test_published_format.published_models, test_published_format.greedy


def test_a_server_on_the_published_formats_streams_the_greedy_text(published_models, greedy, tmp_path):
    tokenizer = load_bundle(published_models, drafter=None).tokenizer
    reference = [tokenizer.decode(ids) for ids in greedy]
    cfg = RepositoryConfig(max_active=4, max_batch_size=4, max_len=256, max_prompt_tokens=64,
                           max_output_tokens=MAX_TOKENS, device="cpu")
    fixed_costs(4).save(tmp_path / "costs.json")  # measuring them would take most of the test's time
    repo = build_repository(tmp_path / "model_repository", published_models, "drafter", cfg, tmp_path / "costs.json")
    with TritonServer(ServerConfig(model_repository=repo, state_dir=tmp_path / "state")) as server:
        client = AdaFlashClient(server.grpc_url, timeout_s=120)
        for mode in ("ar", "dflash", "adaflash-published"):
            done = [client.generate_streaming(p, GenerationParams(max_tokens=MAX_TOKENS, spec_mode=mode))
                    for p in PROMPTS]
            assert [c.text for c in done] == reference, mode
            drafted = [k for c in done for k in c.draft_len_per_step]
            assert (max(drafted) > 0) is (mode != "ar"), mode
