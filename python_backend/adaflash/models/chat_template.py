"""The target's chat template: the Jinja text a Hugging Face folder ships, rendered as transformers renders it.

Chat-tuned targets, and the drafters trained on their outputs (the published DFlash drafters for Qwen3-8B),
saw conversations in the template's format; a bare prompt is text neither was trained to continue, and the
drafter's acceptance falls with it. So the template is rendered the way transformers' `apply_chat_template`
renders it (sandboxed Jinja with trim_blocks and lstrip_blocks, loop controls, `raise_exception`,
`strftime_now`, a `tojson` that keeps non-ASCII and HTML characters, the special tokens as variables), and
rendered text is tokenised without the tokenizer's own special tokens, as there: the template writes them.
The template is the model folder's (the operator's) text; requests only supply the messages and variables.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

TEMPLATE_FILE = "chat_template.jinja"  # newer transformers layouts; it takes precedence over the config's entry
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# The project's own targets (models/default/target, `adaflash-pretrain`) carry ChatML, as Qwen3 writes it: each
# message `<|im_start|>role\ncontent<|im_end|>\n`, the assistant's turn opened by add_generation_prompt: for system
# and user messages and the assistant's earlier answers, what Qwen3's template renders (no tools, no reasoning,
# `enable_thinking` unset). Their tokenizers have no ChatML tokens: the markers are text to them.
CHATML = """{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


class ChatTemplate:
    """A compiled chat template with the variables every rendering sees (the special tokens, the caller's
    switches). Compiled at once, so a broken template fails when it is loaded, not on the first request."""

    def __init__(self, source: str, variables: Mapping[str, Any] | None = None) -> None:
        self.variables = dict(variables or {})
        self._template = _environment().from_string(source)

    def render(self, messages: Sequence[Mapping[str, Any]], /, add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        """`kwargs` are the template's own switches (Qwen3's `enable_thinking`); they win over the variables, never
        over the conversation (positional-only, so a switch may be called anything).
        ValueError when the template refuses the conversation (its `raise_exception`, a value it cannot use)."""
        context = {**self.variables, **kwargs, "messages": [dict(m) for m in messages], "tools": None,
                   "documents": None, "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(context)
        except (jinja2.TemplateError, TypeError) as exc:
            raise ValueError(str(exc)) from None

    def encode(self, tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], /, **kwargs: Any) -> list[int]:
        """Prompt ids of a conversation the assistant answers next. The rendered text already holds the
        template's special tokens (Llama 3's begin-of-text among them): the tokenizer adding its own would
        start the prompt with two."""
        return tokenizer.encode(self.render(messages, **kwargs), add_special_tokens=False).ids

    def encode_user(self, tokenizer: Tokenizer, text: str) -> list[int]:
        """`text` as the one user message of a new conversation: a plain prompt asked of a chat model."""
        return self.encode(tokenizer, [{"role": "user", "content": text}])


def load_chat_template(model_dir: str | Path, /, **variables: Any) -> ChatTemplate | None:
    """The folder's chat template (`chat_template.jinja`, else `chat_template` in `tokenizer_config.json`),
    or None when it has none. `variables` are switches for every rendering (Qwen3's `enable_thinking`)."""
    model_dir = Path(model_dir)
    config_path = model_dir / CONFIG_FILE
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
    template_path = model_dir / TEMPLATE_FILE
    source = template_path.read_text(encoding="utf-8") if template_path.exists() else _configured(config, config_path)
    if source is None:
        return None
    return ChatTemplate(source, {**_special_tokens(config), **variables})


def _configured(config: dict, path: Path) -> str | None:
    """The config's template: a string, or (older multi-template configs) a list of named ones, of which the
    `default` one is the template for plain chat."""
    entry = config.get("chat_template")
    if entry is None or isinstance(entry, str):
        return entry
    named = {t["name"]: t["template"] for t in entry}
    if "default" not in named:
        raise ValueError(f"{path}: chat_template names {sorted(named)} but no 'default' template")
    return named["default"]


def _special_tokens(config: dict) -> dict[str, str]:
    """The special tokens the config sets, as text (a token may be saved as an AddedToken object); unset ones
    stay undefined in the template, as in transformers (not the text 'None')."""
    tokens = {name: config.get(name) for name in SPECIAL_TOKENS}
    tokens = {name: t["content"] if isinstance(t, dict) else t for name, t in tokens.items()}
    return {name: t for name, t in tokens.items() if isinstance(t, str)}


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: tuple | None = None,
            sort_keys: bool = False) -> str:
    """Jinja's own `tojson` escapes HTML characters (for web pages); templates expect plain JSON, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)
