"""An OpenAI-compatible HTTP endpoint (`/v1/models`, `/v1/completions`, `/v1/chat/completions`, and its OpenAPI
document at `/openapi.json`) in front of the server's own gRPC stream: `adaflash serve --openai-port`, or alone as `adaflash openai-front`.

Why a front and not a second engine: every request goes through the `adaflash` model exactly as a gRPC client's
would (the same admission queue, pacing, metrics and lossless decoding), so the HTTP text equals the gRPC text. The
front only translates: OpenAI fields to the model's inputs (chat messages through the server's own
`apply_chat_template` + `messages` fields), chunks to server-sent events, the server's field-naming errors to
OpenAI's error format. A field the server cannot honour is refused by name with a 400, never ignored, because an
OpenAI client has no other way to learn that its `n`, `top_logprobs` or penalty had no effect.

The front is a gRPC client of the server on its own event loop (`Channel`: tritonclient's asyncio client, the
request's arrays and the responses' reading from the contract, `adaflash_contract.wire`). Every HTTP request is a
gRPC stream of its own on one shared channel; a client that disconnects cancels its stream's call at once, which
cancels the request on the server, and the server frees the sequence. A refusal names its request field
(`RequestError.from_wire`), which becomes the OpenAI parameter the client sent.

Security (`adaflash_server.security`): HTTPS with the server's certificate (client certificates required when it
requires them on gRPC), the gRPC stream over TLS when the server's is, and an optional API key that every route
requires, sent as OpenAI's SDKs send theirs (`Authorization: Bearer <key>`); a missing or wrong one is a 401.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tokenizers import Tokenizer
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from adaflash.models.chat_template import ChatTemplate, load_chat_template
from adaflash.models.tokenizer import load_tokenizer
from adaflash.cli_args import byte_size
from adaflash.decoding.limits import check_prompt_text
from adaflash.serving.api import Detokenizer, longest_token, prompt_characters, prompt_ids
from adaflash_contract.connection import (
    Tls,
    add_connection_arguments,
    grpc_metadata,
    grpc_options,
    headers_from_args,
    tls_from_args,
)
from adaflash_contract.errors import INVALID_ARGUMENT, RequestError
from adaflash_contract.wire import (
    ENTRY,
    Chunk,
    GenerationError,
    GenerationParams,
    openai_param,
    request_arrays,
    response_chunk,
)
from adaflash_server.launcher import connect
from adaflash_server.openai_schema import CHAT, COMPLETIONS, MOST_COMPLETION_LOGPROBS, MOST_TOP_LOGPROBS, document, parameters
from adaflash_server.security import (
    ServerTls,
    add_api_key_argument,
    add_tls_arguments,
    api_key_from_args,
    server_tls_from_args,
)

DEFAULT_PORT = 9000  # the port of Triton's own OpenAI frontend
MIB = 1 << 20
_BYTES_A_TOKEN = 64  # a token's bytes at most where the front cannot read the tokenizer (for the body limit only)
_COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_GRPC_UNAVAILABLE = "StatusCode.UNAVAILABLE"  # gRPC's status of a server it cannot reach, as tritonclient spells it
# gRPC waits up to 2 minutes between reconnection attempts to a server that went away: the front's channel tries
# again within a second, so that it serves again as soon as a restarted server does.
_RECONNECT_BACKOFF_MS = 1000


class OpenAIError(Exception):
    """An error answered in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def kind(self) -> str:
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def _invalid(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {message}", param=param, code="invalid_value")


# ---------------------------------------------------------------------------------------------
# What the front knows of the served model


@dataclass(frozen=True)
class Target:
    """The served target as the front needs it: its name, the output limit (the default `max_tokens` of a chat
    request, as OpenAI's is "what the context allows"), and its tokenizer and chat template for `usage`'s
    prompt_tokens (None when the front cannot read the server's target folder: prompt_tokens is then 0)."""

    name: str
    max_output_tokens: int
    tokenizer: Tokenizer | None = None
    chat: ChatTemplate | None = None
    max_prompt_tokens: int | None = None  # the server's limit, which a prompt's characters may show it exceeds
    longest_token: int = 0  # the most bytes one token stands for (`api.longest_token`); 0: no tokenizer

    def too_long(self, values: dict[str, Any]) -> str | None:
        """Why the server would refuse the prompt by its characters alone (None: it may fit): checked before it is
        tokenised, so that a huge prompt costs no tokenising here."""
        if self.max_prompt_tokens is None or not self.longest_token:
            return None
        try:
            check_prompt_text(prompt_characters(values), self.longest_token, self.max_prompt_tokens)
        except RequestError as exc:
            return exc.message
        return None

    def body_limit(self) -> int:
        """The default request body limit: room for the longest prompt the server takes, each of its characters
        escaped in JSON at worst (`\\uXXXX`, six bytes), and a mebibyte for the other fields."""
        characters = (self.max_prompt_tokens or 0) * (self.longest_token or _BYTES_A_TOKEN)
        return MIB + 6 * characters

    def prompt_tokens(self, values: dict[str, Any]) -> int:
        """The prompt's length as the server computes it (the same function, the same files)."""
        if self.tokenizer is None:
            return 0
        return len(prompt_ids(self.tokenizer, values, self.chat))


@dataclass(frozen=True)
class Upstream:
    """How the front reaches the server's gRPC endpoint: its address, TLS, and headers every call carries."""

    url: str
    tls: Tls | None = None
    headers: dict[str, str] | None = None


def served_parameters(upstream: Upstream) -> dict[str, str]:
    """The running server's `adaflash` model config parameters: among them the target's folder
    (`target_dir`) and the output limit (`max_output_tokens`). Over a control connection of its own (sync), as it
    is asked before the front's event loop runs."""
    client = connect(upstream.url, upstream.tls)
    try:
        config = client.get_model_config(ENTRY, as_json=True, headers=grpc_metadata(upstream.headers))["config"]
    finally:
        client.close()
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def describe_target(upstream: Upstream, served_model_name: str | None = None) -> Target:
    """Read the target from the running server's `adaflash` model config: its folder (the model folder's
    name is the served name unless one is given), its output and prompt limits."""
    params = served_parameters(upstream)
    target_dir = Path(params["target_dir"])
    name = served_model_name or target_dir.parent.name
    most_prompt = int(params["max_prompt_tokens"]) if params.get("max_prompt_tokens") else None
    if not (target_dir / "tokenizer.json").is_file():
        return Target(name, int(params["max_output_tokens"]), max_prompt_tokens=most_prompt)
    tokenizer = load_tokenizer(target_dir)
    return Target(name, int(params["max_output_tokens"]), tokenizer, load_chat_template(target_dir), most_prompt,
                  longest_token(tokenizer))


# ---------------------------------------------------------------------------------------------
# OpenAI request -> the model's request


@dataclass
class Generation:
    """One translated request: what is sent over gRPC, and what the answer needs."""

    chat: bool
    prompt: str
    params: GenerationParams
    stream: bool
    include_usage: bool
    max_tokens_param: str  # the field the client limited the output with, for the server's errors
    logprobs: bool = False  # each output token's log-probability in the answer (the server's return_log_probs)

    def param_of(self, field: str) -> str | None:
        """The OpenAI parameter the client sent for the request field `field` (None: none): the contract's, but for
        the prompt (the route's) and the output limit (the one the client used)."""
        if field == "text_input":
            return "messages" if self.chat else "prompt"
        if field == "max_tokens":
            return self.max_tokens_param
        return openai_param(field)

    def values(self) -> dict[str, Any]:
        """The request as the server sees it, for counting the prompt's tokens."""
        return {"text_input": self.prompt, "apply_chat_template": bool(self.params.apply_chat_template),
                "messages": tuple(self.params.messages or ()),
                "chat_template_kwargs": self.params.chat_template_kwargs or {}}


# presence_penalty and frequency_penalty are OpenAI's; repetition_penalty and min_tokens vLLM's extensions.
_PENALTIES = ("presence_penalty", "frequency_penalty", "repetition_penalty")
_CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def completion_generation(body: dict[str, Any], target: Target) -> Generation:
    """/v1/completions: one prompt string (OpenAI's default of 16 output tokens)."""
    _check_fields(body, COMPLETIONS, target)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _invalid("prompt", "must be a string (a batch of prompts, or token ids, is not supported)")
    max_tokens = _integer(body, "max_tokens", _COMPLETION_DEFAULT_MAX_TOKENS)
    generation = _generation(body, chat=False, prompt=prompt, max_tokens=max_tokens, max_tokens_param="max_tokens")
    _ask_logprobs(generation, _alternatives(body, "logprobs", MOST_COMPLETION_LOGPROBS) is not None, target)
    return generation


def chat_generation(body: dict[str, Any], target: Target) -> Generation:
    """/v1/chat/completions: the last message is the user's turn (the model's text_input), the ones before
    travel as `messages`, and the server renders them all in the target's chat template."""
    _check_fields(body, CHAT, target)
    *history, last = _chat_messages(body.get("messages"))
    if last["role"] != "user":
        raise _invalid("messages", f"the last message must be the user's, got role {last['role']!r}")
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, param, target.max_output_tokens)
    generation = _generation(body, chat=True, prompt=last["content"], max_tokens=max_tokens, max_tokens_param=param)
    generation.params.apply_chat_template = True
    generation.params.messages = history or None
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _invalid("chat_template_kwargs", "must be an object")
    generation.params.chat_template_kwargs = kwargs or None
    _alternatives(body, "top_logprobs", MOST_TOP_LOGPROBS)
    _ask_logprobs(generation, _boolean(body, "logprobs", False), target)
    return generation


def _alternatives(body: dict[str, Any], name: str, most: int) -> int | None:
    """How many likeliest alternatives to list per token (completions' `logprobs`, chat's `top_logprobs`): only 0,
    as the server reports the chosen token's log-probability, computed at verification, and not the others'."""
    count = _optional_integer(body, name)
    if count is not None and not 0 <= count <= most:
        raise _invalid(name, f"must be an integer in [0, {most}], got {count}")
    if count:
        raise OpenAIError(400, f"{name}: only 0 is supported (the server reports each chosen token's "
                          "log-probability, not those of the alternatives)", param=name, code="unsupported_parameter")
    return count


def _ask_logprobs(generation: Generation, wanted: bool, target: Target) -> None:
    """The server sends each token's id and log-probability (return_log_probs); the token's text needs the
    target's tokenizer here."""
    if wanted and target.tokenizer is None:
        raise OpenAIError(400, "logprobs: not available: this endpoint cannot read the target's tokenizer",
                          param="logprobs", code="unsupported_parameter")
    generation.logprobs = wanted
    generation.params.return_log_probs = wanted or None


def _check_fields(body: dict[str, Any], route: str, target: Target) -> None:
    """Unknown fields, and known ones the server cannot honour, are refused by name (the table: `openai_schema`); so
    is another model."""
    allowed = parameters(route)
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise OpenAIError(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0],
                          code="unsupported_parameter")
    for name, param in allowed.items():
        if param.no_op is not None and name in body and not param.accepts_as_no_op(body[name]):
            raise OpenAIError(400, f"{name}: not supported by this server (only {name}'s no-op value is accepted)",
                              param=name, code="unsupported_parameter")
    model = body.get("model")
    if not isinstance(model, str):
        raise _invalid("model", "must be a string naming the model (GET /v1/models)")
    if model != target.name:
        raise OpenAIError(404, f"The model `{model}` does not exist (this server serves `{target.name}`)",
                          param="model", code="model_not_found")


def _chat_messages(messages: Any) -> list[dict[str, str]]:
    """Messages as the server's `messages` field takes them: role and text content only."""
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "must be a non-empty list of messages")
    return [_chat_message(m, i) for i, m in enumerate(messages)]


def _chat_message(message: Any, index: int) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in _CHAT_ROLES:
        raise _invalid("messages", f"{where}: role must be one of {', '.join(_CHAT_ROLES)}")
    extra = sorted(set(message) - {"role", "content"})
    if extra:
        raise _invalid("messages", f"{where}.{extra[0]}: not supported by this server")
    return {"role": _CHAT_ROLES[message["role"]], "content": _message_text(message.get("content"), where)}


def _message_text(content: Any, where: str) -> str:
    """String content, or a list of text parts joined (images and audio are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise _invalid("messages", f"{where}.content: must be a string or a list of text parts")


def _generation(body: dict[str, Any], chat: bool, prompt: str, max_tokens: int, max_tokens_param: str) -> Generation:
    """The fields both routes share; OpenAI's defaults (temperature 1, top_p 1), not the server's."""
    stream = _boolean(body, "stream", False)
    _optional_string(body, "user")  # taken, not used: a client still learns when it sent something else
    options = body.get("stream_options")
    if options is not None and not stream:
        raise _invalid("stream_options", "only allowed when stream is true")
    if options is not None and not (isinstance(options, dict) and set(options) <= {"include_usage"}):
        raise _invalid("stream_options", "must be an object with include_usage only")
    params = GenerationParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0),
        top_k=_integer(body, "top_k", 0),
        top_p=_number(body, "top_p", 1.0),
        seed=_optional_integer(body, "seed"),
        **{name: _optional_number(body, name) for name in _PENALTIES},
        min_tokens=_optional_integer(body, "min_tokens"),
        stop_words=_stop(body.get("stop")),
        spec_mode=_optional_string(body, "spec_mode"),
        max_draft=_optional_integer(body, "max_draft"),
    )
    return Generation(chat, prompt, params, stream, bool((options or {}).get("include_usage")), max_tokens_param)


def _stop(value: Any) -> list[str] | None:
    """A string or up to 4 strings (OpenAI's limit). The server ends the output with the token that completes a stop
    string; `StopTrimmer` takes the stop string off, as OpenAI's API does."""
    if value is None:
        return None
    words = [value] if isinstance(value, str) else value
    if not (isinstance(words, list) and len(words) <= 4 and all(isinstance(w, str) for w in words)):
        raise _invalid("stop", "must be a string or a list of up to 4 strings")
    return words or None


def _boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _invalid(name, f"must be a boolean, got {value!r}")
    return value


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(name, f"must be a number, got {value!r}")
    return float(value)


def _optional_number(body: dict[str, Any], name: str) -> float | None:
    return None if body.get(name) is None else _number(body, name, 0.0)


def _integer(body: dict[str, Any], name: str, default: int) -> int:
    value = _optional_integer(body, name)
    return default if value is None else value


def _optional_integer(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise _invalid(name, f"must be an integer, got {value!r}")
    return value


def _optional_string(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _invalid(name, f"must be a string, got {value!r}")
    return value


def server_error(error: GenerationError, generation: Generation) -> OpenAIError:
    """The server's answer in OpenAI's terms: a refusal of a request field (`RequestError.from_wire`) is a 400 naming
    the OpenAI parameter the client sent for it; UNAVAILABLE (queue full, model unloaded while draining, server down)
    is a 503."""
    refusal = RequestError.from_wire(error.message)
    if refusal is not None and refusal.status == INVALID_ARGUMENT:
        param = generation.param_of(refusal.field) if refusal.field else None
        return OpenAIError(400, f"{param}: {refusal.message}" if param else error.message, param=param,
                           code="invalid_value")
    if (refusal is not None or error.status == _GRPC_UNAVAILABLE or "unknown model" in error.message
            or "is not ready" in error.message):
        return OpenAIError(503, f"the server is unavailable: {error.message}", code="service_unavailable")
    return OpenAIError(500, error.message, code="server_error")


# ---------------------------------------------------------------------------------------------
# gRPC streams on the event loop


class Channel:
    """The front's gRPC connection to the server: tritonclient's asyncio client, made on first use in the event loop
    that serves the requests (a gRPC channel belongs to its loop). Every request is a stream of its own on it (HTTP/2
    multiplexes them), so cancelling one call cancels that request alone."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.headers = grpc_metadata(upstream.headers)
        self._client: grpcaio.InferenceServerClient | None = None

    @property
    def client(self) -> grpcaio.InferenceServerClient:
        if self._client is None:
            options = grpc_options(self.upstream.tls, [("grpc.max_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS)])
            self._client = grpcaio.InferenceServerClient(self.upstream.url, **options)
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def chunks(self, arrays: Mapping[str, np.ndarray]) -> AsyncIterator[Chunk]:
        """One request's chunks, sent as `arrays` (the contract's request), until the server ends its stream;
        GenerationError when the server reports an error or cannot be reached. The request is the stream's only
        one, so the stream is half-closed once it is sent, and the server ends the stream after the request's last
        response. Leaving early (the generator closed, or its task cancelled: the HTTP client left) cancels the
        call, and with it the request on the server."""
        inputs = [_infer_input(name, value) for name, value in arrays.items()]

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": ENTRY, "inputs": inputs}

        try:
            call = self.client.stream_infer(requests(), headers=self.headers)
        except InferenceServerException as error:
            raise GenerationError.from_triton(error) from None
        ended = False
        try:
            async for result, error in call:
                if error is not None:
                    raise GenerationError.from_triton(error)
                chunk = response_chunk({o.name: result.as_numpy(o.name) for o in result.get_response().outputs})
                if chunk is not None:
                    yield chunk
            ended = True
        except grpc.aio.AioRpcError as error:  # the stream failed: no connection, TLS, a header the server requires
            raise GenerationError(str(error.code()), error.details() or "") from None
        finally:
            if not ended:
                call.cancel()


def _infer_input(name: str, value: np.ndarray) -> InferInput:
    tensor = InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


async def chunks_of(channel: Channel, generation: Generation) -> AsyncIterator[Chunk]:
    """The request's chunks; leaving early (a closed or cancelled generator: the HTTP client left) cancels it. A
    refusal, the front's (a value its tensor cannot hold: a seed above 2**64) or the server's, is an OpenAIError."""
    try:
        arrays = request_arrays(generation.prompt, generation.params, stream=True)
    except RequestError as exc:
        raise _invalid(generation.param_of(exc.field) or exc.field, exc.message) from None
    async with contextlib.aclosing(channel.chunks(arrays)) as chunks:
        try:
            async for chunk in chunks:
                yield chunk
        except GenerationError as error:
            raise server_error(error, generation) from None


# ---------------------------------------------------------------------------------------------
# Responses


@dataclass
class Totals:
    """What the chunks of a request add up to (counters are cumulative, per-step lists concatenate)."""

    num_output_tokens: int = 0
    accepted: int = 0
    drafted: int = 0
    verify_steps: int = 0
    target_forwards: int = 0
    finish_reason: str | None = None

    def add(self, chunk: Chunk) -> None:
        self.num_output_tokens, self.target_forwards = chunk.num_output_tokens, chunk.target_forwards
        self.accepted += sum(chunk.accepted_per_step)
        self.drafted += sum(chunk.draft_len_per_step)
        self.verify_steps += len(chunk.accepted_per_step)
        self.finish_reason = chunk.finish_reason or self.finish_reason

    def usage(self, prompt_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": self.num_output_tokens,
                "total_tokens": prompt_tokens + self.num_output_tokens}

    def speculation(self) -> dict[str, Any]:
        """The `adaflash` object: tau counts committed tokens per verify step, bonus included, as the client
        library's Completion.tau does."""
        steps = self.verify_steps
        return {"tau": (self.num_output_tokens - 1) / steps if steps else None, "verify_steps": steps,
                "target_forwards": self.target_forwards, "draft_tokens": self.drafted,
                "accepted_draft_tokens": self.accepted,
                "acceptance_rate": self.accepted / self.drafted if self.drafted else None}


class Answer:
    """The OpenAI objects of one request: ids, names and the shape of a choice per route."""

    def __init__(self, generation: Generation, model: str) -> None:
        self.chat, self.model = generation.chat, model
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _object(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, text: str, totals: Totals, prompt_tokens: int,
              tokens: list[TokenLogprob] | None = None) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": self.logprobs(tokens), "finish_reason": totals.finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": self.logprobs(tokens), "finish_reason": totals.finish_reason}
        return {**self._object("chat.completion" if self.chat else "text_completion", [choice]),
                "usage": totals.usage(prompt_tokens), "adaflash": totals.speculation()}

    def delta(self, delta: dict[str, Any] | str, finish_reason: str | None = None,
              tokens: list[TokenLogprob] | None = None) -> dict[str, Any]:
        """A stream chunk with one choice: a chat `delta` object, or a completion's text."""
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": self.logprobs(tokens), "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": self.logprobs(tokens), "finish_reason": finish_reason}
        return self._object("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def logprobs(self, tokens: list[TokenLogprob] | None) -> dict[str, Any] | None:
        """OpenAI's logprobs object of `tokens` (None: not asked for). No alternatives are listed (only 0 is
        accepted): chat's `top_logprobs` are empty, and completions' hold the chosen token, which OpenAI's legacy
        format always includes."""
        if tokens is None:
            return None
        if self.chat:
            return {"content": [{"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode()),
                                 "top_logprobs": []} for t in tokens], "refusal": None}
        return {"tokens": [t.text for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [{t.text: t.logprob} for t in tokens], "text_offset": [t.offset for t in tokens]}

    def usage_chunk(self, totals: Totals, prompt_tokens: int) -> dict[str, Any]:
        return {**self._object("chat.completion.chunk" if self.chat else "text_completion", []),
                "usage": totals.usage(prompt_tokens), "adaflash": totals.speculation()}


def sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


async def stream_events(answer: Answer, first: Chunk | None, rest: AsyncIterator[Chunk], generation: Generation,
                        prompt_tokens: int, logprobs: TokenLogprobs | None = None) -> AsyncIterator[str]:
    """Server-sent events: a chunk per server response, the finishing chunk (with the `adaflash` object), the usage
    chunk when asked for, `[DONE]`. An error after the first event is sent as an error event. `logprobs`: when
    asked for, each text's tokens go with it."""
    totals = Totals()
    usage_field = {"usage": None} if generation.include_usage else {}
    try:
        if answer.chat:
            yield sse({**answer.delta({"role": "assistant", "content": ""}), **usage_field})
        chunk, stops = first, StopTrimmer(generation.params.stop_words)
        while chunk is not None:
            totals.add(chunk)
            if logprobs is not None:
                logprobs.add(chunk)
            if event := _content(answer, stops.text(chunk.text, final=False), logprobs, stops):
                yield sse({**event, **usage_field})
            chunk = await anext(rest, None)
        if event := _content(answer, stops.text("", final=True), logprobs, stops):
            yield sse({**event, **usage_field})
    except OpenAIError as error:
        yield sse(error.body())
        yield sse("[DONE]")
        return
    finally:
        await rest.aclose()
    yield sse({**answer.delta({} if answer.chat else "", totals.finish_reason), **usage_field,
               "adaflash": totals.speculation()})
    if generation.include_usage:
        yield sse(answer.usage_chunk(totals, prompt_tokens))
    yield sse("[DONE]")


def _content(answer: Answer, text: str, logprobs: TokenLogprobs | None, stops: StopTrimmer) -> dict[str, Any] | None:
    """A stream chunk with the next text (what `stops` let through) and its tokens' log-probabilities; None when it
    would carry neither."""
    tokens = None if logprobs is None else logprobs.take(text, cut=stops.stopped)
    if not text and not tokens:
        return None
    return answer.delta({"content": text} if answer.chat else text, tokens=tokens)


@dataclass(frozen=True)
class TokenLogprob:
    text: str  # what the token adds to the output's text
    logprob: float
    offset: int  # where that text starts in the output's


class TokenLogprobs:
    """Each output token's text and log-probability (the server's `output_token_ids`, `output_log_probs`), handed out
    with the text they make up.

    A token's text is what it adds to the decoded output (`api.Detokenizer`, token by token, as the server
    decodes each response): a token ending inside a multi-byte character adds nothing and the one completing it adds
    the character, so the tokens join to exactly the text. Tokens wait while `StopTrimmer` holds their text back;
    where it cuts the text before a stop string, the token the cut falls inside keeps its text up to the cut and
    the ones after it are dropped.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.detokenizer = Detokenizer(tokenizer)
        self.ids: list[int] = []
        self.pending: deque[tuple[str, float]] = deque()
        self.placed = 0  # characters of the output that tokens handed out make up
        self.sent = 0  # characters of the output sent

    def add(self, chunk: Chunk) -> None:
        """A response's tokens; the last response's last token also adds what was held back (an incomplete
        character)."""
        ids, logprobs = chunk.token_ids or [], chunk.log_probs or []
        for i, (token, logprob) in enumerate(zip(ids, logprobs, strict=True)):
            self.ids.append(token)
            final = chunk.finish_reason is not None and i == len(ids) - 1
            self.pending.append((self.detokenizer.delta(self.ids, len(self.ids) - 1, final), logprob))

    def take(self, text: str, cut: bool) -> list[TokenLogprob]:
        """The tokens of `text`, the output's next piece sent. `cut`: the text ends there, before a stop string: the
        token the cut falls inside keeps its text up to it, and the later ones (those adding nothing at the cut
        begin a character after it) are dropped."""
        self.sent += len(text)
        taken = []
        while self.pending:
            token, logprob = self.pending[0]
            if not (self.placed < self.sent if cut else self.placed + len(token) <= self.sent):
                break
            self.pending.popleft()
            token = token[:self.sent - self.placed]
            taken.append(TokenLogprob(token, logprob, self.placed))
            self.placed += len(token)
        if cut:
            self.pending.clear()
        return taken


# ---------------------------------------------------------------------------------------------
# The application


class Front:
    """The routes over one server: the target's description and the gRPC channel to it."""

    def __init__(self, upstream: Upstream, target: Target) -> None:
        self.target = target
        self.channel = Channel(upstream)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.target.name, "object": "model", "created": 0,
                                                         "owned_by": "adaflash"}]})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(document(self.target.name))

    async def completions(self, request: Request) -> Response:
        return await self._answer(request, completion_generation)

    async def chat_completions(self, request: Request) -> Response:
        return await self._answer(request, chat_generation)

    async def _answer(self, request: Request, translate: Callable[[dict[str, Any], Target], Generation]) -> Response:
        """The first chunk (or the server's refusal) comes before the response starts, so a refused request gets
        its 400 or 503 status rather than an error inside a 200 stream."""
        try:
            generation = translate(await _json_body(request), self.target)
            too_long = self.target.too_long(generation.values())
            if too_long is not None:
                param = generation.param_of("text_input")
                raise OpenAIError(400, f"{param}: {too_long}", param=param, code="invalid_value")
            # Tokenising is CPU work: on a thread of its own, so that the loop goes on serving the other requests.
            prompt_tokens = await asyncio.to_thread(self._prompt_tokens, generation)
            chunks = chunks_of(self.channel, generation)
            first = await _unless_disconnected(request, anext(chunks, None))
            answer = Answer(generation, self.target.name)
            logprobs = TokenLogprobs(self.target.tokenizer) if generation.logprobs else None
            if generation.stream:
                return StreamingResponse(stream_events(answer, first, chunks, generation, prompt_tokens, logprobs),
                                         media_type="text/event-stream")
            return JSONResponse(await _unless_disconnected(request, _whole(answer, first, chunks, generation,
                                                                           prompt_tokens, logprobs)))
        except OpenAIError as error:
            return error.response()

    def _prompt_tokens(self, generation: Generation) -> int:
        """The server refuses what cannot be rendered or tokenised, naming the field: leave that answer to it."""
        try:
            return self.target.prompt_tokens(generation.values())
        except ValueError:
            return 0


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OpenAIError(400, f"the request body is not JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object", code="invalid_json")
    return body


async def _whole(answer: Answer, first: Chunk | None, rest: AsyncIterator[Chunk], generation: Generation,
                 prompt_tokens: int, logprobs: TokenLogprobs | None = None) -> dict:
    totals, texts = Totals(), []
    async with contextlib.aclosing(rest):
        chunk = first
        while chunk is not None:
            totals.add(chunk)
            texts.append(chunk.text)
            if logprobs is not None:
                logprobs.add(chunk)
            chunk = await anext(rest, None)
    stops = StopTrimmer(generation.params.stop_words)
    text = stops.text("".join(texts), final=True)
    return answer.whole(text, totals, prompt_tokens,
                        None if logprobs is None else logprobs.take(text, cut=stops.stopped))


class StopTrimmer:
    """OpenAI's stop semantics over the server's: the server ends the output with the token that completes a stop
    string, and OpenAI's text ends before the stop string. So the text is cut where a stop string begins, and a
    stream holds back a tail that could still begin one until the next text shows it does not."""

    def __init__(self, stops: list[str] | None) -> None:
        self.stops = [w for w in stops or [] if w]
        self.held = ""
        self.stopped = False

    def text(self, delta: str, final: bool) -> str:
        """What may be sent of the text so far given `delta`, the text the server sent since."""
        if self.stopped:
            return ""
        text, self.held = self.held + delta, ""
        found = [i for w in self.stops if (i := text.find(w)) >= 0]
        if found:
            self.stopped = True
            return text[:min(found)]
        if final:
            return text
        keep = len(text) - self._open_tail(text)
        self.held = text[keep:]
        return text[:keep]

    def _open_tail(self, text: str) -> int:
        """The length of the longest tail of `text` that a stop string begins with."""
        return max((n for w in self.stops for n in range(min(len(w) - 1, len(text)), 0, -1)
                    if text.endswith(w[:n])), default=0)


async def _unless_disconnected(request: Request, work: Any) -> Any:
    """`work`'s result; cancelled (its generator closed, so the gRPC request with it) when the HTTP client
    disconnects first. A streaming response watches for this itself once it has started."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise OpenAIError(499, "the client disconnected", code="client_closed_request")
    return task.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and wrong methods in OpenAI's error format too."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = f"{request.method} {request.url.path}: {exc.detail if isinstance(exc, HTTPException) else exc}"
    return OpenAIError(status, message, code="not_found" if status == 404 else None).response()


class ApiKeyGuard:
    """Every route requires `Authorization: Bearer <key>`; others get OpenAI's 401. A plain ASGI middleware, not
    Starlette's BaseHTTPMiddleware, which would stand between a streaming response and the disconnect it watches."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.refusal(Headers(scope=scope).get("authorization")) if scope["type"] == "http" else None
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, authorization: str | None) -> Response | None:
        """None for the right key; else the 401 OpenAI answers (compared in constant time: no key by timing)."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        if not authorization:
            error = OpenAIError(401, "You didn't provide an API key: send it as `Authorization: Bearer <key>`")
        elif scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.key):
            return None
        else:
            error = OpenAIError(401, "Incorrect API key provided", code="invalid_api_key")
        response = error.response()
        response.headers["WWW-Authenticate"] = "Bearer"
        return response


class BodyLimit:
    """A request body over `limit` bytes is refused with OpenAI's 413 as soon as that is known: from its
    Content-Length before any of it is kept, else once the bytes received pass the limit. A plain ASGI middleware;
    the body it read is handed on to the route as it came.

    Before it answers, the rest of the body is read and dropped (for at most DRAIN_S and DRAIN_BYTES, as web servers'
    lingering close does): a client sends its whole body before it reads the answer, and a connection closed under
    it would reach it as a reset, not as the 413. Reading is awaited chunk by chunk, so other requests go on."""

    DRAIN_S = 5.0
    DRAIN_BYTES = 256 * MIB

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._drain(receive, more=True)
            await self.refusal(int(declared))(scope, receive, send)
            return
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._drain(receive, more=message.get("more_body", False))
                await self.refusal(size, "at least ")(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _drain(self, receive: Receive, more: bool) -> None:
        deadline, dropped = time.monotonic() + self.DRAIN_S, 0
        while more and dropped <= self.DRAIN_BYTES and (left := deadline - time.monotonic()) > 0:
            try:
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                return
            if message["type"] != "http.request":
                return
            dropped += len(message.get("body", b""))
            more = message.get("more_body", False)

    def refusal(self, size: int, at_least: str = "") -> Response:
        return OpenAIError(413, f"the request body of {at_least}{size} bytes exceeds the limit of {self.limit} "
                                f"(--max-request-bytes)", code="request_too_large").response()


def create_app(upstream: Upstream, target: Target, api_key: str | None = None,
               max_request_bytes: int | None = None) -> Starlette:
    front = Front(upstream, target)
    routes = [Route("/openapi.json", front.openapi, methods=["GET"]),
              Route("/v1/models", front.models, methods=["GET"]),
              Route("/v1/completions", front.completions, methods=["POST"]),
              Route("/v1/chat/completions", front.chat_completions, methods=["POST"])]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await front.channel.close()

    limit = [Middleware(BodyLimit, limit=max_request_bytes or target.body_limit())]
    guard = [Middleware(ApiKeyGuard, key=api_key)] if api_key else []
    return Starlette(routes=routes, middleware=guard + limit, exception_handlers={HTTPException: _http_error},
                     lifespan=lifespan)


def https_options(tls: ServerTls | None) -> dict[str, Any]:
    """uvicorn's TLS settings: the certificate, and client certificates required when a client CA is named."""
    if tls is None:
        return {}
    options = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    if tls.mutual:
        options.update(ssl_ca_certs=str(tls.client_ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def front_url(host: str, port: int, tls: ServerTls | None) -> str:
    return f"{'https' if tls else 'http'}://{host}:{port}/v1"


class FrontServer:
    """The front on a port of `host`, served by uvicorn in a thread: `adaflash serve` starts it once Triton is
    ready and stops it on shutdown. `grpc_tls` and `headers`: how it reaches the server (`Upstream`); `https`:
    the TLS it serves; `api_key`: the key every request must carry."""

    def __init__(self, grpc_url: str, host: str, port: int, served_model_name: str | None = None, *,
                 grpc_tls: Tls | None = None, headers: dict[str, str] | None = None, https: ServerTls | None = None,
                 api_key: str | None = None, max_request_bytes: int | None = None) -> None:
        upstream = Upstream(grpc_url, grpc_tls, headers)
        app = create_app(upstream, describe_target(upstream, served_model_name), api_key, max_request_bytes)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    timeout_graceful_shutdown=5, **https_options(https)))
        self.url = front_url(host, port, https)
        self._thread = threading.Thread(target=self.server.run, name="openai-front", daemon=True)

    def start(self, timeout_s: float = 30.0) -> FrontServer:
        """Return once uvicorn listens; RuntimeError when it failed to (the port taken) or is not up in time."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI endpoint did not start on {self.url}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)


def add_body_limit_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-request-bytes", type=byte_size, help="refuse a larger request body with 413 (default: room "
                   "for the longest prompt the server takes, escaped, plus 1 MiB)")


def register(sub: argparse._SubParsersAction) -> None:
    """The `adaflash openai-front` command (entry point `adaflash.commands`)."""
    p = sub.add_parser("openai-front", help="serve the OpenAI-compatible HTTP endpoint in front of a running server")
    p.add_argument("--grpc-url", default="127.0.0.1:8001", help="the running server's gRPC address")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--served-model-name", help="the model name clients send (default: the model folder's name)")
    add_body_limit_argument(p)
    add_api_key_argument(p)
    add_tls_arguments(p.add_argument_group("HTTPS (this endpoint)"), own_clients=False)
    add_connection_arguments(p.add_argument_group("the server's gRPC endpoint (TLS, headers)"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    https = server_tls_from_args(args)
    upstream = Upstream(args.grpc_url, tls_from_args(args), headers_from_args(args) or None)
    app = create_app(upstream, describe_target(upstream, args.served_model_name), api_key_from_args(args),
                     args.max_request_bytes)
    print(f"OpenAI-compatible endpoint on {front_url(args.host, args.port, https)} (gRPC {args.grpc_url})",
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", **https_options(https))
    return 0
