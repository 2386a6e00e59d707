"""Joined weights: the concatenated (and transposed) copies used for inference follow every change of the
parameters they come from, and training through them reaches each part."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from adaflash.models.layers import MLP, Joined


def _mlp() -> MLP:
    torch.manual_seed(0)
    return MLP(16, 48)  # gate and up joined: 96 x 16, a weight tall enough for the transposed copy


def _reference(m: MLP, x: torch.Tensor) -> torch.Tensor:
    return m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))


def test_joined_inference_follows_an_optimizer_step_and_a_load():
    m = _mlp()
    x1, x8 = torch.randn(1, 16), torch.randn(8, 16)
    with torch.inference_mode():
        before = m(x1)  # one row: the transposed copy of the joined weight
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
    m(torch.randn(4, 3, 16)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


def test_a_single_part_is_the_parameter_itself():
    lin = nn.Linear(4, 8, bias=False)
    holder = nn.Module()
    holder.head = lin
    assert Joined(["head.weight"]).of(holder) is lin.weight
