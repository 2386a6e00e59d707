"""The OpenAI-compatible endpoint over a real tritonserver, driven by the official `openai` SDK: the same text as
the gRPC stream, streaming with usage, chat through the target's template, stop, seed, logprobs, cancellation, and
OpenAI-format errors naming the field (the server's refusals in OpenAI's terms: tests/unit/test_openai.py)."""

from __future__ import annotations

import itertools
import json
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
from openapi_spec_validator import validate as validate_openapi
import pytest
from helpers import fixed_costs, metric_total, scrape, wait_until

from adaflash.models.bundle import load_bundle, save_bundle, tiny_random_bundle
from adaflash.models.chat_template import CONFIG_FILE
from adaflash.models.tokenizer import load_tokenizer
from adaflash.serving.api import longest_token
from adaflash_server.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationError, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer, free_ports
from adaflash_server.openai_front import FrontServer

QWEN3_CHAT = Path(__file__).parents[1] / "fixtures" / "qwen3_chat"
MODEL = "tiny-qwen3"
PROMPT = "The quick brown fox"
MAX_TOKENS = 16
SYSTEM = {"role": "system", "content": "Answer in one word."}
NO_THINKING = {"enable_thinking": False}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny random target with Qwen3's chat template, served by Triton, with the OpenAI front on a free port."""
    root = tmp_path_factory.mktemp("openai")
    model_dir = save_bundle(tiny_random_bundle(seed=0), root / MODEL)
    shutil.copy(QWEN3_CHAT / CONFIG_FILE, model_dir / "target" / CONFIG_FILE)
    costs = root / "cost.json"
    fixed_costs(16).save(costs)
    cfg = RepositoryConfig(max_active=16, max_batch_size=16, max_len=1024, max_prompt_tokens=400,
                           max_output_tokens=600)
    repo = build_repository(root / "model_repository", model_dir, "drafter", cfg, costs)
    with TritonServer(ServerConfig(model_repository=repo, state_dir=root / "state")) as server:
        front = FrontServer(server.grpc_url, "127.0.0.1", free_ports(1)[0]).start()
        try:
            yield server, front, model_dir
        finally:
            front.stop()


@pytest.fixture(scope="module")
def sdk(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[1].url, api_key="unused", max_retries=0, timeout=120)


def _grpc(served, prompt: str, params: GenerationParams):
    with AdaFlashClient(served[0].grpc_url, timeout_s=120) as client:
        return client.generate_streaming(prompt, params)


def _active_sequences(server) -> float:
    return metric_total(scrape(server.metrics_url), "adaflash_active_sequences")


def test_models_lists_the_served_target(sdk):
    assert [m.id for m in sdk.models.list()] == [MODEL]


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_completion_text_equals_the_grpc_text(served, sdk, mode):
    expected = _grpc(served, PROMPT, GenerationParams(max_tokens=MAX_TOKENS, spec_mode=mode))
    got = sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                 extra_body={"spec_mode": mode})
    assert got.choices[0].text == expected.text
    assert got.choices[0].finish_reason == expected.finish_reason == "length"
    tokenizer = load_bundle(served[2], drafter=None).tokenizer
    prompt_tokens = len(tokenizer.encode(PROMPT).ids)
    assert (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens) == (
        prompt_tokens, MAX_TOKENS, prompt_tokens + MAX_TOKENS)
    stats = got.model_extra["adaflash"]
    assert stats["verify_steps"] == len(expected.accepted_per_step)
    assert stats["accepted_draft_tokens"] == sum(expected.accepted_per_step)
    assert stats["tau"] == pytest.approx(expected.tau)


def test_streamed_completion_with_usage_equals_the_grpc_text(served, sdk):
    expected = _grpc(served, PROMPT, GenerationParams(max_tokens=MAX_TOKENS, spec_mode="dflash"))
    chunks = list(sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                         stream=True, stream_options={"include_usage": True},
                                         extra_body={"spec_mode": "dflash"}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 2 and "".join(texts) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MAX_TOKENS
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].model_extra["adaflash"]["verify_steps"] == len(expected.accepted_per_step)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_is_rendered_in_the_target_template_as_over_grpc(served, sdk, stream):
    params = GenerationParams(max_tokens=MAX_TOKENS, spec_mode="dflash", apply_chat_template=True, messages=[SYSTEM],
                              chat_template_kwargs=NO_THINKING)
    expected = _grpc(served, "Name a colour.", params).text
    plain = _grpc(served, "Name a colour.", GenerationParams(max_tokens=MAX_TOKENS, spec_mode="dflash")).text
    got = sdk.chat.completions.create(
        model=MODEL, messages=[SYSTEM, {"role": "user", "content": "Name a colour."}], temperature=0,
        max_completion_tokens=MAX_TOKENS, stream=stream,
        extra_body={"spec_mode": "dflash", "chat_template_kwargs": NO_THINKING})
    if stream:
        chunks = list(got)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
    else:
        assert got.choices[0].message.role == "assistant"
        text = got.choices[0].message.content
    assert text == expected != plain


def test_stop_cuts_the_text_as_the_server_stop_words_do(served, sdk):
    full = _grpc(served, PROMPT, GenerationParams(max_tokens=MAX_TOKENS)).text
    tokenizer = load_bundle(served[2], drafter=None).tokenizer
    stop = next(c for c in full[4:] if c.isascii() and c.isprintable() and len(tokenizer.encode(c).ids) == 1)
    expected = _grpc(served, PROMPT, GenerationParams(max_tokens=MAX_TOKENS, stop_words=[stop]))
    assert expected.finish_reason == "stop" and len(expected.text) < len(full)
    for value in (stop, [stop]):
        got = sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stop=value)
        assert (got.choices[0].text, got.choices[0].finish_reason) == (expected.text, "stop")


def _stop_of_several_tokens(served, text: str) -> str:
    """Three characters of `text` that the tokenizer spells with more than one token."""
    tokenizer = load_bundle(served[2], drafter=None).tokenizer
    start = next(i for i in range(3, len(text) - 3) if len(tokenizer.encode(text[i:i + 3]).ids) > 1)
    return text[start:start + 3]


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_of_several_tokens_ends_the_text_before_it(served, sdk, stream):
    """OpenAI's semantics: the text ends where the stop string begins, also when a stream had already sent a part of
    it (the front holds back a tail that may begin one)."""
    full = _grpc(served, PROMPT, GenerationParams(max_tokens=MAX_TOKENS)).text
    stop = _stop_of_several_tokens(served, full)
    got = sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                 stop=[stop, "never in this text"], stream=stream)
    if stream:
        events = list(got)
        text, finish = "".join(e.choices[0].text for e in events), events[-1].choices[0].finish_reason
    else:
        text, finish = got.choices[0].text, got.choices[0].finish_reason
    assert (text, finish) == (full[:full.index(stop)], "stop")


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_penalties_and_min_tokens_equal_the_grpc_text(served, sdk, mode):
    params = dict(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.4, min_tokens=8)
    expected = _grpc(served, PROMPT, GenerationParams(max_tokens=MAX_TOKENS, spec_mode=mode, **params)).text
    assert expected != _grpc(served, PROMPT, GenerationParams(max_tokens=MAX_TOKENS, spec_mode=mode)).text
    got = sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                 presence_penalty=0.5, frequency_penalty=0.3,
                                 extra_body={"spec_mode": mode, "repetition_penalty": 1.4, "min_tokens": 8})
    assert got.choices[0].text == expected


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_seed_repeats_sampling_and_equals_the_grpc_sample(served, sdk, mode):
    def sample(seed: int) -> str:
        return sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=1.0,
                                      seed=seed, extra_body={"spec_mode": mode}).choices[0].text

    expected = _grpc(served, PROMPT, GenerationParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=7,
                                                      spec_mode=mode)).text
    assert sample(7) == sample(7) == expected != sample(8)


@pytest.mark.parametrize(("stream", "stop"), [(False, False), (True, False), (True, True)])
def test_completion_logprobs_are_the_grpc_log_probs_of_tokens_joining_to_the_text(served, sdk, stream, stop):
    """OpenAI's legacy format with logprobs 0: the chosen token in `top_logprobs`, offsets into the text; with a stop
    string the tokens end where the text does."""
    expected = _grpc(served, PROMPT, GenerationParams(max_tokens=MAX_TOKENS, spec_mode="dflash",
                                                      return_log_probs=True))
    words = [_stop_of_several_tokens(served, expected.text)] if stop else None
    got = sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=0,
                                 stop=words, stream=stream, extra_body={"spec_mode": "dflash"})
    choices = [e.choices[0] for e in got if e.choices] if stream else got.choices
    text = "".join(c.text for c in choices)
    assert text == (expected.text[:expected.text.index(words[0])] if stop else expected.text)
    pieces = [c.logprobs for c in choices if c.logprobs is not None]
    assert len(pieces) > (2 if stream and not stop else 0)
    tokens, offsets = sum((p.tokens for p in pieces), []), sum((p.text_offset for p in pieces), [])
    logprobs = sum((p.token_logprobs for p in pieces), [])
    assert "".join(tokens) == text and offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]
    assert tokens and (stop or len(tokens) == len(expected.log_probs))
    np.testing.assert_allclose(logprobs, expected.log_probs[:len(tokens)], atol=1e-4)
    assert sum((p.top_logprobs for p in pieces), []) == [{t: lp} for t, lp in zip(tokens, logprobs)]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_are_the_grpc_log_probs_of_tokens_joining_to_the_content(served, sdk, stream):
    params = GenerationParams(max_tokens=MAX_TOKENS, apply_chat_template=True, chat_template_kwargs=NO_THINKING,
                              return_log_probs=True)
    expected = _grpc(served, "Name a colour.", params)
    got = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                                      temperature=0, max_completion_tokens=MAX_TOKENS, logprobs=True, top_logprobs=0,
                                      stream=stream, extra_body={"chat_template_kwargs": NO_THINKING})
    if stream:
        choices = [e.choices[0] for e in got if e.choices]
        text = "".join(c.delta.content or "" for c in choices)
    else:
        choices, text = got.choices, got.choices[0].message.content
    content = [t for c in choices if c.logprobs is not None for t in c.logprobs.content]
    assert text == expected.text == "".join(t.token for t in content)
    np.testing.assert_allclose([t.logprob for t in content], expected.log_probs, atol=1e-4)
    assert all(t.bytes == list(t.token.encode()) and t.top_logprobs == [] for t in content)


def test_a_stream_closed_mid_way_cancels_its_request_and_frees_its_sequence(served, sdk):
    server = served[0]
    cancelled = _cancelled_requests(server)
    # dflash: a drafter call every step, so 600 tokens outlast the cancellation's way to the server (plain decoding
    # runs several steps a call and could finish them first, ending the request as "length" instead)
    with sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=600, temperature=0, stream=True,
                                extra_body={"spec_mode": "dflash"}) as stream:
        assert len(list(itertools.islice(stream, 3))) == 3
    wait_until(lambda: _cancelled_requests(server) == cancelled + 1, 30, "the server to count a cancelled request")
    wait_until(lambda: _active_sequences(server) == 0, 30, "the cancelled sequence to be released")
    assert sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4).usage.completion_tokens == 4


def _cancelled_requests(server) -> float:
    return metric_total(scrape(server.metrics_url), "adaflash_requests_total", finish_reason="cancelled")


BAD = {
    "n above one": (dict(n=2), "n"),
    "logprobs negative": (dict(logprobs=-1), "logprobs"),
    "logprobs above OpenAI's 5": (dict(logprobs=6), "logprobs"),
    "logprobs alternatives": (dict(logprobs=2), "logprobs"),
    "logprobs not an integer": (dict(logprobs=True), "logprobs"),
    "echo": (dict(echo=True), "echo"),
    "presence penalty not a number": (dict(extra_body={"presence_penalty": "high"}), "presence_penalty"),
    "repetition penalty zero": (dict(extra_body={"repetition_penalty": 0}), "repetition_penalty"),
    "min_tokens negative": (dict(extra_body={"min_tokens": -1}), "min_tokens"),
    "logit bias": (dict(logit_bias={"1": 5}), "logit_bias"),
    "a field the API lacks": (dict(extra_body={"min_p": 0.1}), "min_p"),
    "five stops": (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
    "max_tokens zero": (dict(max_tokens=0), "max_tokens"),
    "max_tokens not an integer": (dict(extra_body={"max_tokens": "many"}), "max_tokens"),
    "temperature negative": (dict(temperature=-1), "temperature"),
    "top_p zero": (dict(top_p=0), "top_p"),
    "seed beyond 64 bits": (dict(seed=2**70), "seed"),
    "unknown spec_mode": (dict(extra_body={"spec_mode": "eagle"}), "spec_mode"),
    "prompt list": (dict(prompt=["a", "b"]), "prompt"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_completion_input_is_an_openai_400_naming_the_field(sdk, case):
    kwargs, param = BAD[case]
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(**request)
    assert refused.value.status_code == 400
    assert refused.value.param == param, refused.value.body
    assert refused.value.type == "invalid_request_error" and refused.value.body["message"]


@pytest.mark.parametrize(("kwargs", "param"), [
    (dict(n=2), "n"),
    (dict(logprobs="yes"), "logprobs"),
    (dict(logprobs=True, top_logprobs=3), "top_logprobs"),
    (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
    (dict(top_logprobs=-1), "top_logprobs"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools"),
    (dict(messages=[{"role": "assistant", "content": "hi"}]), "messages"),
    (dict(messages=[{"role": "user", "content": "hi", "name": "bob"}]), "messages"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), "messages"),
])
def test_bad_chat_input_is_an_openai_400_naming_the_field(sdk, kwargs, param):
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(**request)
    assert refused.value.param == param, refused.value.body


def test_an_unknown_model_is_a_404(sdk):
    with pytest.raises(openai.NotFoundError) as refused:
        sdk.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=4)
    assert (refused.value.param, refused.value.code) == ("model", "model_not_found")


def test_an_unknown_route_is_an_openai_404(served):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{served[1].url}/embeddings", data=b"{}", timeout=30)
    assert refused.value.code == 404
    assert set(json.loads(refused.value.read())["error"]) == {"message", "type", "param", "code"}


def test_the_openapi_document_is_served_and_its_examples_answer(served):
    """`GET /openapi.json`: a valid OpenAPI 3.1 document naming the served model; each route's example, sent as it
    stands, is answered (the schemas against the front's checks: tests/unit/test_openai_schema.py)."""
    root = served[1].url.removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/openapi.json", timeout=30) as response:
        doc = json.loads(response.read())
    validate_openapi(doc)
    for path, operation in doc["paths"].items():
        if "post" not in operation:
            continue
        example = operation["post"]["requestBody"]["content"]["application/json"]["example"]
        assert example["model"] == MODEL
        status, answer, _ = _post(root + path, json.dumps(example).encode())
        assert status == 200 and answer["choices"], (path, answer)


STALL_S = 5.0  # what tells a request held behind a huge one from one that was not, whatever else runs here


def _post(url: str, body: bytes, timeout_s: float = 30) -> tuple[int, dict, float]:
    """(status, JSON body, seconds) of one POST on a connection of its own."""
    started = time.monotonic()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read()), time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), time.monotonic() - started


def test_a_huge_body_is_a_quick_413_and_stalls_no_other_request(served, sdk):
    """A 20 MB prompt is refused by its size, before any of it is parsed or tokenised (413, OpenAI's format), and a
    16-token completion sent meanwhile on another connection is not held behind it (before, the refusal took about a
    minute and held every other request as long). The bounds here only tell a stall from none on a busy machine."""
    sdk.completions.create(model=MODEL, prompt="warm", max_tokens=4, temperature=0)  # the first call's set-up
    huge = json.dumps({"model": MODEL, "prompt": "x" * 20_000_000, "max_tokens": 16}).encode()
    small = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 16, "temperature": 0}).encode()
    url = f"{served[1].url}/completions"
    with ThreadPoolExecutor(2) as pool:
        refused = pool.submit(_post, url, huge)
        time.sleep(0.05)
        answered = pool.submit(_post, url, small)
        (status, body, refused_s), (small_status, _, small_s) = refused.result(), answered.result()
    assert status == 413 and body["error"]["code"] == "request_too_large" and "exceeds the limit" in body["error"][
        "message"], body
    assert refused_s < STALL_S, refused_s
    assert small_status == 200 and small_s < STALL_S, small_s


def test_a_prompt_too_long_by_its_characters_is_refused_without_tokenising(served):
    """Under the body limit but past max_prompt_tokens by its characters alone (no token of this tokenizer is that
    long): a 400 naming the prompt, at once, over HTTP; over gRPC the server refuses it the same way."""
    longest = longest_token(load_tokenizer(served[2] / "target"))
    text = "y" * (400 * longest + 1)  # the fixture's max_prompt_tokens is 400
    status, body, seconds = _post(f"{served[1].url}/completions",
                                  json.dumps({"model": MODEL, "prompt": text, "max_tokens": 4}).encode())
    assert status == 400 and body["error"]["param"] == "prompt" and "characters exceeds the limit of 400 tokens" in body[
        "error"]["message"], body
    assert seconds < STALL_S, seconds
    with AdaFlashClient(served[0].grpc_url, timeout_s=60) as client, pytest.raises(GenerationError) as refused:
        client.generate(text, GenerationParams(max_tokens=4))
    assert "INVALID_ARGUMENT: text_input: prompt of" in refused.value.message and "characters" in refused.value.message
