"""The memory planner counts what the models really build and allocate, and its budget inverse holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from adaflash.cli import main
from adaflash.models.drafter import DFlashDrafter, DrafterConfig
from adaflash.models.memory import (cache_bytes_for, device_cache_budget, dtype_itemsize, plan_memory,
                                    slots_for_budget, target_parameters, token_heads_parameters, tokens_for_budget)
from adaflash.models.target import TargetConfig, TokenHeads, Transformer

QWEN3_8B = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "qwen3-8b"
QWEN3_8B_PARAMETERS = 8_190_735_360  # the model card's "8.2B"; 6,946,075,648 without embedding and LM head


def tiny_target(model_type: str = "qwen3", tied: bool = False, bias: bool = False) -> dict:
    return {"model_type": model_type, "vocab_size": 97, "hidden_size": 48, "intermediate_size": 80,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "tie_word_embeddings": tied, "attention_bias": bias, "rope_theta": 10000.0}


def tiny_drafter(length_head: bool = False, position_head: bool = False) -> dict:
    dc = {"mask_token_id": 96, "target_layer_ids": [0, 2]}
    if length_head:
        dc.update(use_thresh_head_two_model=True, thresh_head_bottleneck_dim=24, thresh_head_direct_len=True)
    if position_head:
        dc.update(use_position_head=True, position_head_dim=12)
    return {"model_type": "qwen3", "hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "block_size": 8,
            "num_target_layers": 3, "rope_theta": 10000.0, "dflash_config": dc}


def numel(model: torch.nn.Module) -> int:
    """Elements of the model's distinct parameters: a tied LM head is the embedding, counted once."""
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("cfg", [tiny_target(), tiny_target(tied=True), tiny_target("llama", bias=True)],
                         ids=["qwen3", "qwen3-tied", "llama-bias"])
def test_target_parameters_equal_the_built_model(cfg: dict) -> None:
    tc = TargetConfig.from_hf(cfg)
    assert sum(target_parameters(tc).values()) == numel(Transformer(tc))
    assert token_heads_parameters(tc) == numel(TokenHeads(tc))


@pytest.mark.parametrize("heads", [(False, False), (True, False), (True, True)], ids=["dflash", "length", "both"])
def test_drafter_parameters_equal_the_built_model(heads: tuple[bool, bool]) -> None:
    tc, dc = TargetConfig.from_hf(tiny_target()), DrafterConfig.from_hf(tiny_drafter(*heads))
    plan = plan_memory(tc, dc, "float32", slots=2, max_len=32)
    assert sum(plan.drafter_parameters.values()) == numel(DFlashDrafter(dc))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_bytes_per_token_equal_a_real_allocation(dtype: torch.dtype) -> None:
    tc, dc = TargetConfig.from_hf(tiny_target()), DrafterConfig.from_hf(tiny_drafter())
    plan = plan_memory(tc, dc, dtype, slots=3, max_len=40)
    for model, per_token in [(Transformer(tc), plan.target_kv_per_token),
                             (DFlashDrafter(dc), plan.drafter_context_per_token)]:
        cache = model.to(dtype).new_cache(3, 40)
        allocated = sum(t.numel() * t.element_size() for t in (cache.k, cache.v))
        assert allocated == 3 * 40 * per_token


def test_feature_bytes_equal_what_the_target_captures() -> None:
    tc, dc = TargetConfig.from_hf(tiny_target()), DrafterConfig.from_hf(tiny_drafter())
    target = Transformer(tc)
    out = target.forward(target.new_cache(1, 8), [0], [[1, 2, 3]], capture_layers=dc.target_layer_ids)
    plan = plan_memory(tc, dc, "float32", slots=1, max_len=8)
    assert out.hidden.shape[0] * plan.features_per_token == out.hidden.numel() * out.hidden.element_size()


def test_tokens_for_budget_inverts_cache_bytes() -> None:
    tc, dc = TargetConfig.from_hf(tiny_target()), DrafterConfig.from_hf(tiny_drafter())
    plan = plan_memory(tc, dc, "bfloat16", slots=4, max_len=64)
    for tokens in (0, 1, 63, 64, 1000):
        assert tokens_for_budget(plan, cache_bytes_for(plan, tokens)) == tokens
    for budget in (0, 1, 12_345, 10**9):
        tokens = tokens_for_budget(plan, budget)
        assert cache_bytes_for(plan, tokens) <= budget < cache_bytes_for(plan, tokens + 1)
        assert slots_for_budget(plan, budget) == tokens // 64
    assert slots_for_budget(plan, cache_bytes_for(plan, 3 * 64)) == 3


def test_device_budget_is_what_the_weights_and_activations_leave() -> None:
    tc, dc = TargetConfig.from_hf(tiny_target()), DrafterConfig.from_hf(tiny_drafter())
    plan = plan_memory(tc, dc, "float32", slots=2, max_len=16)
    device = 10 * (plan.weight_bytes + plan.activation_bytes)
    assert device_cache_budget(plan, device, 0.5) == device // 2 - plan.weight_bytes - plan.activation_bytes
    with pytest.raises(ValueError, match="does not hold the weights"):
        device_cache_budget(plan, plan.weight_bytes, 1.0)


def test_unknown_dtype_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="dtype: 'float8'"):
        dtype_itemsize("float8")


def plan_json(capsys: pytest.CaptureFixture, *args: str) -> dict:
    assert main(["plan-memory", "--model-dir", str(QWEN3_8B), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_on_the_config_only_qwen3_8b_folder(capsys: pytest.CaptureFixture) -> None:
    assert not list(QWEN3_8B.rglob("*.safetensors"))
    report = plan_json(capsys, "--drafter", "drafter-adaflash", "--dtype", "bfloat16", "--device-memory", "139GiB")
    assert report["parameters"]["target"]["total"] == QWEN3_8B_PARAMETERS
    assert report["weights"]["target_model"] == 2 * QWEN3_8B_PARAMETERS
    assert report["parameters"]["drafter"]["thresh_head_two_model"] == 2 * 4096 * 256 + 256 + 256 * 256 + 256 + 257
    assert report["per_token"] == {"target_kv": 2 * 36 * 8 * 128 * 2, "drafter_context": 2 * 5 * 8 * 128 * 2,
                                   "caches": (2 * 36 + 2 * 5) * 8 * 128 * 2, "features": 5 * 4096 * 2}
    budget = report["budget"]
    used = int(139 * 2**30 * 0.9)
    assert budget["bytes"] == used - report["weights"]["total"] - report["activations"]
    assert budget["tokens"] == budget["bytes"] // report["per_token"]["caches"]
    assert budget["slots"] == budget["tokens"] // 2048


def test_cli_kv_cache_memory_and_table(capsys: pytest.CaptureFixture) -> None:
    report = plan_json(capsys, "--kv-cache-memory", "40GB", "--dtype", "float32", "--slots", "8", "--max-len", "1024")
    assert report["budget"]["tokens"] == 40 * 10**9 // ((2 * 36 + 2 * 5) * 8 * 128 * 4)
    assert report["caches"]["target_kv"] == 8 * 1024 * 2 * 36 * 8 * 128 * 4
    assert main(["plan-memory", "--model-dir", str(QWEN3_8B), "--drafter", ""]) == 0
    table = capsys.readouterr().out
    assert f"{QWEN3_8B_PARAMETERS:,}" in table and "drafter" not in table


@pytest.mark.parametrize("args, option", [
    (["--dtype", "float8"], "--dtype"),
    (["--device-memory", "12XB"], "--device-memory"),
    (["--device-memory", "16GB"], "--device-memory"),  # less than the bf16 weights and activations
    (["--kv-cache-memory", "1MB"], "--kv-cache-memory"),  # not one sequence of 2,048 tokens
    (["--memory-fraction", "1.5", "--device-memory", "141GB"], "--memory-fraction"),
])
def test_cli_bad_input_names_the_option(capsys: pytest.CaptureFixture, args: list[str], option: str) -> None:
    try:
        code = main(["plan-memory", "--model-dir", str(QWEN3_8B), *args])
    except SystemExit as exc:  # argparse refuses it
        code = exc.code
    assert code == 2
    assert option in capsys.readouterr().err


def test_cli_missing_config_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["plan-memory", "--model-dir", str(tmp_path)]) == 2
    assert str(tmp_path / "target" / "config.json") in capsys.readouterr().err
