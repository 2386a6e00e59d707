"""Lean Qwen3 / Llama decoder with a slot-based KV cache and ragged batched forwards.

One forward serves many sequences at once, each with its own cached length and its own
number of new tokens (1 for a decode step, k+1 for a verify, hundreds for a prefill).
Parameter names match Hugging Face checkpoints, so `model.safetensors` loads as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.bias import CausalBias, causal_lower_right

from adaflash.models import graphs, native
from adaflash.models.cache import Gather, KVCache, Paging
from adaflash.models.checkpoint import load_weights, read_config, save_checkpoint
from adaflash.models.layers import MLP, Joined, Ragged, RMSNorm, RopeConfig, apply_rope, attend, rms_norm, rope_cos_sin
from adaflash.models.placement import CPU, Placement, empty_on, indices, place_of


@dataclass
class TargetConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope: RopeConfig
    rms_norm_eps: float = 1e-6
    qk_norm: bool = True
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hf(cls, cfg: dict) -> "TargetConfig":
        model_type = cfg.get("model_type")
        if model_type not in ("qwen3", "llama"):
            raise ValueError(f"unsupported target model_type {model_type!r} (supported: qwen3, llama)")
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            head_dim=head_dim,
            rope=RopeConfig.from_hf(cfg, head_dim),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            qk_norm=model_type == "qwen3",
            attention_bias=cfg.get("attention_bias", False),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        )


def target_config_to_hf(cfg: TargetConfig) -> dict:
    """A Hugging Face config.json for the runner's config (transformers loads it as Qwen3 or Llama)."""
    d = {
        "architectures": ["Qwen3ForCausalLM" if cfg.qk_norm else "LlamaForCausalLM"],
        "model_type": "qwen3" if cfg.qk_norm else "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "attention_bias": cfg.attention_bias,
        "tie_word_embeddings": cfg.tie_word_embeddings, "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope.theta, **(cfg.rope.scaling or {})},
        "eos_token_id": cfg.eos_token_ids[0] if len(cfg.eos_token_ids) == 1 else (cfg.eos_token_ids or None),
    }
    return d


STEP_MAX_NEW = 16  # new tokens per sequence of a decode or verify step (a block) at most


@dataclass
class AttentionGroup:
    """Sequences of one forward whose new-token counts round up to the same power of two (or, where
    `ForwardBatch.build` merges them, every count of a step's size): attention pads queries to the longest in its
    call, so a 1-token sequence beside a 16-token one would cost 16x."""

    tokens: Tensor | slice  # their rows in the packed [T] tokens (a slice when the group is the whole batch)
    context: Gather  # what every layer reads of their slots' caches
    ragged: Ragged
    kv_len: int
    mask: Tensor | CausalBias | None  # [G, 1, Qmax, kv_len]; None when nothing is masked (one new token each,
    # equal lengths); a lower-right causal bias when every sequence adds Qmax tokens after the same start


@dataclass
class ForwardBatch:
    """Where the new tokens of one ragged forward go: their positions, cache pages and offsets, and attention
    groups."""

    positions: Tensor  # [T]
    pages: Tensor  # [T] the cache page each token's key and value go to
    offsets: Tensor  # [T] their place in it
    groups: list[AttentionGroup]
    run: tuple[int, int, int] | None = None  # (page, start, end) when one sequence's writes are a slice of a page
    native: native.AttentionBatch | None = None  # set when attention runs in C (then there are no groups)

    def write(self, store: Tensor, x: Tensor) -> None:
        """Store the new tokens' keys or values x [T, KV, hd] in one layer's cache pages [P, KV, page, hd]."""
        if self.run is not None:
            page, start, end = self.run
            store[page, :, start:end] = x.transpose(0, 1)
        else:
            store[self.pages, :, self.offsets] = x

    @classmethod
    def build(cls, cache: KVCache, slots: list[int], starts: list[int], counts: list[int], device: torch.device,
              fused_causal: bool | None = None, one_short_group: bool | None = None) -> "ForwardBatch":
        """`fused_causal`: groups whose sequences all start at the same position with the same count attend
        under PyTorch's lower-right causal bias instead of a boolean mask, which lets CUDA run its fused SDPA
        kernels (default: on CUDA only; CPU keeps the mask, whose kernel measured no slower there).
        `one_short_group`: sequences with a step's few new tokens (decodes and verifies, up to
        STEP_MAX_NEW) attend as one group, padded to the longest, instead of a group per power of two
        (default: on CUDA only). Why: on a GPU a small model's step is bound by the host issuing operations, and
        each group repeats a layer's attention operations, while padding a few queries costs the device next to
        nothing; on a CPU attention's arithmetic is the cost, and padding a 1-token decode to a 16-token verify's
        length would multiply it."""
        fused = device.type == "cuda" if fused_causal is None else fused_causal
        merge = device.type == "cuda" if one_short_group is None else one_short_group
        positions, pages, offsets = cache.locate(slots, starts, counts, device)
        if native.attends_over(cache.k) and not torch.is_grad_enabled():
            return cls(positions, pages, offsets, [],  # no writes here: `native.attend` stores the new tokens
                       native=native.attention_batch([cache.tables[s] for s in slots], starts, counts))
        ragged = Ragged.build(counts, device)
        buckets: dict[int, list[int]] = {}
        for row, c in enumerate(counts):
            short = merge and c <= STEP_MAX_NEW
            buckets.setdefault(STEP_MAX_NEW if short else 1 << (c - 1).bit_length(), []).append(row)
        if len(buckets) == 1:  # the common case: one group, the whole batch
            return cls(positions, pages, offsets, [_group(slice(None), cache, slots, starts, ragged, fused)],
                       _run(cache, slots, starts, counts))
        groups = []
        for rows in buckets.values():
            tokens = indices([t for r in rows for t in range(ragged.offsets[r], ragged.offsets[r] + counts[r])], device)
            groups.append(_group(tokens, cache, [slots[r] for r in rows], [starts[r] for r in rows],
                                 Ragged.build([counts[r] for r in rows], device), fused))
        return cls(positions, pages, offsets, groups)


def _run(cache: KVCache, slots: list[int], starts: list[int], counts: list[int]) -> tuple[int, int, int] | None:
    """One sequence whose new tokens fall in one page: its writes are a slice."""
    if len(slots) != 1:
        return None
    first, last = starts[0] // cache.page, (starts[0] + counts[0] - 1) // cache.page
    if first != last:
        return None
    offset = starts[0] % cache.page
    return cache.tables[slots[0]][first], offset, offset + counts[0]


def _group(tokens: Tensor | slice, cache: KVCache, slots: list[int], starts: list[int], ragged: Ragged,
           fused_causal: bool) -> AttentionGroup:
    """Causal mask of new tokens over their slot's cache: query j of a sequence starting at s sees 0..s+j."""
    counts = ragged.counts
    kv_len = max(s + c for s, c in zip(starts, counts))
    context = cache.gather(slots, kv_len)
    if ragged.qmax == 1 and all(s + 1 == kv_len for s in starts):
        return AttentionGroup(tokens, context, ragged, kv_len, None)
    if fused_causal and ragged.uniform and all(s + ragged.qmax == kv_len for s in starts):
        return AttentionGroup(tokens, context, ragged, kv_len, causal_lower_right(ragged.qmax, kv_len))
    device = ragged.seq_of_token.device
    query_pos = indices(starts, device)[:, None] + torch.arange(ragged.qmax, device=device)[None, :]  # [G, Qmax]
    mask = torch.arange(kv_len, device=device)[None, None, :] <= query_pos[:, :, None]
    return AttentionGroup(tokens, context, ragged, kv_len, mask[:, None])


class Attention(nn.Module):
    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        h, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = h, kv, hd
        self.q_proj = nn.Linear(cfg.hidden_size, h * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * hd, cfg.hidden_size, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.qk_norm_weight = Joined([("q_norm.weight", h), ("k_norm.weight", kv)])
        self.qk_norm, self.eps = cfg.qk_norm, cfg.rms_norm_eps
        self.qkv_weight = Joined(["q_proj.weight", "k_proj.weight", "v_proj.weight"])
        self.qkv_bias = Joined(["q_proj.bias", "k_proj.bias", "v_proj.bias"]) if cfg.attention_bias else None
        self.o_weight = Joined(["o_proj.weight"])

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: [T, D] -> q [T, H, hd], k and v [T, KV, hd], normed and rotated; q and k as one tensor
        through norm and RoPE (per-head weights), the three projections as one matmul."""
        t, h, kv = x.shape[0], self.n_heads, self.n_kv
        bias = None if self.qkv_bias is None else self.qkv_bias.of(self)
        qkv = self.qkv_weight.linear(self, x, bias).view(t, h + 2 * kv, self.head_dim)
        qk, v = qkv[:, : h + kv], qkv[:, h + kv :]
        if not self.qk_norm:
            qk = apply_rope(qk, cos, sin)
        elif native.can_norm_rope(qk, weight := self.qk_norm_weight.of(self), cos, sin):
            qk = native.norm_rope(qk, weight, cos, sin, self.eps)
        else:
            qk = apply_rope(rms_norm(qk, weight, self.eps), cos, sin)
        return qk[:, :h], qk[:, h:], v

    def forward_causal(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Training path: x [B, T, D], full causal attention, no cache."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x.reshape(b * t, -1), cos, sin)
        q, k, v = (z.view(b, t, z.shape[1], -1).transpose(1, 2) for z in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, fb: ForwardBatch, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(x, cos, sin)
        if fb.native is not None:
            out = native.attend(q, k, v, k_cache, v_cache, fb.native, self.head_dim**-0.5)
            return self.o_weight.linear(self, out.reshape(t, -1), self.o_proj.bias)
        fb.write(k_cache, k)
        fb.write(v_cache, v)
        if len(fb.groups) == 1:
            out = self.attend_group(q, fb.groups[0], k_cache, v_cache)
        else:
            out = q.new_empty(q.shape)
            for g in fb.groups:
                out[g.tokens] = self.attend_group(q[g.tokens], g, k_cache, v_cache)
        return self.o_weight.linear(self, out.reshape(t, -1), self.o_proj.bias)

    def attend_group(self, q: Tensor, g: AttentionGroup, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        """q [Tg, H, hd] of one attention group -> its attention output, packed alike."""
        keys, values = g.context(k_cache), g.context(v_cache)
        qp = g.ragged.pad(q).transpose(1, 2)  # [G, H, Qmax, hd]
        return g.ragged.unpad(attend(qp, keys, values, g.mask, self.head_dim**-0.5).transpose(1, 2))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, fb: ForwardBatch, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, fb, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_causal(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.self_attn.forward_causal(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class ForwardOutput:
    logits: Tensor  # [R, vocab] for the requested rows
    hidden: Tensor | None  # [T, len(capture_layers) * hidden], concatenated in the order asked


class Transformer(nn.Module):
    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", cfg.rope.inv_freq(), persistent=False)
        self.lm_head_weight = Joined(["lm_head.weight"])
        self._layer_parameters: list[tuple[nn.Module, str]] | None = None  # what keys `_native_layers`
        self._native_layers: tuple[list, native.Layers | None] | None = None
        self.step_graphs: bool | None = None  # decode and verify steps as CUDA graphs (`graphs.wanted`)
        self.recorders = graphs.Recorders(graphs.StepGraphs)

    @classmethod
    def from_pretrained(cls, path: str | Path, place: Placement = CPU) -> "Transformer":
        with torch.device("meta"):
            model = cls(TargetConfig.from_hf(read_config(path)))
        empty_on(model, place).reset_buffers()
        load_weights(model, path, _tied(model.config))
        return model

    def reset_buffers(self) -> "Transformer":
        """The RoPE frequencies, computed in fp32 on the model's device (never cast with the weights)."""
        self.inv_freq = self.config.rope.inv_freq().to(self.lm_head.weight.device)
        return self

    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
        save_checkpoint(self, path, target_config_to_hf(self.config), dtype, _tied(self.config))

    def new_cache(self, num_slots: int, max_len: int, paging: Paging | None = None) -> KVCache:
        """Unpaged (slots x max_len) unless `paging` (from a memory budget) says otherwise; with a scratch page
        where steps run as graphs."""
        place = place_of(self)
        return KVCache(self.config, num_slots, max_len, place, paging, graphs.wanted(self.step_graphs, place.device))

    def train_logits(self, ids: Tensor) -> Tensor:
        """ids [B, T] -> logits [B, T, vocab] with plain causal attention: the pretraining path."""
        b, t = ids.shape
        x = self.model.embed_tokens(ids)
        cos, sin = rope_cos_sin(self.inv_freq, torch.arange(t, device=ids.device).repeat(b))
        for layer in self.model.layers:
            x = layer.forward_causal(x, cos.to(x.dtype), sin.to(x.dtype))
        return self.lm_head(self.model.norm(x))

    @torch.inference_mode()
    def forward(
        self,
        cache: KVCache,
        slots: list[int],
        tokens: list[list[int]],
        logit_rows: Tensor | None = None,
        capture_layers: list[int] | None = None,
    ) -> ForwardOutput:
        """Append `tokens[b]` to slot `slots[b]` of `cache` and run them through the model in one batch.

        `logit_rows` picks packed rows whose logits are needed (all when None); layer `i` in
        `capture_layers` is the output of decoder layer i, as DFlash drafters consume it.
        """
        counts = [len(t) for t in tokens]
        starts = [cache.lengths[s] for s in slots]
        for s, st, c in zip(slots, starts, counts):
            cache.reserve(s, st + c)
        stepper = self.recorders.of(self, cache)
        if stepper is not None and stepper.fits(counts):
            step = stepper.run(cache, slots, starts, counts, tokens, capture_layers)
            out = ForwardOutput(self.logits(step.x if logit_rows is None else step.x[logit_rows]),
                                step.hidden)
        else:
            device = self.inv_freq.device
            fb = ForwardBatch.build(cache, slots, starts, counts, device)
            out = self.forward_batch(fb, indices([t for seq in tokens for t in seq], device), cache, logit_rows,
                                     capture_layers)
        for s, st, c in zip(slots, starts, counts):
            cache.lengths[s] = st + c
        return out

    def batch_invariant(self, cache: KVCache) -> bool:
        """Whether every forward over `cache` computes each sequence's rows bitwise as it would alone: attention in
        the native kernels, whose norms and products are batch-invariant too (weights below `layers.COPY_MIN_BYTES`,
        in test-sized models, go through torch's product, as a verify beside a decode already does). Then one
        forward may prefill some sequences and verify others (`steps.step_batch`)."""
        return native.attends_over(cache.k)

    def forward_batch(self, fb: ForwardBatch, ids: Tensor, cache: KVCache, logit_rows: Tensor | None = None,
                      capture_layers: list[int] | None = None) -> ForwardOutput:
        """The device's part of `forward`: tokens `ids` [T], already placed by `fb`, through the layers and the
        LM head; the cache's bookkeeping stays with `forward`. Apart so that this part can be timed or captured
        on its own (`benchmarks/bench_graph_ceiling.py`). Callers hold inference mode."""
        x, hidden = self.forward_layers(fb, ids, cache, capture_layers)
        return ForwardOutput(self.logits(x if logit_rows is None else x[logit_rows]), hidden)

    def logits(self, x: Tensor) -> Tensor:
        """The last layer's output x [R, D] through the final norm and the LM head."""
        return self.lm_head_weight.linear(self, self.model.norm(x))

    def forward_layers(self, fb: ForwardBatch, ids: Tensor, cache: KVCache,
                       capture_layers: list[int] | None = None) -> tuple[Tensor, Tensor | None]:
        """The embedding and the decoder layers: the last layer's output [T, D], and the captured layers' outputs
        [T, len(capture_layers) * D] (None when none are asked)."""
        x = self.model.embed_tokens(ids)
        cos, sin = rope_cos_sin(self.inv_freq, fb.positions)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        asked = capture_layers or []
        wanted = set(asked)
        fused = self._fused_layers(fb)
        if fused is not None and len(wanted) == len(asked):  # the native layers write a column per layer
            return self._decode_natively(x, cos, sin, fb, cache, fused, asked)
        captured: dict[int, Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, fb, cache.k[i], cache.v[i])
            if i in wanted:
                captured[i] = x
        return x, torch.cat([captured[i] for i in capture_layers], dim=-1) if capture_layers else None

    def uniform_layers(self, ids: Tensor, positions: Tensor, pages: Tensor, offsets: Tensor, context: Gather,
                       ragged: Ragged, mask: Tensor, cache: KVCache,
                       capture_layers: list[int] | None) -> tuple[Tensor, Tensor | None]:
        """`forward_layers` for a step padded to every sequence adding the same number of tokens, every index
        already on the device (what `graphs.StepGraphs` records): one attention group under `mask`."""
        group = AttentionGroup(slice(None), context, ragged, context.length, mask)
        return self.forward_layers(ForwardBatch(positions, pages, offsets, [group]), ids, cache, capture_layers)

    def _fused_layers(self, fb: ForwardBatch) -> native.Layers | None:
        """The layers' weights for `native.decode_layers` when this forward can take it: a decode or verify step
        whose attention runs in C, through Qwen3 layers (q/k norms, no biases) with fp32 weights. Gathered again only
        when a weight's storage or version changed (a load, a cast, an in-place update)."""
        if fb.native is None or not self.config.qk_norm or self.config.attention_bias or self.config.head_dim % 16:
            return None
        if self._layer_parameters is None:
            self._layer_parameters = [(m, n) for m in self.model.layers.modules()
                                      for n, p in m._parameters.items() if p is not None]
        key = [(m._parameters[n].data_ptr(), m._parameters[n]._version) for m, n in self._layer_parameters]
        if self._native_layers is None or self._native_layers[0] != key:
            self._native_layers = (key, self._gather_native_layers())
        return self._native_layers[1]

    def _gather_native_layers(self) -> native.Layers | None:
        if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in self.model.layers.parameters()):
            return None
        weights = []
        for layer in self.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            weights.append(native.LayerWeights(
                layer.input_layernorm.weight, attention.qkv_weight.panels(attention),
                attention.qk_norm_weight.of(attention), attention.o_weight.panels(attention),
                layer.post_attention_layernorm.weight, mlp.gate_up.panels(mlp), mlp.down.panels(mlp)))
        return native.Layers(weights) if all(w.usable() for w in weights) else None

    def _decode_natively(self, x: Tensor, cos: Tensor, sin: Tensor, fb: ForwardBatch, cache: KVCache,
                         layers: native.Layers, capture_layers: list[int]) -> tuple[Tensor, Tensor | None]:
        """`forward_layers`'s decoder layers in one C call (the same kernels `DecoderLayer` reaches through Python, in
        its order; about sixty calls fewer per layer). The captured layers are written side by side into one tensor:
        a concatenation after the forward copied them all once more, every step of every sequence that may draft."""
        cfg = self.config
        x = x.contiguous()
        hidden = x.new_empty(x.shape[0], len(capture_layers) * x.shape[1]) if capture_layers else None
        native.decode_layers(x, layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                             cfg.rms_norm_eps, cos, sin, cache.k, cache.v, fb.native, cfg.head_dim**-0.5, hidden,
                             capture_layers)
        return x, hidden


class TokenHeads(nn.Module):
    """The target's embedding and LM head alone, with its config: all a drafter reads of the target. A server's
    drafter model loads this, so the server holds one full copy of the target (in the target model)."""

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.lm_head_weight = Joined(["lm_head.weight"])  # a draft's logits through the target's fast products

    @classmethod
    def from_pretrained(cls, path: str | Path, place: Placement = CPU) -> "TokenHeads":
        with torch.device("meta"):
            heads = cls(TargetConfig.from_hf(read_config(path)))
        load_weights(empty_on(heads, place), path, _tied(heads.config), part=True)
        return heads


def _tied(cfg: TargetConfig) -> frozenset[str]:
    """The LM head's weights when it shares the embedding's: neither saved nor expected."""
    return frozenset({"lm_head.weight"}) if cfg.tie_word_embeddings else frozenset()
