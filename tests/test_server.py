"""A real tritonserver serving the adaflash ensemble over real gRPC: equality, streaming, cancellation, bad input."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from helpers import fixed_costs

from adaflash.decoding.engine import Engine
from adaflash.decoding.modes import MODE_NAMES
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request
from adaflash.evaluation.prompts import load_prompts
from adaflash.models.bundle import load_bundle, save_bundle, tiny_random_bundle
from adaflash.models.chat_template import CONFIG_FILE, load_chat_template
from adaflash_build.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationParams
from adaflash_client.reliability import send_grpc
from adaflash_server.launcher import ServerConfig, TritonServer

MAX_TOKENS = 24
MAX_PROMPT = 160
QWEN3_CHAT = Path(__file__).parent / "fixtures" / "qwen3_chat"


@pytest.fixture(scope="module")
def served(trained_tiny, tmp_path_factory):
    """The trained tiny models written as a model folder (its target with Qwen3's chat template), a repository
    built from it, a server on free ports."""
    root = tmp_path_factory.mktemp("serve")
    model_dir = save_bundle(trained_tiny, root / "models")
    shutil.copy(QWEN3_CHAT / CONFIG_FILE, model_dir / "target" / CONFIG_FILE)
    cfg = RepositoryConfig(max_active=64, max_batch_size=64, max_len=1024, max_prompt_tokens=400,
                           max_output_tokens=600)
    repo = build_repository(root / "model_repository", model_dir, "drafter", cfg)
    with TritonServer(ServerConfig(model_repository=repo, state_dir=root / "state")) as server:
        yield server, model_dir


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return [p.text[-MAX_PROMPT:] for p in load_prompts(None, 20)]


@pytest.fixture(scope="module")
def reference(served, prompts) -> list[str]:
    """In-process plain greedy decoding with the same saved checkpoint, decoded to text."""
    _, model_dir = served
    bundle = load_bundle(model_dir, drafter=None)
    ids = [bundle.tokenizer.encode(p).ids for p in prompts]
    engine = Engine(bundle.target, None, num_slots=4, max_len=1024)
    seqs = engine.generate([Request(i, MAX_TOKENS) for i in ids])
    return [bundle.tokenizer.decode(s.output) for s in seqs]


def _client(served) -> AdaFlashClient:
    return AdaFlashClient(served[0].grpc_url, timeout_s=120)


def _active_sequences(server) -> float:
    text = urllib.request.urlopen(server.metrics_url).read().decode()
    return sum(float(v) for v in re.findall(r"^adaflash_active_sequences\{[^}]*\} (\S+)$", text, re.M))


def _wait_until_idle(server, timeout_s: float = 60.0) -> float:
    """Active sequences once they reach 0 or the timeout passes (the gauge drops as sequences are released)."""
    deadline = time.time() + timeout_s
    while (active := _active_sequences(server)) > 0 and time.time() < deadline:
        time.sleep(0.2)
    return active


@pytest.mark.parametrize("concurrency", [1, 16])
@pytest.mark.parametrize("mode", MODE_NAMES)
def test_greedy_text_equals_in_process_decoding(served, prompts, reference, mode, concurrency):
    params = GenerationParams(max_tokens=MAX_TOKENS, spec_mode=mode)
    with _client(served) as client, ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda p: client.generate_streaming(p, params), prompts))
    for i, (completion, ref) in enumerate(zip(done, reference)):
        assert completion.text == ref, f"{mode} c={concurrency} prompt {i}"
        assert completion.finish_reason in ("length", "stop")
        assert completion.target_forwards == 1 + len(completion.accepted_per_step)
    if mode in ("dflash", "adaflash-published"):
        assert any(a > 0 for c in done for a in c.accepted_per_step), "the trained drafter was never accepted"


def test_streaming_is_incremental_and_matches_non_streaming(served, prompts, reference):
    params = GenerationParams(max_tokens=MAX_TOKENS, spec_mode="dflash")
    with _client(served) as client:
        chunks = list(client.stream(prompts[0], params))
        whole = client.generate(prompts[0], params)
    counts = [c.num_output_tokens for c in chunks]
    assert len(chunks) > 2 and counts == sorted(counts) and counts[0] >= 1
    assert counts[-1] == MAX_TOKENS and chunks[-1].finish_reason == "length"
    assert all(c.finish_reason in (None, "") for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == reference[0] == whole.text
    assert whole.num_output_tokens == MAX_TOKENS


def test_request_with_only_text_input_and_max_tokens(served):
    """What generic Triton LLM clients send: no sampling fields, no spec_mode, over the gRPC stream."""
    client = grpcclient.InferenceServerClient(served[0].grpc_url)
    results = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([["Once upon a time".encode()]], dtype=object))
    max_tokens = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    max_tokens.set_data_from_numpy(np.array([[8]], dtype=np.int32))
    client.async_stream_infer("adaflash", [text, max_tokens])
    deadline = time.time() + 60
    while not results and time.time() < deadline:
        time.sleep(0.05)
    client.stop_stream()
    result, error = results[0]
    assert error is None
    assert int(result.as_numpy("num_output_tokens").reshape(-1)[0]) == 8


def test_cancelled_streams_free_their_sequences(served, prompts):
    server = served[0]
    params = GenerationParams(max_tokens=500, spec_mode="adaflash")

    def start_and_cancel(i: int) -> int:
        with _client(served) as client:
            stream = client.stream(prompts[i % len(prompts)], params)
            seen = 0
            for chunk in stream:
                seen = chunk.num_output_tokens
                if seen >= 3:
                    break
            stream.close()
            return seen

    with ThreadPoolExecutor(50) as pool:
        seen = list(pool.map(start_and_cancel, range(50)))
    assert all(0 < s < 500 for s in seen)
    assert _wait_until_idle(server) == 0
    with _client(served) as client:
        assert client.generate("still serving?", GenerationParams(max_tokens=4)).num_output_tokens == 4


def _text(s: bytes) -> tuple[str, np.ndarray]:
    return "BYTES", np.array([[s]], dtype=object)


def _i32(v: int) -> tuple[str, np.ndarray]:
    return "INT32", np.array([[v]], dtype=np.int32)


def _f32(v: float) -> tuple[str, np.ndarray]:
    return "FP32", np.array([[v]], dtype=np.float32)


def _bool(v: bool) -> tuple[str, np.ndarray]:
    return "BOOL", np.array([[v]], dtype=bool)


BAD = {
    "empty prompt": ("text_input", dict(text_input=_text(b""), max_tokens=_i32(8))),
    "prompt over the limit": ("text_input", dict(text_input=_text(b"x" * 2000), max_tokens=_i32(8))),
    "max_tokens 0": ("max_tokens", dict(text_input=_text(b"hi"), max_tokens=_i32(0))),
    "max_tokens negative": ("max_tokens", dict(text_input=_text(b"hi"), max_tokens=_i32(-5))),
    "max_tokens huge": ("max_tokens", dict(text_input=_text(b"hi"), max_tokens=_i32(10**9))),
    "temperature negative": ("temperature", dict(text_input=_text(b"hi"), max_tokens=_i32(8), temperature=_f32(-0.5))),
    "top_p zero": ("top_p", dict(text_input=_text(b"hi"), max_tokens=_i32(8), top_p=_f32(0.0))),
    "top_p above one": ("top_p", dict(text_input=_text(b"hi"), max_tokens=_i32(8), top_p=_f32(1.5))),
    "unknown spec_mode": ("spec_mode", dict(text_input=_text(b"hi"), max_tokens=_i32(8), spec_mode=_text(b"eagle"))),
    "wrong tensor type": ("max_tokens", dict(text_input=_text(b"hi"), max_tokens=_f32(8.0))),
    "invalid UTF-8": ("text_input", dict(text_input=_text(b"ab\xff\xfe"), max_tokens=_i32(8))),
    "messages not JSON": ("messages", dict(text_input=_text(b"hi"), max_tokens=_i32(8), apply_chat_template=_bool(True),
                                           messages=_text(b'[{"role": "system", "content": '))),
    "messages without the template": ("messages", dict(text_input=_text(b"hi"), max_tokens=_i32(8),
                                                       messages=_text(b'[{"role": "system", "content": "x"}]'))),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_invalid_argument_naming_the_field(served, case):
    """On a gRPC stream Triton reports a request's error as a message without a status code, so the
    code leads our messages; a wrong data type is refused by Triton itself, before any model runs."""
    field, tensors = BAD[case]
    refused, message = send_grpc(served[0], tensors)
    assert refused, f"{case}: accepted"
    if case == "wrong tensor type":
        assert f"input '{field}' data-type is 'FP32'" in message, message
    else:
        assert f"INVALID_ARGUMENT: {field}:" in message, (case, message)
    with _client(served) as client:
        assert client.generate("after a bad request", GenerationParams(max_tokens=4)).num_output_tokens == 4


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_a_chat_request_is_served_as_its_rendered_conversation(served, mode):
    """The server renders messages + text_input in the target's chat template: the same text as in-process decoding
    of the conversation the template writes."""
    _, model_dir = served
    bundle = load_bundle(model_dir, drafter=None)
    system = [{"role": "system", "content": "Answer in one word."}]
    ids = load_chat_template(model_dir / "target").encode(
        bundle.tokenizer, [*system, {"role": "user", "content": "Name a colour."}], enable_thinking=False)
    engine = Engine(bundle.target, None, num_slots=1, max_len=1024)
    expected = bundle.tokenizer.decode(engine.generate([Request(ids, MAX_TOKENS)])[0].output)
    params = GenerationParams(max_tokens=MAX_TOKENS, spec_mode=mode, apply_chat_template=True, messages=system,
                              chat_template_kwargs={"enable_thinking": False})
    with _client(served) as client:
        assert client.generate_streaming("Name a colour.", params).text == expected
        plain = client.generate_streaming("Name a colour.", GenerationParams(max_tokens=MAX_TOKENS, spec_mode=mode))
    assert plain.text != expected  # the template made the difference


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_seeded_sampling_equals_the_engine(served, prompts, mode):
    """The target draws from the same seeded generator in the same order as the in-process engine."""
    _, model_dir = served
    bundle = load_bundle(model_dir)
    engine = Engine(bundle.target, bundle.drafter, num_slots=4, max_len=1024)
    sampling = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=123)
    ids = [bundle.tokenizer.encode(p).ids for p in prompts[:4]]
    expected = [bundle.tokenizer.decode(s.output)
                for s in engine.generate([Request(i, MAX_TOKENS, mode=mode, sampling=sampling) for i in ids])]
    params = GenerationParams(max_tokens=MAX_TOKENS, spec_mode=mode, temperature=1.0, top_k=50, top_p=0.95, seed=123)
    with _client(served) as client:
        got = [client.generate_streaming(p, params).text for p in prompts[:4]]
        other_seed = client.generate_streaming(prompts[0], GenerationParams(
            max_tokens=MAX_TOKENS, spec_mode=mode, temperature=1.0, top_k=50, top_p=0.95, seed=124)).text
    assert got == expected
    assert other_seed != got[0]


def test_metrics_count_requests_tokens_and_steps(served):
    server = served[0]
    with _client(served) as client:
        client.generate_streaming("metrics", GenerationParams(max_tokens=6, spec_mode="dflash"))
    text = urllib.request.urlopen(server.metrics_url).read().decode()
    tokens = re.findall(r'^adaflash_tokens_total\{spec_mode="dflash"\} (\S+)$', text, re.M)
    assert tokens and float(tokens[0]) >= 6
    assert re.search(r'^adaflash_requests_total\{[^}]*spec_mode="dflash"[^}]*\} \S+$', text, re.M)
    assert re.search(r'^adaflash_accepted_tokens_count\{spec_mode="dflash"\} \S+$', text, re.M)
    assert re.search(r'^adaflash_verified_draft_len_bucket\{[^}]*spec_mode="dflash"[^}]*\} \S+$', text, re.M)
    forwards = float(re.findall(r'^adaflash_target_forwards_total\{spec_mode="dflash"\} (\S+)$', text, re.M)[0])
    assert forwards >= 1


def test_a_burst_beyond_max_active_waits_in_the_queue_and_completes(served, prompts, reference):
    """70 requests at once against 64 sequence slots (max_active): the 6 beyond wait their turn, none fails."""
    server = served[0]

    def one(i: int) -> str:
        with _client(served) as client:
            return client.generate(prompts[i % len(prompts)], GenerationParams(max_tokens=MAX_TOKENS)).text

    with ThreadPoolExecutor(70) as pool:
        texts = list(pool.map(one, range(70)))
    assert texts == [reference[i % len(prompts)] for i in range(70)]
    text = urllib.request.urlopen(server.metrics_url).read().decode()
    waited = float(re.findall(r"^adaflash_queue_wait_seconds_count\S* (\S+)$", text, re.M)[0])
    assert waited >= 70  # every admitted request's wait is recorded (0 for those admitted at once)
    assert _wait_until_idle(server) == 0 and _queued(server) == 0


def _queued(server) -> float:
    text = urllib.request.urlopen(server.metrics_url).read().decode()
    return float(re.findall(r"^adaflash_queued_requests\S* (\S+)$", text, re.M)[0])


@pytest.mark.parametrize("field", ["seed", "min_tokens", "repetition_penalty", "exclude_input_in_output"])
def test_http_fields_the_server_does_not_implement_are_refused_by_name(served, field):
    """Triton's HTTP generate endpoint passes unknown JSON fields on as parameters; they are refused, not ignored."""
    body = json.dumps({"text_input": "hello", "max_tokens": 4, field: 1}).encode()
    request = urllib.request.Request(f"{served[0].http_url}/v2/models/adaflash/generate", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 400
    assert f"INVALID_ARGUMENT: {field}: not an input of this server" in refused.value.read().decode()
    good = json.dumps({"text_input": "hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{served[0].http_url}/v2/models/adaflash/generate", data=good, method="POST")
    assert json.loads(urllib.request.urlopen(request, timeout=60).read())["num_output_tokens"] == 4


@pytest.mark.parametrize("pacing", [{"stream_interval_ms": 600_000}, {"max_responses_per_s": 1e-6}])
def test_paced_responses_carry_several_steps_each(tmp_path, pacing):
    """With a stream interval, or a stream's share of the response rate, longer than the whole request, a stream
    gets its first step's tokens at once (the admitting step: prefill and one verify) and the rest in the final
    response: the same text, in two responses."""
    model_dir = save_bundle(tiny_random_bundle(seed=0), tmp_path / "models")
    cfg = RepositoryConfig(max_active=4, max_batch_size=4, max_len=512, max_prompt_tokens=64, max_output_tokens=200,
                           **pacing)
    repo = build_repository(tmp_path / "model_repository", model_dir, "drafter", cfg, _fixed_cost_table(tmp_path))
    params = GenerationParams(max_tokens=40, spec_mode="ar")
    with TritonServer(ServerConfig(model_repository=repo, state_dir=tmp_path / "state")) as server:
        with AdaFlashClient(server.grpc_url, timeout_s=120) as client:
            chunks = list(client.stream("a stream in two parts", params))
            whole = client.generate("a stream in two parts", params)
    assert len(chunks) == 2 and 1 <= chunks[0].num_output_tokens < 40 == chunks[1].num_output_tokens
    assert "".join(c.text for c in chunks) == whole.text
    steps = sum(len(c.accepted_per_step) for c in chunks)
    assert steps == 39 and len(chunks[1].accepted_per_step) > 30  # the final response carries the steps since


def _fixed_cost_table(tmp_path):
    path = tmp_path / "cost.json"
    fixed_costs(4).save(path)
    return path
