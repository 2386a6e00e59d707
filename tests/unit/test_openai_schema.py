"""The OpenAI front's OpenAPI document against the front itself: a valid OpenAPI 3.1 document whose request schemas
accept what the front accepts and refuse what it refuses by type, parameter by parameter (the document served by a
live front: tests/integration/test_openai_served.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openapi_spec_validator import validate

from adaflash_server.openai_front import OpenAIError, Target, chat_generation, completion_generation
from adaflash_server.openai_schema import CHAT, COMPLETIONS, PARAMETERS, document, parameters

MODEL = "default"
TARGET = Target(MODEL, max_output_tokens=64)
TRANSLATE = {COMPLETIONS: completion_generation, CHAT: chat_generation}
BASE = {COMPLETIONS: {"model": MODEL, "prompt": "hi"},
        CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}}
# Values of every JSON type, and near misses of the parameters' own shapes.
CANDIDATES = [None, True, False, 0, 1, 3, -1, 1.5, "x", "", [], ["x"], ["a", "b", "c", "d", "e"], {}, {"x": 1},
              [{"role": "user", "content": "x"}], [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
              [{"role": "tool", "content": "x"}], {"include_usage": True}, {"type": "text"}, "none"]
ROUTE_PARAMS = [(route, name) for route in (COMPLETIONS, CHAT) for name in parameters(route)]


def _schema(route: str) -> dict:
    doc = document(MODEL)
    name = "CompletionRequest" if route == COMPLETIONS else "ChatCompletionRequest"
    return doc["components"]["schemas"][name]


def _refusal(route: str, body: dict) -> OpenAIError | None:
    try:
        TRANSLATE[route](body, TARGET)
    except OpenAIError as error:
        return error
    return None


def test_the_document_is_valid_openapi_3_1():
    doc = document(MODEL)
    validate(doc)
    assert set(doc["paths"]) == {"/v1/models", "/v1/completions", "/v1/chat/completions"}
    json.dumps(doc, allow_nan=False)  # what the route serves


@pytest.mark.parametrize("route", [COMPLETIONS, CHAT])
def test_each_route_example_is_valid_and_accepted(route):
    path = "/v1/completions" if route == COMPLETIONS else "/v1/chat/completions"
    example = document(MODEL)["paths"][path]["post"]["requestBody"]["content"]["application/json"]["example"]
    jsonschema.validate(example, _schema(route))
    assert _refusal(route, example) is None


@pytest.mark.parametrize("route", [COMPLETIONS, CHAT])
def test_an_unknown_parameter_is_refused_by_both(route):
    body = BASE[route] | {"frobnicate": 1}
    assert not jsonschema.Draft202012Validator(_schema(route)).is_valid(body)
    assert _refusal(route, body).param == "frobnicate"


@pytest.mark.parametrize(("route", "name"), ROUTE_PARAMS)
def test_a_value_the_schema_refuses_the_front_refuses_naming_the_parameter(route, name):
    """Whatever value the document says a parameter cannot take, the front refuses with a 4xx naming it."""
    validator = jsonschema.Draft202012Validator(_schema(route)["properties"][name])
    refused = [v for v in CANDIDATES if not validator.is_valid(v)]
    assert refused, f"{name}: every candidate is valid: the test shows nothing"
    for value in refused:
        error = _refusal(route, BASE[route] | {name: value})
        assert error is not None and error.param == name and 400 <= error.status < 500, (name, value, error)


@pytest.mark.parametrize(("route", "name"), ROUTE_PARAMS)
def test_a_value_the_schema_takes_the_front_takes_or_refuses_only_as_unsupported(route, name):
    """A value of the documented type is never refused for its type; it may be for its meaning (logprobs beyond 0
    alternatives, another model than the served one), saying so."""
    validator = jsonschema.Draft202012Validator(_schema(route)["properties"][name])
    for value in (v for v in CANDIDATES if validator.is_valid(v)):
        body = BASE[route] | {name: value}
        if name == "stream_options":
            body["stream"] = True  # only allowed with stream, as OpenAI's
        error = _refusal(route, body)
        assert error is None or error.code in ("unsupported_parameter", "model_not_found") \
            or (name == "messages" and "last message" in error.message), (name, value, error and error.message)


def test_every_parameter_the_server_cannot_honour_accepts_only_its_no_op_values():
    for param in (p for p in PARAMETERS if p.no_op is not None):
        for value in param.no_op:
            assert _refusal(COMPLETIONS, BASE[COMPLETIONS] | {param.name: value}) is None, (param.name, value)
        error = _refusal(COMPLETIONS, BASE[COMPLETIONS] | {param.name: 2})
        assert (error.param, error.code) == (param.name, "unsupported_parameter")
