"""What each stage of `adaflash train` needs of one device, and the arithmetic it does, from the configs alone.

Printed before a stage starts and by `adaflash train --plan-only`, so that a run on a large target is sized
before it is started (the serving arithmetic is `models/memory.py`; this adds training's: fp32 master weights,
gradients and AdamW's two moments of the drafter, the activations one sequence keeps for its backward, the target's
features). Estimates from shapes, not measurements: the allocator's slack, the CUDA context and fused kernels'
savings are not in them. The time is the arithmetic over an assumed sustained throughput, to be replaced by a
measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaflash.models.drafter import DrafterConfig
from adaflash.models.memory import (
    dtype_itemsize,
    drafter_parameters,
    feature_bytes_per_token,
    gib,
    kv_bytes_per_token,
    plan_memory,
    target_parameters,
)
from adaflash.models.target import TargetConfig

TRAINED_BYTES_PER_PARAMETER = 16  # fp32 weight, fp32 gradient, AdamW's two fp32 moments
FP32 = 4


@dataclass(frozen=True)
class TrainingShape:
    """The run's sizes that memory and arithmetic depend on."""

    dtype: str  # the frozen target's
    sequence_tokens: int  # longest prompt + response
    anchors: int  # blocks per sequence and step (the DFlash stage's; the on-policy stage's are fewer)
    sequences: int  # training sequences (regenerated prompts)
    steps: int  # DFlash steps
    batch: int  # sequences per step, all processes together
    generation_slots: int  # sequences the engine decodes at once
    response_tokens: int
    opd_sequences: int  # per round, all rounds together
    opd_steps: int  # all rounds together
    heads_anchors: int
    feature_cache: int  # bytes of target features kept between steps, at most
    heads_sequences: int | None = None  # sequences the heads learn from (None: all)
    processes: int = 1  # under torchrun, DistributedDataParallel keeps a bucketed copy of the gradients


def _forward_bytes(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, tokens: int, keys: int,
                   itemsize: int) -> int:
    """Transient tensors of one layer's forward over `tokens` tokens: the residual, the normed input, q/k/v and the
    attention output, the MLP's gate, up and product, and fp32 attention scores over `keys` positions (the
    unfused kernel's worst case)."""
    per_token = (3 * hidden + (2 * heads + 2 * kv_heads) * head_dim + 3 * intermediate) * itemsize
    return tokens * per_token + tokens * heads * keys * FP32


def drafter_training_bytes(target: TargetConfig, drafter: DrafterConfig, shape: TrainingShape,
                           teacher: bool) -> dict[str, int]:
    """One sequence's forward and backward through the drafter (sequences of a step are accumulated one at a time),
    the target's feature forward before it, and with `teacher` the target's logits over the sequence (on-policy
    distillation)."""
    item = dtype_itemsize(shape.dtype)
    act = FP32 if item == FP32 else 2  # the drafter's activations: fp32 on the CPU, bf16 under CUDA autocast
    L, B, n = shape.sequence_tokens, drafter.block_size, min(shape.anchors, shape.sequence_tokens)
    trained = sum(drafter_parameters(drafter).values())
    layers = drafter.num_hidden_layers * _forward_bytes(
        drafter.hidden_size, drafter.num_attention_heads, drafter.num_key_value_heads, drafter.head_dim,
        drafter.intermediate_size, n * B, L + B, act)
    context = L * (len(drafter.target_layer_ids) * drafter.hidden_size * act + kv_bytes_per_token(drafter, act))
    logits = 3 * n * (B - 1) * target.vocab_size * FP32  # logits, their log-softmax, its gradient
    feature_forward = _forward_bytes(target.hidden_size, target.num_attention_heads, target.num_key_value_heads,
                                     target.head_dim, target.intermediate_size, L, L, item)
    parts = {"target weights (frozen)": sum(target_parameters(target).values()) * item,
             "drafter weights, gradients, AdamW (fp32)": trained * TRAINED_BYTES_PER_PARAMETER,
             "target features: one sequence + the cache": L * feature_bytes_per_token(drafter, item) + min(
                 shape.feature_cache, shape.sequences * L * feature_bytes_per_token(drafter, item)),
             "activations kept for the backward": layers + context + logits,
             "gradient all-reduce buckets (torchrun)": trained * FP32 if shape.processes > 1 else 0,
             "target forward (transient)": feature_forward + L * target.hidden_size * item * 4}
    if teacher:
        parts["teacher logits (fp32, with log-softmax)"] = 2 * L * target.vocab_size * FP32
    return parts


def generation_bytes(target: TargetConfig, drafter: DrafterConfig | None, shape: TrainingShape) -> dict[str, int]:
    """The engine decoding `generation_slots` sequences (the serving plan), and the drafter's fp32 weights."""
    plan = plan_memory(target, drafter, shape.dtype, shape.generation_slots, shape.sequence_tokens + 32)
    parts = {"target weights": plan.target_weight_bytes, "KV caches": plan.cache_bytes,
             "activations (serving estimate)": plan.activation_bytes}
    if drafter is not None:
        parts["drafter weights (fp32)"] = sum(drafter_parameters(drafter).values()) * FP32
    return parts


def heads_bytes(target: TargetConfig, drafter: DrafterConfig, shape: TrainingShape) -> dict[str, int]:
    """The blocks the heads learn from, kept at once: each block's hidden states and confidences, fp32."""
    blocks = (shape.heads_sequences or shape.sequences) * shape.heads_anchors
    return {"target weights": sum(target_parameters(target).values()) * dtype_itemsize(shape.dtype),
            "drafter weights (fp32)": sum(drafter_parameters(drafter).values()) * FP32,
            "blocks (hidden states, fp32)": blocks * drafter.block_size * (drafter.hidden_size + 2) * FP32}


def _dense(target: TargetConfig) -> int:
    """The target's parameters a token's forward multiplies through (its embedding is a lookup)."""
    parts = target_parameters(target)
    head = parts["embed_tokens"] if target.tie_word_embeddings else parts["lm_head"]
    return parts["layers"] + head


def stage_flops(target: TargetConfig, drafter: DrafterConfig, shape: TrainingShape) -> dict[str, float]:
    """Multiply-adds x 2 of each stage: generation is the target's forward over every token it reads or writes;
    a DFlash step is the feature forward plus 6 x the drafter's parameters per block position (forward and
    backward) and the LM head's forward and input gradient; on-policy steps add the teacher's forward."""
    L, B, n = shape.sequence_tokens, drafter.block_size, min(shape.anchors, shape.sequence_tokens)
    dense, trained = _dense(target), sum(drafter_parameters(drafter).values())
    head = target.hidden_size * target.vocab_size
    feature = 2.0 * dense * L
    step = feature + 6.0 * trained * n * B + 4.0 * head * n * (B - 1)
    return {"regenerate": 2.0 * dense * L * shape.sequences,
            "dflash": step * shape.steps * shape.batch,
            "opd": 2.0 * dense * L * shape.opd_sequences + (step + feature) * shape.opd_steps * shape.batch,
            "heads": (feature + 2.0 * trained * n * B) * (shape.heads_sequences or shape.sequences)}


def training_plan(target: TargetConfig, drafter: DrafterConfig, shape: TrainingShape) -> dict[str, dict]:
    """Per stage: bytes by part on each device, their total, and the arithmetic of the whole stage (all devices)."""
    flops = stage_flops(target, drafter, shape)
    parts = {"regenerate": generation_bytes(target, None, shape),
             "dflash": drafter_training_bytes(target, drafter, shape, teacher=False),
             "opd": {**drafter_training_bytes(target, drafter, shape, teacher=True),
                     "generation (between rounds, freed)": 0},
             "heads": heads_bytes(target, drafter, shape)}
    opd_generation = sum(generation_bytes(target, drafter, shape).values())
    plan = {}
    for stage, by_part in parts.items():
        total = sum(by_part.values())
        if stage == "opd":
            total = max(total, opd_generation)
        plan[stage] = {"bytes": by_part, "total_bytes": total, "flops": flops[stage]}
    return plan


def hours(flops: float, devices: int, peak_tflops: float, utilisation: float) -> float:
    """Hours of arithmetic at `utilisation` of `peak_tflops` on each of `devices`: a floor, not a measurement."""
    return flops / (devices * peak_tflops * 1e12 * utilisation) / 3600


def format_stage(stage: str, entry: dict) -> str:
    """A few lines for the log before a stage starts."""
    lines = [f"[{stage}] memory on each device (estimate from shapes): {gib(entry['total_bytes'])}"]
    lines += [f"    {part:<46}{gib(n):>14}" for part, n in entry["bytes"].items() if n]
    lines.append(f"    {'arithmetic, whole stage':<46}{entry['flops'] / 1e15:>10.2f} PFLOP")
    return "\n".join(lines)
