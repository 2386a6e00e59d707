"""Length heads learn the drafter's measured acceptance: calibrated, better than base rates, refitted one at a
time, saved and loaded."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import random_prompts, self_generated

from adaflash.models.drafter import DFlashDrafter
from adaflash.training.heads import (Blocks, calibration, collect_blocks, fit_heads, head_losses, published_loss,
                                     with_heads)


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
    # A block running past the end of its text is incomplete; most blocks are not.
    assert 0.5 < blocks.complete.float().mean() < 1


def test_published_loss_is_the_squared_error_to_a_plus_one_over_b_on_complete_blocks(trained_tiny):
    """AdaFlash's direct-length label: (accepted + 1) / B, the positions the target verifies (anchor counted);
    an incomplete block (its tail past the text) carries no label."""
    drafter = with_heads(trained_tiny.drafter, head_dim=8, heads=("published",))
    b = drafter.config.block_size
    correct = torch.zeros(3, b - 1, dtype=torch.bool)
    correct[0, :4] = True  # a = 4
    correct[0, 5] = True  # after the first miss: not accepted
    correct[1, :] = True  # a = B - 1
    correct[2, :2] = True  # a = 2, but incomplete
    blocks = Blocks(torch.randn(3, b, drafter.config.hidden_size), torch.zeros(3, b - 1, 2), correct,
                    torch.tensor([True, True, False]), ["x"] * 3)
    with torch.no_grad():
        ratio = drafter.thresh_head_two_model(blocks.hidden)
        expected = ((ratio[0] - 5 / b) ** 2 + (ratio[1] - 1.0) ** 2) / 2
        assert torch.allclose(published_loss(drafter, blocks), expected)


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


def test_published_head_predicts_the_mean_accepted_length(trained_heads):
    drafter, _, held = trained_heads
    report = calibration(drafter, held)
    complete = held.select(held.complete.nonzero().squeeze(1))
    observed = complete.accepted.mean().item()
    predicted = sum(d["published_head_accepted"] * d["blocks"] for d in report["per_domain"].values()) / len(
        complete.domains)
    assert abs(predicted - observed) < 0.5
    assert report["published_head_accepted_mae"] < observed + 1  # not worse than guessing zero acceptance


def test_calibration_report_compares_predicted_with_observed(trained_heads):
    drafter, _, held = trained_heads
    report = calibration(drafter, held)
    first = report["per_position"][0]
    assert first["reached"] == int(held.complete.sum())  # complete blocks only
    assert abs(first["predicted"] - first["observed"]) < 0.1
    assert set(report["per_domain"]) == {"a", "b"}
    observed = held.accepted.mean().item()
    for d in report["per_domain"].values():
        assert d["blocks"] > 0 and math.isfinite(d["position_head_accepted"])
    assert report["position_head_accepted_mae"] < observed + 1  # not worse than guessing zero acceptance


def test_refitting_the_published_head_leaves_every_other_tensor_as_it_was(trained_heads):
    drafter, train, _ = trained_heads
    refit = with_heads(drafter, head_dim=16, seed=3, heads=("published",))
    assert refit.config.length_head_dim == 16 and refit.config.position_head_dim == 32
    fit_heads(refit, train, steps=20, batch=64, heads=("published",))
    before, after = drafter.state_dict(), refit.state_dict()
    assert set(after) == set(before)
    assert after["thresh_head_two_model.down.weight"].shape == (16, 2 * refit.config.hidden_size)  # afresh
    for name in before:
        if not name.startswith("thresh_head_two_model."):
            assert torch.equal(after[name], before[name]), name


def test_heads_save_and_load_in_the_published_layout(trained_heads, tmp_path):
    drafter, _, held = trained_heads
    drafter.save_pretrained(tmp_path / "d", dtype=torch.float32)
    loaded = DFlashDrafter.from_pretrained(tmp_path / "d")
    assert loaded.config.length_head and loaded.config.position_head
    with torch.no_grad():
        a = head_losses(drafter, held)
        b = head_losses(loaded, held)
    assert set(a) == set(b) == {"published", "position"}
    assert all(abs(a[h].item() - b[h].item()) < 1e-6 for h in a)
