"""The drafter's block forward on ONNX Runtime (`--drafter-backend onnx`) against PyTorch's: the same drafted
tokens, head outputs within HEAD_TOL, for the engine and for the served drafter model's slots; and decoding with it
stays lossless. One export (about 15 s here) serves the module: a drafter with both length heads and a sliding layer
beside a full one, so every branch of the graph is in it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import fixed_costs, random_prompts

from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request
from adaflash.models.bundle import tiny_random_bundle
from adaflash.models.backends import on_backend
from adaflash.models.drafter import DFlashDrafter
from adaflash.models.placement import placement
from adaflash.serving.protocol import DraftCall
from adaflash.serving.slots import DrafterSlots

pytest.importorskip("onnxruntime", reason="the onnx extra (pip install -e '.[onnx]') is not installed")

# Observed: at most 2e-7 between the two on this CPU (float32 sums in another order); the bound leaves room for
# other CPUs' kernels while still catching a wrong mask, window or position (those move heads by > 1e-2).
HEAD_TOL = 1e-5
MAX_LEN = 400


@pytest.fixture(scope="module")
def drafters(trained_tiny) -> tuple[DFlashDrafter, DFlashDrafter]:
    """The trained tiny drafter given a length head, a position head (seeded random) and a sliding second layer
    (window 24), on PyTorch and on ONNX Runtime."""
    cfg = dataclasses.replace(trained_tiny.drafter.config, length_head=True, length_head_dim=32, position_head=True,
                              position_head_dim=16, layer_types=["full_attention", "sliding_attention"],
                              sliding_window=24)
    torch.manual_seed(7)
    drafter = DFlashDrafter(cfg)
    drafter.load_state_dict(trained_tiny.drafter.state_dict(), strict=False)
    drafter.eval()
    return drafter, on_backend(drafter, trained_tiny.target, "onnx")


def _filled_cache(drafter: DFlashDrafter, batch: int, context: int) -> tuple[object, list[int]]:
    """A context cache whose `batch` sequences hold ragged lengths up to `context`, in slots out of order (the
    gather then copies instead of viewing)."""
    cache = drafter.new_cache(batch + 2, MAX_LEN)
    slots = [batch + 1 - i for i in range(batch)]
    lengths = [max(1, context - 13 * i) for i in range(batch)]
    g = torch.Generator().manual_seed(batch * 1000 + context)
    features = torch.randn(sum(lengths), drafter.fc.weight.shape[1], generator=g)
    drafter.append_context(cache, slots, features, lengths)
    return cache, slots


@pytest.mark.parametrize("block_length", [2, 7, 16])
@pytest.mark.parametrize("context", [1, 40, 300])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_onnx_runtime_drafts_what_pytorch_drafts(trained_tiny, drafters, batch, context, block_length):
    torch_drafter, onnx_drafter = drafters
    cache, slots = _filled_cache(torch_drafter, batch, context)
    anchors = random_prompts(1, seed=batch + context, min_len=batch, max_len=batch)[0]
    want = torch_drafter.draft(trained_tiny.target, cache, slots, anchors, block_length)
    got = onnx_drafter.draft(trained_tiny.target, cache, slots, anchors, block_length)
    assert torch.equal(got.tokens, want.tokens)
    assert got.tokens.shape == (batch, block_length - 1)
    assert (got.accept_ratio - want.accept_ratio).abs().max() <= HEAD_TOL
    assert (got.accept_rates - want.accept_rates).abs().max() <= HEAD_TOL


def test_the_served_drafter_slots_draft_alike(trained_tiny, drafters):
    """What the `drafter` model runs (DrafterSlots): contexts appended over two calls, then drafted."""
    width = drafters[0].fc.weight.shape[1]
    g = torch.Generator().manual_seed(3)
    calls = [DraftCall(keys=[10, 11, 12], anchors=[5, 6, 7], block_length=16,
                       features=[torch.randn(n, width, generator=g) for n in (30, 4, 17)]),
             DraftCall(keys=[11, 12], anchors=[8, 9], block_length=4,
                       features=[torch.randn(3, width, generator=g), None])]
    served = [DrafterSlots(d, trained_tiny.target, 4, MAX_LEN) for d in drafters]
    for call in calls:
        want, got = (s.run(call).value for s in served)
        assert torch.equal(got.tokens, want.tokens)
        assert (got.accept_rates - want.accept_rates).abs().max() <= HEAD_TOL


def test_decoding_with_the_onnx_drafter_is_lossless(trained_tiny, drafters):
    """dflash and adaflash over the ONNX drafter give plain decoding's output; dflash accepts exactly what it
    accepts over the PyTorch drafter (the same drafts, step by step)."""
    prompts = random_prompts(6, seed=21)
    steps = {}
    for name, drafter in zip(("torch", "onnx"), drafters):
        engine = Engine(trained_tiny.target, drafter, num_slots=6, max_len=MAX_LEN,
                        cost_model=fixed_costs(6), plan_gate=False)
        runs = {mode: engine.generate([Request(p, 40, mode=mode, stop_ids=()) for p in prompts])
                for mode in ("ar", "dflash", "adaflash")}
        for mode in ("dflash", "adaflash"):
            assert [s.output for s in runs[mode]] == [s.output for s in runs["ar"]], f"{name} {mode}"
        steps[name] = [[(st.draft_len, st.accepted) for st in s.steps] for s in runs["dflash"]]
    assert steps["onnx"] == steps["torch"]
    assert any(accepted > 0 for seq in steps["onnx"] for _, accepted in seq)


def test_only_a_float32_cpu_drafter_goes_to_onnx_runtime():
    bundle = tiny_random_bundle(seed=0, place=placement("cpu", "bfloat16"))
    with pytest.raises(ValueError, match="float32"):
        on_backend(bundle.drafter, bundle.target, "onnx")
    with pytest.raises(ValueError, match="not one of torch, onnx"):
        on_backend(bundle.drafter, bundle.target, "tensorrt")
