"""The embedded default models: transformers parity of the target and drafters in the published format (a real
server on them: tests/integration/test_default_models_served.py).

These run once the models are committed (`make models` writes them); before that there is
nothing to check and the module is skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash.models.drafter import DFlashDrafter
from adaflash.models.target import Transformer

MODELS = Path(__file__).resolve().parents[2] / DEFAULT_MODEL_DIR
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
