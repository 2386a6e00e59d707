"""Property-based fuzzing of both front doors: generated requests, well formed and not, to the OpenAI endpoint and
to the `adaflash` model over gRPC, drawn by hypothesis from the request fields (`adaflash_contract.wire.FIELDS`) and the
OpenAI front's parameters (`adaflash_server.openai_schema`, the table its OpenAPI document is made from).

What must hold whatever is sent: every request gets an answer (none hangs), no answer is a server error (HTTP 5xx
other than 503; over gRPC an internal error or a failed generation), and once the traffic stops nothing is leaked
(no running or queued sequence, no cache slot held) and the server answers a plain request as before. Traffic goes to
loopback only and is bounded in count; `make test` runs a short run (tests/integration/test_reliability_served.py),
`make soak` a long one (`reliability.py`, scenario `fuzz`).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaflash_contract.modes import MODE_NAMES
from adaflash_contract.wire import FIELDS
from adaflash_server.openai_schema import PARAMETERS

ANSWER_S = 120.0  # a request without an answer after this long counts as hung
MAX_TOKENS = 8  # the most a generated valid request asks for: the fuzz is about input, not load
OPENAI_PARAMS = tuple(sorted({p.name for p in PARAMETERS}))  # both routes' (a route's own, sent to the other, is unknown)
NUMPY = {"BOOL": np.bool_, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BYTES": np.object_}

# Values of any JSON type, wild ones included: what a client may put in any field.
_texts = st.text(max_size=40)
_numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                     st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64, 1e308, -1e308, 0.5, 1.0001]))
_json_any = st.recursive(st.one_of(st.none(), st.booleans(), _numbers, _texts),
                         lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                 st.dictionaries(_texts, inner, max_size=3)), max_leaves=6)


def _plausible(name: str) -> st.SearchStrategy:
    """Values near what a field takes, edges and neighbours of its range included."""
    return {
        "prompt": st.one_of(_texts, st.lists(_texts, max_size=2)),
        "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "x"]),
                                                    "content": _texts}), max_size=3),
        "max_tokens": st.integers(-2, MAX_TOKENS), "max_completion_tokens": st.integers(-2, MAX_TOKENS),
        "temperature": st.floats(-1, 3), "top_p": st.floats(-0.5, 1.5), "seed": st.integers(-5, 2**65),
        "stop": st.one_of(_texts, st.lists(_texts, max_size=5)), "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "logprobs": st.one_of(st.booleans(), st.integers(-1, 3)), "top_logprobs": st.integers(-1, 3),
        "n": st.integers(0, 3), "spec_mode": st.sampled_from([*MODE_NAMES, "eagle", ""]),
        "min_tokens": st.integers(-2, MAX_TOKENS), "presence_penalty": st.floats(-3, 3),
        "frequency_penalty": st.floats(-3, 3), "repetition_penalty": st.floats(-1, 3), "top_k": st.integers(-2, 50),
        "max_draft": st.integers(-2, 20), "chat_template_kwargs": st.dictionaries(_texts, st.booleans(), max_size=2),
    }.get(name, _json_any)


@st.composite
def openai_requests(draw: st.DrawFn, model: str) -> tuple[str, bytes]:
    """(route, body): a body of some of the OpenAI parameters, each plausible or any JSON value, an unknown key now
    and then, or bytes that are not a JSON object at all."""
    route = draw(st.sampled_from(["completions", "chat/completions"]))
    if draw(st.integers(0, 19)) == 0:
        return route, draw(st.one_of(st.binary(max_size=64), st.just(b"[]"), st.just(b"{"), st.just(b'"x"')))
    names = draw(st.lists(st.sampled_from(OPENAI_PARAMS), unique=True, max_size=8))
    body: dict[str, Any] = {"model": model, "max_tokens": 4}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if route == "chat/completions" else {"prompt": "hi"})
    for name in names:
        body[name] = draw(st.one_of(_plausible(name), _json_any) if draw(st.booleans()) else _plausible(name))
    if draw(st.integers(0, 9)) == 0:
        body[draw(_texts)] = draw(_json_any)
    return route, json.dumps(body, allow_nan=False).encode()


def _grpc_value(datatype: str) -> st.SearchStrategy:
    """A [1, 1] array of `datatype` with any value its type holds (BYTES: any bytes)."""
    values = {"BOOL": st.booleans(), "INT32": st.integers(-2**31, 2**31 - 1), "UINT64": st.integers(0, 2**64 - 1),
              "FP32": st.floats(width=32), "BYTES": st.one_of(st.binary(max_size=40), _texts.map(str.encode))}[datatype]
    return values.map(lambda v: (datatype, np.array([[v]], dtype=NUMPY[datatype])))


@st.composite
def grpc_requests(draw: st.DrawFn) -> dict[str, tuple[str, np.ndarray]]:
    """Inputs of the `adaflash` model: a valid request's, with some fields added or replaced by any value of their
    type, now and then of another type, or the required ones missing."""
    tensors = {"text_input": ("BYTES", np.array([[b"hi"]], dtype=np.object_)),
               "max_tokens": ("INT32", np.array([[4]], dtype=np.int32))}
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), unique=True, max_size=6)):
        datatype = FIELDS[name].datatype
        if draw(st.integers(0, 9)) == 0:
            datatype = draw(st.sampled_from(sorted(NUMPY)))
        tensors[name] = draw(_grpc_value(datatype))
    if draw(st.integers(0, 14)) == 0:
        tensors.pop(draw(st.sampled_from(["text_input", "max_tokens"])))
    _, max_tokens = tensors.get("max_tokens", ("", None))
    if max_tokens is not None and max_tokens.dtype == np.int32 and max_tokens.flat[0] > MAX_TOKENS:
        tensors["max_tokens"] = ("INT32", np.array([[MAX_TOKENS]], dtype=np.int32))  # input, not load
    return tensors


def send_openai(url: str, route: str, body: bytes) -> tuple[int | None, str]:
    """(HTTP status, the body's start); None for no answer in ANSWER_S."""
    request = urllib.request.Request(f"{url}/{route}", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_S) as response:
            return response.status, response.read().decode(errors="replace")[:200]
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")[:200]
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def server_error_over_grpc(refused: bool, message: str) -> bool:
    """A gRPC answer that is the server's fault: an internal error, a failed generation, or none at all."""
    return message == "no answer" or (refused and ("INTERNAL" in message or "generation failed" in message
                                                   or "internal error" in message or "Traceback" in message))


def run(front_url: str, send_grpc: Callable[[dict], tuple[bool, str]], requests: int) -> dict:
    """`requests` generated requests, half to each front door: the OpenAI front at `front_url`, the `adaflash` model
    through `send_grpc(tensors) -> (refused, message)`. The same requests on every run (derandomized)."""
    statuses: Counter = Counter()
    failing: list[dict] = []
    model = served_name(front_url)

    def record(door: str, outcome: str, bad: bool, detail: str) -> None:
        statuses[f"{door} {outcome}"] += 1
        if bad and len(failing) < 20:
            failing.append({"door": door, "outcome": outcome, "detail": detail})

    @settings(max_examples=math.ceil(requests / 2), database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one_of_each(data: st.DataObject) -> None:
        route, body = data.draw(openai_requests(model))
        status, text = send_openai(front_url, route, body)
        record("openai", str(status), status is None or (status >= 500 and status != 503),
               f"{route} {body[:300]!r} -> {text}")
        tensors = data.draw(grpc_requests())
        refused, message = send_grpc(tensors)
        record("grpc", "refused" if refused else "answered", server_error_over_grpc(refused, message),
               f"{ {k: v[1].tolist() for k, v in tensors.items()} } -> {message[:200]}")

    one_of_each()
    return {"requests": sum(statuses.values()), "outcomes": dict(sorted(statuses.items())), "failing": failing}


def served_name(front_url: str) -> str:
    """The model name the front serves (`GET /v1/models`)."""
    with urllib.request.urlopen(f"{front_url}/models", timeout=30) as response:
        return json.loads(response.read())["data"][0]["id"]
