"""The wire contract between the Triton models: tensor names, op codes, payloads and their encoding.

Declared once, here, so a tensor is named, typed and converted in one place: the repository
builder writes the `config.pbtxt` input and output lists from these declarations, and every
model's `model.py` only moves `dict[str, np.ndarray]` between Triton and the functions below. A
request field is one `RequestField` (its tensor, its parse rule, where its value goes); its
consumer and the client are the only other places it appears.

The public request's and responses' arrays carry the leading batch dimension of 1 that Triton's
batching models expect; the per-step calls to the target and drafter carry none.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum, IntEnum
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from adaflash.decoding.costs import CostModel
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request, Sequence
from adaflash.decoding.steps import StepResult
from adaflash.models.cache import Paging
from adaflash.models.drafter import Draft
from adaflash.models.placement import Placement, placement
from adaflash_contract.errors import RequestError
from adaflash_contract.modes import Mode, parse_mode
from adaflash_contract.wire import ENTRY as ENTRY  # re-exported: the served side names the public model by it

Tensors = dict[str, np.ndarray]

TARGET, DRAFTER = "target", "drafter"  # the models the entry model calls by name (BLS)
DRAFTER_NAME = re.compile(r"drafter(?:_(\d+))?")  # `drafter`, then each published `drafter_<n>`


class Op(IntEnum):
    """What a call to the `target` or `drafter` model asks for, for every sequence it names."""

    STEP = 1  # the target: prefill the new sequences and verify the others, in one call
    RELEASE = 2
    DRAFT = 3
    COSTS = 4  # the target model's cost table (no sequences): measured where its forwards run


# ---------------------------------------------------------------------------------------------
# Tensor declarations

BOOL, UINT8, INT32, UINT64, FP16, FP32, BYTES = (np.dtype(t) for t in (np.bool_, np.uint8, np.int32, np.uint64,
                                                                        np.float16, np.float32, np.object_))
TRITON_TYPES = {BOOL: "TYPE_BOOL", UINT8: "TYPE_UINT8", INT32: "TYPE_INT32", UINT64: "TYPE_UINT64", FP16: "TYPE_FP16",
                FP32: "TYPE_FP32", BYTES: "TYPE_STRING"}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a model's config: dims exclude the batch dimension."""

    name: str
    dtype: np.dtype
    dims: tuple[int, ...] = (1,)
    optional: bool = False

    @property
    def triton_type(self) -> str:
        return TRITON_TYPES[self.dtype]


@dataclass(frozen=True)
class RequestDefaults:
    """The server's settings a field's parse reads (its limits are checked once, by `decoding.limits.Limits`)."""

    default_mode: str


class Into(Enum):
    """Where a request field's value goes once checked."""

    PROMPT = "prompt"  # turned into the prompt or stop ids (serving/api.py's `encode`)
    REQUEST = "request"  # an attribute of the engine's Request
    SAMPLING = "sampling"  # an attribute of SamplingParams; also sent with the target's prefill
    GENERATION = "generation"  # how the entry model answers (`ServedRequest`)
    CHECKED = "checked"  # a TensorRT-LLM input checked and dropped: what it asks is what this server does anyway
    ALIAS = "alias"  # another name of the field `attr` names


CONSUMERS = {Into.REQUEST: Request, Into.SAMPLING: SamplingParams}
_CONSUMER_DEFAULT = object()


@dataclass(frozen=True)
class RequestField:
    """A field of the public generation request (a TensorRT-LLM ensemble input)."""

    spec: TensorSpec
    parse: Callable[[Any, RequestDefaults], Any]  # the sent value (a scalar, or a list for dims [-1]) -> checked value
    into: Into
    attr: str = ""  # the consumer's attribute, when it is not the tensor name
    default: Any = _CONSUMER_DEFAULT  # when not sent: a value, a function of the limits, or the consumer's default

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def target(self) -> str:
        return self.attr or self.spec.name

    def _default(self) -> Any:
        return getattr(CONSUMERS[self.into], self.target) if self.default is _CONSUMER_DEFAULT else self.default

    def default_value(self, limits: RequestDefaults) -> Any:
        default = self._default()
        return default(limits) if callable(default) else default


def _text(value: Any) -> str:
    raw = value if isinstance(value, bytes) else str(value).encode()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _prompt(value: Any, _: RequestDefaults) -> str:
    text = _text(value)
    if not text:
        raise ValueError("empty prompt")
    return text


def _integer(value: Any, _: RequestDefaults) -> int:
    """An integer field; its range, where it has one, is checked with the request (`Limits.check`)."""
    return int(value)


def _number(value: Any, _: RequestDefaults) -> float:
    """A number field; its range is checked with the request (`Limits.check`, `SamplingParams.validate`)."""
    return float(value)


def _finite(value: Any, _: RequestDefaults) -> float:
    if not math.isfinite(float(value)):
        raise ValueError(f"must be a finite number, got {float(value)}")
    return float(value)


def _only(allowed: Any, why: str) -> Callable[[Any, RequestDefaults], Any]:
    """A TensorRT-LLM input this server takes only at one value (its default): any other is refused, by name."""
    def parse(value: Any, _: RequestDefaults) -> Any:
        if type(allowed)(value) != allowed:
            raise ValueError(f"only {allowed!r} is supported ({why}), got {value!r}")
        return allowed
    return parse


def _refused(why: str) -> Callable[[Any, RequestDefaults], Any]:
    """A TensorRT-LLM input that does not apply to this server: refused whenever it is sent, never ignored."""
    def parse(value: Any, _: RequestDefaults) -> Any:
        raise ValueError(f"not supported: {why}")
    return parse


def _flag(value: Any, _: RequestDefaults) -> bool:
    return bool(value)


def _words(values: list, _: RequestDefaults) -> tuple[str, ...]:
    return tuple(_text(w) for w in values if len(w))


def _json(value: Any) -> Any:
    try:
        return json.loads(_text(value))
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at character {exc.pos})") from None


def _messages(value: Any, _: RequestDefaults) -> tuple[dict[str, Any], ...]:
    """The turns before text_input (a system message, earlier turns), as a JSON list of chat messages."""
    turns = _json(value)
    if not (isinstance(turns, list) and all(isinstance(t, dict) and isinstance(t.get("role"), str)
                                            and isinstance(t.get("content"), str) for t in turns)):
        raise ValueError('must be a JSON list of {"role": "...", "content": "..."} objects')
    return tuple(turns)


def _template_kwargs(value: Any, _: RequestDefaults) -> dict[str, Any]:
    """The chat template's switches (Qwen3's enable_thinking), vLLM's field of the same name."""
    kwargs = _json(value)
    if not isinstance(kwargs, dict):
        raise ValueError(f"must be a JSON object, got {type(kwargs).__name__}")
    return kwargs


def _mode(value: Any, _: RequestDefaults) -> Mode:
    """The mode, resolved here once (whether this server runs it is `Limits.check`'s)."""
    return parse_mode(_text(value))


REQUEST_FIELDS: tuple[RequestField, ...] = (
    RequestField(TensorSpec("text_input", BYTES), _prompt, Into.PROMPT),
    RequestField(TensorSpec("max_tokens", INT32), _integer, Into.REQUEST),
    RequestField(TensorSpec("stream", BOOL, optional=True), _flag, Into.GENERATION, default=False),
    RequestField(TensorSpec("temperature", FP32, optional=True), _number, Into.SAMPLING),
    RequestField(TensorSpec("top_k", INT32, optional=True), _integer, Into.SAMPLING),
    RequestField(TensorSpec("top_p", FP32, optional=True), _number, Into.SAMPLING),
    RequestField(TensorSpec("seed", UINT64, optional=True), _integer, Into.SAMPLING),
    RequestField(TensorSpec("random_seed", UINT64, optional=True), _integer, Into.ALIAS, attr="seed", default=None),
    RequestField(TensorSpec("repetition_penalty", FP32, optional=True), _number, Into.SAMPLING),
    RequestField(TensorSpec("presence_penalty", FP32, optional=True), _number, Into.SAMPLING),
    RequestField(TensorSpec("frequency_penalty", FP32, optional=True), _number, Into.SAMPLING),
    RequestField(TensorSpec("min_tokens", INT32, optional=True), _integer, Into.SAMPLING),
    RequestField(TensorSpec("return_log_probs", BOOL, optional=True), _flag, Into.SAMPLING, attr="log_probs"),
    RequestField(TensorSpec("end_id", INT32, optional=True), _integer, Into.PROMPT, default=None),
    RequestField(TensorSpec("pad_id", INT32, optional=True), _integer, Into.PROMPT, default=None),
    RequestField(TensorSpec("stop_words", BYTES, (-1,), optional=True), _words, Into.PROMPT, default=()),
    RequestField(TensorSpec("bad_words", BYTES, (-1,), optional=True), _words, Into.PROMPT, default=()),
    RequestField(TensorSpec("exclude_input_in_output", BOOL, optional=True), _flag, Into.GENERATION, default=True),
    RequestField(TensorSpec("return_num_input_tokens", BOOL, optional=True), _flag, Into.GENERATION, default=False),
    # num_output_tokens is in every response anyway: the flag is accepted and changes nothing.
    RequestField(TensorSpec("return_num_output_tokens", BOOL, optional=True), _flag, Into.CHECKED, default=False),
    RequestField(TensorSpec("return_perf_metrics", BOOL, optional=True), _flag, Into.GENERATION, default=False),
    RequestField(TensorSpec("spec_mode", BYTES, optional=True), _mode, Into.REQUEST, attr="mode",
                 default=lambda defaults: parse_mode(defaults.default_mode)),
    RequestField(TensorSpec("max_draft", INT32, optional=True), _integer, Into.REQUEST),
    # text_input as the user's message in the target's chat template (serving/api.py renders it).
    RequestField(TensorSpec("apply_chat_template", BOOL, optional=True), _flag, Into.PROMPT, default=False),
    RequestField(TensorSpec("messages", BYTES, optional=True), _messages, Into.PROMPT, default=()),
    RequestField(TensorSpec("chat_template_kwargs", BYTES, optional=True), _template_kwargs, Into.PROMPT,
                 default=MappingProxyType({})),
    # TensorRT-LLM's ensemble inputs that ask for something this server does not do (docs/architecture.md,
    # "The TensorRT-LLM request contract"): checked, so that a client learns it instead of being ignored.
    RequestField(TensorSpec("num_return_sequences", INT32, optional=True),
                 _only(1, "one sequence per request: send n requests"), Into.CHECKED, default=1),
    RequestField(TensorSpec("beam_width", INT32, optional=True),
                 _only(1, "speculative decoding verifies one sequence; beam search is not implemented"), Into.CHECKED,
                 default=1),
    RequestField(TensorSpec("length_penalty", FP32, optional=True), _finite, Into.CHECKED, default=1.0),
    RequestField(TensorSpec("return_context_logits", BOOL, optional=True),
                 _only(False, "logits are not returned; return_log_probs gives per-token log-probabilities"),
                 Into.CHECKED, default=False),
    RequestField(TensorSpec("return_generation_logits", BOOL, optional=True),
                 _only(False, "logits are not returned; return_log_probs gives per-token log-probabilities"),
                 Into.CHECKED, default=False),
    RequestField(TensorSpec("decoder_text_input", BYTES, optional=True),
                 _refused("the target is decoder-only (no encoder-decoder models)"), Into.CHECKED, default=None),
    *(RequestField(TensorSpec(name, dtype, dims, optional=True), _refused(why), Into.CHECKED, default=None)
      for name, dtype, dims, why in (
          ("prompt_embedding_table", FP16, (-1, -1), "prompt tuning tables are not implemented"),
          ("prompt_table_extra_id", UINT64, (1,), "prompt tuning tables are not implemented"),
          ("prompt_vocab_size", INT32, (1,), "prompt tuning tables are not implemented"),
          ("embedding_bias_words", BYTES, (-1,), "embedding bias is not implemented; bad_words bans words"),
          ("embedding_bias_weights", FP32, (-1,), "embedding bias is not implemented; bad_words bans words"),
          ("lora_task_id", UINT64, (1,), "LoRA adapters are not implemented"),
          ("lora_weights", FP16, (-1, -1), "LoRA adapters are not implemented"),
          ("lora_config", INT32, (-1, 3), "LoRA adapters are not implemented"),
          ("guided_decoding_guide_type", BYTES, (1,), "guided decoding is not implemented"),
          ("guided_decoding_guide", BYTES, (1,), "guided decoding is not implemented"))),
)
# Request parameters Triton itself sets or reads (its parameters extension): never a client's field.
TRITON_PARAMETERS = ("sequence_id", "priority", "timeout", "sequence_start", "sequence_end", "headers")


def refuse_parameters(parameters: dict) -> None:
    """The server reads no request parameters, but Triton's HTTP generate endpoint turns every JSON field
    that is not an input into one: a field the server does not implement would be accepted and ignored.
    Refuse the first such field by name, as gRPC refuses an unknown input."""
    unknown = sorted(k for k in parameters if k not in TRITON_PARAMETERS and not k.startswith("triton_"))
    if unknown:
        raise RequestError(unknown[0], f"not an input of this server (inputs: "
                                       f"{', '.join(f.name for f in REQUEST_FIELDS)})")

SAMPLING_FIELDS = tuple(f for f in REQUEST_FIELDS if f.into is Into.SAMPLING)

STATS = (  # per-response statistics the client receives beside text_output
    TensorSpec("num_output_tokens", INT32),
    TensorSpec("target_forwards", INT32),
    TensorSpec("accepted_per_step", INT32, (-1,)),
    TensorSpec("draft_len_per_step", INT32, (-1,)),
    TensorSpec("finish_reason", BYTES),
)
# What a client asks for by name (return_log_probs, return_num_input_tokens, return_perf_metrics), in TensorRT-LLM's
# names and shapes (a beam dimension of 1); absent from responses that did not ask.
REQUESTED = (
    TensorSpec("cum_log_probs", FP32, (-1,)),
    TensorSpec("output_log_probs", FP32, (-1, -1)),  # of this response's new tokens
    # This server's own, with return_log_probs: the tokens those log-probabilities are of (a client that renders
    # them per token, as OpenAI's logprobs do, needs each token; TensorRT-LLM's ensemble has no such output).
    TensorSpec("output_token_ids", INT32, (-1, -1)),
    TensorSpec("num_input_tokens", INT32),
    TensorSpec("acceptance_rate", FP32),
    TensorSpec("total_accepted_draft_tokens", INT32),
    TensorSpec("total_draft_tokens", INT32),
)
TEXT_OUTPUT = TensorSpec("text_output", BYTES)
RESPONSE = (TEXT_OUTPUT, *STATS, *REQUESTED)
# The target and drafter models take one call per engine step carrying every sequence in it (no batch
# dimension): `keys` names the sequences, ragged token lists travel flat with their `lengths`, features flat
# with their `feature_rows`. Features travel in the target's own dtype, bit for bit: as the bytes of each row
# ([rows, width x itemsize] UINT8, since numpy has no bfloat16) with `feature_dtype` naming the dtype (an index
# into FEATURE_DTYPES), so half-precision targets send half the bytes of fp32.
OP = TensorSpec("op", INT32)
KEYS = TensorSpec("keys", UINT64, (-1,))
# Sequences that ended since the model's last call, freed before the call runs: releases ride on the next call
# instead of a call of their own (Op.RELEASE remains for a server with nothing else to send).
RELEASE_KEYS = TensorSpec("release", UINT64, (-1,), optional=True)
FEATURES = (TensorSpec("feature_rows", INT32, (-1,)), TensorSpec("features", UINT8, (-1, -1)),
            TensorSpec("feature_dtype", INT32))
FEATURE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TARGET_CALL = (
    OP,
    KEYS,
    RELEASE_KEYS,
    TensorSpec("lengths", INT32, (-1,), optional=True),
    TensorSpec("tokens", INT32, (-1,), optional=True),
    # Per key, 1 when the sequence drafts: only those get features back (absent: every one does).
    TensorSpec("capture", BOOL, (-1,), optional=True),
    # Per key, plain decoding steps (steps.decode_run): a call of sequences fed their anchor only, none new.
    TensorSpec("runs", INT32, (-1,), optional=True),
    *(replace(f.spec, dims=(-1,), optional=True) for f in SAMPLING_FIELDS),
    TensorSpec("token_lists", BYTES, (-1,), optional=True),  # per new sequence: JSON of its TOKEN_LISTS
)
TOKEN_LISTS = ("end_ids", "bad_words")  # the SamplingParams fields that are token lists
# Optional outputs are left off a step's answer when they carry nothing (encode_target_result).
TARGET_RESULT = (
    TensorSpec("committed_lengths", INT32, (-1,)),
    TensorSpec("committed", INT32, (-1,)),
    TensorSpec("log_probs", FP32, (-1,), optional=True),  # per committed token; NaN for sequences that did not ask
    TensorSpec("accepted", INT32, (-1,)),
    TensorSpec("expected_accepted", FP32, (-1,), optional=True),
    *(replace(s, optional=True) for s in FEATURES),
    TensorSpec("forward_ms", FP32),
)
COST_TABLE = TensorSpec("cost_table", BYTES)  # the target's answer to Op.COSTS: CostModel.to_json() as JSON
DRAFTER_CALL = (
    OP,
    KEYS,
    RELEASE_KEYS,
    TensorSpec("anchors", INT32, (-1,), optional=True),
    *(replace(s, optional=True) for s in FEATURES),
    TensorSpec("block_length", INT32, optional=True),
)
DRAFTER_RESULT = (
    TensorSpec("draft_tokens", INT32, (-1, -1)),
    TensorSpec("accept_ratio", FP32, (-1,)),  # empty without a length head
    TensorSpec("accept_rates", FP32, (-1, -1)),  # [0, 0] without a position head
    TensorSpec("draft_ms", FP32),
)

# Every model's inputs and outputs, by model name (published drafters use the `drafter` entry).
MODEL_TENSORS: dict[str, tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]] = {
    ENTRY: (tuple(f.spec for f in REQUEST_FIELDS), RESPONSE),
    TARGET: (TARGET_CALL, (*TARGET_RESULT, COST_TABLE)),
    DRAFTER: (DRAFTER_CALL, DRAFTER_RESULT),
}


def names(specs: Iterable[TensorSpec]) -> list[str]:
    return [s.name for s in specs]


# This server's own request fields and outputs, beside TensorRT-LLM's ensemble ones (docs/architecture.md, "The
# TensorRT-LLM request contract"). A stock-contract ensemble (the repository builder's --stock-contract-ensemble)
# leaves them out, so that clients can be tried, or compared, against exactly TensorRT-LLM's tensors.
# num_output_tokens is a TensorRT-LLM name too, but there it counts each response's tokens and here the tokens so
# far: a copy standing for TensorRT-LLM cannot carry it.
OWN_INPUTS = frozenset({"random_seed", "spec_mode", "max_draft", "apply_chat_template", "messages",
                        "chat_template_kwargs"})
OWN_OUTPUTS = frozenset({*names(STATS), "output_token_ids"})
STOCK_CONTRACT = (tuple(f.spec for f in REQUEST_FIELDS if f.name not in OWN_INPUTS),
                  tuple(s for s in RESPONSE if s.name not in OWN_OUTPUTS))


def model_parameters(model_config: dict) -> dict[str, str]:
    """The `parameters` of a model's config (as Triton passes it to `initialize`), as plain strings."""
    return {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}


def model_paging(params: dict[str, str]) -> Paging | None:
    """The paged caches' shape the repository builder sized from a memory budget (`kv_pages` 0: unpaged)."""
    pages = int(params.get("kv_pages") or 0)
    return Paging(int(params["kv_page"]), pages) if pages else None


def model_placement(params: dict[str, str], instance_kind: str, device_id: str) -> Placement:
    """Where a model instance puts its tensors: the GPU Triton gave the instance (its kind and device id, as
    `initialize` receives them), else the CPU; in the repository's dtype."""
    device = f"cuda:{device_id}" if instance_kind == "GPU" else "cpu"
    return placement(device, params.get("dtype") or None)


# ---------------------------------------------------------------------------------------------
# Encoding primitives


def _array(value: Any, dtype: np.dtype) -> np.ndarray:
    """[1, n]: the batch dimension first; text as UTF-8 bytes."""
    values = value if isinstance(value, (list, tuple, np.ndarray)) else [value]
    if dtype == BYTES:
        values = [v.encode() if isinstance(v, str) else v for v in values]
    return np.asarray(values, dtype=dtype).reshape(1, -1)


def _flat(value: Any, dtype: np.dtype) -> np.ndarray:
    """A 1-D array (the per-step calls carry no batch dimension)."""
    return np.asarray(value if isinstance(value, (list, tuple, np.ndarray)) else [value], dtype=dtype).reshape(-1)


def _scalar(tensors: Tensors, name: str) -> Any:
    flat = np.asarray(tensors[name]).reshape(-1)
    if flat.size != 1:
        raise ValueError(f"{name}: expected one value, got {flat.size}")
    return flat[0]


def _list(tensors: Tensors, name: str) -> list:
    return np.asarray(tensors[name]).reshape(-1).tolist()


def _required(tensors: Tensors, required: Iterable[str]) -> None:
    missing = [n for n in required if tensors.get(n) is None]
    if missing:
        raise ValueError(f"{missing[0]}: required")


def decode_op(tensors: Tensors, allowed: Iterable[Op]) -> Op:
    """The call's op code; ValueError naming `op` for one this model does not serve."""
    _required(tensors, ["op"])
    code = int(_scalar(tensors, "op"))
    if code not in set(allowed):
        raise ValueError(f"op: unknown operation {code}")
    return Op(code)


def encode_release(keys: list[int]) -> Tensors:
    """Ends sequences in the target or a drafter: their cache slots are free again."""
    return {"op": _flat(Op.RELEASE, INT32), "keys": _flat(keys, UINT64)}


def result_names(op: Op) -> list[str]:
    """The outputs a call of `op` asks for by name (a model returns only those)."""
    return {Op.RELEASE: [], Op.COSTS: [COST_TABLE.name], Op.DRAFT: names(DRAFTER_RESULT),
            Op.STEP: names(TARGET_RESULT)}[op]


def encode_costs_call() -> Tensors:
    return {"op": _flat(Op.COSTS, INT32), "keys": _flat([], UINT64)}


def encode_cost_table(cost: CostModel) -> Tensors:
    return {COST_TABLE.name: _flat(json.dumps(cost.to_json()).encode(), BYTES)}


def decode_cost_table(tensors: Tensors) -> CostModel:
    return CostModel.from_json(json.loads(_scalar(tensors, COST_TABLE.name)))


def _encode_release(keys: list[int]) -> Tensors:
    return {RELEASE_KEYS.name: _flat(keys, UINT64)} if keys else {}


def _decode_release(tensors: Tensors) -> list[int]:
    return _list(tensors, RELEASE_KEYS.name) if tensors.get(RELEASE_KEYS.name) is not None else []


def decode_keys(tensors: Tensors) -> list[int]:
    _required(tensors, ["keys"])
    return _list(tensors, "keys")


# ---------------------------------------------------------------------------------------------
# The generation request


def parse_request(tensors: dict[str, np.ndarray | None], limits: RequestDefaults) -> dict[str, Any]:
    """The checked value of every request field (its default when not sent), keyed by field name.

    Raises RequestError naming the field.
    """
    values = {}
    for f in REQUEST_FIELDS:
        sent = tensors.get(f.name)
        if sent is None:
            if not f.spec.optional:
                raise RequestError(f.name, "required")
            values[f.name] = f.default_value(limits)
            continue
        try:
            raw = _scalar(tensors, f.name) if f.spec.dims == (1,) else _list(tensors, f.name)
            values[f.name] = f.parse(raw, limits)
        except RequestError:
            raise
        except ValueError as exc:
            raise RequestError(f.name, str(exc)) from None
    for f in REQUEST_FIELDS:
        if f.into is Into.ALIAS and values[f.name] is not None:
            if tensors.get(f.target) is not None and values[f.target] != values[f.name]:
                raise RequestError(f.name, f"an alias of {f.target}, sent with a different value")
            values[f.target] = values[f.name]
    return values


@dataclass(frozen=True)
class Encoded:
    """A request's text turned into token ids (`api.encode`)."""

    prompt_ids: list[int]
    stop_ids: list[int]  # end_id (or the model's end of sequence) and the stop words of one token
    bad_words: list[list[int]] = field(default_factory=list)
    stop_texts: list[str] = field(default_factory=list)  # stop words of several tokens, matched as text


@dataclass
class ServedRequest:
    """What the step loop runs: the engine's request, the ids that stop it, and how the entry model answers."""

    request: Request
    stop_ids: frozenset[int]
    stream: bool
    stop_texts: tuple[str, ...] = ()
    echo: bool = False  # exclude_input_in_output false: the final text starts with the prompt
    returns: frozenset[str] = frozenset()  # the return_* fields the client set

    def text_ids(self, seq: Sequence, final: bool) -> list[int]:
        """The ids a response's text is decoded from: the output, after the prompt in an echoing request's one
        response."""
        return [*self.request.prompt_ids, *seq.output] if self.echo and final and not self.stream else seq.output


RETURNS = ("return_num_input_tokens", "return_perf_metrics")


def served_request(encoded: Encoded, values: dict[str, Any]) -> ServedRequest:
    """What the step loop runs for a request: its tokenised text (`encoded`) and its checked fields (`values`,
    `parse_request`'s)."""
    sampling = SamplingParams(**{f.target: values[f.name] for f in SAMPLING_FIELDS},
                              bad_words=tuple(tuple(w) for w in encoded.bad_words))
    request = Request(prompt_ids=list(encoded.prompt_ids), sampling=sampling,
                      **{f.target: values[f.name] for f in REQUEST_FIELDS if f.into is Into.REQUEST})
    return ServedRequest(request, frozenset(encoded.stop_ids), values["stream"], tuple(encoded.stop_texts),
                      echo=not values["exclude_input_in_output"], returns=frozenset(r for r in RETURNS if values[r]))


# ---------------------------------------------------------------------------------------------
# The responses


def encode_response(seq: Sequence, text: str, sent_len: int, steps_from: int, final: bool,
                    served: ServedRequest) -> Tensors:
    """One streamed response: `text` (the delta since the last one), the statistics so far, the steps since the last
    response, and what the client asked for by name."""
    steps = seq.steps[steps_from:]
    values = {
        "text_output": text, "num_output_tokens": len(seq.output), "target_forwards": 1 + len(seq.steps),
        "accepted_per_step": [s.accepted for s in steps], "draft_len_per_step": [s.draft_len for s in steps],
        "finish_reason": seq.finish_reason or "",
    }
    out = {s.name: _array(values[s.name], s.dtype) for s in (TEXT_OUTPUT, *STATS)}
    out.update(_requested(seq, sent_len, served))
    return out


def _requested(seq: Sequence, sent_len: int, served: ServedRequest) -> Tensors:
    """The return_* outputs, in TensorRT-LLM's shapes ([1, beams] and [1, beams, tokens])."""
    out = {}
    if seq.sampling.log_probs:
        out["cum_log_probs"] = np.asarray([[sum(seq.log_probs)]], dtype=np.float32)
        out["output_log_probs"] = np.asarray([[seq.log_probs[sent_len:]]], dtype=np.float32)
        out["output_token_ids"] = np.asarray([[seq.output[sent_len:]]], dtype=np.int32)
    if "return_num_input_tokens" in served.returns:
        out["num_input_tokens"] = _array(len(seq.request.prompt_ids), INT32)
    if "return_perf_metrics" in served.returns:
        drafted = sum(st.draft_len for st in seq.steps)
        accepted = sum(st.accepted for st in seq.steps)
        out.update(acceptance_rate=_array(accepted / drafted if drafted else 0.0, FP32),
                   total_accepted_draft_tokens=_array(accepted, INT32), total_draft_tokens=_array(drafted, INT32))
    return out


# ---------------------------------------------------------------------------------------------
# The target model: entry model <-> target


@dataclass
class TargetCall:
    """A step: the first `len(sampling)` sequences are new (their feeds are their prompts, and each keeps its
    sampling settings); the others verify ([anchor] + draft). A release call carries keys only."""

    op: Op
    keys: list[int]  # the sequences, one entry each
    feeds: list[list[int]]
    sampling: list[SamplingParams] = field(default_factory=list)
    release: list[int] = field(default_factory=list)  # sequences to free first
    capture: list[bool] | None = None  # per key: return its features (it drafts); None: every one
    runs: list[int] | None = None  # per key: plain decoding steps (no new sequence, feeds of one token)


def _split(flat: list, lengths: list[int]) -> list[list]:
    ends = np.cumsum(lengths).tolist()
    return [flat[e - n : e] for e, n in zip(ends, lengths)]


def encode_target_call(call: TargetCall) -> Tensors:
    out = {"op": _flat(call.op, INT32), "keys": _flat(call.keys, UINT64),
           "lengths": _flat([len(f) for f in call.feeds], INT32),
           "tokens": _flat([t for f in call.feeds for t in f], INT32), **_encode_release(call.release)}
    if call.capture is not None:
        out["capture"] = np.asarray(call.capture, dtype=bool)
    if call.runs is not None:
        out["runs"] = _flat(call.runs, INT32)
    if call.sampling:
        out.update({f.name: _flat([getattr(sp, f.target) for sp in call.sampling], f.spec.dtype)
                    for f in SAMPLING_FIELDS})
        out["token_lists"] = _flat([json.dumps({k: getattr(sp, k) for k in TOKEN_LISTS}) for sp in call.sampling],
                                   BYTES)
    return out


def decode_target_call(tensors: Tensors) -> TargetCall:
    """ValueError naming the field for an unknown op, inconsistent lengths or invalid sampling settings."""
    op = decode_op(tensors, (Op.STEP, Op.RELEASE))
    keys = decode_keys(tensors)
    if op is Op.RELEASE:
        return TargetCall(op, keys, [])
    release = _decode_release(tensors)
    _required(tensors, ["lengths", "tokens"])
    lengths, tokens = _list(tensors, "lengths"), _list(tensors, "tokens")
    if len(lengths) != len(keys) or sum(lengths) != len(tokens) or min(lengths, default=1) < 1:
        raise ValueError(f"lengths: {len(lengths)} lengths summing to {sum(lengths)} for {len(keys)} keys and "
                         f"{len(tokens)} tokens")
    call = TargetCall(op, keys, _split(tokens, lengths), release=release)
    if tensors.get("capture") is not None:
        call.capture = [bool(c) for c in np.asarray(tensors["capture"]).reshape(-1)]
        if len(call.capture) != len(keys):
            raise ValueError(f"capture: {len(call.capture)} flags for {len(keys)} keys")
    if tensors.get("runs") is not None:
        call.runs = _list(tensors, "runs")
        if len(call.runs) != len(keys) or min(call.runs, default=1) < 1 or max(lengths, default=1) > 1:
            raise ValueError(f"runs: {len(call.runs)} step counts (each at least 1) for {len(keys)} keys fed one "
                             f"token each, got {call.runs} for feeds of {lengths} tokens")
    if any(tensors.get(f.name) is not None for f in SAMPLING_FIELDS):
        _required(tensors, [f.name for f in SAMPLING_FIELDS])
        columns = {f.target: _list(tensors, f.name) for f in SAMPLING_FIELDS}
        new = {len(v) for v in columns.values()}
        if len(new) != 1 or new.pop() > len(keys):
            raise ValueError(f"temperature: sampling settings for {sorted(len(v) for v in columns.values())} "
                             f"sequences, {len(keys)} keys")
        lists = _token_lists(tensors, len(columns["seed"]))
        call.sampling = [SamplingParams(**{k: v[i] for k, v in columns.items()}, **lists[i])
                         for i in range(len(columns["seed"]))]
        for sp in call.sampling:
            sp.validate()
        if call.runs is not None:
            raise ValueError("runs: a call with new sequences (sampling settings) runs no plain decoding steps")
    return call


def _token_lists(tensors: Tensors, new: int) -> list[dict[str, Any]]:
    """Each new sequence's TOKEN_LISTS (empty when the call carries none)."""
    if tensors.get("token_lists") is None:
        return [{}] * new
    rows = [json.loads(v) for v in _list(tensors, "token_lists")]
    if len(rows) != new:
        raise ValueError(f"token_lists: {len(rows)} entries for {new} new sequences")
    try:
        return [{"end_ids": tuple(int(t) for t in r["end_ids"]),
                 "bad_words": tuple(tuple(int(t) for t in w) for w in r["bad_words"])} for r in rows]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"token_lists: not lists of token ids ({exc})") from None


def _encode_features(features: list[torch.Tensor | None]) -> Tensors:
    present = [f for f in features if f is not None]
    flat = torch.cat(present).cpu().contiguous() if present else torch.zeros(0, 0)
    return {"feature_rows": _flat([0 if f is None else f.shape[0] for f in features], INT32),
            "features": flat.view(torch.uint8).numpy(), "feature_dtype": _flat(FEATURE_DTYPES.index(flat.dtype), INT32)}


def _decode_features(tensors: Tensors) -> list[torch.Tensor | None]:
    rows = _list(tensors, "feature_rows")
    code = int(_scalar(tensors, "feature_dtype"))
    if not 0 <= code < len(FEATURE_DTYPES):
        raise ValueError(f"feature_dtype: {code} is not an index into {len(FEATURE_DTYPES)} dtypes")
    raw = np.ascontiguousarray(tensors["features"], dtype=np.uint8)
    if raw.ndim != 2 or raw.shape[1] % FEATURE_DTYPES[code].itemsize:
        raise ValueError(f"features: shape {list(raw.shape)} is not rows of {FEATURE_DTYPES[code]} values")
    if not raw.size:
        return [None] * len(rows)
    parts = torch.split(torch.from_numpy(raw).view(FEATURE_DTYPES[code]), rows)
    return [None if n == 0 else p for p, n in zip(parts, rows)]


def encode_target_result(results: list[StepResult], forward_ms: float) -> Tensors:
    """Outputs that carry nothing stay off the wire: log_probs when no sequence asked for them,
    expected_accepted when every sequence verified greedily, features when none drafts. Each tensor costs a
    copy and a lookup on both sides of a call, and this call is on every step's path."""
    out = {"committed_lengths": _flat([len(r.committed) for r in results], INT32),
           "committed": _flat([t for r in results for t in r.committed], INT32),
           "accepted": _flat([r.accepted for r in results], INT32), "forward_ms": _flat(forward_ms, FP32)}
    if any(r.log_probs is not None for r in results):
        out["log_probs"] = _flat([p for r in results for p in (r.log_probs or [math.nan] * len(r.committed))], FP32)
    if any(r.expected_accepted for r in results):
        out["expected_accepted"] = _flat([r.expected_accepted for r in results], FP32)
    if any(r.features is not None for r in results):
        out.update(_encode_features([r.features for r in results]))
    return out


def decode_target_result(tensors: Tensors) -> tuple[list[StepResult], float]:
    """The results in call order, and the forward's milliseconds; an output left off reads as carrying nothing."""
    lengths = _list(tensors, "committed_lengths")
    committed = _split(_list(tensors, "committed"), lengths)
    n = len(lengths)
    log_probs = [None] * n
    if tensors.get("log_probs") is not None:
        log_probs = [None if any(map(math.isnan, p)) else p for p in _split(_list(tensors, "log_probs"), lengths)]
    expected = _list(tensors, "expected_accepted") if tensors.get("expected_accepted") is not None else [0.0] * n
    features = _decode_features(tensors) if tensors.get("features") is not None else [None] * n
    return ([StepResult(c, a, e, f, p) for c, a, e, f, p in zip(committed, _list(tensors, "accepted"), expected,
                                                                features, log_probs)],
            float(_scalar(tensors, "forward_ms")))


# ---------------------------------------------------------------------------------------------
# The drafter model: entry model <-> drafter


@dataclass
class DraftCall:
    """Draft one block per sequence. Features: the target's, of positions each sequence committed since its
    last draft (None: none), appended to its context before drafting."""

    keys: list[int]
    anchors: list[int]
    features: list[torch.Tensor | None]
    block_length: int
    release: list[int] = field(default_factory=list)


def encode_draft_call(call: DraftCall) -> Tensors:
    return {"op": _flat(Op.DRAFT, INT32), "keys": _flat(call.keys, UINT64), "anchors": _flat(call.anchors, INT32),
            **_encode_features(call.features), "block_length": _flat(call.block_length, INT32),
            **_encode_release(call.release)}


def decode_draft_call(tensors: Tensors) -> DraftCall:
    _required(tensors, [s.name for s in DRAFTER_CALL if s is not RELEASE_KEYS])
    call = DraftCall(decode_keys(tensors), _list(tensors, "anchors"), _decode_features(tensors),
                     int(_scalar(tensors, "block_length")), _decode_release(tensors))
    if not len(call.keys) == len(call.anchors) == len(call.features):
        raise ValueError(f"anchors: {len(call.anchors)} anchors and {len(call.features)} feature counts for "
                         f"{len(call.keys)} keys")
    return call


def encode_draft(draft: Draft, draft_ms: float) -> Tensors:
    """What cutting the blocks needs (tokens, head outputs); the block's hidden states stay in the drafter."""
    ratio = np.zeros(0, np.float32) if draft.accept_ratio is None else draft.accept_ratio.float().cpu().numpy()
    rates = np.zeros((0, 0), np.float32) if draft.accept_rates is None else draft.accept_rates.float().cpu().numpy()
    return {"draft_tokens": draft.tokens.cpu().numpy().astype(np.int32), "accept_ratio": ratio, "accept_rates": rates,
            "draft_ms": _flat(draft_ms, FP32)}


def decode_draft(tensors: Tensors) -> tuple[Draft, float]:
    def optional(name: str) -> torch.Tensor | None:
        return torch.from_numpy(np.ascontiguousarray(tensors[name])) if tensors[name].size else None
    tokens = torch.from_numpy(np.asarray(tensors["draft_tokens"], dtype=np.int64))
    return (Draft(tokens=tokens, hidden=None, accept_ratio=optional("accept_ratio"),
                  accept_rates=optional("accept_rates")), float(_scalar(tensors, "draft_ms")))


# ---------------------------------------------------------------------------------------------
# Drafter model names


def drafter_number(name: str) -> int | None:
    """1 for `drafter`, n for a published `drafter_<n>`, None for another model."""
    m = DRAFTER_NAME.fullmatch(name)
    return None if m is None else int(m.group(1) or 1)


def drafter_models_in(model_names: Iterable[str]) -> list[str]:
    """The drafter models among `model_names`, oldest first."""
    return sorted((n for n in model_names if drafter_number(n) is not None), key=drafter_number)


def next_drafter_name(newest: str) -> str:
    """The name a drafter published after `newest` gets."""
    return f"drafter_{drafter_number(newest) + 1}"
