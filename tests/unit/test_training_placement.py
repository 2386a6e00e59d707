"""Training on a placement: the drafter trains in fp32 beside a half-precision target, and the training code
makes its tensors on the models' device (checked on PyTorch's meta device, which holds shapes, no values)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from adaflash.models.bundle import tiny_random_bundle
from adaflash.models.placement import move_to, place_of, placement
from adaflash.models.tokenizer import BYTE_SPECIALS
from adaflash.training.dflash import dflash_loss, fit_drafter, new_drafter, sample_anchors, training_data
from adaflash.training.opd import DistillConfig, distill_loss

BF16 = placement("cpu", "bfloat16")
FP32 = placement("cpu", "float32")


class OffDevice(TorchDispatchMode):
    """Records every op that reads or makes a tensor off `device` while it is active."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = device
        self.ops = 0
        self.found: set[tuple[str, str]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor) and t.device.type != self.device:
                self.found.add((str(func), str(t.device)))
        return out


def random_sequences(n: int, length: int, start: int) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(5)
    return [(torch.randint(0, 250, (length,), generator=g).tolist(), start) for _ in range(n)]


def mean_loss(drafter, target, sequences) -> float:
    """The DFlash loss at every anchor of the responses, without gradients: the same blocks before and after."""
    total = 0.0
    with torch.no_grad():
        for tokens, feats, start in training_data(target, sequences, drafter.config.target_layer_ids):
            anchors = torch.arange(start - 1, tokens.shape[0] - 1)
            total += dflash_loss(drafter, target, tokens, feats, anchors, 4.0).item()
    return total / len(sequences)


def test_the_drafter_trains_in_fp32_beside_a_bf16_target():
    bundle = tiny_random_bundle(seed=3, place=BF16)
    target = bundle.target
    drafter = new_drafter(target, bundle.tokenizer.token_to_id(BYTE_SPECIALS[2]), num_layers=1, block_size=4)
    assert place_of(drafter) == FP32 and place_of(target) == BF16
    frozen = {k: v.clone() for k, v in target.state_dict().items()}
    seqs = random_sequences(2, 24, 8)
    before = mean_loss(drafter, target, seqs)
    losses = fit_drafter(drafter, target, seqs, steps=16, lr=3e-3, anchors_per_seq=8)
    assert len(losses) == 16
    assert mean_loss(drafter, target, seqs) < 0.8 * before
    assert place_of(drafter) == FP32
    assert all(torch.equal(v, frozen[k]) for k, v in target.state_dict().items())


def test_a_half_precision_drafter_is_refused_for_training():
    bundle = tiny_random_bundle(seed=3, place=BF16)
    with pytest.raises(ValueError, match="drafter: trains in float32 on cpu, got bfloat16 on cpu"):
        fit_drafter(bundle.drafter, bundle.target, random_sequences(1, 24, 8), steps=1)


def test_the_training_forward_makes_every_tensor_on_the_models_device():
    """Everything from the token ids to the losses of both recipes, and their backward, on the meta device:
    any tensor made on the CPU (an arange without a device, an index list) is an op argument or output on
    the CPU. What reads values cannot run on meta and is not covered: the anchor draw (CPU by design, moved
    once by fit_drafter), the optimizer step, the loss read, and pretraining's batch."""
    bundle = tiny_random_bundle(seed=3, block_size=8)
    meta = placement("meta")
    target, drafter = move_to(bundle.target, meta), move_to(bundle.drafter, meta)
    mask = bundle.tokenizer.token_to_id(BYTE_SPECIALS[2])
    anchors = sample_anchors(4, 40, 6, torch.Generator().manual_seed(0)).to("meta")
    seq = random_sequences(1, 40, 5)
    with OffDevice("meta") as mode:
        tokens, feats, _ = training_data(target, seq, drafter.config.target_layer_ids)[0]
        losses = [dflash_loss(drafter, target, tokens, feats, anchors, 4.0)]
        losses += [distill_loss(DistillConfig(kind))(drafter, target, tokens, feats, anchors, 4.0)
                   for kind in ("reverse", "forward")]
        sum(losses).backward()
    assert mode.ops > 1000 and mode.found == set()
    assert place_of(new_drafter(target, mask, num_layers=1, block_size=8)) == placement("meta", "float32")
