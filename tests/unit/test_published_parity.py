"""Our drafter and length head compute what the published code computes, on the same random weights.

The references below are written from the upstream math in plain torch, as upstream computes it:
- the drafter as z-lab/dflash's `DFlashDraftModel` (Transformers 4.57): context = hidden_norm(fc(target
  hidden states)); in every layer queries from the block, keys and values from [context ; block] projected
  by the layer's own k_proj/v_proj, k_norm, RoPE at absolute positions (queries take the last B), eager
  attention over the whole concatenation with an explicit mask: none for a full layer, and for a
  `sliding_attention` layer flash attention's non-causal window (W - 1, W - 1) with the query aligned to the
  bottom right of the keys;
- the length head as ZinYY/AdaFlash's `ThreshHeadTwoModel`: [mean over the whole block ; last position] ->
  SiLU(down) -> + SiLU(res) -> sigmoid(out);
- the published rule as AdaFlash serves it: candidate length round(ratio * B * 1.3) in [1, B], anchor counted.
Our cached drafting (`draft`), its recomputation (`draft_uncached`) and training's blocks (`anchored_blocks`)
must all match: max abs difference within TOL (fp32; measured about 1e-6).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from adaflash.decoding.policy import published_length
from adaflash.models.bundle import tiny_random_bundle
from adaflash.models.drafter import DFlashDrafter, DrafterConfig
from adaflash.training.dflash import anchored_blocks, target_features

TOL = 1e-4
BLOCK = 8
WINDOW = 5  # below the block size, so a sliding layer cuts the block as well as the context


def drafter_config(sliding: bool) -> dict:
    """A config.json with the published keys, shaped for `tiny_random_bundle`'s target."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": False, "num_hidden_layers": 2,
        "num_target_layers": 4, "block_size": BLOCK, "max_position_embeddings": 512,
        "layer_types": ["sliding_attention", "full_attention"] if sliding else ["full_attention"] * 2,
        "use_sliding_window": sliding, "sliding_window": WINDOW if sliding else None, "max_window_layers": 0,
        "dflash_config": {"mask_token_id": 258, "target_layer_ids": [1, 2], "use_thresh_head_two_model": True,
                          "thresh_head_bottleneck_dim": 24, "thresh_head_direct_len": True},
    }


def random_drafter(sliding: bool, seed: int = 0) -> DFlashDrafter:
    drafter = DFlashDrafter(DrafterConfig.from_hf(drafter_config(sliding)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            scale = 0.1 if name.endswith("norm.weight") else 0.3
            p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + scale * torch.randn(p.shape, generator=g))
    return drafter.eval()


# ---- the references ------------------------------------------------------------------------------------------

def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def reference_block(w: dict[str, Tensor], cfg: dict, target_hidden: Tensor, noise: Tensor) -> Tensor:
    """One block drafted from scratch: target_hidden [C, F] of positions 0..C-1, noise [B, D] (the target's
    embedding of [anchor, mask, ...]) at positions C..C+B-1 -> final-norm hidden states [B, D]."""
    c, b = target_hidden.shape[0], noise.shape[0]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ctx = rms_norm(target_hidden @ w["fc.weight"].T, w["hidden_norm.weight"])
    cos, sin = rope(torch.arange(c + b), hd, cfg["rope_theta"])
    h = noise
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"])
        both = torch.cat([ctx, x])  # [context ; block]
        q = rms_norm((x @ w[p + "self_attn.q_proj.weight"].T).view(b, heads, hd), w[p + "self_attn.q_norm.weight"])
        k = rms_norm((both @ w[p + "self_attn.k_proj.weight"].T).view(c + b, kv, hd), w[p + "self_attn.k_norm.weight"])
        v = (both @ w[p + "self_attn.v_proj.weight"].T).view(c + b, kv, hd)
        q = q * cos[-b:, None] + rotate_half(q) * sin[-b:, None]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        if kind == "sliding_attention" and c + b > cfg["sliding_window"]:
            query = torch.arange(b)[:, None] + c  # bottom-right aligned
            key = torch.arange(c + b)[None, :]
            scores = scores.masked_fill((query - key).abs() > cfg["sliding_window"] - 1, float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).reshape(b, heads * hd)
        h = h + attn @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(h, w["norm.weight"])


def reference_thresh_head(w: dict[str, Tensor], block_hidden: Tensor) -> Tensor:
    """block_hidden [n, B, D] -> [n]."""
    feat = torch.cat([block_hidden.mean(dim=-2), block_hidden[:, -1]], dim=-1)
    h = F.silu(feat @ w["thresh_head_two_model.down.weight"].T + w["thresh_head_two_model.down.bias"])
    h = h + F.silu(h @ w["thresh_head_two_model.res.0.weight"].T + w["thresh_head_two_model.res.0.bias"])
    return torch.sigmoid(h @ w["thresh_head_two_model.out.weight"].T + w["thresh_head_two_model.out.bias"])[:, 0]


def reference_candidate_length(ratio: float, block_size: int, rate: float = 1.3, min_len: int = 1) -> int:
    """AdaFlash's verify length, anchor counted (CANDIDATE_LEN_MIN 1 and THRESHOLD_RATE 1.3 as it serves)."""
    return int(torch.tensor(ratio * block_size * rate).round().clamp(min_len, block_size))


# ---- the comparisons -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def target():
    return tiny_random_bundle(seed=7).target


def context_features(target, length: int, seed: int) -> tuple[list[int], Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (length,), generator=g).tolist()
    return tokens, target_features(target, tokens, [1, 2])


def reference_draft(drafter: DFlashDrafter, target, features: Tensor, anchor: int) -> Tensor:
    ids = torch.tensor([anchor] + [drafter.config.mask_token_id] * (BLOCK - 1))
    with torch.no_grad():
        noise = target.model.embed_tokens(ids).float()
        return reference_block(drafter.state_dict(), drafter.config.to_hf(), features, noise)


@pytest.mark.parametrize("sliding", [False, True])
def test_cached_and_uncached_drafts_match_the_published_forward(target, sliding):
    drafter = random_drafter(sliding)
    seqs = {2: context_features(target, 23, seed=1), 0: context_features(target, 9, seed=2)}
    cache = drafter.new_cache(num_slots=3, max_len=64)
    for chunk in ((0, 11), (11, 23)):  # two appends, ragged: the second one only for slot 2
        counts = [max(0, min(chunk[1], len(seqs[s][0])) - chunk[0]) for s in seqs]
        feats = torch.cat([seqs[s][1][chunk[0]: chunk[0] + n] for s, n in zip(seqs, counts)])
        drafter.append_context(cache, list(seqs), feats, counts)
    anchors = [17, 42]
    cached = drafter.draft(target, cache, list(seqs), anchors)
    worst = 0.0
    for i, (tokens, feats) in enumerate(seqs.values()):
        ref = reference_draft(drafter, target, feats, anchors[i])
        uncached = drafter.draft_uncached(target, feats, anchors[i])
        worst = max(worst, (cached.hidden[i] - ref).abs().max().item(), (uncached.hidden[0] - ref).abs().max().item())
        ratio = reference_thresh_head(drafter.state_dict(), ref[None])[0]
        assert abs(cached.accept_ratio[i].item() - ratio.item()) <= TOL
    assert worst <= TOL


def test_training_blocks_match_the_published_forward(target):
    drafter = random_drafter(sliding=True, seed=1)
    tokens, feats = context_features(target, 30, seed=3)
    anchors = torch.tensor([3, 14, 27])  # the last block runs past the text: its labels are masked, not its math
    with torch.no_grad():
        hidden, _, _ = anchored_blocks(drafter, target, torch.tensor(tokens), feats, anchors)
    for i, a in enumerate(anchors.tolist()):
        assert (hidden[i] - reference_draft(drafter, target, feats[:a], tokens[a])).abs().max().item() <= TOL


def test_a_sliding_layer_cuts_what_full_attention_sees(target):
    """The window matters (the comparisons above could not tell the two apart otherwise) and only where the
    keys reach beyond it."""
    sliding, full = random_drafter(sliding=True), random_drafter(sliding=False)
    full.load_state_dict(sliding.state_dict())
    _, feats = context_features(target, 20, seed=4)
    far = sliding.draft_uncached(target, feats, 5).hidden[0] - full.draft_uncached(target, feats, 5).hidden[0]
    assert far.abs().max().item() > 1e-2
    block_only = sliding.draft_uncached(target, feats[:0], 5).hidden - full.draft_uncached(target, feats[:0], 5).hidden
    assert block_only[0, :WINDOW].abs().max().item() > 1e-2  # the block (8) is wider than the window (5) too


def test_the_length_head_pools_the_whole_block(target):
    drafter = random_drafter(sliding=False, seed=2)
    hidden = torch.randn(6, BLOCK, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours = drafter.thresh_head_two_model(hidden)
        ref = reference_thresh_head(drafter.state_dict(), hidden)
        assert (ours - ref).abs().max().item() <= TOL
        changed = hidden.clone()
        changed[:, 0] += 1.0  # the anchor's hidden state is part of the mean
        assert (drafter.thresh_head_two_model(changed) - ours).abs().max().item() > 1e-4


@pytest.mark.parametrize("ratio", [0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.77, 1.0])
@pytest.mark.parametrize("block_size", [8, 16])
def test_the_published_rule_verifies_the_candidate_length_less_the_anchor(ratio, block_size):
    candidate = reference_candidate_length(ratio, block_size)
    assert published_length(ratio, block_size, block_size - 1) == candidate - 1
    assert published_length(ratio, block_size, 2) == min(2, candidate - 1)  # the sequence's cap still holds


def test_the_published_rule_by_hand():
    assert published_length(0.0, 16, 15) == 0  # the anchor alone: a plain step
    assert published_length(0.2, 16, 15) == 3  # round(4.16) = 4 positions, anchor included
    assert published_length(0.5, 8, 7) == 4  # round(5.2) = 5
    assert published_length(1.0, 16, 15) == 15  # round(20.8) capped at the block
