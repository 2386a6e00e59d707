"""What a served target and its drafter hold in memory, from their configs alone: weights, caches, features and
the transient tensors of a forward.

A server must size its caches before it allocates them, and a GPU's memory is the budget: so the arithmetic is
pure (no tensor allocated, no weight read) and one function answers both ways, the bytes a plan needs and the
tokens a budget holds. `adaflash plan-memory` prints it; the engine and the served models size their caches
with `tokens_for_budget`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adaflash.models.cache import AttentionShape
from adaflash.models.drafter import DEFAULT_BLOCK_SIZE, DrafterConfig
from adaflash.models.placement import DTYPES
from adaflash.models.target import TargetConfig

SCORE_BYTES = 4  # attention scores and sampling probabilities are fp32 whatever the weights' dtype


@dataclass(frozen=True)
class MemoryPlan:
    """Parameters by part and bytes by use, in one dtype, for `slots` sequences of up to `max_len` tokens.

    The drafter model holds its own copy of the target's embedding and LM head (`token_heads_parameters`),
    because it runs in a process of its own; without a drafter the drafter fields are empty or 0."""

    dtype: str
    itemsize: int
    slots: int
    max_len: int
    target_parameters: dict[str, int]
    drafter_parameters: dict[str, int]
    token_heads_parameters: int
    target_kv_per_token: int
    drafter_context_per_token: int
    features_per_token: int
    activation_bytes: int

    @property
    def target_weight_bytes(self) -> int:
        return sum(self.target_parameters.values()) * self.itemsize

    @property
    def drafter_model_weight_bytes(self) -> int:
        """The drafter model's process: the drafter and its copy of the target's embedding and LM head."""
        return (sum(self.drafter_parameters.values()) + self.token_heads_parameters) * self.itemsize

    @property
    def weight_bytes(self) -> int:
        return self.target_weight_bytes + self.drafter_model_weight_bytes

    @property
    def cache_bytes_per_token(self) -> int:
        """A sequence's position costs one target KV entry and one drafter context entry."""
        return self.target_kv_per_token + self.drafter_context_per_token

    @property
    def cache_bytes(self) -> int:
        return cache_bytes_for(self, self.slots * self.max_len)

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.cache_bytes + self.activation_bytes


def dtype_itemsize(dtype: str | torch.dtype) -> int:
    """Bytes per element; a name must be one the models load in (placement.DTYPES)."""
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[dtype].itemsize


def _linear(inputs: int, outputs: int, bias: bool = False) -> int:
    return inputs * outputs + (outputs if bias else 0)


def _decoder_layer(shape: AttentionShape, hidden: int, intermediate: int, heads: int, bias: bool,
                   qk_norm: bool) -> int:
    """One Qwen3/Llama layer as target.DecoderLayer and drafter.DraftLayer build it: q/k/v/o, the per-head q
    and k norms (Qwen3), the SwiGLU MLP and the two RMSNorms."""
    q, kv = heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
    attention = _linear(hidden, q, bias) + 2 * _linear(hidden, kv, bias) + _linear(q, hidden, bias)
    qk_norms = 2 * shape.head_dim if qk_norm else 0
    return attention + qk_norms + 3 * hidden * intermediate + 2 * hidden


def target_parameters(cfg: TargetConfig) -> dict[str, int]:
    """By part, in checkpoint order; a tied LM head is the embedding itself, so it counts 0."""
    embedding = cfg.vocab_size * cfg.hidden_size
    layer = _decoder_layer(cfg, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                           cfg.attention_bias, cfg.qk_norm)
    return {"embed_tokens": embedding, "layers": cfg.num_hidden_layers * layer, "norm": cfg.hidden_size,
            "lm_head": 0 if cfg.tie_word_embeddings else embedding}


def token_heads_parameters(cfg: TargetConfig) -> int:
    """The target's embedding and LM head alone (`TokenHeads`): what a drafter model loads of the target."""
    parts = target_parameters(cfg)
    return parts["embed_tokens"] + parts["lm_head"]


def drafter_parameters(cfg: DrafterConfig) -> dict[str, int]:
    """The drafter's own parameters by part: it borrows the target's embedding and LM head, so they are not
    here. The length heads count only when the config enables them, as the model builds them."""
    hidden = cfg.hidden_size
    layer = _decoder_layer(cfg, hidden, cfg.intermediate_size, cfg.num_attention_heads, bias=False, qk_norm=True)
    parts = {"fc": _linear(len(cfg.target_layer_ids) * hidden, hidden), "hidden_norm": hidden,
             "layers": cfg.num_hidden_layers * layer, "norm": hidden}
    if cfg.length_head:
        dim = cfg.length_head_dim
        parts["thresh_head_two_model"] = _linear(2 * hidden, dim, True) + _linear(dim, dim, True) + _linear(dim, 1, True)
    if cfg.position_head:
        dim = cfg.position_head_dim
        parts["position_head"] = ((cfg.block_size - 1) * dim + _linear(2 * hidden + 2, dim, True)
                                  + _linear(dim, dim, True) + _linear(dim, 1, True))
    return parts


def kv_bytes_per_token(shape: AttentionShape, itemsize: int) -> int:
    """One position of a `KVCache`: a key and a value per layer and key/value head."""
    return 2 * shape.num_hidden_layers * shape.num_key_value_heads * shape.head_dim * itemsize


def feature_bytes_per_token(cfg: DrafterConfig, itemsize: int) -> int:
    """The target's hidden states of the drafter's layers for one committed position: what crosses from the
    target to the drafter, on each hop."""
    return len(cfg.target_layer_ids) * cfg.hidden_size * itemsize


def _forward_bytes(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, tokens: int,
                   keys: int, logits: int, itemsize: int) -> int:
    """Tensors one forward of `tokens` packed tokens holds at once: per token the residual stream, its normed
    input, a layer's output, q/k/v, the attention output and the MLP's gate/up and product; the attention
    scores of every query over `keys` positions (fp32, the unfused kernel's worst case); `logits` rows with
    their fp32 probabilities."""
    per_token = (3 * hidden + (heads + 2 * kv_heads) * head_dim + heads * head_dim + 3 * intermediate) * itemsize
    return tokens * per_token + tokens * heads * keys * SCORE_BYTES + logits * (itemsize + SCORE_BYTES)


def activation_bytes(target: TargetConfig, drafter: DrafterConfig | None, itemsize: int, slots: int,
                     max_len: int, prefill_tokens: int) -> int:
    """An estimate from shapes, not a measurement, of the largest forwards' transient tensors, so that a
    budget leaves them room: the target verifying every slot's block while prefilling `prefill_tokens`
    (with one layer's keys and values gathered for all slots and the captured features), and the drafter,
    in its own process at the same time, drafting a block for every slot over its whole gathered context
    (and one layer's context joined to the block's keys and values).
    The CUDA context and the allocator's slack are not in it: the fraction of the device left unused is."""
    block = DEFAULT_BLOCK_SIZE if drafter is None else drafter.block_size
    verified = slots * block
    tokens = verified + prefill_tokens
    gathered = slots * max_len * kv_bytes_per_token(target, itemsize) // target.num_hidden_layers
    features = 0 if drafter is None else 2 * tokens * feature_bytes_per_token(drafter, itemsize)
    total = gathered + features + _forward_bytes(
        target.hidden_size, target.num_attention_heads, target.num_key_value_heads, target.head_dim,
        target.intermediate_size, tokens, max_len, verified * target.vocab_size, itemsize)
    if drafter is not None:
        context = slots * max_len * kv_bytes_per_token(drafter, itemsize)
        total += context + context // drafter.num_hidden_layers + _forward_bytes(
            drafter.hidden_size, drafter.num_attention_heads, drafter.num_key_value_heads, drafter.head_dim,
            drafter.intermediate_size, verified, max_len + block, slots * (block - 1) * target.vocab_size, itemsize)
    return total


def plan_memory(target: TargetConfig, drafter: DrafterConfig | None, dtype: str | torch.dtype, slots: int,
                max_len: int, prefill_tokens: int = 4096) -> MemoryPlan:
    """`prefill_tokens`: the most prompt tokens one step prefills (the scheduler's budget), for the activations."""
    if slots < 1 or max_len < 1:
        raise ValueError(f"slots and max_len must be >= 1, got {slots} and {max_len}")
    itemsize = dtype_itemsize(dtype)
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    return MemoryPlan(
        dtype=name, itemsize=itemsize, slots=slots, max_len=max_len,
        target_parameters=target_parameters(target),
        drafter_parameters={} if drafter is None else drafter_parameters(drafter),
        token_heads_parameters=0 if drafter is None else token_heads_parameters(target),
        target_kv_per_token=kv_bytes_per_token(target, itemsize),
        drafter_context_per_token=0 if drafter is None else kv_bytes_per_token(drafter, itemsize),
        features_per_token=0 if drafter is None else feature_bytes_per_token(drafter, itemsize),
        activation_bytes=activation_bytes(target, drafter, itemsize, slots, max_len, prefill_tokens),
    )


def cache_bytes_for(plan: MemoryPlan, tokens: int) -> int:
    """Target KV and drafter context for `tokens` positions in all."""
    return tokens * plan.cache_bytes_per_token


def tokens_for_budget(plan: MemoryPlan, budget: int) -> int:
    """Positions of target KV and drafter context together that `budget` bytes hold: the inverse of
    `cache_bytes_for`, rounded down."""
    if budget < 0:
        raise ValueError(f"cache budget: must be >= 0 bytes, got {budget}")
    return budget // plan.cache_bytes_per_token


def slots_for_budget(plan: MemoryPlan, budget: int) -> int:
    """Sequences of `plan.max_len` tokens whose caches `budget` bytes hold."""
    return tokens_for_budget(plan, budget) // plan.max_len


def device_cache_budget(plan: MemoryPlan, device_memory: int, fraction: float = 0.9) -> int:
    """Bytes left for the caches when the server may use `fraction` of the device: the weights and the
    activations come first. Raises ValueError when nothing is left, naming what took it."""
    if not 0 < fraction <= 1:
        raise ValueError(f"memory fraction: must be in (0, 1], got {fraction}")
    usable = int(device_memory * fraction)
    left = usable - plan.weight_bytes - plan.activation_bytes
    if left <= 0:
        raise ValueError(f"{fraction:g} x {gib(device_memory)} = {gib(usable)} does not hold the weights "
                         f"({gib(plan.weight_bytes)}, {plan.dtype}) and activations ({gib(plan.activation_bytes)}): "
                         "nothing is left for the caches")
    return left


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"
