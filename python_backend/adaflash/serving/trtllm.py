"""The TensorRT-LLM target profile: AdaFlash's length policy as TensorRT-LLM's draft-length schedule.

TensorRT-LLM's DFlash path (the pinned release, `TRTLLM_RELEASE`) verifies one draft length for every
sequence of a step, looked up from the batch size in its `draft_len_schedule`; it has no per-sequence or
per-step length a client or a drafter could set. What carries over from AdaFlash is the cost-aware trade
itself: for each batch size, the length the policy (`policy.choose_lengths`) verifies for a batch of sequences
that accept like the drafter's calibration, on the measured cost table. Pure arithmetic and declarations, no
TensorRT-LLM import, so the profile is derived and tested on a CPU (docs/architecture.md, "TensorRT-LLM target
profile").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from adaflash.decoding.costs import CostModel, block_lengths
from adaflash.decoding.policy import choose_lengths

TRTLLM_RELEASE = "1.4.0rc1"  # the tensorrt-llm whose source the names below were read from (pyproject's trtllm extra)
LLMAPI_MODEL = "tensorrt_llm"  # the LLM-API Triton model's name (triton_backend/all_models/llmapi/)


def load_cost_table(report: dict) -> CostModel:
    """The cost table of a `CostModel.to_json` file or of an `adaflash bench` report (its `cost_model_ms`). A table
    without drafter timings would make drafting look free, so it is refused."""
    table = report.get("cost_model_ms", report)
    if not table or "verify_ms" not in table:
        raise ValueError("no cost table: expected verify_ms (a CostModel JSON) or cost_model_ms (an adaflash bench "
                         "report)")
    cost = CostModel.from_json(table)
    if not cost.draft:
        raise ValueError("the cost table has no draft_ms: it was measured without a drafter")
    return cost


def acceptance_rates(calibration: dict, block_size: int) -> np.ndarray:
    """P(position j accepted | 1..j-1 accepted) for j = 1 .. block_size - 1, as observed on held-out text
    (`calibration.json` of `adaflash-train-heads`). Every position must be there: a schedule built on guessed
    acceptance would look measured and not be."""
    observed = {p["position"]: p["observed"] for p in calibration.get("per_position", [])}
    missing = [j for j in range(1, block_size) if observed.get(j) is None]
    if missing:
        raise ValueError(f"calibration: no observed acceptance for positions {missing} (block_size {block_size})")
    return np.array([observed[j] for j in range(1, block_size)], dtype=float)


def policy_length(rates: np.ndarray, cost: CostModel, batch: int, block_size: int) -> int:
    """Draft tokens per sequence the adaflash policy verifies when `batch` sequences that all accept like `rates`
    share a step: its block-length choice (as `LengthController._plan` makes it) and its allocation
    (`choose_lengths`), averaged over the batch and rounded, because TensorRT-LLM verifies one length for all of
    them. 0 when no block pays for its drafter forward."""
    rows = np.tile(rates, (batch, 1))
    best_rate, best_length = 0.0, 0
    for block_length in block_lengths(block_size):
        ks, rate = choose_lengths(rows, [block_length - 1] * batch, cost, batch, other_tokens=0,
                                  draft_ms=cost.draft_ms(batch, block_length))
        if any(ks) and rate > best_rate:
            best_rate, best_length = rate, round(sum(ks) / batch)
    return best_length


@dataclass(frozen=True)
class LengthSchedule:
    """Draft tokens verified at each batch size 1 .. N (`lengths[b - 1]`), never rising with the batch size."""

    lengths: tuple[int, ...]

    @classmethod
    def levelled(cls, lengths: list[int]) -> LengthSchedule:
        """Lengths that never rise with the batch size. TensorRT-LLM requires the smallest batch size's length to
        be `max_draft_len`, the longest; and a verified token only costs more as the batch grows, so a length that
        rises again is timing noise in the table (levelled as `costs._monotone` levels it)."""
        return cls(tuple(int(k) for k in np.minimum.accumulate(np.asarray(lengths, dtype=int))))

    @property
    def max_draft_len(self) -> int:
        return self.lengths[0]

    @property
    def max_concurrency(self) -> int:
        """The largest batch size that still drafts: above it speculation does not pay (0: it never does)."""
        return sum(k > 0 for k in self.lengths)

    def draft_len_schedule(self) -> dict[int, int]:
        """TensorRT-LLM's `draft_len_schedule`: a key's length holds for the batch sizes above the previous key up
        to it, and above the largest key it drafts nothing. So each key closes a run of equal lengths, and the
        final run of zeros is left to that implicit rule."""
        tiers = {}
        for batch, k in enumerate(self.lengths, start=1):
            if k and (batch == len(self.lengths) or self.lengths[batch] != k):
                tiers[batch] = k
        return tiers


def derive_schedule(rates: np.ndarray, cost: CostModel, max_batch: int, block_size: int) -> LengthSchedule:
    """The policy's length at every batch size up to `max_batch`, levelled."""
    return LengthSchedule.levelled([policy_length(rates, cost, b, block_size) for b in range(1, max_batch + 1)])


@dataclass(frozen=True)
class LlmApiTensor:
    """One tensor of the LLM-API model's config.pbtxt (Triton type, dims without the batch dimension)."""

    name: str
    triton_type: str
    dims: tuple[int, ...] = (1,)
    optional: bool = True


# Our request fields (`protocol.REQUEST_FIELDS`) -> the LLM-API model's inputs that carry them. The others
# (end_id, spec_mode, max_draft, apply_chat_template, messages, chat_template_kwargs) have no counterpart there.
REQUEST_TENSORS: dict[str, LlmApiTensor] = {
    "text_input": LlmApiTensor("text_input", "TYPE_STRING", (-1,), optional=False),
    "max_tokens": LlmApiTensor("sampling_param_max_tokens", "TYPE_INT32"),
    "stream": LlmApiTensor("streaming", "TYPE_BOOL"),
    "temperature": LlmApiTensor("sampling_param_temperature", "TYPE_FP32"),
    "top_k": LlmApiTensor("sampling_param_top_k", "TYPE_INT32"),
    "top_p": LlmApiTensor("sampling_param_top_p", "TYPE_FP32"),
    "seed": LlmApiTensor("sampling_param_seed", "TYPE_UINT64"),
    "stop_words": LlmApiTensor("sampling_param_stop", "TYPE_STRING", (-1,)),
}
# Asks the model for the finish reason, which our responses carry (`finish_reason`).
RESPONSE_SWITCHES = (LlmApiTensor("return_finish_reason", "TYPE_BOOL"),)

# Every output the LLM-API model may send: Triton refuses a response tensor its config does not declare.
# text_output and finish_reason are ours by the same names; total_accepted_draft_tokens / total_draft_tokens
# replace our per-step accepted_per_step / draft_len_per_step with per-request totals.
LLMAPI_OUTPUTS = (
    LlmApiTensor("text_output", "TYPE_STRING", (-1,)),
    LlmApiTensor("finish_reason", "TYPE_STRING", (-1,)),
    LlmApiTensor("stop_reason", "TYPE_STRING", (-1,)),
    LlmApiTensor("cumulative_logprob", "TYPE_FP32", (-1,)),
    LlmApiTensor("kv_cache_reused_block", "TYPE_INT32", (-1,)),
    LlmApiTensor("kv_cache_missed_block", "TYPE_INT32", (-1,)),
    LlmApiTensor("kv_cache_alloc_new_blocks", "TYPE_INT32", (-1,)),
    LlmApiTensor("kv_cache_alloc_total_blocks", "TYPE_INT32", (-1,)),
    LlmApiTensor("kv_cache_hit_rate", "TYPE_FP32", (-1,)),
    LlmApiTensor("arrival_time_ns", "TYPE_INT64"),
    LlmApiTensor("first_scheduled_time_ns", "TYPE_INT64"),
    LlmApiTensor("first_token_time_ns", "TYPE_INT64"),
    LlmApiTensor("last_token_time_ns", "TYPE_INT64"),
    LlmApiTensor("acceptance_rate", "TYPE_FP32"),
    LlmApiTensor("total_accepted_draft_tokens", "TYPE_INT32"),
    LlmApiTensor("total_draft_tokens", "TYPE_INT32"),
)
