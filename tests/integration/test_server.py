"""A real tritonserver serving the `adaflash` model over real gRPC: equality, streaming, cancellation, bad input."""

from __future__ import annotations

import csv
import json
import queue
import re
import shutil
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from helpers import fixed_costs, metric_by, metric_total, scrape, wait_until

from adaflash.decoding.engine import Engine
from adaflash_contract.modes import MODE_NAMES
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request
from adaflash.evaluation.prompts import load_prompts
from adaflash.models.bundle import load_bundle, save_bundle, tiny_random_bundle
from adaflash.models.chat_template import CONFIG_FILE, load_chat_template
from adaflash.serving.api import TextStops
from adaflash.serving.protocol import OWN_INPUTS, OWN_OUTPUTS, STOCK_CONTRACT, names
from adaflash_server.repository import RepositoryConfig, build_repository
from adaflash_client import AdaFlashClient, GenerationParams
from adaflash_client.client import build_inputs
from adaflash_tools.reliability import send_grpc, send_http
from adaflash_tools.sweep import completion_record, summarize_level, write_tidy_csv
from adaflash_server.launcher import ServerConfig, TritonServer

MAX_TOKENS = 24
MAX_PROMPT = 160
MAX_ACTIVE = 64  # the served repository's sequence slots
QWEN3_CHAT = Path(__file__).parents[1] / "fixtures" / "qwen3_chat"
STOCK = "trtllm_contract"  # an ensemble over `adaflash` with TensorRT-LLM's tensors only


@pytest.fixture(scope="module")
def served(trained_tiny, tmp_path_factory):
    """The trained tiny models written as a model folder (its target with Qwen3's chat template), a repository
    built from it (with the stock-contract ensemble STOCK beside `adaflash`), a server on free ports."""
    root = tmp_path_factory.mktemp("serve")
    model_dir = save_bundle(trained_tiny, root / "models")
    shutil.copy(QWEN3_CHAT / CONFIG_FILE, model_dir / "target" / CONFIG_FILE)
    cfg = RepositoryConfig(max_active=MAX_ACTIVE, max_batch_size=MAX_ACTIVE, max_len=1024, max_prompt_tokens=400,
                           max_output_tokens=600)
    repo = build_repository(root / "model_repository", model_dir, "drafter", cfg, stock_contract_ensemble=STOCK)
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
    return metric_total(scrape(server.metrics_url), "adaflash_active_sequences")


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


def _cancelled(server, mode: str) -> float:
    return metric_total(scrape(server.metrics_url), "adaflash_requests_total", finish_reason="cancelled", spec_mode=mode)


def test_cancelled_streams_free_their_sequences(served, prompts):
    """50 streams of 500 tokens, half `ar` and half `adaflash`, each closed once all have had their first response
    (which is never held back): the server ends them as cancelled, not finished (an `ar` sequence needs 500 steps of
    the 50 sequences' batch, far longer than the loop takes to notice), every slot comes back, and the server still
    serves. (Closed each on its own first response, a stream whose client thread started late ran alone at the end,
    at tiny-model speed, and could finish its 500 tokens before the loop's next question to Triton.)"""
    server = served[0]
    modes = ["ar", "adaflash"]
    before = {m: _cancelled(server, m) for m in modes}
    all_started = threading.Barrier(50, timeout=60)

    def start_and_cancel(i: int) -> int:
        params = GenerationParams(max_tokens=500, spec_mode=modes[i % 2])
        with _client(served) as client:
            stream = client.stream(prompts[i % len(prompts)], params)
            seen = next(iter(stream)).num_output_tokens
            all_started.wait()
            stream.close()
            return seen

    with ThreadPoolExecutor(50) as pool:
        seen = list(pool.map(start_and_cancel, range(50)))
    assert all(0 < s < 500 for s in seen)
    assert _wait_until_idle(server) == 0
    wait_until(lambda: _cancelled(server, "ar") - before["ar"] == 25, 30, "25 ar streams ended as cancelled")
    with _client(served) as client:
        assert client.generate("still serving?", GenerationParams(max_tokens=4)).num_output_tokens == 4


def test_requests_not_streamed_are_cancelled_too(served, prompts):
    """A non-streaming request sends nothing before its end, so only the loop's own question to Triton can see
    its client leave (an ensemble's postprocessing step never could). A full server of them (MAX_ACTIVE requests of
    600 `ar` steps, seconds on the tiny models against the loop's quarter-second question; one alone can finish
    first) ends every one as cancelled when the client leaves, and frees every sequence."""
    server = served[0]
    before = _cancelled(server, "ar")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: None)
    for i in range(MAX_ACTIVE):
        inputs = build_inputs(prompts[i % len(prompts)], GenerationParams(max_tokens=600, spec_mode="ar"), stream=False)
        client.async_stream_infer("adaflash", inputs)
    wait_until(lambda: _active_sequences(server) == MAX_ACTIVE, 30, "every request to start")
    client.stop_stream(cancel_requests=True)
    wait_until(lambda: _cancelled(server, "ar") - before == MAX_ACTIVE, 30, "every request to end as cancelled")
    assert _wait_until_idle(server) == 0
    client.close()


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


# ---- the TensorRT-LLM request contract, as a client written for a TensorRT-LLM ensemble sends it ----------

TRTLLM_OUTPUTS = ("text_output", "cum_log_probs", "output_log_probs", "num_input_tokens", "num_output_tokens",
                  "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "finish_reason")


def _words(*words: str) -> tuple[str, np.ndarray]:
    return "BYTES", np.array([[w.encode() for w in words]], dtype=object)


def _trtllm_stream(server, tensors: dict) -> list[dict]:
    """Every response of one raw tritonclient stream, as {output: array or None}."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        inputs = []
        for name, (dtype, value) in tensors.items():
            inputs.append(grpcclient.InferInput(name, list(value.shape), dtype))
            inputs[-1].set_data_from_numpy(value)
        client.async_stream_infer("adaflash", inputs, enable_empty_final_response=True)
        responses = []
        while True:
            result, error = results.get(timeout=120)
            assert error is None, error
            if result.get_response().outputs:
                responses.append({n: result.as_numpy(n) for n in TRTLLM_OUTPUTS})
            if result.get_response().parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()
        client.close()


def _joined_text(responses: list[dict]) -> str:
    return "".join(r["text_output"].reshape(-1)[0].decode() for r in responses)


@pytest.mark.parametrize("mode", ["ar", "dflash", "adaflash"])
def test_a_tensorrt_llm_request_with_penalties_bad_words_and_log_probs_equals_the_engine(served, prompts, reference,
                                                                                        mode):
    """seed, the three penalties, min_tokens, bad_words, pad_id, the return_* outputs, in TensorRT-LLM's names and
    shapes; the text equals in-process plain decoding with the same processors, and they changed it."""
    _, model_dir = served
    bundle = load_bundle(model_dir, drafter=None)
    banned = [reference[0][4:6], reference[0][9]]
    ids = bundle.tokenizer.encode(prompts[0]).ids
    sampling = SamplingParams(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2, min_tokens=6,
                              bad_words=tuple(tuple(bundle.tokenizer.encode(w).ids) for w in banned), log_probs=True)
    engine = Engine(bundle.target, None, num_slots=1, max_len=1024)
    expected = engine.generate([Request(ids, MAX_TOKENS, sampling=sampling)])[0]
    tensors = dict(text_input=_text(prompts[0].encode()), max_tokens=_i32(MAX_TOKENS), stream=_bool(True),
                   seed=("UINT64", np.array([[5]], dtype=np.uint64)), repetition_penalty=_f32(1.3),
                   presence_penalty=_f32(0.4), frequency_penalty=_f32(0.2), min_tokens=_i32(6),
                   bad_words=_words(*banned), pad_id=_i32(0), num_return_sequences=_i32(1), beam_width=_i32(1),
                   return_log_probs=_bool(True), return_num_input_tokens=_bool(True),
                   return_num_output_tokens=_bool(True), return_perf_metrics=_bool(True), spec_mode=_text(mode.encode()))
    responses = _trtllm_stream(served[0], tensors)
    final = responses[-1]
    assert _joined_text(responses) == bundle.tokenizer.decode(expected.output) != reference[0]
    assert int(final["num_input_tokens"].reshape(-1)[0]) == len(ids)
    assert int(final["num_output_tokens"].reshape(-1)[0]) == len(expected.output)
    log_probs = np.concatenate([r["output_log_probs"].reshape(-1) for r in responses])
    np.testing.assert_allclose(log_probs, expected.log_probs, rtol=1e-4, atol=1e-5)
    assert final["cum_log_probs"].shape == (1, 1) and final["output_log_probs"].ndim == 3
    np.testing.assert_allclose(final["cum_log_probs"].reshape(-1)[0], sum(expected.log_probs), rtol=1e-4)
    drafted, accepted = (int(final[n].reshape(-1)[0]) for n in ("total_draft_tokens", "total_accepted_draft_tokens"))
    assert 0 <= accepted <= drafted and (drafted == 0 if mode == "ar" else mode != "dflash" or drafted > 0)
    assert float(final["acceptance_rate"].reshape(-1)[0]) == pytest.approx(accepted / drafted if drafted else 0.0)
    # The same request over HTTP's generate endpoint (JSON fields, one response).
    body = {name: (value.reshape(-1).tolist() if name == "bad_words" else value.reshape(-1)[0].item())
            for name, (_, value) in tensors.items() if name not in ("text_input", "stream", "bad_words", "spec_mode")}
    status, text = send_http(served[0], {**body, "text_input": prompts[0], "bad_words": banned, "spec_mode": mode})
    assert status == 200, text
    answer = json.loads(text)
    assert answer["text_output"] == bundle.tokenizer.decode(expected.output)
    assert answer["num_input_tokens"] == len(ids)
    np.testing.assert_allclose(answer["output_log_probs"], expected.log_probs, rtol=1e-4, atol=1e-5)


def test_the_client_library_sends_the_contract_and_reads_its_outputs(served, prompts):
    """GenerationParams' penalties, min_tokens, bad_words, return_log_probs, return_num_input_tokens: the same as a raw
    TensorRT-LLM request (the test above), through AdaFlashClient."""
    params = GenerationParams(max_tokens=MAX_TOKENS, spec_mode="dflash", repetition_penalty=1.3, presence_penalty=0.4,
                              frequency_penalty=0.2, min_tokens=6, bad_words=["ff", "g"], return_log_probs=True,
                              return_num_input_tokens=True)
    with _client(served) as client:
        streamed = client.generate_streaming(prompts[0], params)
        whole = client.generate(prompts[0], params)
    assert streamed.text == whole.text and "ff" not in whole.text and "g" not in whole.text
    assert len(streamed.log_probs) == len(whole.log_probs) == whole.num_output_tokens
    np.testing.assert_allclose(streamed.log_probs, whole.log_probs, rtol=1e-5)
    assert all(p <= 0 for p in whole.log_probs) and whole.num_input_tokens == streamed.num_input_tokens > 0


@pytest.mark.parametrize("stream", [True, False])
def test_a_stop_word_of_several_tokens_ends_the_text_where_it_completes(served, prompts, reference, stream):
    _, model_dir = served
    bundle = load_bundle(model_dir, drafter=None)
    word = reference[1][8:12]
    assert len(bundle.tokenizer.encode(word).ids) > 1
    ids = bundle.tokenizer.encode(prompts[1]).ids
    engine = Engine(bundle.target, None, num_slots=1, max_len=1024)
    expected = engine.generate([Request(ids, MAX_TOKENS, stop_text=TextStops(bundle.tokenizer, (word,)))])[0]
    assert expected.finish_reason == "stop"
    tensors = dict(text_input=_text(prompts[1].encode()), max_tokens=_i32(MAX_TOKENS), stream=_bool(stream),
                   stop_words=_words(word, "a stop that never comes"), spec_mode=_text(b"dflash"))
    responses = _trtllm_stream(served[0], tensors)
    text = _joined_text(responses)
    assert text == bundle.tokenizer.decode(expected.output) and word in text and len(text) < len(reference[1])
    assert responses[-1]["finish_reason"].reshape(-1)[0] == b"stop"


def test_http_generate_takes_the_contract_too_and_echoes_the_prompt_when_asked(served, prompts, reference):
    """exclude_input_in_output false: the text starts with the prompt (not streaming, as TensorRT-LLM)."""
    body = {"text_input": prompts[2], "max_tokens": MAX_TOKENS, "exclude_input_in_output": False,
            "return_num_input_tokens": True, "spec_mode": "dflash"}
    status, text = send_http(served[0], body)
    assert status == 200, text
    answer = json.loads(text)
    assert answer["text_output"] == prompts[2] + reference[2] and answer["num_input_tokens"] > 0
    status, text = send_http(served[0], {**body, "repetition_penalty": 1.5, "exclude_input_in_output": True})
    assert status == 200 and json.loads(text)["text_output"] not in ("", reference[2])


REFUSED = {"beam_width": _i32(4), "num_return_sequences": _i32(2), "lora_task_id": ("UINT64", np.array([[3]], np.uint64)),
           "guided_decoding_guide_type": _text(b"json"), "return_generation_logits": _bool(True)}


@pytest.mark.parametrize("field", list(REFUSED))
def test_tensorrt_llm_inputs_this_server_does_not_do_are_refused_by_name(served, field):
    refused, message = send_grpc(served[0], dict(text_input=_text(b"hi"), max_tokens=_i32(4), **{field: REFUSED[field]}))
    assert refused and f"INVALID_ARGUMENT: {field}:" in message, message
    value = REFUSED[field][1].reshape(-1)[0]
    status, text = send_http(served[0], {"text_input": "hi", "max_tokens": 4,
                                         field: value.decode() if isinstance(value, bytes) else value.item()})
    assert status == 400 and f"INVALID_ARGUMENT: {field}:" in text, text


def test_the_stock_contract_ensemble_declares_tensorrt_llm_tensors_only(served):
    """What the client tests below run against: the same models behind TensorRT-LLM's tensor names alone."""
    with grpcclient.InferenceServerClient(served[0].grpc_url) as client:
        metadata = client.get_model_metadata(STOCK)
    inputs, outputs = ({t.name for t in tensors} for tensors in (metadata.inputs, metadata.outputs))
    assert (inputs, outputs) == tuple(set(names(specs)) for specs in STOCK_CONTRACT)
    assert not inputs & OWN_INPUTS and not outputs & OWN_OUTPUTS and "text_output" in outputs
    refused, message = send_grpc(served[0], dict(text_input=_text(b"hi"), max_tokens=_i32(4),
                                                 spec_mode=_text(b"ar")), model=STOCK)
    assert refused and "spec_mode" in message, message


@pytest.mark.parametrize("stream", [True, False])
def test_the_client_gets_the_same_text_from_a_stock_contract_without_this_servers_statistics(served, prompts,
                                                                                           reference, stream):
    """A model without this server's inputs and statistics (a stock TensorRT-LLM ensemble): the client sends only
    what it takes, reads what it sends, and leaves the rest None; acceptance from TensorRT-LLM's totals."""
    params = GenerationParams(max_tokens=MAX_TOKENS)
    tokenizer = load_bundle(served[1], drafter=None).tokenizer
    with AdaFlashClient(served[0].grpc_url, model_name=STOCK, timeout_s=120) as client, \
            AdaFlashClient(served[0].grpc_url, model_name=STOCK, timeout_s=120, tokenizer=tokenizer) as counting:
        chunks = []
        got = client.generate_streaming(prompts[0], params, chunks.append) if stream else client.generate(prompts[0],
                                                                                                          params)
        counted = counting.generate(prompts[0], params)
    assert got.text == counted.text == reference[0]
    assert (got.num_output_tokens, got.target_forwards, got.accepted_per_step, got.finish_reason) == (None,) * 4
    assert (got.tau, got.mean_accepted_per_step, got.tokens_per_s) == (None,) * 3
    assert got.time_to_first_token_s is not None and (not stream or len(chunks) >= 2)  # the first and the final
    assert counted.num_output_tokens == len(tokenizer.encode(reference[0], add_special_tokens=False).ids)
    drafted, accepted = got.draft_tokens, got.accepted_draft_tokens
    assert drafted is not None and 0 <= accepted <= drafted
    assert got.acceptance_rate == (accepted / drafted if drafted else None)


def test_a_field_the_stock_contract_lacks_is_refused_by_name_before_sending(served):
    with AdaFlashClient(served[0].grpc_url, model_name=STOCK, timeout_s=60) as client:
        for params in (GenerationParams(max_tokens=4, spec_mode="ar"), GenerationParams(max_tokens=4, max_draft=2)):
            field = "spec_mode" if params.spec_mode else "max_draft"
            with pytest.raises(ValueError, match=f"^{field}: model '{STOCK}' has no such input"):
                client.generate("hi", params)
        assert client.generate("hi", GenerationParams(max_tokens=4)).text


def test_the_locust_users_records_leave_the_figures_a_stock_contract_lacks_blank(served, prompts, tmp_path):
    """The Locust user's records (`completion_record`), the sweep's row and CSV: None and empty cells where the model
    reports nothing, never zeros; this server's own model fills them."""
    records = {}
    for model in (STOCK, "adaflash"):
        with AdaFlashClient(served[0].grpc_url, model_name=model, timeout_s=120) as client:
            records[model] = [{"ok": True, "t_start": 0.0, "t_end": 1.0,
                               **completion_record(client.generate_streaming(p, GenerationParams(max_tokens=8)))}
                              for p in prompts[:2]]
    assert all(r[k] is None for r in records[STOCK] for k in ("tokens", "itl_s", "steps", "target_forwards", "tau"))
    assert all(r["drafted"] is not None and r["ttft_s"] is not None for r in records[STOCK])
    stock, own = (summarize_level(records[m], "default", 1) for m in (STOCK, "adaflash"))
    assert stock["output_tokens"] is None and own["output_tokens"] == sum(r["tokens"] for r in records["adaflash"])
    write_tidy_csv([stock, own], tmp_path / "sweep.csv")
    with (tmp_path / "sweep.csv").open() as f:
        cells = list(csv.DictReader(f))
    blank = ("output_tokens", "output_tokens_per_s", "itl_p50_ms", "tau", "mean_accepted_per_step", "mean_draft_len")
    assert all(cells[0][k] == "" for k in blank) and all(cells[1][k] != "" for k in blank)
    assert cells[0]["requests"] == "2" and cells[0]["ttft_p50_ms"] != "" and cells[0]["latency_p50_ms"] != ""


def test_metrics_count_requests_tokens_and_steps(served):
    """Every finished request's steps are counted by the tokens they verified and accepted, consistently: the
    steps by either count add up to the forwards less one prefill per request, and the token totals to the
    counts weighed by their values."""
    server = served[0]
    with _client(served) as client:
        completion = client.generate_streaming("metrics", GenerationParams(max_tokens=6, spec_mode="dflash"))

    def consistent() -> bool:
        samples = scrape(server.metrics_url)
        tokens = metric_total(samples, "adaflash_tokens_total", spec_mode="dflash")
        requests = metric_total(samples, "adaflash_requests_total", spec_mode="dflash")
        forwards = metric_total(samples, "adaflash_target_forwards_total", spec_mode="dflash")
        by_accepted = metric_by(samples, "adaflash_verify_steps_total", "accepted", spec_mode="dflash")
        by_draft_len = metric_by(samples, "adaflash_verify_steps_by_draft_len_total", "draft_len", spec_mode="dflash")
        accepted = metric_total(samples, "adaflash_accepted_tokens_total", spec_mode="dflash")
        drafted = metric_total(samples, "adaflash_verified_draft_tokens_total", spec_mode="dflash")
        steps = sum(by_accepted.values())
        return (tokens >= 6 and requests >= 1 and steps >= len(completion.accepted_per_step) > 0
                and steps == sum(by_draft_len.values()) == forwards - requests
                and accepted == sum(int(k) * n for k, n in by_accepted.items())
                and drafted == sum(int(k) * n for k, n in by_draft_len.items()) >= accepted)

    wait_until(consistent, 30, "the finished request's metrics")  # metrics are sent after the final response


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


@pytest.mark.parametrize("field", ["ignore_eos", "n", "logprobs", "best_of"])
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


def test_paced_responses_carry_several_steps_each(tmp_path):
    """With a stream's share of the response rate longer than the whole request, a stream gets its first step's
    tokens at once (the admitting step: prefill and one verify) and the rest in the final response: the same text,
    in two responses. (The stream interval takes the same path, through `pacing.response_gap`:
    tests/unit/test_pacing.py.)"""
    model_dir = save_bundle(tiny_random_bundle(seed=0), tmp_path / "models")
    cfg = RepositoryConfig(max_active=4, max_batch_size=4, max_len=512, max_prompt_tokens=64, max_output_tokens=200,
                           max_responses_per_s=1e-6)
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
