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

The request's arrays, the responses' reading, `GenerationParams`, `Chunk`, `Completion`, `GenerationError` and `Tls`
are the contract's (`adaflash_contract.wire`, `adaflash_contract.connection`), shared with the server's OpenAI front;
this module is the transport (tritonclient's sync gRPC client) and re-exports them under their old names.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from adaflash_contract.connection import Tls, grpc_metadata, grpc_options
from adaflash_contract.errors import RequestError
from adaflash_contract.modes import MODE_NAMES
from adaflash_contract.wire import (
    FINAL_RESPONSE,
    Chunk,
    Completion,
    GenerationError,
    GenerationParams,
    field_array,
    request_arrays,
    response_chunk,
)

__all__ = ["SPEC_MODES", "AdaFlashClient", "Chunk", "Completion", "GenerationError", "GenerationParams",
           "ModelContract", "Tls", "build_inputs", "connect", "fit_inputs", "infer_inputs", "is_final", "parse_chunk"]

SPEC_MODES = MODE_NAMES  # what `spec_mode` may name: the contract's registry, so the client offers exactly its modes

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
    """The request for this model: RequestError (a ValueError) naming the first input the caller set that the model
    lacks (never dropped silently: the caller asked for its effect); from a model without this server's statistics,
    also TensorRT-LLM's figures (`_STOCK_ASKS`)."""
    missing = next((t.name() for t in inputs if t.name() not in contract.inputs), None)
    if missing is not None:
        raise RequestError(missing, f"model {contract.name!r} has no such input (a TensorRT-LLM ensemble has none "
                           "of this server's own, such as spec_mode and max_draft); leave it unset")
    if contract.reports_steps:
        return inputs
    return inputs + infer_inputs({flag: field_array(flag, True) for flag, output in _STOCK_ASKS
                                  if flag in contract.inputs and (output is None or output in contract.outputs)})


def connect(url: str, tls: Tls | None = None) -> grpcclient.InferenceServerClient:
    """A tritonclient connection to `url` (host:port), over TLS when `tls` is given: the one place this library
    makes a gRPC connection, so every request reaches a TLS server alike."""
    return grpcclient.InferenceServerClient(url, **grpc_options(tls))


def build_inputs(prompt: str, params: GenerationParams, stream: bool | None = None) -> list[grpcclient.InferInput]:
    """The request tensors (`adaflash_contract.wire.request_arrays`, wrapped for tritonclient): each with the
    leading batch dimension 1; optional ones only when set (not None), `stream` included. RequestError (a
    ValueError) naming a field whose value its datatype cannot hold."""
    return infer_inputs(request_arrays(prompt, params, stream=stream))


def infer_inputs(arrays: Mapping[str, np.ndarray]) -> list[grpcclient.InferInput]:
    """Arrays by input name as tritonclient's tensors."""
    inputs = []
    for name, value in arrays.items():
        tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def parse_chunk(result: grpcclient.InferResult, contract: ModelContract | None = None) -> Chunk | None:
    """The chunk a response carries, or None for an empty (flags-only) final response
    (`adaflash_contract.wire.response_chunk` over the result's arrays).

    `contract`: the model's; None for this server's `adaflash` model. Where the model declares this server's statistics,
    a response without them is an error; a model without them (TensorRT-LLM's) leaves them None, and its
    `num_output_tokens`, when sent, counts this response's tokens only (`AdaFlashClient` adds them up).
    """
    outputs = {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
    return response_chunk(outputs, statistics=contract is None or contract.reports_steps)


def is_final(result: grpcclient.InferResult) -> bool:
    """Whether the server marked this response as the request's last one."""
    parameters = result.get_response().parameters
    return FINAL_RESPONSE in parameters and parameters[FINAL_RESPONSE].bool_param


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
        self.headers = grpc_metadata(headers)
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
