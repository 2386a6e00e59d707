"""The OpenAI-compatible front's request parameters, and the OpenAPI document it publishes (`GET /openapi.json`).

Why one table: the parameters a route takes, their JSON types and the values accepted for the parameters the server
cannot honour live here once; the front refuses what is not in it (`openai_front._check_fields`) and the document
says the same to a client generator or a fuzzer (schemathesis, or `adaflash_tools.fuzz`). A parameter's type here is
what the front checks; its range (the output limit, the prompt's length, a mode's name) is the server's to check,
and its refusal names the parameter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from adaflash_contract.modes import MODE_NAMES

COMPLETIONS, CHAT = "completions", "chat"
BOTH = frozenset({COMPLETIONS, CHAT})
MOST_COMPLETION_LOGPROBS, MOST_TOP_LOGPROBS = 5, 20  # OpenAI's limits of /v1/completions' and chat's counts
MOST_STOP_WORDS = 4  # OpenAI's limit


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """The front reads a null as the parameter left out (OpenAI's SDKs send some so)."""
    return {"anyOf": [schema, {"type": "null"}]}


_INTEGER, _NUMBER = _nullable({"type": "integer"}), _nullable({"type": "number"})
_STRING, _BOOLEAN, _OBJECT = _nullable({"type": "string"}), _nullable({"type": "boolean"}), _nullable({"type": "object"})
_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"enum": ["system", "developer", "user", "assistant"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {
        "type": "object", "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]},
}, "additionalProperties": False}


@dataclass(frozen=True)
class Parameter:
    """A request parameter of the routes in `routes`. `no_op`: for a parameter the server lacks, the only values
    accepted (OpenAI's defaults), so that a client learns its setting had no effect rather than losing it silently."""

    name: str
    schema: dict[str, Any]
    description: str
    routes: frozenset[str] = BOTH
    required: bool = False
    no_op: tuple[Any, ...] | None = None

    def accepts_as_no_op(self, value: Any) -> bool:
        """`value` is one of the no-op values, of the same JSON type (`True` is not `1`)."""
        return any(value == v and type(value) is type(v) for v in self.no_op or ())

    def json_schema(self) -> dict[str, Any]:
        if self.no_op is not None:
            return {"enum": list(self.no_op), "description": self.description}
        return self.schema | {"description": self.description}


def _no_op(name: str, *values: Any) -> Parameter:
    shown = " or ".join(json.dumps(v) for v in values)
    return Parameter(name, {}, f"Not supported: accepted only as {shown}.", no_op=values)


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("model", {"type": "string"}, "The served model's name (`GET /v1/models`).", required=True),
    Parameter("prompt", {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"},
                                                         "minItems": 1, "maxItems": 1}]},
              "One prompt (a list of one string is taken too); a batch or token ids are not supported.",
              frozenset({COMPLETIONS}), required=True),
    Parameter("messages", {"type": "array", "minItems": 1, "items": _MESSAGE},
              "The conversation, rendered in the target's chat template; the last message is the user's.",
              frozenset({CHAT}), required=True),
    Parameter("max_tokens", _INTEGER, "The most tokens to generate (completions: 16 by default; chat: the server's "
                                      "output limit)."),
    Parameter("max_completion_tokens", _INTEGER, "As max_tokens; wins over it.", frozenset({CHAT})),
    Parameter("stream", _BOOLEAN, "Server-sent events, a chunk per response of the server."),
    Parameter("stream_options", _nullable({"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                                           "additionalProperties": False}),
              "With stream: include_usage adds a last chunk with the token counts."),
    Parameter("temperature", _NUMBER, "Sampling temperature; 0 is greedy (1 by default, as OpenAI's)."),
    Parameter("top_p", _NUMBER, "Nucleus sampling (1 by default)."),
    Parameter("top_k", _INTEGER, "The k likeliest tokens only (0: all); vLLM's extension."),
    Parameter("seed", _INTEGER, "The sampler's seed: the same request and seed give the same text."),
    Parameter("stop", _nullable({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"},
                                                                "maxItems": MOST_STOP_WORDS}]}),
              f"Up to {MOST_STOP_WORDS} strings; the text ends before the first one generated."),
    Parameter("presence_penalty", _NUMBER, "OpenAI's presence penalty."),
    Parameter("frequency_penalty", _NUMBER, "OpenAI's frequency penalty."),
    Parameter("repetition_penalty", _NUMBER, "A multiplicative repetition penalty; vLLM's extension."),
    Parameter("min_tokens", _INTEGER, "The fewest tokens to generate before an end token; vLLM's extension."),
    Parameter("spec_mode", _nullable({"type": "string", "examples": list(MODE_NAMES)}),
              f"The decoding mode, one of the served modes ({', '.join(MODE_NAMES)}); the server's default when left "
              "out. Every mode gives the text plain decoding gives."),
    Parameter("max_draft", _INTEGER, "The most draft tokens verified per step."),
    Parameter("user", _STRING, "An end user's id (accepted, not used)."),
    Parameter("logprobs", _nullable({"type": "integer", "minimum": 0, "maximum": MOST_COMPLETION_LOGPROBS}),
              "Each token's log-probability; only 0 alternatives per token.", frozenset({COMPLETIONS})),
    Parameter("logprobs", _BOOLEAN, "Each token's log-probability.", frozenset({CHAT})),
    Parameter("top_logprobs", _nullable({"type": "integer", "minimum": 0, "maximum": MOST_TOP_LOGPROBS}),
              "Alternatives per token: only 0.", frozenset({CHAT})),
    Parameter("chat_template_kwargs", _OBJECT, "Variables of the chat template (vLLM's extension).",
              frozenset({CHAT})),
    _no_op("n", 1), _no_op("best_of", 1), _no_op("echo", False), _no_op("suffix", "", None),
    _no_op("logit_bias", None, {}), _no_op("tools", None, []), _no_op("tool_choice", "none", None),
    _no_op("parallel_tool_calls", None), _no_op("functions", None, []), _no_op("function_call", "none", None),
    _no_op("response_format", None, {"type": "text"}),
)


def parameters(route: str) -> dict[str, Parameter]:
    """The parameters `route` (COMPLETIONS or CHAT) takes, by name."""
    return {p.name: p for p in PARAMETERS if route in p.routes}


def request_schema(route: str) -> dict[str, Any]:
    """The JSON schema of a request body of `route`: no property beyond the table's."""
    params = parameters(route)
    return {"type": "object", "properties": {n: p.json_schema() for n, p in params.items()},
            "required": [n for n, p in params.items() if p.required], "additionalProperties": False}


_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"], "description": "The request parameter at fault."},
                   "code": {"type": ["string", "null"]}}}}}
_USAGE = {"type": "object", "properties": {n: {"type": "integer"} for n in
                                           ("prompt_tokens", "completion_tokens", "total_tokens")}}
_ANSWERS = {
    COMPLETIONS: {"type": "object", "required": ["id", "object", "model", "choices"], "properties": {
        "id": {"type": "string"}, "object": {"const": "text_completion"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "usage": _USAGE, "choices": {"type": "array", "items": {
            "type": "object", "properties": {"index": {"type": "integer"}, "text": {"type": "string"},
                                             "finish_reason": {"type": ["string", "null"]}}}}}},
    CHAT: {"type": "object", "required": ["id", "object", "model", "choices"], "properties": {
        "id": {"type": "string"}, "object": {"const": "chat.completion"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "usage": _USAGE, "choices": {"type": "array", "items": {
            "type": "object", "properties": {
                "index": {"type": "integer"}, "finish_reason": {"type": ["string", "null"]},
                "message": {"type": "object", "properties": {"role": {"const": "assistant"},
                                                             "content": {"type": "string"}}}}}}}},
}
_REFUSALS = {"400": "A parameter refused, named in error.param.", "401": "No or a wrong API key.",
             "404": "Another model than the served one.",
             "413": "The body is over the limit (--max-request-bytes).",
             "503": "The server is unavailable or its queue full; try again."}


def _route(route: str, summary: str, example: dict[str, Any]) -> dict[str, Any]:
    name = "Completion" if route == COMPLETIONS else "ChatCompletion"
    return {"post": {
        "summary": summary, "operationId": f"create{name}",
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{name}Request"}, "example": example}}},
        "responses": {"200": {"description": "The answer; with stream, server-sent events (chunks, then [DONE]).",
                              "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}},
                                          "text/event-stream": {"schema": {"type": "string"}}}},
                      **{code: {"description": why, "content": {"application/json": {
                          "schema": {"$ref": "#/components/schemas/Error"}}}} for code, why in _REFUSALS.items()}}}}


def document(model: str, version: str = "1") -> dict[str, Any]:
    """The OpenAPI 3.1 document of the front serving `model`."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "AdaFlash OpenAI-compatible endpoint", "version": version,
                 "description": "Completions and chat completions through the server's adaflash model: the same "
                                "admission, decoding and text as its gRPC stream."},
        "paths": {
            "/v1/models": {"get": {"summary": "The served model", "operationId": "listModels", "responses": {
                "200": {"description": "One model.", "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"object": {"const": "list"}, "data": {"type": "array"}}}}}},
                "401": {"description": _REFUSALS["401"]}}}},
            "/v1/completions": _route(COMPLETIONS, "Complete a prompt",
                                      {"model": model, "prompt": "def fibonacci(n):", "max_tokens": 16}),
            "/v1/chat/completions": _route(CHAT, "Answer a conversation", {
                "model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}),
        },
        "components": {"schemas": {"CompletionRequest": request_schema(COMPLETIONS),
                                   "ChatCompletionRequest": request_schema(CHAT),
                                   "Completion": _ANSWERS[COMPLETIONS], "ChatCompletion": _ANSWERS[CHAT],
                                   "Error": _ERROR}},
    }
