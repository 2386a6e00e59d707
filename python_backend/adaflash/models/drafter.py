"""DFlash block-diffusion drafter, as published, with the AdaFlash length head.

One forward drafts a whole block: the block is [anchor, mask x (B-1)], queries come from
the block only, keys/values from [injected context ; block], attention is bidirectional
(within the window of a sliding layer), and the target's frozen embedding and LM head
turn ids into vectors and back. The
context is the target's hidden states of committed positions, fused by `fc`; its
per-layer K/V are cached per slot, so each step only projects the newly committed ones.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adaflash.models import graphs, native
from adaflash.models.cache import Gather, KVCache, Paging
from adaflash.models.checkpoint import load_weights, read_config, save_checkpoint
from adaflash.models.layers import MLP, Joined, RMSNorm, RopeConfig, apply_rope, argmax, attend, rope_cos_sin
from adaflash.models.placement import CPU, Placement, empty_on, indices, place_of
from adaflash.models.target import Transformer

DEFAULT_BLOCK_SIZE = 16  # the published DFlash drafters' block: an anchor and 15 masked positions
OUR_HEADS = ("position_head.",)  # tensors no published format has: saved apart (`checkpoint.EXTENSION`)


def block_size_of(drafter: "DFlashDrafter | None") -> int:
    """The block a drafter was trained with; without one, the default (it still bounds a prompt-lookup draft)."""
    return DEFAULT_BLOCK_SIZE if drafter is None else drafter.config.block_size


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Published default: spread evenly from layer 1 to layer N-3; the middle layer for a 1-layer drafter."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start = min(1, num_target_layers - 1)
    end = max(start, num_target_layers - 3)  # shallow targets: never before layer 1, never past the last
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope: RopeConfig
    rms_norm_eps: float
    block_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    length_head: bool
    length_head_dim: int
    hf: dict  # the full config.json; `to_hf` writes it back with the fields above taking precedence
    position_head: bool = False  # AdaFlash's per-position variant (our extension, `position_head.*` weights)
    position_head_dim: int = 64
    layer_types: list[str] | None = None  # per layer "full_attention" or "sliding_attention" (None: all full)
    sliding_window: int | None = None  # positions a sliding layer reaches, its query's own included

    def __post_init__(self) -> None:
        if self.layer_types is None:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types names {len(self.layer_types)} layers, the drafter has {self.num_hidden_layers}")

    def window(self, layer: int) -> int | None:
        """The sliding window of one drafter layer, None for full attention."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    @classmethod
    def from_hf(cls, cfg: dict) -> "DrafterConfig":
        dc = cfg.get("dflash_config", {})
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        layer_ids = dc.get("target_layer_ids") or default_target_layer_ids(cfg["num_target_layers"], cfg["num_hidden_layers"])
        if "mask_token_id" not in dc:
            raise ValueError("drafter config.json: dflash_config.mask_token_id is required")
        length_head = bool(dc.get("use_thresh_head_two_model", False))
        if length_head and not dc.get("thresh_head_direct_len", False):
            raise ValueError("drafter config.json: a thresh_head_two_model without dflash_config.thresh_head_direct_len "
                             "predicts a confidence threshold, not the verify length; only direct-length heads are "
                             "served (as in AdaFlash's SGLang serving path)")
        layer_types, window = attention_layout(cfg)
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            head_dim=head_dim,
            rope=RopeConfig.from_hf(cfg, head_dim),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            block_size=cfg["block_size"],
            num_target_layers=cfg["num_target_layers"],
            target_layer_ids=list(layer_ids),
            mask_token_id=dc["mask_token_id"],
            length_head=length_head,
            length_head_dim=dc.get("thresh_head_bottleneck_dim", 256),
            hf=copy.deepcopy(cfg),
            position_head=bool(dc.get("use_position_head", False)),
            position_head_dim=dc.get("position_head_dim", 64),
            layer_types=layer_types,
            sliding_window=window,
        )

    def to_hf(self) -> dict:
        cfg = copy.deepcopy(self.hf)
        cfg.update(
            architectures=["DFlashDraftModel"], model_type="qwen3", block_size=self.block_size,
            num_target_layers=self.num_target_layers, num_hidden_layers=self.num_hidden_layers,
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
        )
        if "rope_parameters" in cfg:
            cfg["rope_parameters"]["rope_theta"] = self.rope.theta
        else:
            cfg["rope_theta"] = self.rope.theta
        dc = cfg.setdefault("dflash_config", {})
        dc.update(mask_token_id=self.mask_token_id, target_layer_ids=self.target_layer_ids)
        if self.length_head:
            dc.update(use_thresh_head_two_model=True, thresh_head_bottleneck_dim=self.length_head_dim,
                      thresh_head_direct_len=True)
        else:
            for key in ("use_thresh_head_two_model", "thresh_head_bottleneck_dim", "thresh_head_direct_len"):
                dc.pop(key, None)
        if self.position_head:
            dc.update(use_position_head=True, position_head_dim=self.position_head_dim)
        else:
            dc.pop("use_position_head", None)
            dc.pop("position_head_dim", None)
        cfg["layer_types"] = list(self.layer_types)
        if self.sliding_window is not None:
            cfg.update(use_sliding_window=True, sliding_window=self.sliding_window)
        return cfg


LAYER_TYPES = ("full_attention", "sliding_attention")


def attention_layout(cfg: dict) -> tuple[list[str], int | None]:
    """Layer types and sliding window as Hugging Face's Qwen3Config resolves them for z-lab's drafter: the
    window counts only with `use_sliding_window` (default 4096 when the key is absent), and without
    `layer_types` the layers from `max_window_layers` on slide."""
    n = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
    types = cfg.get("layer_types") or ["sliding_attention" if window is not None and i >= cfg.get("max_window_layers", 28)
                                       else "full_attention" for i in range(n)]
    if len(types) != n or not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"drafter config.json: layer_types must name {n} layers, each one of {LAYER_TYPES}, got {types}")
    if window is not None and window < 1:
        raise ValueError(f"drafter config.json: sliding_window must be positive, got {window}")
    return list(types), window


class DraftAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        h, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = h, kv, hd
        self.q_proj = nn.Linear(cfg.hidden_size, h * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        # The target's products (native for a draft's few rows); training keeps F.linear on each part.
        self.q_weight, self.o_weight = Joined(["q_proj.weight"]), Joined(["o_proj.weight"])
        self.kv_weight = Joined(["k_proj.weight", "v_proj.weight"])

    def project_kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """x: [T, D] -> keys (k_norm, RoPE) and values [T, KV, hd]; used for context and block alike."""
        t = x.shape[0]
        k, v = self.kv_weight.linear(self, x).view(t, 2 * self.n_kv, self.head_dim).chunk(2, dim=1)
        return apply_rope(self.k_norm(k), cos, sin), v

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor) -> Tensor:
        """x: [n, B, D] block; ctx_k/ctx_v: [n, KV, Lc, hd]; mask: [n, 1, B, Lc + B] (`visible_keys`)."""
        n, b, _ = x.shape
        flat = x.reshape(n * b, -1)
        q = apply_rope(self.q_norm(self.q_weight.linear(self, flat).view(n * b, self.n_heads, self.head_dim)), cos, sin)
        k, v = self.project_kv(flat, cos, sin)
        keys = torch.cat([ctx_k, k.view(n, b, self.n_kv, -1).transpose(1, 2)], dim=2)
        values = torch.cat([ctx_v, v.view(n, b, self.n_kv, -1).transpose(1, 2)], dim=2)
        out = attend(q.view(n, b, self.n_heads, -1).transpose(1, 2), keys, values, mask, self.head_dim**-0.5)
        return self.o_weight.linear(self, out.transpose(1, 2).reshape(n, b, -1))

    def forward_cached(self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                       batch: native.AttentionBatch) -> Tensor:
        """x: [T, D], the blocks packed; their keys and values go into the caches at the block's positions (past the
        context, which later appends overwrite), and each block position attends over its context and whole block
        there (`native.attend`, not causal): `forward` without gathering the context or building a mask."""
        t = x.shape[0]
        q = apply_rope(self.q_norm(self.q_weight.linear(self, x).view(t, self.n_heads, self.head_dim)), cos, sin)
        k, v = self.project_kv(x, cos, sin)
        out = native.attend(q, k, v, k_cache, v_cache, batch, self.head_dim**-0.5, causal=False)
        return self.o_weight.linear(self, out.reshape(t, -1))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.self_attn = DraftAttention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_cached(self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                       batch: native.AttentionBatch) -> Tensor:
        x = x + self.self_attn.forward_cached(self.input_layernorm(x), cos, sin, k_cache, v_cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


def visible_keys(ctx_mask: Tensor, starts: Tensor, block: int, window: int | None) -> Tensor:
    """[n, 1, B, Lc + B] boolean: which of [context ; block] keys each block query attends to.

    Context key s sits at absolute position s, block position j at starts + j. Full attention: the valid
    context and the whole block (no causal mask). A sliding layer keeps the keys within `window` - 1
    positions of the query on either side: z-lab's drafter hands Hugging Face's `sliding_window` to flash
    attention, non-causal, as the window (W - 1, W - 1) aligned to the query's own position, so the block
    stays bidirectional and the context is cut W - 1 positions before each query."""
    n, lc = ctx_mask.shape
    valid = torch.cat([ctx_mask, ctx_mask.new_ones(n, block)], dim=1)[:, None, None, :]
    if window is None:
        return valid.expand(n, 1, block, lc + block)
    query = starts[:, None] + torch.arange(block, device=starts.device)[None, :]
    key = torch.cat([torch.arange(lc, device=starts.device).expand(n, lc), query], dim=1)
    near = (query[:, :, None] - key[:, None, :]).abs() < window
    return valid & near[:, None]


class LengthHead(nn.Module):
    """AdaFlash's `thresh_head_two_model` with `thresh_head_direct_len`: the whole block's final hidden states
    -> candidate length / B, the block positions worth verifying (anchor included), trained on (a + 1) / B."""

    def __init__(self, hidden: int, dim: int) -> None:
        super().__init__()
        self.down = nn.Linear(2 * hidden, dim)
        self.res = nn.ModuleList([nn.Linear(dim, dim)])
        self.out = nn.Linear(dim, 1)

    def forward(self, block_hidden: Tensor) -> Tensor:
        """block_hidden: [n, B, D], pooled over every position, the anchor too, as published -> [n] in (0, 1)."""
        x = F.silu(self.down(torch.cat([block_hidden.mean(dim=1), block_hidden[:, -1]], dim=-1)))
        x = x + F.silu(self.res[0](x))
        return torch.sigmoid(self.out(x)).squeeze(-1)


class PositionHead(nn.Module):
    """Per-position acceptance, what a cost-aware length choice needs: for each drafted position j,
    P(token j accepted | tokens 1..j-1 accepted), from its hidden state, the block's mean, the
    drafter's own confidence in the token (`confidence`) and a learned embedding of j."""

    def __init__(self, hidden: int, dim: int, positions: int) -> None:
        super().__init__()
        self.position = nn.Embedding(positions, dim)
        self.down = nn.Linear(2 * hidden + 2, dim)
        self.res = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, 1)

    @staticmethod
    def confidence(logits: Tensor) -> Tensor:
        """[n, B-1, V] draft logits -> [n, B-1, 2]: top log-probability and entropy of each position."""
        logp = torch.log_softmax(logits.float(), dim=-1)
        return torch.stack([logp.max(dim=-1).values, -(logp.exp() * logp).sum(dim=-1)], dim=-1)

    def forward(self, block_hidden: Tensor, confidence: Tensor) -> Tensor:
        """block_hidden [n, B, D], confidence [n, B-1, 2] -> [n, B-1] in (0, 1)."""
        draft = block_hidden[:, 1:]
        x = torch.cat([draft, draft.mean(dim=1, keepdim=True).expand_as(draft), confidence.to(draft.dtype)], dim=-1)
        x = self.down(x) + self.position.weight[: draft.shape[1]]
        x = x + F.silu(self.res(x))
        return torch.sigmoid(self.out(x)).squeeze(-1)


@dataclass
class Draft:
    tokens: Tensor  # [n, block_length - 1] drafted ids (greedy: the draft is deterministic)
    hidden: Tensor | None  # [n, block_size, D] final-norm hidden states of the block (None: a draft sent over the
    # wire, or drafted by ONNX Runtime)
    accept_ratio: Tensor | None  # [n] length head prediction of (accepted + 1) / block_size
    accept_rates: Tensor | None = None  # [n, block_size - 1] position head: P(j accepted | 1..j-1 accepted)


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.fc_weight = Joined(["fc.weight"])
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.length_head:
            self.thresh_head_two_model = LengthHead(cfg.hidden_size, cfg.length_head_dim)
        if cfg.position_head:
            self.position_head = PositionHead(cfg.hidden_size, cfg.position_head_dim, cfg.block_size - 1)
        self.register_buffer("inv_freq", cfg.rope.inv_freq(), persistent=False)
        self.step_graphs: bool | None = None  # drafts and context projections as CUDA graphs (`graphs.wanted`)
        self.recorders = graphs.Recorders(graphs.DraftGraphs)

    @property
    def length_head(self) -> LengthHead | None:
        return self.thresh_head_two_model if self.config.length_head else None

    @classmethod
    def from_pretrained(cls, path: str | Path, place: Placement = CPU) -> "DFlashDrafter":
        with torch.device("meta"):
            model = cls(DrafterConfig.from_hf(read_config(path)))
        empty_on(model, place).reset_buffers()
        load_weights(model, path)
        return model

    def reset_buffers(self) -> "DFlashDrafter":
        """The RoPE frequencies, computed in fp32 on the model's device (never cast with the weights)."""
        self.inv_freq = self.config.rope.inv_freq().to(self.fc.weight.device)
        return self

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin computed in fp32, then cast to the weights' dtype, as Hugging Face's Qwen3 does."""
        cos, sin = rope_cos_sin(self.inv_freq, positions)
        return cos.to(self.fc.weight.dtype), sin.to(self.fc.weight.dtype)

    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        config = self.config.to_hf()
        config["dtype"] = str(dtype).removeprefix("torch.")
        save_checkpoint(self, path, config, dtype, extension=OUR_HEADS)

    def check_target(self, target: Transformer) -> None:
        """A drafter only fits the target it was trained for; say which dimension differs."""
        t, d = target.config, self.config
        problems = []
        if t.hidden_size != d.hidden_size:
            problems.append(f"hidden_size {d.hidden_size} != target {t.hidden_size}")
        if t.num_hidden_layers != d.num_target_layers:
            problems.append(f"num_target_layers {d.num_target_layers} != target depth {t.num_hidden_layers}")
        if max(d.target_layer_ids) >= t.num_hidden_layers:
            problems.append(f"target_layer_ids {d.target_layer_ids} out of range")
        if not 0 <= d.mask_token_id < t.vocab_size:
            problems.append(f"mask_token_id {d.mask_token_id} outside the target vocabulary")
        if problems:
            raise ValueError("drafter does not match target: " + "; ".join(problems))

    def new_cache(self, num_slots: int, max_len: int, paging: Paging | None = None) -> KVCache:
        """The per-slot context keys and values of every drafter layer (paged like the target's when asked; with a
        scratch page where drafts run as graphs)."""
        place = place_of(self)
        return KVCache(self.config, num_slots, max_len, place, paging, graphs.wanted(self.step_graphs, place.device))

    def fuse(self, features: Tensor) -> Tensor:
        """Concatenated target hidden states [T, n_layers * D] -> one context vector per position."""
        return self.hidden_norm(self.fc_weight.linear(self, features))

    @torch.inference_mode()
    def append_context(self, cache: KVCache, slots: list[int], features: Tensor, counts: list[int]) -> None:
        """Project newly committed positions (packed `features`, `counts[b]` for `slots[b]`) into `cache`."""
        if sum(counts) == 0:
            return
        starts = [cache.lengths[s] for s in slots]
        for s, st, n in zip(slots, starts, counts):
            cache.reserve(s, st + n)
        recorder = self.recorders.of(self, cache)
        if recorder is not None and recorder.fits(sum(counts)):
            recorder.append(cache, slots, starts, counts, features.to(self.fc.weight))
        else:
            positions, pages, offsets = cache.locate(slots, starts, counts, self.inv_freq.device)
            self.project_context(cache, positions, pages, offsets, features.to(self.fc.weight))
        for s, n in zip(slots, counts):
            cache.lengths[s] += n

    def project_context(self, cache: KVCache, positions: Tensor, pages: Tensor, offsets: Tensor,
                        features: Tensor) -> None:
        """`append_context` with every index on the device: features [T, F] at `positions`, their keys and values
        written to `pages` at `offsets` (what `graphs.DraftGraphs` records)."""
        fused = self.fuse(features)
        cos, sin = self._rope(positions)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.project_kv(fused, cos, sin)
            cache.k[i][pages, :, offsets] = k
            cache.v[i][pages, :, offsets] = v

    @torch.inference_mode()
    def draft(self, target: Transformer, cache: KVCache, slots: list[int], anchors: list[int],
              block_length: int | None = None) -> Draft:
        """Draft block_length - 1 tokens (default block_size - 1) after each anchor; the anchor sits right after
        the context cached in `cache`. A shorter block than trained costs less and drafts its first positions alike."""
        recorder, length = self.recorders.of(self, cache), self.block_length(block_length)
        if recorder is not None:
            return Draft(*recorder.run(cache, target, slots, anchors, length))
        if self._drafts_in_cache(cache, slots, length):
            return self._draft_in_cache(target, cache, slots, anchors, length)
        lengths = [cache.lengths[s] for s in slots]
        device = cache.k.device
        return self.draft_gathered(target, cache, indices(anchors, device), indices(lengths, device),
                                   cache.gather(slots, max(lengths)), length)

    def draft_gathered(self, target: Transformer, cache: KVCache, anchors: Tensor, ctx_lens: Tensor, context: Gather,
                       block_length: int | None = None) -> Draft:
        """`draft` with every index on the device: the anchors [n], context lengths [n] and what to read of the
        cache (what `graphs.DraftGraphs` records)."""
        ctx_kv = [(context(cache.k[i]), context(cache.v[i])) for i in range(len(self.layers))]
        return self.draft_block(target, self.block_ids(anchors, block_length), ctx_lens, ctx_kv)

    def _drafts_in_cache(self, cache: KVCache, slots: list[int], length: int) -> bool:
        """Whether this draft runs in `cache` (`_draft_in_cache`): the native kernels attend over it, every layer
        attends fully (no window), the block forward is this class's (another backend's takes `draft_block`), and
        each block fits in its slot, pages included (past the pages its context holds)."""
        if (not native.attends_over(cache.k) or type(self).draft_block is not DFlashDrafter.draft_block
                or any(self.config.window(i) is not None for i in range(len(self.layers)))):
            return False
        ends = [cache.lengths[s] + length for s in slots]
        if max(ends) > cache.max_len:
            return False
        return sum(max(-(-end // cache.page) - len(cache.tables[s]), 0) for s, end in zip(slots, ends)) <= len(cache.free)

    def _draft_in_cache(self, target: Transformer, cache: KVCache, slots: list[int], anchors: list[int],
                        length: int) -> Draft:
        """`draft` on the CPU's native kernels: each block's keys and values are written past its context in the
        cache, where its queries read them with the context's, in place, instead of gathering every context for the
        batch and joining the block to it (docs/history.md, round 28). The pages a block took beyond its context's
        go back after."""
        starts = [cache.lengths[s] for s in slots]
        for s, start in zip(slots, starts):
            cache.reserve(s, start + length)
        batch = native.attention_batch([cache.tables[s] for s in slots], starts, [length] * len(slots))
        x = target.model.embed_tokens(self.block_ids(anchors, length).reshape(-1)).to(self.fc.weight.dtype)
        cos, sin = self._rope(indices([start + j for start in starts for j in range(length)], x.device))
        for i, layer in enumerate(self.layers):
            x = layer.forward_cached(x, cos, sin, cache.k[i], cache.v[i], batch)
        for s, start in zip(slots, starts):
            cache.truncate(s, start)
        return self._finish(target, self.norm(x).view(len(slots), length, -1))

    @torch.inference_mode()
    def draft_uncached(self, target: Transformer, features: Tensor, anchor: int) -> Draft:
        """The same draft recomputed from scratch for one sequence: context K/V projected from `features` [C, F]."""
        ctx_lens = torch.tensor([features.shape[0]], device=self.inv_freq.device)
        return self.draft_block(target, self.block_ids([anchor]), ctx_lens, self.context_kv(features))

    def draft_block(self, target: Transformer, ids: Tensor, ctx_lens: Tensor,
                    ctx_kv: list[tuple[Tensor, Tensor]]) -> Draft:
        """Blocks `ids` [n, B] right after each sequence's ctx_lens[i] context positions, whose keys and values are
        gathered for the batch in `ctx_kv` (per layer, [n, KV, Lc, hd]; positions past a sequence's own are masked).
        The boundary another backend takes over (`onnx_drafter.py`): the cache before it stays PyTorch's."""
        lc = ctx_kv[0][0].shape[2]
        ctx_mask = torch.arange(lc, device=ids.device)[None, :] < ctx_lens[:, None]
        return self._finish(target, self.block_hidden(target, ids, ctx_lens, ctx_kv, ctx_mask))

    def context_kv(self, features: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per-layer context keys/values [1, KV, C, hd] of positions 0..C-1 (training and reference path)."""
        fused = self.fuse(features.to(self.fc.weight))
        cos, sin = self._rope(torch.arange(features.shape[0], device=fused.device))
        out = []
        for layer in self.layers:
            k, v = layer.self_attn.project_kv(fused, cos, sin)
            out.append((k.transpose(0, 1)[None], v.transpose(0, 1)[None]))
        return out

    def block_length(self, asked: int | None) -> int:
        """The block a draft runs: block_size unless a shorter one is asked."""
        length = self.config.block_size if asked is None else asked
        if not 2 <= length <= self.config.block_size:
            raise ValueError(f"block_length must be in [2, {self.config.block_size}], got {length}")
        return length

    def block_ids(self, anchors: list[int] | Tensor, block_length: int | None = None) -> Tensor:
        device = self.inv_freq.device
        anchors = anchors.to(device, torch.long) if isinstance(anchors, Tensor) else indices(anchors, device)
        length = self.block_length(block_length)
        ids = torch.full((anchors.shape[0], length), self.config.mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = anchors
        return ids

    def block_hidden(
        self, target: Transformer, ids: Tensor, starts: Tensor, ctx_kv: list[tuple[Tensor, Tensor]], ctx_mask: Tensor
    ) -> Tensor:
        """Blocks `ids` [n, B] at absolute positions starts[i] + 0..B-1, each seeing the context where ctx_mask[i]
        (context position s at key s), within the window of each sliding layer."""
        n, b = ids.shape
        x = target.model.embed_tokens(ids).to(self.fc.weight.dtype)
        cos, sin = self._rope((starts[:, None] + torch.arange(b, device=ids.device)[None, :]).reshape(-1))
        windows = [self.config.window(i) for i in range(len(self.layers))]
        masks = {w: visible_keys(ctx_mask, starts, b, w) for w in set(windows)}
        for layer, (ck, cv), w in zip(self.layers, ctx_kv, windows):
            x = layer(x, cos, sin, ck.expand(n, -1, -1, -1), cv.expand(n, -1, -1, -1), masks[w])
        return self.norm(x)

    def _finish(self, target: Transformer, hidden: Tensor) -> Draft:
        logits = target.lm_head_weight.linear(target, hidden[:, 1:].to(target.lm_head.weight.dtype))
        head = self.length_head
        return Draft(tokens=argmax(logits), hidden=hidden, accept_ratio=None if head is None else head(hidden),
                     accept_rates=self.position_head(hidden, PositionHead.confidence(logits))
                     if self.config.position_head else None)
