"""The README's examples that talk to a server, run as printed against a real server on the default models.

README.md stays the source of truth: the examples are read from it when the tests are collected.
- A fenced ```bash block is an example when one of its commands (backslash continuations and quoted line breaks
  joined) starts with `curl` or `.venv/bin/adaflash-client`; those commands run, in order (the block's other
  commands, such as `make serve`, are not). Each must exit 0 within DEADLINE_S; each curl must answer HTTP 200 (a
  curl configuration of the test's own, $CURL_HOME/.curlrc, prints the status on stderr) with a JSON body, or
  server-sent events of JSON; an `adaflash-client` must print text.
- A fenced ```python block is an example when it constructs an OpenAI client for http://127.0.0.1:9000/v1 or an
  `AdaFlashClient`; it runs in an interpreter of its own (this one's environment) and must exit 0 within DEADLINE_S.
One `adaflash serve` on models/default, as `make serve` starts it, listens on free loopback ports; the examples'
ports are rewritten to those (8001 -> gRPC, 9000 -> OpenAI), and nothing else: where an example relies on the
default address (an `adaflash-client` without --url, `AdaFlashClient()` without one) it is given the gRPC port.
Skipped by rule (`needs_other_setup`): examples that need TLS, an API key or a host other than this machine.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import wait_until

from adaflash_server.launcher import free_ports

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MODELS = ROOT / "models" / "default"
GRPC_PORT, OPENAI_PORT = 8001, 9000  # the README's (`make serve`'s) ports
LOOPBACK = ("127.0.0.1", "localhost")
SERVER_COMMANDS = ("curl", ".venv/bin/adaflash-client")
START_S = 900  # `adaflash serve` builds the repository and measures the target's costs before it is ready
DEADLINE_S = 300
STATUS = "readme-test-http-status"
TLS_OR_KEY = ("https://", "--ssl", "--root-cert", "--tls", "--cacert", "--api-key", "ADAFLASH_API_KEY", "Authorization")

pytestmark = pytest.mark.skipif(not (MODELS / "target" / "config.json").exists(), reason="models/default not built")


@dataclass(frozen=True)
class Example:
    kind: str  # "bash" or "python"
    line: int  # the README line of its opening fence
    text: str  # the block as printed
    commands: tuple[str, ...] = ()  # bash: the commands that talk to the server

    @property
    def where(self) -> str:
        return f"README.md:{self.line}"


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, line of the opening fence, body) of every fenced block."""
    blocks, lang, start, body = [], None, 0, []
    for n, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*```(\S*)\s*$", line)
        if lang is None and fence:
            lang, start, body = fence.group(1), n, []
        elif lang is not None and fence and not fence.group(1):
            blocks.append((lang, start, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def shell_commands(block: str) -> list[str]:
    """The block's commands: lines joined while a quote is open or a line ends in a backslash; comments dropped."""
    commands, pending = [], ""
    for line in block.splitlines():
        pending += line + "\n"
        if line.rstrip().endswith("\\"):
            continue
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quoted string goes on on the next line
            continue
        if words:
            commands.append(pending.strip())
        pending = ""
    assert not pending.strip(), f"unterminated command: {pending!r}"
    return commands


def talks_to_server(command: str) -> bool:
    return command.split(None, 1)[0] in SERVER_COMMANDS


def examples(text: str) -> list[Example]:
    found = []
    for lang, line, body in fenced_blocks(text):
        if lang in ("bash", "sh", "shell"):
            commands = tuple(c for c in shell_commands(body) if talks_to_server(c))
            if commands:
                found.append(Example("bash", line, body, commands))
        elif lang == "python" and ("AdaFlashClient(" in body or re.search(
                r"OpenAI\([^)]*base_url\s*=\s*[\"']http://(127\.0\.0\.1|localhost):9000/v1", body, re.S)):
            found.append(Example("python", line, body))
    return found


def example_id(example: Example) -> str:
    """What it shows, not where: `curl-chat-completions`, `adaflash-client`, `python-completions`, ..."""
    if example.kind == "python":
        call = re.search(r"\.((?:chat\.)?completions)\.create\(", example.text)
        return "python-" + (call.group(1).replace(".", "-") if call else
                            "adaflash-client" if "AdaFlashClient(" in example.text else "openai")
    first = example.commands[0]
    if first.startswith("curl"):
        path = re.search(r"/v1/([\w/.-]+)", first)
        return "curl-" + (path.group(1).replace("/", "-") if path else "request")
    return "adaflash-client"


def needs_other_setup(example: Example) -> str | None:
    """Why the example cannot run against a plain local server, or None."""
    text = example.text if example.kind == "python" else "\n".join(example.commands)
    if marker := next((m for m in TLS_OR_KEY if m in text), None):
        return f"needs TLS or an API key ({marker!r})"
    hosts = set(re.findall(r"(?:https?://|--url[= ]+[\"']?)([A-Za-z0-9_.-]+)", text))
    hosts |= set(re.findall(r"\burl=[\"']([A-Za-z0-9_.-]+):\d+", text))
    if remote := sorted(h for h in hosts if h not in LOOPBACK):
        return f"needs a remote host ({', '.join(remote)})"
    return None


def params(found: list[Example]) -> list:
    """One test per example, by what it shows (numbered when shown twice); those needing other setup skipped."""
    out, seen = [], {}
    for e in found:
        base = example_id(e)
        seen[base] = seen.get(base, 0) + 1
        reason = needs_other_setup(e)
        marks = [pytest.mark.skip(reason=f"{e.where}: {reason}")] if reason else []
        out.append(pytest.param(e, id=base if seen[base] == 1 else f"{base}-{seen[base]}", marks=marks))
    return out


EXAMPLES = examples(README.read_text(encoding="utf-8"))


def with_ports(text: str, grpc: int, openai: int) -> str:
    """Only the ports change: the README's 8001 and 9000 on this machine become the test server's."""
    host = r"(127\.0\.0\.1|localhost)"
    text = re.sub(rf"{host}:{GRPC_PORT}\b", rf"\g<1>:{grpc}", text)
    return re.sub(rf"{host}:{OPENAI_PORT}\b", rf"\g<1>:{openai}", text)


def bash_command(command: str, grpc: int, openai: int) -> str:
    command = with_ports(command, grpc, openai)
    if command.startswith(".venv/bin/adaflash-client") and "--url" not in command:  # relies on 127.0.0.1:8001
        command = command.replace(".venv/bin/adaflash-client", f".venv/bin/adaflash-client --url 127.0.0.1:{grpc}", 1)
    return command


def python_source(text: str, grpc: int, openai: int) -> str:
    """The example with its ports rewritten; an AdaFlashClient made without a url gets the test server's."""
    prelude = ""
    if "AdaFlashClient(" in text:
        prelude = (
            "import adaflash_client as _client\n"
            "_init = _client.AdaFlashClient.__init__\n"
            "_names = _init.__code__.co_varnames[:_init.__code__.co_argcount]\n"
            "_at = _names.index('url') - (len(_names) - len(_init.__defaults__))\n"
            f"_init.__defaults__ = (*_init.__defaults__[:_at], '127.0.0.1:{grpc}', *_init.__defaults__[_at + 1:])\n")
    return prelude + with_ports(text, grpc, openai)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`adaflash serve` on models/default (`make serve`) on free loopback ports: (gRPC port, OpenAI port)."""
    root = tmp_path_factory.mktemp("readme")
    grpc, http, metrics, openai = free_ports(4)
    log = root / "serve.log"
    cmd = [sys.executable, "-m", "adaflash.entry", "serve", "--model-dir", str(MODELS.relative_to(ROOT)),
           "--state-dir", str(root / "state"), "--grpc-port", str(grpc), "--http-port", str(http),
           "--metrics-port", str(metrics), "--openai-port", str(openai)]
    with log.open("w") as out:
        serve = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: "Ctrl-C stops the server" in log.read_text() or serve.poll() is not None, START_S,
                   "adaflash serve to be ready", interval_s=0.5)
        assert serve.poll() is None, f"adaflash serve exited: {log.read_text()[-3000:]}"
        yield grpc, openai
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)  # drains, then stops tritonserver
            try:
                serve.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()


@pytest.fixture(scope="module")
def curl_home(tmp_path_factory) -> Path:
    """A curl configuration that adds only a status line on stderr: the example's own options stay as printed."""
    home = tmp_path_factory.mktemp("curl")
    (home / ".curlrc").write_text(f'write-out = "%{{stderr}}{STATUS} %{{http_code}}\\n"\n')
    return home


def test_the_readme_shows_each_kind_of_client():
    """The examples the README keeps: curl, the gRPC client and the OpenAI SDK against 127.0.0.1."""
    kinds = {example_id(e).split("-")[0] for e in EXAMPLES}
    assert {"curl", "adaflash", "python"} <= kinds, [example_id(e) for e in EXAMPLES]


def _json_documents(body: str) -> list:
    """A JSON body, or the data of each server-sent event (`data: {...}`, then `data: [DONE]`)."""
    stripped = body.strip()
    if not stripped.startswith("data:"):
        return [json.loads(stripped)]
    events = [line[len("data:"):].strip() for line in stripped.splitlines() if line.startswith("data:")]
    assert events and events[-1] == "[DONE]", stripped[-500:]
    return [json.loads(e) for e in events[:-1]]


def body_on_stdout(command: str) -> bool:
    """Whether curl's body is the command's output: no pipe, redirection, --output or further command."""
    tokens = list(shlex.shlex(command, posix=True, punctuation_chars=True))
    return not any(t in ("-o", "--output") or t.strip("0123456789&") in ("|", ">", ">>", "&&", "||", ";")
                   for t in tokens)


@pytest.mark.parametrize("example", params(EXAMPLES))
def test_readme_example_runs_against_a_server(example: Example, server, curl_home):
    grpc, openai = server
    if example.kind == "python":
        source = python_source(example.text, grpc, openai)
        run = subprocess.run([sys.executable, "-c", source], cwd=ROOT, capture_output=True, text=True,
                             timeout=DEADLINE_S)
        assert run.returncode == 0, f"{example.where}:\n{source}\nstdout: {run.stdout[-2000:]}\nstderr: {run.stderr[-3000:]}"
        return
    env = {**os.environ, "CURL_HOME": str(curl_home)}  # curl reads $CURL_HOME/.curlrc first
    for command in example.commands:
        command = bash_command(command, grpc, openai)
        run = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, env=env,
                             timeout=DEADLINE_S)
        detail = f"{example.where}: {command}\nstdout: {run.stdout[-2000:]}\nstderr: {run.stderr[-3000:]}"
        assert run.returncode == 0, detail
        if command.startswith("curl"):
            statuses = re.findall(rf"^{STATUS} (\d+)$", run.stderr, re.M)
            assert statuses and all(s == "200" for s in statuses), detail
            if body_on_stdout(command):
                documents = _json_documents(run.stdout)
                assert documents and all(isinstance(d, dict) and "error" not in d for d in documents), detail
        else:
            assert run.stdout.strip(), detail
