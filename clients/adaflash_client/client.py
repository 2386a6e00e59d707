"""gRPC client for the `adaflash` Triton model: streamed tokens plus speculative-decoding statistics.

Why a wrapper around tritonclient: the model is decoupled (one response per decode step, then a
final flag that may come in an empty response), reports cumulative counters and per-step lists
that have to be aggregated, and a caller that stops reading must cancel the request on the
server rather than let it run to `max_tokens`. tritonclient allows one bidirectional stream per
`InferenceServerClient`, so every request gets a client of its own, taken from a small pool so
that consecutive requests reuse the gRPC connection.

The same client works against a stock TensorRT-LLM ensemble: it asks the model's metadata once which inputs and
outputs the model has (`ModelContract`), sends only inputs the model takes (refusing, by name, a field the caller set
that it lacks, such as `spec_mode`) and reads what it sends; this server's statistics are then None.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from adaflash.decoding.modes import MODE_NAMES

SPEC_MODES = MODE_NAMES  # what `spec_mode` may name: the core's registry, so the client offers exactly its modes

# (GenerationParams field, input tensor, Triton datatype) of the optional scalar inputs.
_OPTIONAL_SCALARS = (
    ("temperature", "temperature", "FP32"),
    ("top_k", "top_k", "INT32"),
    ("top_p", "top_p", "FP32"),
    ("seed", "seed", "UINT64"),
    ("repetition_penalty", "repetition_penalty", "FP32"),
    ("presence_penalty", "presence_penalty", "FP32"),
    ("frequency_penalty", "frequency_penalty", "FP32"),
    ("min_tokens", "min_tokens", "INT32"),
    ("end_id", "end_id", "INT32"),
    ("max_draft", "max_draft", "INT32"),
    ("apply_chat_template", "apply_chat_template", "BOOL"),
    ("return_log_probs", "return_log_probs", "BOOL"),
    ("return_num_input_tokens", "return_num_input_tokens", "BOOL"),
)
_WORD_LISTS = ("stop_words", "bad_words")  # [1, n] text inputs, not sent when empty
_OPTIONAL_JSON = ("messages", "chat_template_kwargs")  # sent as JSON text, each in the input of its name
# What the client asks of a model without this server's statistics (a TensorRT-LLM ensemble), where the model takes
# the input: (the flag set true, the output it makes the model send; None: no output). TensorRT-LLM's default
# exclude_input_in_output (false) would start a non-streaming text with the prompt.
_STOCK_ASKS = (("exclude_input_in_output", None), ("return_num_output_tokens", "num_output_tokens"),
               ("return_perf_metrics", "total_draft_tokens"))


@dataclass(frozen=True)
class ModelContract:
    """The inputs and outputs a model declares (Triton's model metadata): what a request may send and read.

    This server's `adaflash` model has them all; a stock TensorRT-LLM ensemble has TensorRT-LLM's tensors only:
    none of this server's inputs (`spec_mode`, `max_draft`, the chat fields) or statistics outputs.
    """

    name: str
    inputs: frozenset[str]
    outputs: frozenset[str]

    @classmethod
    def of(cls, metadata: Any) -> ModelContract:
        """From tritonclient's ModelMetadataResponse."""
        return cls(metadata.name, frozenset(t.name for t in metadata.inputs),
                   frozenset(t.name for t in metadata.outputs))

    @property
    def reports_steps(self) -> bool:
        """Whether every response carries this server's statistics (per-step lists, the tokens so far)."""
        return "accepted_per_step" in self.outputs

    @property
    def counts_per_response(self) -> bool:
        """Whether `num_output_tokens` counts each response's tokens (TensorRT-LLM's meaning), not the tokens so far
        (this server's)."""
        return not self.reports_steps and "num_output_tokens" in self.outputs


def fit_inputs(inputs: list[grpcclient.InferInput], contract: ModelContract) -> list[grpcclient.InferInput]:
    """The request for this model: ValueError naming the first input the caller set that the model lacks (never
    dropped silently: the caller asked for its effect); from a model without this server's statistics, also
    TensorRT-LLM's figures (`_STOCK_ASKS`)."""
    missing = next((t.name() for t in inputs if t.name() not in contract.inputs), None)
    if missing is not None:
        raise ValueError(f"{missing}: model {contract.name!r} has no such input (a TensorRT-LLM ensemble has none "
                         "of this server's own, such as spec_mode and max_draft); leave it unset")
    if contract.reports_steps:
        return inputs
    return inputs + [_scalar_tensor(flag, "BOOL", True) for flag, output in _STOCK_ASKS
                     if flag in contract.inputs and (output is None or output in contract.outputs)]


@dataclass(frozen=True)
class Tls:
    """TLS for the gRPC connection (PEM files).

    `root_cert`: the CA certificate(s) to verify the server with (None: gRPC's bundled public roots); the
    server's own certificate works too, as gRPC accepts a trusted leaf. `client_cert` and `client_key`: this
    client's identity, for a server that asks for one (mutual TLS). `server_name`: the name the server's
    certificate is checked against when the URL's host is not in it (an IP address, a port forward).
    """

    root_cert: str | Path | None = None
    client_cert: str | Path | None = None
    client_key: str | Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("a client certificate needs its key and a key its certificate")


def connect(url: str, tls: Tls | None = None) -> grpcclient.InferenceServerClient:
    """A tritonclient connection to `url` (host:port), over TLS when `tls` is given: the one place a gRPC
    connection is made, so every client of the server (this library, the OpenAI front, the launcher's own
    probes) reaches a TLS server alike."""
    if tls is None:
        return grpcclient.InferenceServerClient(url)
    return grpcclient.InferenceServerClient(
        url, ssl=True, root_certificates=tls.root_cert, private_key=tls.client_key,
        certificate_chain=tls.client_cert, channel_args=_channel_args(tls.server_name))


def _channel_args(server_name: str | None) -> list[tuple[str, Any]] | None:
    """tritonclient's own channel options plus the name to verify; None keeps its defaults untouched (any
    channel_args given replace them all, so they are repeated here)."""
    if server_name is None:
        return None
    keepalive = grpcclient.KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.ssl_target_name_override", server_name),
    ]


class GenerationError(Exception):
    """A request failed on the server or on the way to it.

    `status` is the gRPC status as tritonclient spells it ("StatusCode.UNAVAILABLE"); it is None
    for errors the server reports inside the stream (a model or backend error), where only a
    message exists.
    """

    def __init__(self, status: str | None, message: str) -> None:
        super().__init__(f"[{status}] {message}" if status else message)
        self.status = status
        self.message = message

    @classmethod
    def from_triton(cls, error: InferenceServerException) -> GenerationError:
        return cls(error.status(), error.message())


@dataclass
class GenerationParams:
    """Sampling and speculation settings of one request.

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
    no text is made locally when `AdaFlashClient.cancel()` interrupts a request. `num_output_tokens` counts the
    tokens so far. A model without this server's statistics (a stock TensorRT-LLM ensemble, `ModelContract`) leaves
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
    client's tokenizer (`AdaFlashClient(tokenizer=...)`; the model's own count when its tokens are the tokenizer's
    encoding of the text), else None.
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


def build_inputs(prompt: str, params: GenerationParams, stream: bool | None = None) -> list[grpcclient.InferInput]:
    """The request tensors, each with the leading batch dimension 1 (the model has max_batch_size > 0).

    Optional tensors are included only when set (not None), `stream` included.
    """
    inputs = [_bytes_tensor("text_input", [prompt]), _scalar_tensor("max_tokens", "INT32", params.max_tokens)]
    if stream is not None:
        inputs.append(_scalar_tensor("stream", "BOOL", stream))
    for attr, name, datatype in _OPTIONAL_SCALARS:
        value = getattr(params, attr)
        if value is not None:
            inputs.append(_scalar_tensor(name, datatype, value))
    if params.spec_mode is not None:
        inputs.append(_bytes_tensor("spec_mode", [params.spec_mode]))
    for name in _WORD_LISTS:
        if getattr(params, name):
            inputs.append(_bytes_tensor(name, getattr(params, name)))
    for name in _OPTIONAL_JSON:
        value = getattr(params, name)
        if value is not None:
            inputs.append(_bytes_tensor(name, [json.dumps(value, ensure_ascii=False)]))
    return inputs


def _scalar_tensor(name: str, datatype: str, value: bool | int | float) -> grpcclient.InferInput:
    """A [1, 1] tensor; integers out of the datatype's range are refused because numpy would wrap them."""
    dtype = triton_to_np_dtype(datatype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise ValueError(f"{name}={value} does not fit {datatype}")
    return _tensor(name, datatype, np.array([[value]], dtype=dtype))


def _bytes_tensor(name: str, texts: list[str]) -> grpcclient.InferInput:
    """A [1, n] BYTES tensor of UTF-8 strings."""
    return _tensor(name, "BYTES", np.array([[t.encode("utf-8") for t in texts]], dtype=np.object_))


def _tensor(name: str, datatype: str, value: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def parse_chunk(result: grpcclient.InferResult, contract: ModelContract | None = None) -> Chunk | None:
    """The chunk a response carries, or None for an empty (flags-only) final response.

    `contract`: the model's; None for this server's `adaflash` model. Where the model declares this server's statistics,
    a response without them is an error; a model without them (TensorRT-LLM's) leaves them None, and its
    `num_output_tokens`, when sent, counts this response's tokens only (`AdaFlashClient` adds them up).
    """
    if not result.get_response().outputs:
        return None
    statistic = partial(_output, result) if contract is None or contract.reports_steps else result.as_numpy
    finish_reason = statistic("finish_reason")
    return Chunk(
        text=_text(_output(result, "text_output").flat[0]),
        num_output_tokens=_first(statistic("num_output_tokens")),
        target_forwards=_first(statistic("target_forwards")),
        accepted_per_step=_listed(statistic("accepted_per_step")),
        draft_len_per_step=_listed(statistic("draft_len_per_step")),
        finish_reason=None if finish_reason is None else _text(finish_reason.flat[0]) or None,
        log_probs=_listed(result.as_numpy("output_log_probs")),
        token_ids=_listed(result.as_numpy("output_token_ids")),
        num_input_tokens=_first(result.as_numpy("num_input_tokens")),
        total_accepted_draft_tokens=_first(result.as_numpy("total_accepted_draft_tokens")),
        total_draft_tokens=_first(result.as_numpy("total_draft_tokens")),
    )


def _first(value: np.ndarray | None) -> int | None:
    return None if value is None else int(value.flat[0])


def _listed(value: np.ndarray | None) -> list | None:
    return None if value is None else value.reshape(-1).tolist()


def is_final(result: grpcclient.InferResult) -> bool:
    """Whether the server marked this response as the request's last one."""
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param


def _output(result: grpcclient.InferResult, name: str) -> np.ndarray:
    """An output the model promises in every non-empty response; its absence is a server bug worth surfacing."""
    value = result.as_numpy(name)
    if value is None:
        raise GenerationError(None, f"response lacks output {name!r}")
    return value


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


_CANCEL = object()  # queued by cancel(): wakes the iterating thread without touching tritonclient
_STREAM_ERROR_WAIT_S = 1.0


class _Call:
    """The queue between tritonclient's response thread and the thread iterating one request."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()

    def on_response(self, result: grpcclient.InferResult | None = None,
                    error: InferenceServerException | None = None) -> None:
        """tritonclient's stream callback: runs on its response thread, so it only enqueues."""
        self.queue.put((result, error))

    def cancel(self) -> None:
        self.queue.put(_CANCEL)

    def stream_error(self) -> InferenceServerException | None:
        """The error of a stream that failed before the request went out (no connection, a TLS handshake, a header
        the server requires), which tritonclient hands the callback, a moment later, while the send itself only
        says that the stream "is no longer in valid state"."""
        try:
            item = self.queue.get(timeout=_STREAM_ERROR_WAIT_S)
        except queue.Empty:
            return None
        return None if item is _CANCEL else item[1]


class AdaFlashClient:
    """Client of the `adaflash` model on one Triton server; thread-safe, usable as a context manager.

    `timeout_s` bounds each request's gRPC stream (None: no limit); an expired one raises
    GenerationError with status "StatusCode.DEADLINE_EXCEEDED". `tls` connects over TLS (see `Tls`);
    `headers` go with every call as gRPC metadata (for a gateway in front of the server, or Triton's
    `--grpc-restricted-protocol`); their names are lower-cased, as gRPC requires and HTTP/2 treats them alike.
    `model_name`: this server's `adaflash`, or another model with TensorRT-LLM's tensors (a stock TensorRT-LLM
    ensemble is `ensemble`): the model's inputs and outputs are asked of the server with the first request
    (`ModelContract`). `tokenizer` (a `tokenizers.Tokenizer`, optional) counts the output tokens of a model
    that reports none.
    """

    def __init__(self, url: str = "127.0.0.1:8001", model_name: str = "adaflash",
                 timeout_s: float | None = None, tls: Tls | None = None,
                 headers: Mapping[str, str] | None = None, tokenizer: Any = None) -> None:
        self.url = url
        self.model_name = model_name
        self.timeout_s = timeout_s
        self.tls = tls
        self.headers = {name.lower(): value for name, value in (headers or {}).items()} or None
        self.tokenizer = tokenizer
        self._contract: ModelContract | None = None
        self._lock = threading.Lock()
        self._idle: list[grpcclient.InferenceServerClient] = []
        self._active: set[_Call] = set()
        self._closed = False
        self._control = connect(url, tls)

    def __enter__(self) -> AdaFlashClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def server_ready(self) -> bool:
        """Whether the server answers and is ready; an unreachable server is simply not ready."""
        try:
            return self._control.is_server_ready(headers=self.headers)
        except InferenceServerException:
            return False

    def model_ready(self) -> bool:
        """Whether the model is loaded and ready; an unreachable server counts as not ready."""
        try:
            return self._control.is_model_ready(self.model_name, headers=self.headers)
        except InferenceServerException:
            return False

    def stream(self, prompt: str, params: GenerationParams | None = None,
               request_id: str | None = None) -> Iterator[Chunk]:
        """Chunks of a streaming request as they arrive; the iteration ends after the final response.

        Invalid parameters (an integer out of its tensor's range) raise ValueError here; the request
        itself is sent on the first `next()`, which raises ValueError for a field the model lacks
        (`fit_inputs`). Leaving early (break, exception, `.close()` on
        the generator) cancels it on the server; a caller keeping its own reference to the
        generator should close it (e.g. `contextlib.closing`) instead of just dropping the loop.
        Raises GenerationError in the iterating thread when the server reports an error.
        """
        return self._run(prompt, params or GenerationParams(), request_id, stream=True)

    def generate(self, prompt: str, params: GenerationParams | None = None,
                 request_id: str | None = None) -> Completion:
        """One non-streaming request (`stream` False): the server sends the whole text at once."""
        return _collect(self._run(prompt, params or GenerationParams(), request_id, stream=False),
                        tokenizer=self.tokenizer)

    def generate_streaming(self, prompt: str, params: GenerationParams | None = None,
                           on_chunk: Callable[[Chunk], None] | None = None,
                           request_id: str | None = None) -> Completion:
        """A streaming request aggregated into a Completion; `on_chunk` sees every chunk as it arrives."""
        return _collect(self._run(prompt, params or GenerationParams(), request_id, stream=True), on_chunk,
                        self.tokenizer)

    def cancel(self) -> None:
        """Cancel every request of this client in progress, from any thread.

        Each one ends with a local Chunk whose finish_reason is "cancelled" (a Completion with that
        finish_reason), and its gRPC stream is cancelled so the server stops generating.
        """
        with self._lock:
            calls = list(self._active)
        for call in calls:
            call.cancel()

    def close(self) -> None:
        """Cancel requests in progress and close the connections; later requests raise RuntimeError."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        self.cancel()
        for client in idle:
            client.close()
        self._control.close()

    def _run(self, prompt: str, params: GenerationParams, request_id: str | None, stream: bool) -> Iterator[Chunk]:
        """Build the tensors now, so that an invalid parameter raises ValueError at the call, not on first next()."""
        return self._responses(build_inputs(prompt, params, stream=stream), request_id)

    def _responses(self, inputs: list[grpcclient.InferInput], request_id: str | None) -> Iterator[Chunk]:
        """Send one request on a stream of its own and yield its chunks until the final response."""
        call = _Call()
        client = self._acquire(call)
        finished = cancelled = False
        try:
            contract = self._contract_on(client)
            self._send(client, call, fit_inputs(inputs, contract), request_id)
            last: Chunk | None = None
            produced = 0  # the tokens so far, from a model that counts each response's (TensorRT-LLM)
            while True:
                item = call.queue.get()
                if item is _CANCEL:
                    cancelled = True
                    yield _cancelled_chunk(last)
                    return
                result, error = item
                if error is not None:
                    raise GenerationError.from_triton(error)
                finished = is_final(result)
                chunk = parse_chunk(result, contract)
                if chunk is not None:
                    if contract.counts_per_response and chunk.num_output_tokens is not None:
                        produced += chunk.num_output_tokens
                        chunk.num_output_tokens = produced
                    last = chunk
                    yield chunk
                if finished:
                    return
        finally:
            client.stop_stream(cancel_requests=not finished)
            self._release(client, call, reuse=finished or cancelled)

    def _contract_on(self, client: grpcclient.InferenceServerClient) -> ModelContract:
        """The model's inputs and outputs, asked once, on the request's own connection (a failed one is replaced
        by a fresh one, which connects as soon as the server is back; `_release`)."""
        if self._contract is None:
            try:
                metadata = client.get_model_metadata(self.model_name, headers=self.headers,
                                                     client_timeout=self.timeout_s)
            except InferenceServerException as error:
                raise GenerationError.from_triton(error) from error
            self._contract = ModelContract.of(metadata)
        return self._contract

    def _send(self, client: grpcclient.InferenceServerClient, call: _Call,
              inputs: list[grpcclient.InferInput], request_id: str | None) -> None:
        try:
            client.start_stream(call.on_response, stream_timeout=self.timeout_s, headers=self.headers)
            client.async_stream_infer(self.model_name, inputs, request_id=request_id or "",
                                      enable_empty_final_response=True)
        except InferenceServerException as error:
            raise GenerationError.from_triton(call.stream_error() or error) from error

    def _acquire(self, call: _Call) -> grpcclient.InferenceServerClient:
        """An idle connection (or a new one), with `call` registered for cancel()."""
        with self._lock:
            if self._closed:
                raise RuntimeError("AdaFlashClient is closed")
            self._active.add(call)
            if self._idle:
                return self._idle.pop()
        return connect(self.url, self.tls)

    def _release(self, client: grpcclient.InferenceServerClient, call: _Call, reuse: bool) -> None:
        """Back to the idle connections, unless the request failed: a connection whose server went away
        waits out gRPC's reconnect backoff (many seconds) before it works again, while a new one connects
        as soon as the server is back."""
        with self._lock:
            self._active.discard(call)
            if reuse and not self._closed:
                self._idle.append(client)
                return
        client.close()


def _cancelled_chunk(last: Chunk | None) -> Chunk:
    """The local end of a cancelled request, carrying the counters reached so far."""
    return Chunk(text="", num_output_tokens=last.num_output_tokens if last else 0,
                 target_forwards=last.target_forwards if last else 0,
                 accepted_per_step=None if last and last.accepted_per_step is None else [],
                 draft_len_per_step=None if last and last.draft_len_per_step is None else [],
                 finish_reason="cancelled",
                 total_accepted_draft_tokens=last.total_accepted_draft_tokens if last else None,
                 total_draft_tokens=last.total_draft_tokens if last else None)


def _collect(chunks: Iterator[Chunk], on_chunk: Callable[[Chunk], None] | None = None,
             tokenizer: Any = None) -> Completion:
    """Aggregate chunks: text and per-step lists concatenate, counters are cumulative so the last wins.

    `closing` makes an exception in `on_chunk` (or a KeyboardInterrupt) cancel the request at once.
    """
    start = time.perf_counter()
    first_token_s: float | None = None
    last_chunk_s: float | None = None  # latency ends here, not after the stream's teardown
    seen: list[Chunk] = []
    with contextlib.closing(chunks):
        for chunk in chunks:
            last_chunk_s = time.perf_counter() - start
            if first_token_s is None and (chunk.num_output_tokens is None or chunk.num_output_tokens > 0):
                first_token_s = last_chunk_s
            seen.append(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
    last = seen[-1] if seen else None
    text = "".join(c.text for c in seen)
    return Completion(
        text=text,
        num_output_tokens=_output_tokens(last, text, tokenizer),
        target_forwards=last.target_forwards if last else 0,
        finish_reason=last.finish_reason if last else None,
        num_input_tokens=last.num_input_tokens if last else None,
        total_accepted_draft_tokens=last.total_accepted_draft_tokens if last else None,
        total_draft_tokens=last.total_draft_tokens if last else None,
        time_to_first_token_s=first_token_s,
        latency_s=last_chunk_s if last_chunk_s is not None else time.perf_counter() - start,
        **{name: _joined(seen, name) for name in ("accepted_per_step", "draft_len_per_step", "log_probs",
                                                  "token_ids")},
    )


def _joined(chunks: list[Chunk], name: str) -> list | None:
    """A list the chunks carry in pieces (per step, per token); None when the last one carries none: the model
    sends none (per-step lists) or the request did not ask (per-token lists)."""
    if not chunks or getattr(chunks[-1], name) is None:
        return None
    return [v for c in chunks for v in getattr(c, name) or []]


def _output_tokens(last: Chunk | None, text: str, tokenizer: Any) -> int | None:
    """The model's count, else the text re-encoded by `tokenizer`, else None (unknown, not zero)."""
    if last is None:
        return 0
    if last.num_output_tokens is not None or tokenizer is None:
        return last.num_output_tokens
    return len(tokenizer.encode(text, add_special_tokens=False).ids)
