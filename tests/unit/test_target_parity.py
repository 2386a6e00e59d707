"""The runner's logits and hidden states equal transformers' on random tiny Qwen3 and Llama checkpoints."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from adaflash.models.target import Transformer

TOL = 1e-4


def _hf_model(kind: str, tmp_path, tie: bool = False):
    common = dict(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    if kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 5000.0}))
    elif kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    else:
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
        model = LlamaForCausalLM(LlamaConfig(**common, rope_parameters=rope))
    with torch.no_grad():  # random norm weights so that a missing norm cannot go unnoticed
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.eval()
    model.save_pretrained(tmp_path)
    return model


def _hf_logits(model, ids: list[int]) -> tuple[torch.Tensor, tuple]:
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0], out.hidden_states


@pytest.mark.parametrize("kind", ["qwen3", "llama", "llama3-rope"])
def test_ragged_batch_matches_transformers(kind, tmp_path):
    hf = _hf_model(kind, tmp_path, tie=kind == "llama")
    runner = Transformer.from_pretrained(tmp_path)
    cache = runner.new_cache(num_slots=6, max_len=128)
    g = torch.Generator().manual_seed(1)
    seqs = {slot: torch.randint(0, 97, (n,), generator=g).tolist() for slot, n in [(0, 40), (3, 7), (5, 23)]}
    # Prefill different prefixes, then one ragged step with 1, 9 and 4 new tokens per sequence.
    prefix = {0: 30, 3: 6, 5: 19}
    runner.forward(cache, list(prefix), [seqs[s][: prefix[s]] for s in prefix])
    new = {0: seqs[0][30:31], 3: seqs[3][6:7] + [], 5: seqs[5][19:23]}
    new[3] = seqs[3][6:] + torch.randint(0, 97, (8,), generator=g).tolist()
    out = runner.forward(cache, list(new), [new[s] for s in new], capture_layers=[0, 1])
    row = 0
    for slot in new:
        full = seqs[slot][: prefix[slot]] + new[slot]
        ref_logits, ref_hidden = _hf_logits(hf, full)
        n = len(new[slot])
        got = out.logits[row : row + n]
        assert (got - ref_logits[-n:]).abs().max().item() <= TOL
        hidden = out.hidden[row : row + n]
        ref = torch.cat([ref_hidden[1][0, -n:], ref_hidden[2][0, -n:]], dim=-1)
        assert (hidden - ref).abs().max().item() <= TOL
        row += n


def test_truncation_drops_rejected_tokens(tmp_path):
    hf = _hf_model("qwen3", tmp_path)
    runner = Transformer.from_pretrained(tmp_path)
    cache = runner.new_cache(num_slots=2, max_len=64)
    ids = list(range(3, 23))
    runner.forward(cache, [1], [ids])
    runner.forward(cache, [1], [[50, 51, 52, 53, 54]])  # a verify whose tokens are all rejected but the first
    cache.truncate(1, 21)
    out = runner.forward(cache, [1], [[60, 61]])
    ref, _ = _hf_logits(hf, ids + [50, 60, 61])
    assert (out.logits - ref[-2:]).abs().max().item() <= TOL
    assert cache.lengths[1] == 23


def test_logit_rows_select_positions(tmp_path):
    _hf_model("qwen3", tmp_path)
    runner = Transformer.from_pretrained(tmp_path)
    all_rows = runner.forward(runner.new_cache(num_slots=2, max_len=64), [0], [[5, 6, 7, 8]]).logits
    last = runner.forward(runner.new_cache(num_slots=2, max_len=64), [0], [[5, 6, 7, 8]], logit_rows=torch.tensor([3])).logits
    assert torch.allclose(all_rows[3:], last, atol=1e-6)


def test_overflowing_the_cache_is_an_error(tmp_path):
    _hf_model("qwen3", tmp_path)
    runner = Transformer.from_pretrained(tmp_path)
    cache = runner.new_cache(num_slots=1, max_len=8)
    with pytest.raises(ValueError, match="exceed"):
        runner.forward(cache, [0], [list(range(9))])


def test_training_forward_matches_transformers(tmp_path):
    hf = _hf_model("qwen3", tmp_path)
    runner = Transformer.from_pretrained(tmp_path)
    ids = torch.randint(0, 97, (3, 21), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(ids).logits
        got = runner.train_logits(ids)
    assert (got - ref).abs().max().item() <= TOL
