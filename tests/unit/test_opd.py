"""On-policy distillation: the losses move the drafter toward the target; rounds publish versions and resume."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import random_prompts, self_generated

from adaflash.models.bundle import load_bundle, save_bundle
from adaflash.training.dflash import anchored_blocks, fit_drafter, target_features
from adaflash.training.opd import DistillConfig, distill_loss, main, teacher_logits

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"


def reverse_kl(drafter, target, seqs) -> float:
    """Mean KL(p_drafter || p_target) over the first four block positions of blocks in the responses."""
    total, n = 0.0, 0
    with torch.no_grad():
        for tokens, start in seqs:
            t = torch.tensor(tokens)
            anchors = torch.arange(start, len(tokens) - 5, 3)
            hidden, _, _ = anchored_blocks(drafter, target, t, target_features(target, tokens, drafter.config.target_layer_ids), anchors)
            log_d = F.log_softmax(target.lm_head(hidden[:, 1:5]), -1)
            log_t = F.log_softmax(teacher_logits(target, t), -1)[anchors[:, None] + torch.arange(4)[None, :]]
            total += float((log_d.exp() * (log_d - log_t)).sum(-1).sum())
            n += anchors.numel() * 4
    return total / n


@pytest.mark.parametrize("kind", ["reverse", "forward"])
def test_distillation_lowers_the_drafters_divergence_from_the_target(trained_tiny, kind):
    """Measured on the sequences trained on: the tiny random target has no structure that a few
    steps could generalise, so this checks that the losses pull the drafter toward the target."""
    target = trained_tiny.target
    train = self_generated(target, random_prompts(24, seed=31), max_tokens=48)
    drafter = copy.deepcopy(trained_tiny.drafter)
    before = reverse_kl(drafter, target, train)
    fit_drafter(drafter, target, train, steps=120, lr=1e-3, loss_fn=distill_loss(DistillConfig(kind=kind)))
    assert reverse_kl(drafter, target, train) < 0.9 * before


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        distill_loss(DistillConfig(kind="sideways"))


def test_rounds_publish_versions_and_resume(trained_tiny, tmp_path):
    model_dir = save_bundle(copy.deepcopy(trained_tiny), tmp_path / "models")
    args = ["--model-dir", str(model_dir), "--data", str(CORPUS), "--from", "drafter", "--out", "drafter-opd",
            "--work", str(tmp_path / "work"), "--rounds", "2", "--prompts-per-domain", "2", "--steps", "3",
            "--response-tokens", "16", "--anchors", "4"]
    assert main(args) == 0
    for r in (1, 2):
        assert (tmp_path / "work" / "versions" / str(r) / "model.safetensors").exists()
    rounds = [json.loads(x) for x in (tmp_path / "work" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2] and all(r["generation_tau"] >= 1 for r in rounds)
    generated = [json.loads(x) for x in (tmp_path / "work" / "round-1" / "generated.jsonl").read_text().splitlines()]
    assert {g["temperature"] for g in generated} == {0.0, 1.0} and len(generated) == 10
    assert main(args) == 0  # everything published: nothing retrained
    assert len((tmp_path / "work" / "rounds.jsonl").read_text().splitlines()) == 2
    bundle = load_bundle(model_dir, "drafter-opd")
    final = load_bundle(tmp_path / "models", "drafter")  # the starting drafter is untouched
    assert not torch.equal(bundle.drafter.fc.weight, final.drafter.fc.weight)
