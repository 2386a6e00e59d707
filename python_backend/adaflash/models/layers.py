"""Building blocks shared by the target and the drafter: RMSNorm, RoPE, SwiGLU MLP, ragged attention, the greedy
token of each row of logits.

Both models follow the Qwen3/Llama layout, so the pieces that carry the math live here once.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.bias import CausalBias

from adaflash.models import native
from adaflash.models.placement import indices


def argmax(logits: Tensor) -> Tensor:
    """`logits.argmax(-1)`: the index of each row's first maximum, on the CPU from `torch.max`, which gives the same
    indices. Why: there torch's argmax over a verify's logits took two to three times what its max took, a few percent
    of a plain decoding step under load (docs/history.md, engine speed round 34). Elsewhere torch's argmax, which every
    GPU round ran: whether max is faster there is unmeasured."""
    return logits.max(-1).indices if logits.device.type == "cpu" else logits.argmax(-1)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Normalised in fp32 and cast back before the weight, as Hugging Face's Qwen3 and Llama do. In fp32 on CPU
    at inference one C call (`native.rms_norm`, where it builds); otherwise one torch call instead of six
    (bitwise equal to the spelled-out formula in fp32), a weight of the normalised shape applied inside it (q
    and k normed together carry one weight per head)."""
    if native.can_norm(x, weight):
        return native.rms_norm(x, weight, eps)
    if x.dtype == torch.float32:
        if weight.dim() == 1:
            return F.rms_norm(x, (x.shape[-1],), weight, eps=eps)
        return weight * F.rms_norm(x, (x.shape[-1],), eps=eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


# On CPU, MKL's product of a weight by up to thousands of rows runs at a third to a half of what the machine can
# (benchmarks/bench_layout.py, docs/history.md): for a few rows it reads the weight slowly, for many it computes
# slowly. Small fp32 weights are therefore multiplied by the C product of `adaflash.models.native` where it builds,
# from a copy laid out in panels: as fast as oneDNN's packed product from one row to thousands, and a row's sums do
# not depend on the other rows of the call (oneDNN's do). Without it `Joined` keeps a copy that multiplies faster
# than MKL: one or two rows through the weight split by output rows into one transposed part per thread,
# multiplied as one batched product, which runs the parts on all threads; more rows through a oneDNN-packed copy.
# Copies are kept only for weights this small, so a large model is never held twice over, and this large: a tiny
# weight sits in cache, and oneDNN's call costs more than it reads.
COPY_MAX_BYTES = 64 << 20
COPY_MIN_BYTES = 256 << 10
SPLIT_MAX_ROWS = 2
PACKED_MAX_ROWS = 256  # measured faster up to here; larger prefills are compute-bound
PACKED_FOR_ROWS = 16  # the row count oneDNN lays the packed weight out for


class Layout(enum.Enum):
    PLAIN = "plain"
    SPLIT = "split"
    PACKED = "packed"
    NATIVE = "native"


MKLDNN = torch.backends.mkldnn.is_available()


def layout_for(x: Tensor, w: Tensor) -> Layout:
    """Which copy of `w` multiplies `x` fastest (`Joined.linear` decides alike, its weight's part checked once)."""
    layout = _layout(x.numel() // x.shape[-1], _copyable(w))
    if layout is Layout.SPLIT and w.shape[0] % torch.get_num_threads():
        return Layout.PLAIN  # the split copy has a part per thread
    return layout


def _copyable(w: Tensor) -> bool:
    """Whether `w` is a weight a faster product or copy is used for (gradients and thread count aside)."""
    return (w.device.type == "cpu" and w.dtype == torch.float32 and w.is_contiguous()
            and COPY_MIN_BYTES <= w.nbytes <= COPY_MAX_BYTES)


def _layout(rows: int, copyable: bool) -> Layout:
    if not copyable or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return Layout.PLAIN
    if native.available():
        return Layout.NATIVE
    if rows > PACKED_MAX_ROWS:
        return Layout.PLAIN
    if rows <= SPLIT_MAX_ROWS:
        return Layout.SPLIT
    return Layout.PACKED if MKLDNN else Layout.PLAIN


def split_rows(w: Tensor, parts: int) -> Tensor:
    """w [out, in] -> [parts, in, out / parts]: part p holds output rows p*out/parts.. as columns."""
    return torch.stack([p.t().contiguous() for p in w.chunk(parts, 0)])


def split_linear(x: Tensor, split: Tensor) -> Tensor:
    """x [..., in] @ W.T from `split_rows(W, parts)`: one batched product, one part per thread. For one row the
    parts' outputs lie in order already ([parts, 1, out / parts]); more rows need them interleaved."""
    rows = x.reshape(-1, x.shape[-1])
    y = torch.bmm(rows.expand(split.shape[0], -1, -1), split)
    if rows.shape[0] > 1:
        y = y.transpose(0, 1)
    return y.reshape(x.shape[:-1] + (-1,))


def packed_weight(w: Tensor) -> Tensor:
    """w [out, in] in oneDNN's blocked layout for products of about PACKED_FOR_ROWS rows."""
    return torch.ops.mkldnn._reorder_linear_weight(w, PACKED_FOR_ROWS)


def packed_linear(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    """x [..., in] @ W.T + bias from `packed_weight(W)`."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return y.reshape(x.shape[:-1] + (-1,))


@dataclass
class Joined:
    """Parameters of one module concatenated along dim 0, so that layers reading the same input run as one
    matmul (q, k and v; gate and up). The checkpoint and training keep the parts apart: the joined copy is
    remade when any part changed (an optimizer step, a load, a cast), and while gradients flow it is remade
    every call so that they reach each part. A part `(name, rows)` is that 1-d parameter repeated `rows`
    times (a per-head norm weight beside another); a single part is used as it is.

    Every linear of a decode step goes through here, so the check that the parts are unchanged is kept to
    a few attribute reads: part names are resolved once, and the faster copies are keyed by the parts'
    versions alone (a copy split across threads also by the thread count)."""

    parts: list[str | tuple[str, int]]
    _names: list[tuple[str, str, int]] = field(init=False, repr=False)
    _single: bool = field(init=False, repr=False)  # one part, not repeated: used as it is
    _key: list[tuple[int, int]] | None = field(default=None, repr=False)
    _value: Tensor | None = field(default=None, repr=False)
    _copyable: bool = field(default=False, repr=False)
    _copies: dict[Layout, tuple[tuple, Tensor]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._names = [_name_of(p) for p in self.parts]
        self._single = len(self._names) == 1 and not self._names[0][2]

    def __deepcopy__(self, memo: dict) -> "Joined":
        """The parts only: the joined and derived copies are remade from the copied module's parameters on use (a
        oneDNN-packed tensor cannot be copied at all)."""
        return Joined(list(self.parts))

    def of(self, module: nn.Module) -> Tensor:
        return self._joined([_part(module, n) for n in self._names])

    def linear(self, module: nn.Module, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """x @ W.T (+ bias) with the joined weight W, from the copy of it that multiplies x fastest."""
        w = self._joined([_part(module, n) for n in self._names])
        layout = _layout(x.numel() // x.shape[-1], self._copyable)
        if layout is Layout.PLAIN:
            return F.linear(x, w, bias)
        if layout is Layout.SPLIT and w.shape[0] % torch.get_num_threads():
            return F.linear(x, w, bias)
        copy = self._copy(w, layout)
        if layout is Layout.PACKED:
            return packed_linear(x, copy, bias)
        if layout is Layout.NATIVE:
            y = native.product(x.reshape(-1, x.shape[-1]).contiguous(), copy, w.shape[0]).reshape(x.shape[:-1] + (-1,))
        else:
            y = split_linear(x, copy)
        return y if bias is None else y + bias

    def panels(self, module: nn.Module) -> Tensor:
        """The joined weight as the C product reads it (`native.panels`), the copy `linear` multiplies by too."""
        return self._copy(self._joined([_part(module, n) for n in self._names]), Layout.NATIVE)

    def _copy(self, w: Tensor, layout: Layout) -> Tensor:
        """The copy of the joined weight `w` in `layout`, made again when a part changed."""
        key = (self._key, torch.get_num_threads() if layout is Layout.SPLIT else 0)  # a part per thread
        held = self._copies.get(layout)
        if held is None or held[0] != key:
            held = self._copies[layout] = (key, _copy_of(w, layout))
        return held[1]

    def _joined(self, tensors: list[Tensor]) -> Tensor:
        """The joined weight, remade when a part's storage or version changed (`_key`, which `linear` then keys
        its copies by); a single part is returned as it is, so that gradients reach it."""
        single = self._single
        traced = torch.compiler.is_compiling()  # torch.export (the ONNX drafter): no storage to key copies by
        if traced or not single and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return tensors[0] if single else torch.cat([_repeated(t, n) for t, n in zip(tensors, self._names)])
        key = [(t.data_ptr(), t._version) for t in tensors]
        if key != self._key:
            self._value = None if single else torch.cat([_repeated(t, n) for t, n in zip(tensors, self._names)])
            self._key, self._copyable = key, _copyable(tensors[0] if single else self._value)
        return tensors[0] if single else self._value


def _copy_of(w: Tensor, layout: Layout) -> Tensor:
    if layout is Layout.NATIVE:
        return native.panels(w)
    return split_rows(w, torch.get_num_threads()) if layout is Layout.SPLIT else packed_weight(w)


def _name_of(part: str | tuple[str, int]) -> tuple[str, str, int]:
    name, rows = (part, 0) if isinstance(part, str) else part
    owner, attr = name.split(".")
    return owner, attr, rows


def _part(module: nn.Module, name: tuple[str, str, int]) -> Tensor:
    """The part's current tensor (a load or a cast may have replaced it), read past `nn.Module.__getattr__`."""
    owner = module._modules.get(name[0])
    if owner is None:
        owner = getattr(module, name[0])
    tensor = owner._parameters.get(name[1])
    return getattr(owner, name[1]) if tensor is None else tensor


def _repeated(tensor: Tensor, name: tuple[str, str, int]) -> Tensor:
    return tensor.expand(name[2], -1) if name[2] else tensor


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up = Joined(["gate_proj.weight", "up_proj.weight"])
        self.down = Joined(["down_proj.weight"])

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up.linear(self, x).chunk(2, dim=-1)
        return self.down.linear(self, F.silu(gate) * up)


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
    """cos and sin [T, 1, head_dim] for `apply_rope`; the sin's first half is negated, which turns Hugging
    Face's rotate-half into a roll."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    sin = freqs.sin()
    return torch.cat([freqs, freqs], dim=-1).cos()[:, None], torch.cat([-sin, sin], dim=-1)[:, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [T, heads, head_dim]: Hugging Face's x * cos + rotate_half(x) * sin, the sum and second product as one
    call."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)


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
    def build(cls, counts: list[int], device: torch.device) -> "Ragged":
        offsets = [0]
        for c in counts[:-1]:
            offsets.append(offsets[-1] + c)
        found = indices([[b for b, c in enumerate(counts) for _ in range(c)], [j for c in counts for j in range(c)]],
                        device)
        return cls(seq_of_token=found[0], row_of_token=found[1], counts=counts, offsets=offsets, qmax=max(counts))

    @property
    def uniform(self) -> bool:
        """Every sequence has Qmax new tokens (decode steps, equal drafts): padding is a reshape."""
        return len(self.counts) * self.qmax == self.seq_of_token.shape[0]

    def pad(self, x: Tensor) -> Tensor:
        """[T, ...] packed -> [B, Qmax, ...] padded with zeros."""
        if self.uniform:
            return x.reshape((len(self.counts), self.qmax) + tuple(x.shape[1:]))
        out = x.new_zeros((len(self.counts), self.qmax) + tuple(x.shape[1:]))
        out[self.seq_of_token, self.row_of_token] = x
        return out

    def unpad(self, x: Tensor) -> Tensor:
        if self.uniform:
            return x.reshape((-1,) + tuple(x.shape[2:]))
        return x[self.seq_of_token, self.row_of_token]


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | CausalBias | None, scale: float) -> Tensor:
    """q: [B, H, Q, hd]; k, v: [B, KV, L, hd]; mask: [B, 1, Q, L] boolean (True = may attend), a causal bias,
    or None when every query may attend every key."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
