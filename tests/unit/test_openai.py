"""The OpenAI-compatible endpoint's errors without a server: the server's refusals in OpenAI's terms (the endpoint
over a real tritonserver, driven by the official `openai` SDK: tests/integration/test_openai_served.py)."""

from __future__ import annotations

import pytest

from adaflash_client import GenerationParams
from adaflash_client.client import GenerationError
from adaflash_server.openai_front import Generation, server_error


def _generation(chat: bool) -> Generation:
    return Generation(chat=chat, prompt="hi", params=GenerationParams(), stream=False, include_usage=False,
                      max_tokens_param="max_completion_tokens")


@pytest.mark.parametrize(("message", "chat", "status", "param"), [
    ("INVALID_ARGUMENT: apply_chat_template: the target has no chat template", True, 400,
     "messages"),
    ("INVALID_ARGUMENT: text_input: prompt of 900 tokens exceeds the limit of 400", False, 400, "prompt"),
    ("INVALID_ARGUMENT: max_tokens: must be in [1, 600], got 0", True, 400, "max_completion_tokens"),
    ("UNAVAILABLE: the admission queue is full (256 requests waiting)", False, 503, None),
])
def test_server_refusals_become_openai_errors(message, chat, status, param):
    """The server's own answers (a target without a chat template, overload) in OpenAI's terms."""
    error = server_error(GenerationError(None, message), _generation(chat))
    assert (error.status, error.param) == (status, param)
    assert error.body()["error"]["message"]


def test_an_unreachable_server_is_a_503():
    error = server_error(GenerationError("StatusCode.UNAVAILABLE", "failed to connect to all addresses"),
                         _generation(False))
    assert (error.status, error.body()["error"]["code"]) == (503, "service_unavailable")
