"""The public model's wire contract, as every client of it needs it: the request as arrays, the responses read back
from arrays, and the OpenAI name of each request field.

Arrays only (name -> numpy array, each with the leading batch dimension 1 that the model's max_batch_size > 0 asks
for): wrapping them in a transport's tensors (tritonclient's InferInput, sync or asyncio) and unwrapping a result
into arrays is each transport's business, so the client library and the server's OpenAI front share this codec and
nothing else. numpy and the standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from adaflash_contract.errors import RequestError

ENTRY = "adaflash"  # the public model's name: checks, tokenises, runs the step loop, detokenises, streams

# ---------------------------------------------------------------------------------------------
# Request fields

SCALAR, WORDS, JSON = "scalar", "words", "json"  # a [1, 1] value; a [1, n] list of texts; a [1, 1] JSON text


@dataclass(frozen=True)
class Field:
    """A request field of the public model a client sends: its input (TensorRT-LLM's name where TensorRT-LLM has
    the field), Triton's datatype, how a value becomes its array (`SCALAR`, `WORDS`, `JSON`), and the OpenAI request
    parameter that sets it (None: none does)."""

    name: str
    datatype: str
    openai: str | None = None
    shape: str = SCALAR


FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("text_input", "BYTES", "prompt"),  # /v1/chat/completions: the last user message (`messages`)
    Field("max_tokens", "INT32", "max_tokens"),  # chat: max_completion_tokens where the client sent that
    Field("stream", "BOOL", "stream"),
    Field("temperature", "FP32", "temperature"),
    Field("top_k", "INT32", "top_k"),
    Field("top_p", "FP32", "top_p"),
    Field("seed", "UINT64", "seed"),
    Field("repetition_penalty", "FP32", "repetition_penalty"),
    Field("presence_penalty", "FP32", "presence_penalty"),
    Field("frequency_penalty", "FP32", "frequency_penalty"),
    Field("min_tokens", "INT32", "min_tokens"),
    Field("end_id", "INT32"),
    Field("stop_words", "BYTES", "stop", WORDS),
    Field("bad_words", "BYTES", None, WORDS),
    Field("spec_mode", "BYTES", "spec_mode"),
    Field("max_draft", "INT32", "max_draft"),
    Field("apply_chat_template", "BOOL", "messages"),
    Field("messages", "BYTES", "messages", JSON),
    Field("chat_template_kwargs", "BYTES", "chat_template_kwargs", JSON),
    Field("return_log_probs", "BOOL", "logprobs"),
    Field("return_num_input_tokens", "BOOL"),
    # TensorRT-LLM's flags a client sets for a stock ensemble's figures (this server takes them as well)
    Field("exclude_input_in_output", "BOOL"),
    Field("return_num_output_tokens", "BOOL"),
    Field("return_perf_metrics", "BOOL"),
)}
_DTYPES = {"BOOL": np.bool_, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BYTES": np.object_}


def openai_param(name: str) -> str | None:
    """The OpenAI request parameter behind the request field `name` (None: none, or not a field)."""
    spec = FIELDS.get(name)
    return None if spec is None else spec.openai


# ---------------------------------------------------------------------------------------------
# What a client asks and gets


@dataclass
class GenerationParams:
    """Sampling and speculation settings of one request; each field is the request field of its name.

    A field left at None is not sent, so the server's default applies. The sampling fields
    default to greedy decoding, sent explicitly so that results do not depend on the server's
    defaults; set them to None for a request made of `text_input` and `max_tokens` only.
    An empty `stop_words` list is not sent either. With `apply_chat_template`, the prompt is the user's
    message in the target's chat template, after the turns in `messages` (e.g. a system message), with the
    template's switches in `chat_template_kwargs` (e.g. {"enable_thinking": False} for Qwen3).
    """

    max_tokens: int = 128
    temperature: float | None = 0.0
    top_k: int | None = 0
    top_p: float | None = 1.0
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int | None = None
    end_id: int | None = None
    stop_words: list[str] | None = None
    bad_words: list[str] | None = None
    spec_mode: str | None = None
    max_draft: int | None = None
    apply_chat_template: bool | None = None
    messages: list[dict[str, str]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_log_probs: bool | None = None  # each output token's log-probability (`Chunk.log_probs`)
    return_num_input_tokens: bool | None = None  # the prompt's length in tokens (`Chunk.num_input_tokens`)


@dataclass
class Chunk:
    """One response: the new text and the counters the server reported with it.

    `finish_reason` is None while the request runs. A chunk with finish_reason "cancelled" and
    no text is made locally when a client cancels a request. `num_output_tokens` counts the
    tokens so far. A model without this server's statistics (a stock TensorRT-LLM ensemble) leaves
    them None: the token count too unless it sends TensorRT-LLM's, and finish_reason until a cancellation.
    """

    text: str
    num_output_tokens: int | None
    target_forwards: int | None
    accepted_per_step: list[int] | None
    draft_len_per_step: list[int] | None
    finish_reason: str | None
    log_probs: list[float] | None = field(default=None, kw_only=True)  # of its new tokens, when the request asked
    token_ids: list[int] | None = field(default=None, kw_only=True)  # those tokens (this server's, with log_probs)
    num_input_tokens: int | None = field(default=None, kw_only=True)  # when the request asked
    # TensorRT-LLM's acceptance figures so far, from a model without the per-step lists (return_perf_metrics)
    total_accepted_draft_tokens: int | None = field(default=None, kw_only=True)
    total_draft_tokens: int | None = field(default=None, kw_only=True)


@dataclass
class Completion(Chunk):
    """A finished request: the whole text, the per-step lists of all its responses and timings.

    Times run from sending the request: `time_to_first_token_s` until the first response reporting
    a generated token (None when none came; for a non-streaming request it equals the latency),
    `latency_s` until the last response carrying outputs (the closing of the gRPC stream is not
    counted). From a model that reports no token count, `num_output_tokens` is the text re-encoded by the
    client's tokenizer where it has one, else None.
    """

    time_to_first_token_s: float | None
    latency_s: float

    @property
    def tau(self) -> float | None:
        """Mean tokens committed per verify step, bonus token included (None without steps).

        The first token comes from the prefill forward, every later one from a verify step, so
        tau = (num_output_tokens - 1) / steps: 1.0 for plain decoding, 1 + mean accepted drafts
        for speculation (less when a stop word or max_tokens cuts the last step).
        """
        if not self.accepted_per_step or self.num_output_tokens is None:
            return None
        return (self.num_output_tokens - 1) / len(self.accepted_per_step)

    @property
    def mean_accepted_per_step(self) -> float | None:
        """Mean accepted draft tokens per verify step (None without steps)."""
        if not self.accepted_per_step:
            return None
        return sum(self.accepted_per_step) / len(self.accepted_per_step)

    @property
    def accepted_draft_tokens(self) -> int | None:
        """Draft tokens accepted in all: this server's per-step counts, else TensorRT-LLM's total, else None."""
        return sum(self.accepted_per_step) if self.accepted_per_step is not None else self.total_accepted_draft_tokens

    @property
    def draft_tokens(self) -> int | None:
        """Draft tokens verified in all: this server's per-step lengths, else TensorRT-LLM's total, else None."""
        return sum(self.draft_len_per_step) if self.draft_len_per_step is not None else self.total_draft_tokens

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over verified draft tokens (None without any)."""
        drafted = self.draft_tokens
        return self.accepted_draft_tokens / drafted if drafted else None

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens over the whole request latency, prefill included."""
        if self.num_output_tokens is None or self.latency_s <= 0:
            return None
        return self.num_output_tokens / self.latency_s


class GenerationError(Exception):
    """A request failed on the server or on the way to it.

    `status` is the gRPC status as tritonclient spells it ("StatusCode.UNAVAILABLE"); it is None
    for errors the server reports inside the stream (a model or backend error), where only a
    message exists. A refusal's field and why are `RequestError.from_wire(message)`.
    """

    def __init__(self, status: str | None, message: str) -> None:
        super().__init__(f"[{status}] {message}" if status else message)
        self.status = status
        self.message = message

    @classmethod
    def from_triton(cls, error: Any) -> GenerationError:
        """From tritonclient's InferenceServerException (sync or aio alike)."""
        return cls(error.status(), error.message())


# ---------------------------------------------------------------------------------------------
# Request -> arrays

FINAL_RESPONSE = "triton_final_response"  # Triton's response parameter that marks a request's last response


def request_arrays(prompt: str, params: GenerationParams, stream: bool | None = None) -> dict[str, np.ndarray]:
    """The request's arrays by input name. Optional fields are included only when set (not None), `stream` included;
    an empty word list is not sent. RequestError (a ValueError) naming the field whose value its datatype cannot
    hold (numpy would wrap an integer out of range)."""
    arrays = {"text_input": field_array("text_input", prompt)}
    if stream is not None:
        arrays["stream"] = field_array("stream", stream)
    for attr in fields(params):
        value = getattr(params, attr.name)
        if value is not None and (FIELDS[attr.name].shape != WORDS or value):
            arrays[attr.name] = field_array(attr.name, value)
    return arrays


def field_array(name: str, value: Any) -> np.ndarray:
    """The array of request field `name` holding `value`: [1, 1], or [1, n] for a word list."""
    spec = FIELDS[name]
    if spec.shape == WORDS:
        return np.array([[_utf8(w) for w in value]], dtype=np.object_)
    if spec.shape == JSON:
        return np.array([[json.dumps(value, ensure_ascii=False).encode("utf-8")]], dtype=np.object_)
    if spec.datatype == "BYTES":
        return np.array([[_utf8(value)]], dtype=np.object_)
    dtype = _DTYPES[spec.datatype]
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise RequestError(name, f"{value} does not fit {spec.datatype}")
    return np.array([[value]], dtype=dtype)


def _utf8(value: Any) -> bytes:
    return str(value).encode("utf-8")


# ---------------------------------------------------------------------------------------------
# Arrays -> response


def response_chunk(outputs: Mapping[str, np.ndarray], statistics: bool = True) -> Chunk | None:
    """The chunk a response's arrays (by output name) carry, or None for an empty (flags-only) final response.

    `statistics`: the model declares this server's statistics, so a response without them is an error
    (GenerationError); else (a TensorRT-LLM model) they are None where absent, and `num_output_tokens`, when sent,
    counts this response's tokens only (the caller adds them up).
    """
    if not outputs:
        return None

    def statistic(name: str) -> np.ndarray | None:
        return _output(outputs, name) if statistics else outputs.get(name)

    finish_reason = statistic("finish_reason")
    return Chunk(
        text=_text(_output(outputs, "text_output").flat[0]),
        num_output_tokens=_first(statistic("num_output_tokens")),
        target_forwards=_first(statistic("target_forwards")),
        accepted_per_step=_listed(statistic("accepted_per_step")),
        draft_len_per_step=_listed(statistic("draft_len_per_step")),
        finish_reason=None if finish_reason is None else _text(finish_reason.flat[0]) or None,
        log_probs=_listed(outputs.get("output_log_probs")),
        token_ids=_listed(outputs.get("output_token_ids")),
        num_input_tokens=_first(outputs.get("num_input_tokens")),
        total_accepted_draft_tokens=_first(outputs.get("total_accepted_draft_tokens")),
        total_draft_tokens=_first(outputs.get("total_draft_tokens")),
    )


def _output(outputs: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """An output the model promises in every non-empty response; its absence is a server bug worth surfacing."""
    value = outputs.get(name)
    if value is None:
        raise GenerationError(None, f"response lacks output {name!r}")
    return value


def _first(value: np.ndarray | None) -> int | None:
    return None if value is None else int(value.flat[0])


def _listed(value: np.ndarray | None) -> list | None:
    return None if value is None else value.reshape(-1).tolist()


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
