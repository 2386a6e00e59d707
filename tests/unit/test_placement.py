"""Device and dtype: parsing, tensors created only on the models' device, half precision on tiny models, the
fused causal attention path, and features on the wire in the target's dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import DeviceLog, modes_equal_up_to_ties, random_prompts

from adaflash_contract.modes import MODE_NAMES
from adaflash.decoding.steps import StepResult
from adaflash.models.layers import rope_cos_sin
from adaflash.models.bundle import load_bundle, save_bundle, tiny_random_bundle
from adaflash.models.placement import CPU, Placement, move_to, place_of, placement
from adaflash.models.target import ForwardBatch
from adaflash.serving import protocol

META = Placement(torch.device("meta"), torch.bfloat16)


def test_dtype_follows_the_device_and_bad_values_name_the_argument() -> None:
    assert placement("cpu") == CPU
    assert placement("cpu", "bfloat16").dtype == torch.bfloat16
    assert placement(None).device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="^dtype: 'int8'"):
        placement("cpu", "int8")
    with pytest.raises(ValueError, match="^device: 'tpu'"):
        placement("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="^device: 'cuda'.*no CUDA"):
            placement("cuda")


def test_forwards_create_every_tensor_on_the_models_device() -> None:
    """PyTorch's meta device stands in for a GPU: a tensor that a forward makes on the CPU (an index, a mask, a
    position) is logged with its op. Covers the target's prefill and verify (masked, fused-causal and mask-free
    attention groups), the drafter's context and block forwards; not the value reads (argmax, tolist), which
    meta tensors cannot answer."""
    bundle = tiny_random_bundle(seed=0)
    target, drafter = move_to(bundle.target, META), move_to(bundle.drafter, META)
    cache, context = target.new_cache(3, 64), drafter.new_cache(3, 64)
    assert cache.k.device.type == context.k.device.type == "meta"
    log = DeviceLog()
    with log:
        out = target.forward(cache, [0, 1, 2], [[1, 2, 3, 4], [5, 6], [7]], capture_layers=[1, 2])
        target.forward(cache, [0, 1], [[8, 9, 10], [11, 12, 13]])  # unequal starts: a mask
        target.forward(cache, [0, 2], [[1], [2]])  # one token each
        drafter.append_context(context, [0, 1, 2], out.hidden, [4, 2, 1])
        drafter.draft(target, context, [0, 2], [3, 4], 8)
        drafter.draft(target, context, [1], [5])
    assert set(log.devices) == {torch.device("meta")}, {str(d): ops[:5] for d, ops in log.devices.items()}


def test_fused_causal_attention_equals_the_masked_path() -> None:
    """On CUDA a verify of equal counts after equal starts runs under a lower-right causal bias (fused SDPA
    kernels) instead of a boolean mask; on the CPU both can run, and must agree."""
    target = tiny_random_bundle(seed=1).target
    attn = target.model.layers[0].self_attn
    cache = target.new_cache(2, 32)
    target.forward(cache, [0, 1], [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    x = torch.randn(8, target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    outs = []
    for fused in (False, True):
        fb = ForwardBatch.build(cache, [0, 1], [5, 5], [4, 4], torch.device("cpu"), fused_causal=fused)
        assert (type(fb.groups[0].mask).__name__ == "CausalBias") == fused
        cos, sin = rope_cos_sin(target.inv_freq, fb.positions)
        outs.append(attn(x, cos, sin, fb, cache.k[0], cache.v[0]))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_short_counts_attending_as_one_group_equal_a_group_per_power_of_two() -> None:
    """On CUDA the sequences of a step's size (decodes, verifies of different draft lengths) attend as one padded
    group, a prefill beside them in its own; on the CPU each power of two is a group. Both run here and must
    agree, each sequence after its own cached length."""
    target = tiny_random_bundle(seed=1).target
    attn = target.model.layers[0].self_attn
    cache = target.new_cache(4, 64)
    target.forward(cache, [0, 1, 2, 3], [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14]])
    starts, counts = [3, 5, 2, 4], [1, 3, 6, 20]
    x = torch.randn(sum(counts), target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    outs = []
    for merged, groups in ((False, 4), (True, 2)):
        fb = ForwardBatch.build(cache, [0, 1, 2, 3], starts, counts, torch.device("cpu"), one_short_group=merged)
        assert len(fb.groups) == groups
        cos, sin = rope_cos_sin(target.inv_freq, fb.positions)
        outs.append(attn(x, cos, sin, fb, cache.k[0], cache.v[0]))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("dtype", "tolerance"), [("bfloat16", 0.03), ("float16", 0.005)])
def test_half_precision_models_stay_close_to_fp32(tmp_path, dtype: str, tolerance: float) -> None:
    """A checkpoint loaded in half precision: logits within `tolerance` of the largest fp32 logit (measured
    on this tiny model: 1.8% in bf16, 0.29% in fp16, about 2^-8 and 2^-11 rounding through four layers) with the
    same argmax; features in that dtype; RoPE frequencies kept in fp32."""
    save_bundle(tiny_random_bundle(seed=2), tmp_path)
    full = load_bundle(tmp_path, "drafter")
    half = load_bundle(tmp_path, "drafter", placement("cpu", dtype))
    assert place_of(half.target).dtype == place_of(half.drafter).dtype == getattr(torch, dtype)
    assert half.target.inv_freq.dtype == half.drafter.inv_freq.dtype == torch.float32
    tokens = [[5, 9, 2, 7, 1, 3, 8, 4]]
    ref = full.target.forward(full.target.new_cache(1, 16), [0], tokens, capture_layers=[1, 2])
    got = half.target.forward(half.target.new_cache(1, 16), [0], tokens, capture_layers=[1, 2])
    assert got.hidden.dtype == getattr(torch, dtype)
    diff = (got.logits.float() - ref.logits).abs().max().item()
    assert diff <= tolerance * ref.logits.abs().max().item(), f"{dtype} logits differ from fp32 by {diff}"
    assert torch.equal(got.logits.argmax(-1), ref.logits.argmax(-1))


def test_every_mode_matches_plain_decoding_in_bfloat16_up_to_rounding_ties(trained_tiny) -> None:
    """In bf16 a verify forward of k+1 rows and a decode forward of one row round differently (other kernel
    blocking), so where two tokens' logits are within bf16 rounding a mode may pick the other one, as on a
    GPU: fp32 is where greedy equality is exact (test_lossless.py). Here every mode either equals plain
    decoding or first departs from it where plain decoding's two candidates are within the bf16 tolerance of
    test_half_precision_models_stay_close_to_fp32 (3% of the largest logit); a real verification bug departs
    where the target clearly prefers its own token."""
    place = placement("cpu", "bfloat16")
    target = move_to(tiny_random_bundle(seed=0).target, place)
    target.load_state_dict(trained_tiny.target.state_dict())
    drafter = move_to(type(trained_tiny.drafter)(trained_tiny.drafter.config), place)
    drafter.load_state_dict(trained_tiny.drafter.state_dict())
    equal = modes_equal_up_to_ties(target, drafter, random_prompts(6, seed=3), 24, tolerance=0.03)
    assert equal >= 6 * len(MODE_NAMES) // 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_features_cross_the_wire_bit_for_bit_in_their_dtype(dtype: torch.dtype) -> None:
    feats = [torch.randn(3, 8).to(dtype), None, torch.randn(2, 8).to(dtype)]
    results = [StepResult([1], 0, 0.0, f) for f in feats]
    wire = protocol.encode_target_result(results, 1.0)
    assert wire["features"].dtype == np.uint8 and wire["features"].nbytes == 5 * 8 * dtype.itemsize
    decoded, _ = protocol.decode_target_result(wire)
    for sent, got in zip(feats, (r.features for r in decoded)):
        assert (got is None) == (sent is None)
        if sent is not None:
            assert got.dtype == dtype and torch.equal(got, sent)


def test_malformed_features_name_the_field() -> None:
    wire = protocol.encode_target_result([StepResult([1], 0, 0.0, torch.randn(2, 4))], 1.0)
    with pytest.raises(ValueError, match="^feature_dtype"):
        protocol.decode_target_result({**wire, "feature_dtype": np.array([7], np.int32)})
    with pytest.raises(ValueError, match="^features"):
        protocol.decode_target_result({**wire, "features": wire["features"][:, :-1]})
