"""The target's chat template renders as transformers' `apply_chat_template` renders it (Qwen3's published
template), is read from either place a Hugging Face folder keeps it, tokenises without a second BOS, and is
what `adaflash generate --chat` and `adaflash bench --chat` feed the models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, processors

from adaflash.cli import main
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request
from adaflash.evaluation.prompts import Prompt, encode_prompts, eval_set_prompts
from adaflash.models.bundle import load_bundle, save_bundle, tiny_random_bundle
from adaflash.models.chat_template import CONFIG_FILE, TEMPLATE_FILE, ChatTemplate, load_chat_template
from adaflash.models.tokenizer import byte_tokenizer

QWEN3 = Path(__file__).parents[1] / "fixtures" / "qwen3_chat"
CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
# "hi" asked of Qwen3 with thinking off, as its template writes it.
QWEN3_HI = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "Give me a short introduction to large language models."}],
    "system and history": [
        {"role": "system", "content": "You are a terse assistant. Réponds en français si on te parle français."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n4."},
        {"role": "user", "content": "Et 3 × 3 ? <b>\"quoted\"</b>"},
    ],
}


# Written without whitespace control, so the block options decide the layout; `tojson` on non-ASCII and HTML.
PLAIN_BLOCKS = """{% for m in messages %}
    {% if m.role == 'system' %}
[SYS] {{ m.content | tojson }}
    {% else %}
<{{ m.role }}> {{ m.content }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}<assistant>{% endif %}"""


def _transformers_tokenizer(template: str, specials: dict):
    """transformers' own tokenizer carrying the template and special tokens."""
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(), chat_template=template, **specials)


def _qwen3_config() -> dict:
    return json.loads((QWEN3 / CONFIG_FILE).read_text())


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("switches", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
def test_qwen3_template_renders_as_transformers_renders_it(conversation, switches):
    messages = CONVERSATIONS[conversation]
    config = _qwen3_config()
    reference = _transformers_tokenizer(config["chat_template"],
                                        {k: v for k, v in config.items() if k.endswith("_token") and v is not None})
    ours = load_chat_template(QWEN3)
    for generation_prompt in (True, False):
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                 **switches)
        assert ours.render(messages, add_generation_prompt=generation_prompt, **switches) == expected
    assert ours.render(messages, **switches).endswith(
        "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if switches.get("enable_thinking") is False else ""))


def test_block_whitespace_and_tojson_follow_transformers():
    messages = CONVERSATIONS["system and history"]
    reference = _transformers_tokenizer(PLAIN_BLOCKS, {})
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ChatTemplate(PLAIN_BLOCKS).render(messages) == expected
    assert '[SYS] "You are a terse assistant. Réponds' in expected and "\n<user> What is 2 + 2?\n" in expected


def test_variables_given_at_load_apply_to_every_rendering_and_a_call_overrides_them():
    messages = CONVERSATIONS["one user turn"]
    quiet = load_chat_template(QWEN3, enable_thinking=False)
    assert quiet.render(messages).endswith("<think>\n\n</think>\n\n")
    assert quiet.render(messages, enable_thinking=True).endswith("<|im_start|>assistant\n")


def test_the_jinja_file_takes_precedence_and_special_tokens_are_variables(tmp_path):
    (tmp_path / CONFIG_FILE).write_text(json.dumps({
        "chat_template": "config: {{ messages[0].content }}",
        "bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "</s>", "unk_token": None}))
    assert load_chat_template(tmp_path).render([{"role": "user", "content": "hi"}]) == "config: hi"
    (tmp_path / TEMPLATE_FILE).write_text("{{ bos_token }}[{{ unk_token }}]{{ messages[0].content }}{{ eos_token }}")
    assert load_chat_template(tmp_path).render([{"role": "user", "content": "hi"}]) == "<s>[]hi</s>"


def test_a_folder_without_a_template_has_none_and_a_named_list_gives_its_default(tmp_path):
    assert load_chat_template(tmp_path) is None
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"eos_token": "</s>"}))
    assert load_chat_template(tmp_path) is None
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]}))
    assert load_chat_template(tmp_path).render([]) == "plain"


def test_a_refused_conversation_is_a_value_error_and_templates_are_sandboxed():
    strict = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}")
    with pytest.raises(ValueError, match="roles must alternate"):
        strict.render([{"role": "assistant", "content": "hi"}])
    with pytest.raises(ValueError, match="unsafe"):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])
    assert ChatTemplate("{{ strftime_now('%Y') }}").render([]).isdigit()


def test_rendered_text_is_tokenised_without_a_second_begin_of_text():
    """A Llama-3-style tokenizer adds its BOS to any text; the template writes it already."""
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens(["<s>"])
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    chat = ChatTemplate("{{ bos_token }}{{ messages[0].content }}", {"bos_token": "<s>"})
    ids = chat.encode_user(tokenizer, "hi")
    assert ids == [bos, *Tokenizer.encode(tokenizer, "hi", add_special_tokens=False).ids]
    assert tokenizer.encode("<s>hi").ids[:2] == [bos, bos]  # what encoding it with the tokenizer's own BOS gives


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory) -> Path:
    """The tiny random models as a folder whose target carries Qwen3's chat template."""
    model_dir = save_bundle(tiny_random_bundle(seed=0), tmp_path_factory.mktemp("chat") / "models")
    shutil.copy(QWEN3 / CONFIG_FILE, model_dir / "target" / CONFIG_FILE)
    return model_dir


def test_generate_with_chat_decodes_the_rendered_conversation(chat_model_dir, capsys):
    assert main(["generate", "--model-dir", str(chat_model_dir), "--mode", "ar", "--max-tokens", "12", "--json",
                 "--prompt", "hi", "--chat", "--chat-kwargs", '{"enable_thinking": false}']) == 0
    got = json.loads(capsys.readouterr().out)["token_ids"]
    bundle = load_bundle(chat_model_dir, drafter=None)
    ids = bundle.tokenizer.encode(QWEN3_HI).ids
    assert got == Engine(bundle.target, None, num_slots=1, max_len=256).generate([Request(ids, 12, mode="ar")])[0].output


@pytest.mark.parametrize("argv,names", [
    (["--tiny-random", "--chat"], "--chat: the tiny random target has no chat template"),
    (["--model-dir", "{plain}", "--chat"], "--chat: .*target has no chat template"),
    (["--tiny-random", "--chat-kwargs", '{"enable_thinking": false}'], "--chat-kwargs: only read with --chat"),
])
def test_chat_flags_the_target_cannot_serve_are_refused_by_name(tmp_path, argv, names):
    argv = [a.replace("{plain}", str(tmp_path)) for a in argv]
    for command in (["generate", "--prompt", "hi"], ["bench", "--json", str(tmp_path / "bench.json")]):
        with pytest.raises(SystemExit, match=names):
            main([*command, *argv])


def test_bench_with_chat_wraps_each_prompt_as_written_in_the_template(chat_model_dir, tmp_path):
    chat = load_chat_template(QWEN3, enable_thinking=False)
    tokenizer = byte_tokenizer()
    assert encode_prompts(tokenizer, [Prompt("hi", None, "0")], 512, chat) == [tokenizer.encode(QWEN3_HI).ids]
    trained, as_written = eval_set_prompts(CORPUS, 1), eval_set_prompts(CORPUS, 1, training_template=False)
    assert [p.text + "\n\n" if p.domain in ("chat", "math") else p.text for p in as_written] == [p.text for p in trained]
    out = tmp_path / "bench.json"
    assert main(["bench", "--model-dir", str(chat_model_dir), "--modes", "ar,ngram", "--concurrency", "1",
                 "--num-prompts", "2", "--max-tokens", "4", "--json", str(out), "--chat"]) == 0
    report = json.loads(out.read_text())
    assert report["chat"] is True and all(r["greedy_equal_to_ar"] for r in report["rows"])
