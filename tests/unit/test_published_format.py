"""Checkpoints in the published formats, decoded in process (served unchanged by a real server:
tests/integration/test_published_format_served.py).

Tiny random checkpoints written with exactly the config keys and tensor names of the published files: a
Qwen3 target as Transformers writes Qwen3ForCausalLM, z-lab/Qwen3-8B-DFlash-b16's drafter and the AdaFlash
drafter with its length head (their config.json files from tests/fixtures/reference, scaled down; the
tensor names of its checkpoint-format.md, written by hand), all in bfloat16 as published. The drafted text
equals plain greedy decoding of the same checkpoint.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request
from adaflash.models.bundle import load_bundle
from adaflash.models.tokenizer import BYTE_SPECIALS, byte_tokenizer

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "reference"  # published config.json files (README there)
MAX_TOKENS = 24
H, INTER, HEADS, KV, HD, TARGET_LAYERS, DRAFT_LAYERS, LENGTH_HEAD = 64, 128, 4, 2, 16, 6, 2, 32
TARGET_LAYER_IDS = [1, 3]  # the published spread for 6 target layers and 2 drafter layers
PROMPTS = ["def fibonacci(n):\n    ", "The capital of France is", "1, 2, 3, 4, 5, 6,", "Once upon a time"]


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Large enough weights that the greedy text is not one repeated token."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=g))
            else:
                p.copy_((1.0 if "embed" in name else 0.2) * torch.randn(p.shape, generator=g))


def write_target(path: Path) -> dict:
    tok = byte_tokenizer()
    eos = tok.token_to_id(BYTE_SPECIALS[0])
    cfg = Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=H, intermediate_size=INTER,
                      num_hidden_layers=TARGET_LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV,
                      head_dim=HD, max_position_embeddings=1024, tie_word_embeddings=False, bos_token_id=eos,
                      eos_token_id=eos)
    model = Qwen3ForCausalLM(cfg)
    _randomize(model, seed=1)
    model.to(torch.bfloat16).save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    return {"vocab_size": tok.get_vocab_size(), "mask_token_id": tok.token_to_id(BYTE_SPECIALS[2]), "eos": eos}


def scaled_drafter_config(name: str, target: dict) -> dict:
    """A published config.json with the shapes of the tiny target; every key kept, none added."""
    cfg = copy.deepcopy(json.loads((CONFIGS / name).read_text()))
    cfg.update(hidden_size=H, intermediate_size=INTER, num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD,
               num_hidden_layers=DRAFT_LAYERS, max_window_layers=DRAFT_LAYERS, num_target_layers=TARGET_LAYERS,
               layer_types=["full_attention"] * DRAFT_LAYERS, vocab_size=target["vocab_size"],
               bos_token_id=target["eos"], eos_token_id=target["eos"], max_position_embeddings=1024)
    cfg["dflash_config"].update(mask_token_id=target["mask_token_id"], target_layer_ids=TARGET_LAYER_IDS)
    if "thresh_head_bottleneck_dim" in cfg["dflash_config"]:
        cfg["dflash_config"]["thresh_head_bottleneck_dim"] = LENGTH_HEAD
    assert set(cfg) == set(json.loads((CONFIGS / name).read_text()))
    return cfg


def drafter_tensors(length_head: bool, seed: int) -> dict[str, torch.Tensor]:
    """The tensor names and shapes of checkpoint-format.md, by hand."""
    g = torch.Generator().manual_seed(seed)

    def t(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=g)

    def norm(n: int) -> torch.Tensor:
        return 0.8 + 0.4 * torch.rand(n, generator=g)

    sd = {"fc.weight": t(H, len(TARGET_LAYER_IDS) * H), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for i in range(DRAFT_LAYERS):
        p = f"layers.{i}."
        sd |= {p + "self_attn.q_proj.weight": t(HEADS * HD, H), p + "self_attn.k_proj.weight": t(KV * HD, H),
               p + "self_attn.v_proj.weight": t(KV * HD, H), p + "self_attn.o_proj.weight": t(H, HEADS * HD),
               p + "self_attn.q_norm.weight": norm(HD), p + "self_attn.k_norm.weight": norm(HD),
               p + "mlp.gate_proj.weight": t(INTER, H), p + "mlp.up_proj.weight": t(INTER, H),
               p + "mlp.down_proj.weight": t(H, INTER), p + "input_layernorm.weight": norm(H),
               p + "post_attention_layernorm.weight": norm(H)}
    if length_head:
        sd |= {"thresh_head_two_model.down.weight": t(LENGTH_HEAD, 2 * H),
               "thresh_head_two_model.down.bias": t(LENGTH_HEAD),
               "thresh_head_two_model.res.0.weight": t(LENGTH_HEAD, LENGTH_HEAD),
               "thresh_head_two_model.res.0.bias": t(LENGTH_HEAD),
               "thresh_head_two_model.out.weight": t(1, LENGTH_HEAD), "thresh_head_two_model.out.bias": t(1)}
    return sd


def write_drafter(path: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})


@pytest.fixture(scope="module")
def published_models(tmp_path_factory) -> Path:
    """target/ (Qwen3), drafter/ (AdaFlash: DFlash with its length head), drafter-dflash/ (z-lab DFlash)."""
    root = tmp_path_factory.mktemp("published") / "models"
    target = write_target(root / "target")
    write_drafter(root / "drafter", scaled_drafter_config("adaflash-qwen3-8b-thresh-head.json", target),
                  drafter_tensors(length_head=True, seed=2))
    write_drafter(root / "drafter-dflash", scaled_drafter_config("dflash-qwen3-8b-b16.json", target),
                  drafter_tensors(length_head=False, seed=3))
    return root


@pytest.fixture(scope="module")
def greedy(published_models) -> list[list[int]]:
    """Plain greedy decoding of the same checkpoint, in process."""
    bundle = load_bundle(published_models, drafter=None)
    engine = Engine(bundle.target, None, num_slots=4, max_len=256)
    return [s.output for s in engine.generate([Request(bundle.tokenizer.encode(p).ids, MAX_TOKENS) for p in PROMPTS])]


def test_the_published_dflash_drafter_drafts_the_greedy_text_in_process(published_models, greedy):
    bundle = load_bundle(published_models, drafter="drafter-dflash")
    engine = Engine(bundle.target, bundle.drafter, num_slots=4, max_len=256)
    seqs = engine.generate([Request(bundle.tokenizer.encode(p).ids, MAX_TOKENS, mode="dflash") for p in PROMPTS])
    assert [s.output for s in seqs] == greedy
    assert max(st.draft_len for s in seqs for st in s.steps) == bundle.drafter.config.block_size - 1
