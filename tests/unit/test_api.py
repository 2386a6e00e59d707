"""The served contract without a server: input checks name the field, payloads survive their wire
encoding, streamed text never splits a character."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import fixed_costs

from adaflash_contract.modes import MODES
from adaflash.decoding.sampling import SamplingParams
from adaflash.decoding.sequence import Request, Sequence, StepRecord
from adaflash.decoding.steps import StepResult
from adaflash.models.drafter import Draft
from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash.models.chat_template import ChatTemplate, load_chat_template
from adaflash.models.tokenizer import byte_tokenizer, load_tokenizer
from adaflash.serving import protocol
from adaflash.serving.api import DETOKENIZE_CONTEXT, Detokenizer, encode, longest_token, prompt_characters
from adaflash_contract.errors import RequestError
from adaflash.decoding.limits import Limits
from adaflash.serving.protocol import RequestDefaults, parse_request

QWEN3_CHAT = Path(__file__).parents[1] / "fixtures" / "qwen3_chat"
LIMITS = RequestDefaults(default_mode="adaflash")
AR = RequestDefaults(default_mode="ar")
SERVER = Limits(vocab_size=300, max_len=200, block_size=16, max_output_tokens=100, max_prompt_tokens=64)


def _checked(tensors, tok=None, limits: Limits = SERVER, chat=None):
    """A request as the server takes it: parsed, tokenised (a byte tokenizer), then checked once (`Limits.check`)."""
    tok = tok or byte_tokenizer()
    values = parse_request(tensors, AR)
    served = protocol.served_request(encode(tok, values, tok.get_vocab_size(), [256], chat), values)
    limits.check(served.request)
    return served


def _tensors(**kw):
    base = {"text_input": np.array([[b"hello"]], dtype=object), "max_tokens": np.array([[8]], dtype=np.int32)}
    base.update(kw)
    return base


def test_defaults_and_overrides():
    got = parse_request(_tensors(), LIMITS)
    refused = {"decoder_text_input", "prompt_embedding_table", "prompt_table_extra_id", "prompt_vocab_size",
               "embedding_bias_words", "embedding_bias_weights", "lora_task_id", "lora_weights", "lora_config",
               "guided_decoding_guide_type", "guided_decoding_guide"}
    assert got == {"text_input": "hello", "max_tokens": 8, "stream": False, "temperature": 0.0, "top_k": 0,
                   "top_p": 1.0, "seed": 0, "random_seed": None, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                   "frequency_penalty": 0.0, "min_tokens": 0, "return_log_probs": False, "end_id": None,
                   "pad_id": None, "stop_words": (), "bad_words": (), "exclude_input_in_output": True,
                   "return_num_input_tokens": False, "return_num_output_tokens": False, "return_perf_metrics": False,
                   "spec_mode": MODES["adaflash"], "max_draft": None, "apply_chat_template": False, "messages": (),
                   "chat_template_kwargs": {}, "num_return_sequences": 1, "beam_width": 1, "length_penalty": 1.0,
                   "return_context_logits": False, "return_generation_logits": False, **dict.fromkeys(refused)}
    got = parse_request(_tensors(spec_mode=np.array([[b"ngram"]], dtype=object), top_k=np.array([[5]]),
                                 random_seed=np.array([[7]], dtype=np.uint64)), LIMITS)
    assert (got["spec_mode"], got["top_k"], got["seed"]) == (MODES["ngram"], 5, 7)  # random_seed: seed's old name
    with pytest.raises(ValueError, match="^random_seed: an alias of seed"):
        parse_request(_tensors(seed=np.array([[1]], dtype=np.uint64), random_seed=np.array([[7]], dtype=np.uint64)),
                      LIMITS)


@pytest.mark.parametrize("field,value,reason", [
    ("num_return_sequences", np.array([[2]], dtype=np.int32), "one sequence per request"),
    ("beam_width", np.array([[4]], dtype=np.int32), "beam search is not implemented"),
    ("return_generation_logits", np.array([[True]]), "logits are not returned"),
    ("lora_config", np.zeros((1, 2, 3), dtype=np.int32), "LoRA adapters"),
    ("prompt_embedding_table", np.zeros((1, 2, 4), dtype=np.float16), "prompt tuning"),
    ("guided_decoding_guide", np.array([[b"{}"]], dtype=object), "guided decoding"),
    ("decoder_text_input", np.array([[b"x"]], dtype=object), "decoder-only"),
])
def test_tensorrt_llm_inputs_this_server_does_not_do_are_refused_by_name(field, value, reason):
    with pytest.raises(ValueError, match=f"^{field}: .*{reason}"):
        parse_request(_tensors(**{field: value}), LIMITS)
    for accepted in ("num_return_sequences", "beam_width"):  # their one supported value
        assert parse_request(_tensors(**{accepted: np.array([[1]], dtype=np.int32)}), LIMITS)[accepted] == 1


@pytest.mark.parametrize("field,value", [
    ("max_tokens", np.array([[0]])), ("max_tokens", np.array([[101]])), ("temperature", np.array([[-1.0]])),
    ("temperature", np.array([[np.nan]])), ("temperature", np.array([[np.inf]])), ("top_p", np.array([[0.0]])), ("top_k", np.array([[-1]])),
    ("repetition_penalty", np.array([[0.0]], dtype=np.float32)), ("presence_penalty", np.array([[np.inf]])),
    ("min_tokens", np.array([[-1]], dtype=np.int32)),
    ("spec_mode", np.array([[b"medusa"]], dtype=object)), ("text_input", np.array([[b"\xc3"]], dtype=object)),
    ("text_input", np.array([[b""]], dtype=object)), ("max_draft", np.array([[-2]])),
    ("max_draft", np.array([[-1]])), ("top_k", np.array([[1, 2]])),
    ("messages", np.array([[b'[{"role": "system"']], dtype=object)),
    ("messages", np.array([[b'[{"role": "system"}]']], dtype=object)),
    ("messages", np.array([[b'{"role": "system", "content": "hi"}']], dtype=object)),
    ("chat_template_kwargs", np.array([[b'["enable_thinking"]']], dtype=object)),
])
def test_bad_values_name_their_field(field, value):
    with pytest.raises(RequestError, match=f"^{field}:") as refused:
        _checked(_tensors(**{field: value}))
    assert refused.value.field == field


def test_stop_words_and_end_id():
    tok = byte_tokenizer()
    inputs = parse_request(_tensors(stop_words=np.array([[b"\n", b"."]], dtype=object)), AR)
    got = encode(tok, inputs, tok.get_vocab_size(), [256])
    assert got.stop_ids == [256, tok.encode("\n").ids[0], tok.encode(".").ids[0]]
    assert got.prompt_ids == tok.encode("hello").ids and got.stop_texts == []
    # a word of several tokens is a text stop; bad words become their token ids
    words = parse_request(_tensors(stop_words=np.array([[b"\xc3\xa9", b"."]], dtype=object),
                                   bad_words=np.array([[b"ab", b"c"]], dtype=object)), AR)
    got = encode(tok, words, tok.get_vocab_size(), [256])
    assert got.stop_texts == ["é"] and got.stop_ids == [256, tok.encode(".").ids[0]]
    assert got.bad_words == [tok.encode("ab").ids, tok.encode("c").ids] and len(got.bad_words[0]) == 2
    with pytest.raises(ValueError, match="^pad_id:"):
        encode(tok, parse_request(_tensors(pad_id=np.array([[100000]], dtype=np.int32)), AR), tok.get_vocab_size(),
               [256])
    with pytest.raises(ValueError, match="^text_input:"):
        _checked(_tensors(text_input=np.array([[b"x" * 65]], dtype=object)), tok)


def _bytes(text: str) -> np.ndarray:
    return np.array([[text.encode()]], dtype=object)


def test_a_chat_request_is_its_conversation_in_the_target_template_with_the_answer_opened():
    tok = byte_tokenizer()
    chat = load_chat_template(QWEN3_CHAT)
    values = parse_request(_tensors(apply_chat_template=np.array([[True]]),
                                    messages=_bytes('[{"role": "system", "content": "Be brief."}]'),
                                    chat_template_kwargs=_bytes('{"enable_thinking": false}')), AR)
    ids = encode(tok, values, tok.get_vocab_size(), [256], chat).prompt_ids
    expected = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.decode(ids) == expected and ids == tok.encode(expected).ids
    plain = encode(tok, parse_request(_tensors(), AR), tok.get_vocab_size(), [256], chat).prompt_ids
    assert plain == tok.encode("hello").ids  # the template applies only when asked for
    with pytest.raises(ValueError, match="^text_input: prompt of"):  # the limit counts the rendered prompt
        limits = Limits(vocab_size=300, max_len=400, block_size=16, max_prompt_tokens=len(ids) - 1)
        limits.check(protocol.served_request(encode(tok, values, tok.get_vocab_size(), [256], chat), values).request)


@pytest.mark.parametrize("field,sent,chat", [
    ("apply_chat_template", {"apply_chat_template": np.array([[True]])}, None),
    ("messages", {"messages": _bytes('[{"role": "system", "content": "x"}]')}, ChatTemplate("{{ messages }}")),
    ("chat_template_kwargs", {"chat_template_kwargs": _bytes('{"enable_thinking": false}')}, ChatTemplate("x")),
    ("messages", {"apply_chat_template": np.array([[True]]), "messages": _bytes('[{"role": "user", "content": "x"}]')},
     ChatTemplate("{% if messages[0].role == messages[1].role %}{{ raise_exception('roles must alternate') }}"
                  "{% endif %}")),
])
def test_chat_requests_the_target_cannot_render_name_their_field(field, sent, chat):
    """No template, conversation fields without the flag, a conversation the template refuses."""
    tok = byte_tokenizer()
    with pytest.raises(ValueError, match=f"^{field}:"):
        encode(tok, parse_request(_tensors(**sent), AR), tok.get_vocab_size(), [256], chat)


def test_streamed_deltas_never_split_a_character_and_add_up_to_the_text():
    tok = byte_tokenizer()
    text = "naïve 世界 🙂 end"
    ids = tok.encode(text).ids
    deltas, sent = [], 0
    for n in range(1, len(ids) + 1):
        deltas.append(Detokenizer(tok).delta(ids[:n], sent, final=n == len(ids)))
        sent = n
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert any(d == "" for d in deltas)  # held back while a multi-byte character was incomplete
    # Bytes that never form a character are sent as replacement characters, at the latest at the end.
    assert Detokenizer(tok).delta(ids[:1] + [tok.encode("é").ids[0]], 1, final=True) == "\ufffd"


def _whole_output_delta(tok, ids, sent_len, final):
    """The reference: decode the whole output each time (O(tokens^2) over a stream)."""
    def stable(text, final):
        return text if final else text.rstrip("\ufffd")

    before = stable(tok.decode(ids[:sent_len]), False) if sent_len else ""
    return stable(tok.decode(ids), final)[len(before):]


def _llama_like_tokenizer():
    """SentencePiece-style: '▁' for spaces, byte fallback tokens, a decoder that strips the leading space."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    pieces = ["<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "▁the", "▁cat", "s", "at", "é", "▁naïve", "世"]
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], byte_fallback=True,
                               unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


TOKENIZERS = {"bytes": byte_tokenizer, "llama-like": _llama_like_tokenizer,
              "default target": lambda: load_tokenizer(DEFAULT_MODEL_DIR / "target")}


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_windowed_deltas_equal_the_whole_output_deltas(name):
    """Random ids (broken UTF-8 included) and real multilingual text, cut into random responses: decoding from
    a window before the sent text gives exactly the deltas of decoding the whole output (a byte-fallback
    decoder, whose decoding is not local, is decoded whole)."""
    if name == "default target" and not (DEFAULT_MODEL_DIR / "target" / "tokenizer.json").exists():
        pytest.skip("no default models")
    tok = TOKENIZERS[name]()
    detokenizer = Detokenizer(tok)
    assert detokenizer.windowed == (name != "llama-like")  # byte fallback is not local: whole-output decoding
    rng = random.Random(0)
    vocab = tok.get_vocab_size()
    texts = ["naïve 世界 🙂 end, the cats sat. " * 3, "def f(x):\n    return x ** 2  # 平方\n" * 2]
    outputs = [tok.encode(t).ids for t in texts] + [[rng.randrange(vocab) for _ in range(rng.randrange(20, 80))]
                                                    for _ in range(150)]
    for ids in outputs:
        assert len(ids) > DETOKENIZE_CONTEXT
        sent = 0
        for n in sorted(set(rng.sample(range(1, len(ids) + 1), k=min(len(ids), 12))) | {len(ids)}):
            final = n == len(ids)
            assert detokenizer.delta(ids[:n], sent, final) == _whole_output_delta(tok, ids[:n], sent, final), (ids, n)
            sent = n


def test_a_parsed_request_reaches_the_step_loop_as_the_engine_request():
    values = parse_request(_tensors(temperature=np.array([[0.5]], dtype=np.float32), top_k=np.array([[3]]),
                                    random_seed=np.array([[9]], dtype=np.uint64),
                                    stream=np.array([[True]]), max_draft=np.array([[2]])), LIMITS)
    got = protocol.served_request(protocol.Encoded([5, 6], [0, 7], [[4]], ["stop here"]), values)
    assert (got.request.prompt_ids, got.request.max_tokens, got.request.mode, got.request.max_draft) == ([5, 6], 8,
                                                                                                        MODES["adaflash"], 2)
    assert got.request.sampling == SamplingParams(temperature=0.5, top_k=3, top_p=1.0, seed=9, bad_words=((4,),))
    assert got.stop_ids == {0, 7} and got.stream is True and got.stop_texts == ("stop here",)
    unset = protocol.served_request(protocol.Encoded([5], [0]), parse_request(_tensors(), LIMITS))
    assert unset.request.max_draft is None and unset.request.sampling == SamplingParams()


def test_target_calls_and_results_round_trip():
    sampling = [SamplingParams(temperature=1.0, top_k=50, top_p=0.5, seed=123), SamplingParams()]
    step = protocol.TargetCall(protocol.Op.STEP, [7, 2**40, 9], [[1, 2], [3], [4, 5, 6]], sampling, release=[3],
                               capture=[True, False, True])
    call = protocol.decode_target_call(protocol.encode_target_call(step))
    assert call == step  # two new sequences with their settings, then one verifying; one to free first
    verify = protocol.decode_target_call(protocol.encode_target_call(protocol.TargetCall(protocol.Op.STEP, [7], [[3]])))
    assert (verify.op, verify.keys, verify.feeds, verify.sampling, verify.release, verify.capture) == (
        protocol.Op.STEP, [7], [[3]], [], [], None)
    run = protocol.TargetCall(protocol.Op.STEP, [7, 9], [[3], [4]], runs=[5, 2])
    assert protocol.decode_target_call(protocol.encode_target_call(run)) == run
    release = protocol.decode_target_call(protocol.encode_release([7, 8]))
    assert (release.op, release.keys) == (protocol.Op.RELEASE, [7, 8])
    features = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    results = [StepResult([4, 5], 1, 0.75, features[:2]), StepResult([6], 0, 0.0, features[2:])]
    got, ms = protocol.decode_target_result(protocol.encode_target_result(results, 2.5))
    assert ms == 2.5 and [(r.committed, r.accepted, r.expected_accepted) for r in got] == [([4, 5], 1, 0.75), ([6], 0, 0.0)]
    assert all(torch.equal(g.features, r.features) for g, r in zip(got, results))
    wire = protocol.encode_target_result([StepResult([4], 0, 0.0, None)], 1.0)
    assert sorted(wire) == ["accepted", "committed", "committed_lengths", "forward_ms"]  # nothing empty travels
    plain, _ = protocol.decode_target_result(wire)
    assert (plain[0].features, plain[0].log_probs, plain[0].expected_accepted) == (None, None, 0.0)


def test_bad_target_calls_name_their_field():
    with pytest.raises(ValueError, match="^op: unknown operation 3"):
        protocol.decode_target_call(protocol.encode_target_call(protocol.TargetCall(protocol.Op.DRAFT, [1], [[1]])))
    tensors = protocol.encode_target_call(protocol.TargetCall(protocol.Op.STEP, [1], [[1]], [SamplingParams()]))
    tensors["top_p"] = np.array([0.0], dtype=np.float32)
    with pytest.raises(ValueError, match="top_p"):
        protocol.decode_target_call(tensors)
    tensors = protocol.encode_target_call(protocol.TargetCall(protocol.Op.STEP, [1], [[1]], [SamplingParams()]))
    tensors["seed"] = np.array([1, 2], dtype=np.uint64)
    with pytest.raises(ValueError, match="^temperature: sampling settings"):
        protocol.decode_target_call(tensors)
    tensors = protocol.encode_target_call(protocol.TargetCall(protocol.Op.STEP, [1, 2], [[1], [2, 3]]))
    tensors["lengths"] = np.array([1, 1], dtype=np.int32)
    with pytest.raises(ValueError, match="^lengths:"):
        protocol.decode_target_call(tensors)
    with pytest.raises(ValueError, match="^keys: required"):
        protocol.decode_target_call({"op": np.array([1], dtype=np.int32)})
    tensors = protocol.encode_target_call(protocol.TargetCall(protocol.Op.STEP, [1, 2], [[1], [2]], capture=[True, False]))
    tensors["capture"] = np.array([True], dtype=bool)
    with pytest.raises(ValueError, match="^capture: 1 flags for 2 keys"):
        protocol.decode_target_call(tensors)
    for runs, feeds, sampling in [([2], [[1], [2]], []), ([2, 0], [[1], [2]], []), ([2, 2], [[1], [2, 3]], []),
                                  ([2], [[1]], [SamplingParams()])]:
        tensors = protocol.encode_target_call(protocol.TargetCall(protocol.Op.STEP, [1, 2][:len(feeds)], feeds,
                                                                  sampling, runs=runs))
        with pytest.raises(ValueError, match="^runs: "):
            protocol.decode_target_call(tensors)


def test_draft_calls_and_drafts_round_trip():
    call = protocol.DraftCall(keys=[7, 9], anchors=[11, 12], features=[torch.ones(2, 4), None], block_length=6)
    got = protocol.decode_draft_call(protocol.encode_draft_call(call))
    assert (got.keys, got.anchors, got.block_length) == ([7, 9], [11, 12], 6)
    assert torch.equal(got.features[0], call.features[0]) and got.features[1] is None
    none = protocol.decode_draft_call(protocol.encode_draft_call(protocol.DraftCall([7], [11], [None], 16)))
    assert none.features == [None]
    draft = Draft(tokens=torch.tensor([[8, 9], [1, 2]]), hidden=torch.zeros(2, 3, 4),
                  accept_ratio=torch.tensor([0.5, 0.25]), accept_rates=None)
    back, ms = protocol.decode_draft(protocol.encode_draft(draft, 1.5))
    assert ms == 1.5 and back.tokens.tolist() == [[8, 9], [1, 2]] and back.accept_rates is None
    assert torch.equal(back.accept_ratio, draft.accept_ratio) and back.hidden is None


def test_responses_carry_the_text_and_the_statistics():
    seq = Sequence(id=42, request=Request([1], 4), tokens=[1, 2, 3], generator=None, stop_ids=frozenset(),
                   output=[2, 3], steps=[StepRecord(2, 1, 2)], finish_reason="length")
    generation = protocol.ServedRequest(seq.request, frozenset(), stream=True)
    out = protocol.encode_response(seq, "hé", sent_len=1, steps_from=0, final=True, served=generation)
    assert list(out) == protocol.names((protocol.TEXT_OUTPUT, *protocol.STATS))
    assert out["text_output"].reshape(-1)[0].decode() == "hé" and out["num_output_tokens"].tolist() == [[2]]
    assert out["finish_reason"].reshape(-1)[0] == b"length" and out["accepted_per_step"].tolist() == [[1]]
    assert generation.text_ids(seq, final=True) == [2, 3]


def test_what_a_client_asks_for_by_name_is_in_its_responses_only():
    """return_log_probs, return_num_input_tokens, return_perf_metrics and exclude_input_in_output false, in
    TensorRT-LLM's names and shapes; output_log_probs carries the response's new tokens."""
    values = parse_request(_tensors(return_log_probs=np.array([[True]]), return_num_input_tokens=np.array([[True]]),
                                    return_perf_metrics=np.array([[True]]),
                                    exclude_input_in_output=np.array([[False]])), LIMITS)
    generation = protocol.served_request(protocol.Encoded([1, 5], [0]), values)
    assert generation.echo and generation.request.sampling.log_probs
    seq = Sequence(id=7, request=generation.request, tokens=[1, 5, 2, 3], generator=None, stop_ids=frozenset(),
                   output=[2, 3], log_probs=[-0.5, -0.25], steps=[StepRecord(4, 1, 2), StepRecord(2, 0, 1)],
                   finish_reason="length")
    assert generation.text_ids(seq, final=True) == [1, 5, 2, 3]  # the one response of a request not streamed
    assert generation.text_ids(seq, final=False) == [2, 3]
    out = protocol.encode_response(seq, "x", sent_len=1, steps_from=0, final=True, served=generation)
    assert out["cum_log_probs"].tolist() == [[-0.75]] and out["output_log_probs"].tolist() == [[[-0.25]]]
    assert out["output_token_ids"].tolist() == [[[3]]]
    assert out["num_input_tokens"].tolist() == [[2]] and out["total_draft_tokens"].tolist() == [[6]]
    assert out["total_accepted_draft_tokens"].tolist() == [[1]]
    assert out["acceptance_rate"].tolist() == [[np.float32(1 / 6)]]
    asked_nothing = protocol.encode_response(seq, "x", 1, 0, True, protocol.ServedRequest(seq.request, frozenset(), True))
    assert set(asked_nothing) == set(protocol.names((protocol.TEXT_OUTPUT, *protocol.STATS))) | {
        "cum_log_probs", "output_log_probs", "output_token_ids"}


def test_every_encoded_payload_matches_its_declaration():
    """What the encoders write is what the model configs (written from the declarations) promise."""
    values = parse_request(_tensors(return_num_input_tokens=np.array([[True]]),
                                    return_perf_metrics=np.array([[True]]),
                                    return_log_probs=np.array([[True]])), LIMITS)
    generation = protocol.served_request(protocol.Encoded([1], [0]), values)
    seq = Sequence(id=1, request=generation.request, tokens=[1, 2], generator=None, stop_ids=frozenset(), output=[2],
                   log_probs=[-0.5])
    payloads = {
        ("adaflash", 1): protocol.encode_response(seq, "x", 0, 0, False, generation),
        ("target", 0): protocol.encode_target_call(protocol.TargetCall(protocol.Op.STEP, [1], [[1]],
                                                                       [SamplingParams()])),
        ("target", 1): protocol.encode_target_result([StepResult([1], 0, 0.0, torch.zeros(1, 2))], 1.0),
        ("drafter", 0): protocol.encode_draft_call(protocol.DraftCall([1], [1], [torch.zeros(1, 2)], 2)),
        ("drafter", 1): protocol.encode_draft(Draft(torch.zeros(1, 1, dtype=torch.long), None, None, None), 1.0),
    }
    assert set(payloads[("adaflash", 1)]) == set(protocol.names(protocol.RESPONSE))  # every output, asked for
    unbatched = {"target", "drafter"}  # called once per step: no batch dimension
    for (model, side), tensors in payloads.items():
        specs = {s.name: s for s in protocol.MODEL_TENSORS[model][side]}
        assert set(tensors) <= set(specs), (model, side)
        for name, value in tensors.items():
            batch = 0 if model in unbatched else 1
            assert value.dtype == specs[name].dtype and value.ndim == batch + len(specs[name].dims), (model, name)


@pytest.mark.parametrize("names,oldest_first", [
    (["drafter_10", "target", "drafter", "drafter_2", ".staging-drafter_3"], ["drafter", "drafter_2", "drafter_10"]),
    (["target"], []),
])
def test_drafter_models_are_ordered_by_their_number(names, oldest_first):
    assert protocol.drafter_models_in(names) == oldest_first
    assert protocol.next_drafter_name("drafter") == "drafter_2"
    assert protocol.next_drafter_name("drafter_10") == "drafter_11"


def test_model_parameters_are_plain_strings():
    config = {"parameters": {"max_len": {"string_value": "2048"}, "target_dir": {"string_value": "/m"}}}
    assert protocol.model_parameters(config) == {"max_len": "2048", "target_dir": "/m"}


def test_request_parameters_are_refused_by_name_except_tritons_own():
    protocol.refuse_parameters({"sequence_id": 0, "triton_enable_empty_final_response": True})
    with pytest.raises(ValueError, match="^min_tokens: not an input of this server"):
        protocol.refuse_parameters({"seed": 1, "min_tokens": 2})  # the first of them in name order


def test_the_cost_table_travels_from_the_target_model_as_declared():
    cost = fixed_costs(4)
    tensors = protocol.encode_cost_table(cost)
    assert protocol.decode_cost_table(tensors).to_json() == cost.to_json()
    assert list(tensors) == protocol.result_names(protocol.Op.COSTS)
    declared = {s.name: s for s in protocol.MODEL_TENSORS["target"][1]}
    assert all(v.dtype == declared[n].dtype and v.ndim == len(declared[n].dims) for n, v in tensors.items())
    call = protocol.encode_costs_call()
    assert protocol.decode_op(call, tuple(protocol.Op)) is protocol.Op.COSTS and protocol.decode_keys(call) == []


def test_a_prompt_is_refused_by_its_characters_only_where_no_tokenisation_could_fit_it():
    """No token stands for more than `longest_token` bytes, so a text with more characters than the limit times that
    has more tokens than the limit, whatever its tokenisation; a text under that bound is left to the token count."""
    tok = byte_tokenizer()
    longest = longest_token(tok)
    assert longest >= max(len(tok.decode([i]).encode()) for i in range(tok.get_vocab_size()))
    limits = Limits(vocab_size=300, max_len=200, block_size=16, max_prompt_tokens=64)
    limits.check_prompt_text(64 * longest, longest)
    with pytest.raises(RequestError, match="^text_input: prompt of .* characters exceeds the limit of 64 tokens"):
        limits.check_prompt_text(64 * longest + 1, longest)
    Limits(vocab_size=300, max_len=200, block_size=16).check_prompt_text(10**9, longest)  # no limit: nothing to check
    values = parse_request(_tensors(text_input=_bytes("héllo"), apply_chat_template=np.array([[True]]),
                                    messages=_bytes('[{"role": "system", "content": "abc"}]')), AR)
    assert prompt_characters(values) == 5 + 3
