"""Length heads learn the drafter's measured acceptance: calibrated, better than base rates, saved and loaded."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import random_prompts, self_generated

from adaflash.models.drafter import DFlashDrafter
from adaflash.training.heads import calibration, collect_blocks, fit_heads, head_losses, with_heads


@pytest.fixture(scope="module")
def trained_heads(trained_tiny):
    """Heads fitted on blocks of one set of the target's texts; a disjoint set for calibration."""
    target = trained_tiny.target
    train = self_generated(target, random_prompts(48, seed=21), max_tokens=64)
    held = self_generated(target, random_prompts(24, seed=22), max_tokens=64)
    drafter = with_heads(trained_tiny.drafter, head_dim=32)
    train_blocks = collect_blocks(drafter, target, train, ["a"] * len(train), anchors_per_seq=24, seed=0)
    held_blocks = collect_blocks(drafter, target, held, ["a", "b"] * (len(held) // 2), anchors_per_seq=24, seed=1)
    fit_heads(drafter, train_blocks, steps=1000, batch=256)
    return drafter, train_blocks, held_blocks


def test_blocks_label_acceptance_as_verification_would(trained_heads):
    _, blocks, _ = trained_heads
    reached = blocks.reached
    assert reached[:, 0].all()  # the first drafted token is always verified
    # Position j is reached exactly when every earlier one was accepted.
    assert torch.equal(reached[:, 1:], blocks.correct.float().cumprod(dim=1)[:, :-1].bool())
    assert 0 < blocks.accepted.mean() < blocks.correct.shape[1]  # some blocks accepted, none all the way
    assert (blocks.accepted == 0).any()


def test_position_head_beats_base_rates_on_held_out_text(trained_heads):
    """The head must know more than 'position j is accepted x% of the time' (the running estimates)."""
    drafter, train, held = trained_heads
    reached, correct = held.reached, held.correct.float()
    base = torch.stack([train.correct[train.reached[:, j], j].float().mean() for j in range(correct.shape[1])])
    base = base.clamp(1e-3, 1 - 1e-3)[None, :].expand_as(correct)
    with torch.no_grad():
        rates = drafter.position_head(held.hidden, held.confidence).clamp(1e-6, 1 - 1e-6)

    def log_loss(p: torch.Tensor) -> float:
        return float(-(correct * p.log() + (1 - correct) * (1 - p).log())[reached].mean())

    assert log_loss(rates) < 0.97 * log_loss(base)  # better by a clear margin, not a tie


def test_calibration_report_compares_predicted_with_observed(trained_heads):
    drafter, _, held = trained_heads
    report = calibration(drafter, held)
    first = report["per_position"][0]
    assert first["reached"] == held.hidden.shape[0]
    assert abs(first["predicted"] - first["observed"]) < 0.1
    assert set(report["per_domain"]) == {"a", "b"}
    observed = held.accepted.mean().item()
    for d in report["per_domain"].values():
        assert d["blocks"] > 0 and math.isfinite(d["position_head_accepted"])
    assert report["position_head_accepted_mae"] < observed + 1  # not worse than guessing zero acceptance


def test_heads_save_and_load_in_the_published_layout(trained_heads, tmp_path):
    drafter, _, held = trained_heads
    drafter.save_pretrained(tmp_path / "d", dtype=torch.float32)
    loaded = DFlashDrafter.from_pretrained(tmp_path / "d")
    assert loaded.config.length_head and loaded.config.position_head
    with torch.no_grad():
        a = head_losses(drafter, held)
        b = head_losses(loaded, held)
    assert all(abs(x.item() - y.item()) < 1e-6 for x, y in zip(a, b))
