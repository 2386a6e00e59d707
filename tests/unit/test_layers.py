"""Joined weights: the concatenated (and split) copies used for inference follow every change of the
parameters they come from, equal the plain product, and training through them reaches each part. The copies are
what a host without the native product uses (tests/unit/test_native.py covers that one): it is switched off here.
And the greedy token of each row of logits is torch's argmax, ties and all."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import copy

import pytest

from adaflash.models import native
from helpers import joined_product_in
from adaflash.models.layers import (MLP, Joined, Layout, argmax, layout_for, packed_linear, packed_weight,
                                    split_linear, split_rows)


@pytest.fixture(autouse=True)
def without_native(monkeypatch):
    monkeypatch.setattr(native, "available", lambda: False)


def _mlp() -> MLP:
    torch.manual_seed(0)
    return MLP(128, 384)  # gate and up joined: 768 x 128; every weight large enough for the split copy


def _reference(m: MLP, x: torch.Tensor) -> torch.Tensor:
    return m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))


def test_joined_inference_follows_an_optimizer_step_and_a_load():
    m = _mlp()
    x1, x8 = torch.randn(1, 128), torch.randn(8, 128)
    with torch.inference_mode():
        before = m(x1)  # the split copies of the joined weights
        assert torch.allclose(before, _reference(m, x1), atol=1e-6)
        assert torch.allclose(m(x8), _reference(m, x8), atol=1e-6)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    _reference(m, x8).square().sum().backward()
    opt.step()
    with torch.inference_mode():
        after = m(x1)
        assert not torch.allclose(after, before) and torch.allclose(after, _reference(m, x1), atol=1e-6)
    m.load_state_dict(_mlp().state_dict())
    with torch.inference_mode():
        assert torch.allclose(m(x1), before, atol=1e-6)


def test_training_through_joined_weights_reaches_each_part():
    m = _mlp()
    m(torch.randn(4, 3, 128)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


def test_a_single_part_is_the_parameter_itself():
    lin = nn.Linear(4, 8, bias=False)
    holder = nn.Module()
    holder.head = lin
    assert Joined(["head.weight"]).of(holder) is lin.weight


@pytest.mark.parametrize("shape", [(1,), (3,), (16,), (2, 5)])
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_the_split_product_equals_the_plain_one(shape, parts):
    torch.manual_seed(len(shape) * parts)
    w, x = torch.randn(48, 20), torch.randn(*shape, 20)
    assert torch.allclose(split_linear(x, split_rows(w, parts)), F.linear(x, w), atol=1e-5)


@pytest.mark.parametrize(("rows", "layout"), [(1, Layout.SPLIT), (2, Layout.SPLIT), (5, Layout.PACKED), (300, Layout.PLAIN)])
def test_each_layout_adds_the_bias_and_follows_a_cast(rows, layout):
    holder, lin, joined, x = joined_product_in(layout, rows)
    with torch.inference_mode():
        assert list(joined._copies) == ([] if layout is Layout.PLAIN else [layout])
        holder.double()
        y = joined.linear(holder, x.double(), lin.bias)  # fp64: the plain product, not the stale fp32 copy
        assert y.dtype == torch.float64 and torch.allclose(y, lin(x.double()))


def test_the_packed_product_equals_the_plain_one():
    torch.manual_seed(1)
    w, x = torch.randn(48, 20), torch.randn(2, 7, 20)
    assert torch.allclose(packed_linear(x, packed_weight(w), None), F.linear(x, w), atol=1e-5)


def test_a_tiny_weight_keeps_the_plain_product():
    with torch.inference_mode():
        assert layout_for(torch.randn(1, 8), torch.randn(32, 8)) is Layout.PLAIN


def test_a_module_with_derived_copies_deep_copies():
    m = _mlp()
    with torch.inference_mode():
        m(torch.randn(1, 128)), m(torch.randn(8, 128))  # split and packed copies made
    twin = copy.deepcopy(m)
    x = torch.randn(8, 128)
    with torch.inference_mode():
        assert torch.allclose(twin(x), m(x), atol=1e-5)


def test_a_weight_the_threads_do_not_divide_keeps_the_plain_product():
    lin = nn.Linear(128, 512, bias=False)
    holder = nn.Module()
    holder.proj = lin
    joined, x, threads = Joined(["proj.weight"]), torch.randn(1, 128), torch.get_num_threads()
    torch.set_num_threads(3)  # 512 rows in 3 parts: no split copy
    try:
        with torch.inference_mode():
            assert layout_for(x, lin.weight) is Layout.PLAIN
            assert torch.allclose(joined.linear(holder, x), lin(x), atol=1e-5) and not joined._copies
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_argmax_is_torchs_argmax_ties_infinities_and_nan_included(dtype):
    torch.manual_seed(0)
    logits = torch.randn(3, 64, 512)
    logits[0] = torch.round(logits[0] * 2)  # many ties within a row: the first maximum wins
    logits[1, :, 7] = logits[1, :, 300] = float("inf")
    logits[2, :5, 100] = float("nan")
    logits = logits.to(dtype)
    assert torch.equal(argmax(logits), logits.argmax(-1))
    assert torch.equal(argmax(logits[0, 0]), logits[0, 0].argmax())
