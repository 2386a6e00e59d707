"""Building blocks shared by the target and the drafter: RMSNorm, RoPE, SwiGLU MLP, ragged attention.

Both models follow the Qwen3/Llama layout, so the pieces that carry the math live here once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class RopeConfig:
    """Rotary embedding parameters; `scaling` holds the Llama 3 frequency rescaling when present."""

    head_dim: int
    theta: float
    scaling: dict | None = None

    @classmethod
    def from_hf(cls, cfg: dict, head_dim: int) -> "RopeConfig":
        params = dict(cfg.get("rope_parameters") or {})
        scaling = cfg.get("rope_scaling") or None
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = (scaling or params).get("rope_type", (scaling or {}).get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"unsupported rope_type {rope_type!r} (supported: default, llama3)")
        return cls(head_dim=head_dim, theta=theta, scaling=(scaling or params) if rope_type == "llama3" else None)

    def inv_freq(self) -> Tensor:
        inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        if self.scaling is not None:
            inv = _llama3_scale(inv, self.scaling)
        return inv.float()


def _llama3_scale(inv_freq: Tensor, s: dict) -> Tensor:
    """Llama 3.1 rope scaling: long wavelengths are divided by `factor`, short ones kept, the band between blended."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = old_len / low, old_len / high
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(mid, blended, scaled)


def rope_cos_sin(inv_freq: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, head_dim] (rotate-half convention of Hugging Face)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


@dataclass
class Ragged:
    """Index bookkeeping for one packed forward: B sequences, sequence b has `counts[b]` new tokens.

    Linear layers run on the packed [T, D] tokens (no padding waste); attention scatters
    queries into a padded [B, H, Qmax, hd] view (the target groups sequences of similar counts
    so that the padding stays small).
    """

    seq_of_token: Tensor  # [T] which sequence each packed token belongs to
    row_of_token: Tensor  # [T] its index among that sequence's new tokens
    counts: list[int]
    offsets: list[int]  # where each sequence's tokens start in the packed [T]
    qmax: int

    @classmethod
    def build(cls, counts: list[int]) -> "Ragged":
        c = torch.tensor(counts, dtype=torch.long)
        seq = torch.repeat_interleave(torch.arange(len(counts)), c)
        starts = torch.cumsum(c, 0) - c
        row = torch.arange(int(c.sum())) - starts[seq]
        return cls(seq_of_token=seq, row_of_token=row, counts=counts, offsets=starts.tolist(), qmax=max(counts))

    def pad(self, x: Tensor) -> Tensor:
        """[T, ...] packed -> [B, Qmax, ...] padded with zeros."""
        out = x.new_zeros((len(self.counts), self.qmax) + tuple(x.shape[1:]))
        out[self.seq_of_token, self.row_of_token] = x
        return out

    def unpad(self, x: Tensor) -> Tensor:
        return x[self.seq_of_token, self.row_of_token]


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q: [B, H, Q, hd]; k, v: [B, KV, L, hd]; mask: [B, 1, Q, L] boolean (True = may attend)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])


def gather_slots(cache: Tensor, slots: list[int], length: int) -> Tensor:
    """cache: [N, KV, max_len, hd] -> [B, KV, length, hd]; a view when the slots are consecutive."""
    first = slots[0]
    if slots == list(range(first, first + len(slots))):
        return cache[first : first + len(slots), :, :length]
    return cache[torch.tensor(slots), :, :length]
