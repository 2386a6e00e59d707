"""The containers for real: the CPU image built, run and talked to, and (with --compose) docker-compose.yml's
server, loadtest and fleet, one replica killed under load.

    .venv/bin/python -m adaflash_tools.image_check --json bench-out/image-check.json              # make image-check
    .venv/bin/python -m adaflash_tools.image_check --compose --json bench-out/compose-check.json  # make compose-check

Image check: a Docker daemon (the one that answers, else one of its own: `dockerd --iptables=false
--storage-driver=vfs` with its data under --data-root; needs root and Debian's docker.io); the base
debian:bookworm-slim (pulled, else made from Debian's packages with debootstrap and `docker import`); the image built
with BuildKit (torch's CPU wheel from pip's local wheel folder when it has one, served on 127.0.0.1, else PyTorch's
CPU index; pip's CA bundle as the build secret `pip_ca`), its build time and size printed; the container run with
its ports published on 127.0.0.1, waited for until its HEALTHCHECK says healthy; one streaming gRPC completion with
`adaflash-client` and one completion with the OpenAI SDK from this host; the container stopped (SIGTERM: the drain)
and removed.

Compose check (after the image check's build): `docker compose` (v2) or `docker-compose` (v1) as project
`adaflash-check`: `up -d server` until healthy, `run --rm loadtest` with a short sweep (its report in the host's
./bench-out/sweep), `down`; then the fleet profile (`up -d replica balancer`; the balancer's image from Debian's
nginx, deploy/docker/, when nginx:1.28.0 cannot be pulled), closed-loop gRPC streams through the balancer's port for
--fleet-load-s seconds and `docker kill` of one replica (SIGKILL to its whole container: a lost node) after
--kill-after-s; the requests counted by phase as adaflash_tools.failover counts them, and by the balancer's log.

Every wait has a deadline. Whatever it started is stopped and removed at the end, failed or not: its containers,
the compose project, the local wheel server and the daemon it started (whose images stay cached under --data-root);
it then checks that no process of that daemon is left. Exit status 0 when every step and check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from datetime import datetime
from dataclasses import asdict, dataclass, field
from pathlib import Path

from adaflash_tools.net import accepts, http_ok, log_tail

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
IMAGE = "adaflash:cpu"
BASE = "debian:bookworm-slim"
SUITE = "bookworm"
NGINX_IMAGE = "nginx:1.28.0"  # docker-compose.yml's balancer
NGINX_FALLBACK = ROOT / "deploy" / "docker" / "compose.debian-nginx.yml"
PROJECT = "adaflash-check"
CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
COMPOSE_PORTS = [8000, 8001, 8002, 9000, 8201]  # what docker-compose.yml publishes on the host
PROMPT = "def fibonacci(n):"
DEFAULT_DATA_ROOT = Path("/var/tmp/adaflash-docker")
HEALTHY_TIMEOUT_S = 900.0  # the image's start period (600 s) and more: two replicas load at once on 2 cores
BUILD_TIMEOUT_S = 3600.0
WHEEL_INDEX_PORT = 38765
STOP_TIMEOUT_S = 75  # docker-compose.yml's stop_grace_period: the server drains for up to 60 s


def log(message: str) -> None:
    print(f"[image-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


class CheckFailed(RuntimeError):
    pass


class Interrupted(Exception):
    """SIGTERM or SIGINT: the check stops, and removes what it started on the way out."""


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(f"stopped by signal {signum}")


def run_group(cmd: list[str], timeout: float, output: Path) -> None:
    """A command in a process group of its own, output to a file; on a timeout or an interruption the whole group
    is killed (debootstrap's chrooted dpkg and apt outlive a kill of debootstrap alone)."""
    with output.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = process.wait(timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        raise
    if code != 0:
        raise CheckFailed(f"{' '.join(cmd)} exited {code}: {log_tail(output)}")


def unmount_under(folder: Path) -> int:
    """Unmount whatever is mounted under `folder` (lazily when busy), deepest first; how many."""
    mounts = mounts_under(folder)
    for mount in mounts:
        if run(["umount", mount], 30, check=False).returncode != 0:
            run(["umount", "-l", mount], 30, check=False)
    return len(mounts)


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None, check: bool = True,
        capture: bool = True, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """A command with a deadline; its output captured (or streamed when `capture` is False)."""
    try:
        result = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, text=True,
                                stdout=subprocess.PIPE if capture else None,
                                stderr=subprocess.STDOUT if capture else None)
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"{' '.join(cmd[:4])} ...: no end within {timeout:.0f} s") from exc
    if check and result.returncode != 0:
        raise CheckFailed(f"{' '.join(cmd)} exited {result.returncode}: {(result.stdout or '')[-3000:]}")
    return result


# The daemon -----------------------------------------------------------------------------------------------------

def docker_clis() -> list[str]:
    """Every `docker` on PATH, in PATH order."""
    found = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = Path(folder) / "docker"
        if path.is_file() and os.access(path, os.X_OK) and str(path.resolve()) not in map(_resolved, found):
            found.append(str(path))
    return found


def _resolved(path: str) -> str:
    return str(Path(path).resolve())


def build_cli(env: dict[str, str]) -> str:
    """A docker CLI that builds with BuildKit: one with the buildx plugin, or one older than 23.0 (its own BuildKit
    client, with DOCKER_BUILDKIT=1; Debian 12's docker.io is 20.10). A newer CLI without buildx has only the legacy
    builder, which has no RUN --mount."""
    for cli in docker_clis():
        if run([cli, "buildx", "version"], 30, env, check=False).returncode == 0:
            return cli
        version = run([cli, "version", "--format", "{{.Client.Version}}"], 30, env, check=False).stdout.strip()
        major = re.match(r"(\d+)\.", version)
        if major and int(major[1]) < 23:
            return cli
    raise CheckFailed("no docker CLI here builds with BuildKit: install the buildx plugin, or Debian's docker.io")


class Daemon:
    """The Docker daemon the check talks to: the one that answers (DOCKER_HOST or the default socket), else a
    dockerd of its own with everything under `data_root`, stopped by `stop()`."""

    def __init__(self, data_root: Path, own: bool) -> None:
        self.data_root = data_root
        self.own = own
        self.process: subprocess.Popen | None = None
        self.env = dict(os.environ)
        self.cli = (docker_clis() or ["docker"])[0]

    def answers(self) -> bool:
        result = run([self.cli, "version", "--format", "{{.Server.Version}}"], 20, self.env, check=False)
        return result.returncode == 0

    def start(self) -> Daemon:
        if not self.own and self.answers():
            log(f"using the Docker daemon that answers ({self.env.get('DOCKER_HOST', 'the default socket')})")
            return self
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise CheckFailed("no Docker daemon answers and dockerd is not installed (Debian: apt-get install "
                              "docker.io tini; tini is docker-init, which `--init` and compose's init: need)")
        if os.geteuid() != 0:
            raise CheckFailed("no Docker daemon answers, and starting one needs root")
        for sub in ("data", "exec"):
            (self.data_root / sub).mkdir(parents=True, exist_ok=True)
        socket_path = self.data_root / "docker.sock"
        self.env["DOCKER_HOST"] = f"unix://{socket_path}"
        # No iptables rules on this host (containers reach each other on the bridge, published ports go through
        # docker-proxy); vfs needs nothing of the kernel but a filesystem.
        cmd = [dockerd, "--iptables=false", "--storage-driver=vfs", "--data-root", str(self.data_root / "data"),
               "--exec-root", str(self.data_root / "exec"), "--pidfile", str(self.data_root / "docker.pid"),
               "-H", self.env["DOCKER_HOST"]]
        with (self.data_root / "dockerd.log").open("ab") as out:
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = log_tail(self.data_root / "dockerd.log")
                self.stop()
                raise CheckFailed(f"dockerd did not start: {tail}")
            time.sleep(0.5)
        log(f"started dockerd (pid {self.process.pid}, data root {self.data_root}, {self.env['DOCKER_HOST']})")
        return self

    def docker(self, *args: str, timeout: float = 120, check: bool = True,
               capture: bool = True) -> subprocess.CompletedProcess:
        return run([self.cli, *args], timeout, self.env, check, capture)

    def has_image(self, name: str) -> bool:
        return self.docker("image", "inspect", name, check=False).returncode == 0

    def stop(self) -> list[str]:
        """SIGTERM to the dockerd it started (it stops its containerd), SIGKILL to its group if it lingers; then
        the processes still running that name the data root (none expected), which are SIGKILLed and returned."""
        if self.process is None:
            return []
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
        left = processes_naming(str(self.data_root))
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # dockerd leaves its default network namespace mounted under the exec root; unmounted, the data root can
        # be deleted.
        unmounted = unmount_under(self.data_root)
        log(f"stopped dockerd (pid {self.process.pid}); processes left naming {self.data_root}: {len(left)}; "
            f"unmounted {unmounted} mount(s) it left")
        return [f"{pid} {cmd}" for pid, cmd in left]


def mounts_under(folder: Path) -> list[str]:
    """Mount points under `folder`, deepest first (Linux: /proc/self/mounts)."""
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    prefix = str(folder.resolve()).rstrip("/") + "/"
    return sorted((p for p in points if (p + "/").startswith(prefix)), key=len, reverse=True)


def processes_naming(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line contains `text` (Linux: /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if text in cmd:
                found.append((int(proc.name), cmd))
    return found


# The base image -------------------------------------------------------------------------------------------------

def apt_mirror() -> str:
    """The Debian mirror apt uses here (deb822 or one-line sources), else deb.debian.org."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        text = path.read_text(errors="replace") if path.is_file() else ""
        for uri in re.findall(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+/debian)/?\s", text + "\n", re.M):
            return uri
    return "http://deb.debian.org/debian"


# What debian:bookworm-slim has beyond a minbase debootstrap: the archive with its updates and security suites,
# and dpkg told to leave documentation out of later installs.
SLIM_SOURCES = """Types: deb
URIs: {mirror}
Suites: {suite} {suite}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {security}
Suites: {suite}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
SLIM_DPKG_EXCLUDES = """path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
"""


def base_image(daemon: Daemon, work: Path, pull_timeout_s: float) -> dict:
    """debian:bookworm-slim: there already, pulled, or made from Debian's packages."""
    if daemon.has_image(BASE):
        return {"base": BASE, "source": "already in the daemon"}
    started = time.monotonic()
    if daemon.docker("pull", BASE, timeout=pull_timeout_s, check=False).returncode == 0:
        return {"base": BASE, "source": "pulled", "seconds": round(time.monotonic() - started, 1)}
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise CheckFailed(f"{BASE} cannot be pulled and debootstrap is not installed (apt-get install debootstrap)")
    mirror = apt_mirror()
    log(f"{BASE} cannot be pulled: making it with debootstrap --variant=minbase {SUITE} from {mirror}")
    rootfs = work / "rootfs"
    run_group([debootstrap, "--variant=minbase", SUITE, str(rootfs), mirror], 1200, work / "debootstrap.log")
    for leftover in [*(rootfs / "var/cache/apt/archives").glob("*.deb"), rootfs / "etc/apt/sources.list"]:
        leftover.unlink(missing_ok=True)
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
    security = mirror.rsplit("/debian", 1)[0] + "/debian-security"
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(
        SLIM_SOURCES.format(mirror=mirror, security=security, suite=SUITE))
    (rootfs / "etc/dpkg/dpkg.cfg.d/docker").write_text(SLIM_DPKG_EXCLUDES)
    for folder in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"):
        for path in (rootfs / folder).glob("*"):
            if path.is_dir() and not (folder == "usr/share/doc" and (path / "copyright").exists()):
                shutil.rmtree(path, ignore_errors=True)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        subprocess.run([daemon.cli, "import", "--change", 'CMD ["bash"]', "-", BASE], stdin=tar.stdout,
                       env=daemon.env, check=True, timeout=600, capture_output=True)
    finally:
        tar.stdout.close()
        tar.wait(60)
    shutil.rmtree(rootfs, ignore_errors=True)
    return {"base": BASE, "source": f"debootstrap --variant=minbase {SUITE} {mirror}, docker import",
            "seconds": round(time.monotonic() - started, 1)}


# The build ------------------------------------------------------------------------------------------------------

def pip_setting(name: str) -> list[str]:
    """A pip setting's values as pip here sees them (PIP_* environment, then its configuration files)."""
    values = os.environ.get(f"PIP_{name.upper().replace('-', '_')}", "").split()
    config = run([sys.executable, "-m", "pip", "config", "list"], 60, check=False).stdout
    for key, value in re.findall(r"^[\w:.-]*\.([\w-]+)='(.*)'$", config, re.M):
        if key == name:
            values += value.split()
    return list(dict.fromkeys(values))


def torch_pin() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d.split("==", 1)[1] for d in deps if d.startswith("torch=="))


def local_torch_wheel() -> Path | None:
    """torch's CPU wheel for this Python in a local folder pip finds links in, as on these machines."""
    version = torch_pin()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for link in pip_setting("find-links"):
        folder = Path(link.removeprefix("file://"))
        if folder.is_dir():
            wheels = sorted(folder.glob(f"torch-{version}+cpu-{tag}-{tag}-*x86_64.whl"))
            if wheels:
                return wheels[0]
    return None


class WheelIndex:
    """A one-package index (PEP 503 layout: /torch/<wheel>) served on 127.0.0.1 for the build's pip."""

    def __init__(self, wheel: Path, work: Path) -> None:
        self.root = work / "torch-index"
        (self.root / "torch").mkdir(parents=True, exist_ok=True)
        link = self.root / "torch" / wheel.name
        if not link.exists():
            link.symlink_to(wheel)
        handler = functools.partial(_QuietHandler, directory=str(self.root))
        try:  # the same URL each time keeps the build's torch layer cached (the URL is part of its cache key)
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEEL_INDEX_PORT), handler)
        except OSError:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __enter__(self) -> WheelIndex:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def ca_bundle() -> Path | None:
    """The CA bundle pip here is told to trust (PIP_CERT or pip's `cert`), which a TLS-rewriting proxy needs."""
    for value in pip_setting("cert"):
        if Path(value).is_file():
            return Path(value)
    return None


def build_image(daemon: Daemon, work: Path, torch_index: str | None, pip_index: str | None,
                ca: Path | None) -> dict:
    """`docker build -t adaflash:cpu .` with BuildKit; the build time and the image's size."""
    cli = build_cli(daemon.env)
    env = daemon.env | {"DOCKER_BUILDKIT": "1"}
    wheel = None if torch_index else local_torch_wheel()
    with contextlib.ExitStack() as stack:
        # The host's network: pip reaches a wheel server on 127.0.0.1, and a daemon started with --iptables=false
        # gives containers on its bridge no route out.
        args = ["build", "--progress", "plain", "--network", "host", "-t", IMAGE]
        if wheel is not None:
            torch_index = stack.enter_context(WheelIndex(wheel, work)).url
        if torch_index:
            args += ["--build-arg", f"TORCH_INDEX_URL={torch_index}"]
        if pip_index:
            args += ["--build-arg", f"PIP_INDEX_URL={pip_index}"]
        if ca is not None:
            args += ["--secret", f"id=pip_ca,src={ca}"]
        log(f"building {IMAGE}: {cli} {' '.join(args)} . (torch from {wheel or torch_index or 'the default index'})")
        started = time.monotonic()
        build_log = work / "build.log"
        with build_log.open("w") as out:
            result = subprocess.run([cli, *args, "."], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    timeout=BUILD_TIMEOUT_S)
        seconds = round(time.monotonic() - started, 1)
    if result.returncode != 0:
        raise CheckFailed(f"the build failed after {seconds} s: {log_tail(build_log)}")
    size = int(daemon.docker("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    native = re.findall(r"native kernels: (\w+)", build_log.read_text(errors="replace"))
    log(f"built {IMAGE} in {seconds} s; image size {size / 1e9:.2f} GB ({size} bytes)")
    return {"image": IMAGE, "build_s": seconds, "size_bytes": size, "size_gb": round(size / 1e9, 2),
            "cli": cli, "torch_from": str(wheel or torch_index or "https://download.pytorch.org/whl/cpu"),
            "ca_secret": str(ca) if ca else None, "native_kernels_built": native[-1:] == ["True"]}


# The image, run ------------------------------------------------------------------------------------------------

def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def state(daemon: Daemon, container: str) -> dict:
    result = daemon.docker("inspect", "--format", "{{json .State}}", container, check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def health_log(container_state: dict) -> list[str]:
    """The healthcheck's last runs (Docker keeps five): seconds after the container started, how long, exit code."""
    def seconds(stamp: str) -> float:  # RFC 3339 with nanoseconds; the fraction cut to microseconds
        whole, _, fraction = stamp.rstrip("Z").partition(".")
        fraction = re.match(r"\d*", fraction)[0][:6]
        zone = re.search(r"[+-]\d\d:\d\d$", stamp)
        value = datetime.fromisoformat(f"{whole}.{fraction or '0'}{zone[0] if zone else '+00:00'}")
        return value.timestamp()

    try:
        start = seconds(container_state["StartedAt"])
        return [f"at {seconds(e['Start']) - start:.1f} s took {seconds(e['End']) - seconds(e['Start']):.1f} s: "
                f"exit {e['ExitCode']}" for e in container_state.get("Health", {}).get("Log", [])]
    except (KeyError, ValueError, TypeError):
        return []


def wait_healthy(daemon: Daemon, containers: list[str], timeout_s: float, ready_url: str | None = None) -> dict:
    """Until every container's healthcheck says healthy (and, with `ready_url`, when it first answered 200)."""
    started = time.monotonic()
    deadline = started + timeout_s
    ready_s = None
    while True:
        states = {c: state(daemon, c) for c in containers}
        if ready_s is None and ready_url and http_ok(ready_url):
            ready_s = round(time.monotonic() - started, 1)
        if all(s.get("Health", {}).get("Status") == "healthy" for s in states.values()):
            return {"healthy_s": round(time.monotonic() - started, 1), "ready_answered_s": ready_s,
                    "health_log": {c: health_log(s) for c, s in states.items()}}
        for name, s in states.items():
            if not s.get("Running") or s.get("Health", {}).get("Status") == "unhealthy":
                raise CheckFailed(f"{name} is {s.get('Status')}/{s.get('Health', {}).get('Status')}: "
                                  f"{daemon.docker('logs', '--tail', '40', name, check=False).stdout}")
        if time.monotonic() > deadline:
            raise CheckFailed(f"not healthy within {timeout_s:.0f} s: {containers}")
        time.sleep(1.0)


def grpc_completion(grpc: str) -> dict:
    """One streaming completion with the project's client, `adaflash-client`."""
    client = VENV_BIN / "adaflash-client"
    result = subprocess.run([str(client), PROMPT, "--url", grpc, "--stream", "--max-tokens", "32"],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise CheckFailed(f"adaflash-client exited {result.returncode}: {result.stderr[-2000:]}")
    stats = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    log(f"gRPC (adaflash-client --stream): {result.stdout!r}; {stats}")
    return {"text": result.stdout, "stats": stats}


def openai_completion(base_url: str) -> dict:
    """One completion with the OpenAI Python SDK (the dev extra's `openai`)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", timeout=300, max_retries=0)
    reply = client.completions.create(model="default", prompt=PROMPT, max_tokens=32, temperature=0)
    text = reply.choices[0].text
    log(f"OpenAI SDK (completions.create): {text!r}; usage {reply.usage}")
    if not reply.usage or reply.usage.completion_tokens < 1:
        raise CheckFailed(f"the OpenAI completion has no tokens: {reply}")
    return {"text": text, "finish_reason": reply.choices[0].finish_reason,
            "completion_tokens": reply.usage.completion_tokens}


def native_loaded(daemon: Daemon, container: str) -> bool:
    """Whether a process in the container has the native kernels (the library built in the image) mapped."""
    result = daemon.docker("exec", container, "sh", "-c", "grep -l kernels- /proc/[0-9]*/maps 2>/dev/null",
                           check=False)
    return bool(result.stdout.strip())


def image_run(daemon: Daemon, run_id: str) -> dict:
    """The image as `docker run` starts it, its ports on free 127.0.0.1 ports; healthy, two completions, stop."""
    name = f"adaflash-image-check-{run_id}"
    host = dict(zip(CONTAINER_PORTS, free_ports(len(CONTAINER_PORTS)), strict=True))
    publish = [a for key, port in CONTAINER_PORTS.items() for a in ("-p", f"127.0.0.1:{host[key]}:{port}")]
    started = time.monotonic()
    daemon.docker("run", "-d", "--init", "--shm-size", "1g", "--name", name, "--label", f"adaflash.check={run_id}",
                  *publish, IMAGE)
    result: dict = {"container": name, "host_ports": host}
    try:
        result |= wait_healthy(daemon, [name], HEALTHY_TIMEOUT_S, f"http://127.0.0.1:{host['http']}/v2/health/ready")
        result["healthy_s"] = round(time.monotonic() - started, 1)
        log(f"{name} healthy {result['healthy_s']} s after `docker run` (ready answered after "
            f"{result['ready_answered_s']} s)")
        result["user"] = daemon.docker("exec", name, "id", "-un").stdout.strip()
        result["native_kernels_loaded"] = native_loaded(daemon, name)
        result["grpc"] = grpc_completion(f"127.0.0.1:{host['grpc']}")
        result["openai"] = openai_completion(f"http://127.0.0.1:{host['openai']}/v1")
        stop_started = time.monotonic()
        daemon.docker("stop", "-t", str(STOP_TIMEOUT_S), name, timeout=STOP_TIMEOUT_S + 30)
        result["stop_s"] = round(time.monotonic() - stop_started, 1)
        result["exit_code"] = state(daemon, name).get("ExitCode")
        log(f"stopped in {result['stop_s']} s, exit code {result['exit_code']}")
    finally:
        daemon.docker("rm", "-f", name, check=False)
    return result


# Compose -------------------------------------------------------------------------------------------------------

def compose_cli(daemon: Daemon) -> list[str]:
    """`docker compose` (v2) where the plugin answers, else `docker-compose` (v1)."""
    for cli in docker_clis():
        if run([cli, "compose", "version"], 30, daemon.env, check=False).returncode == 0:
            return [cli, "compose"]
    v1 = shutil.which("docker-compose")
    if v1 is None:
        raise CheckFailed("neither `docker compose` nor `docker-compose` is installed (Debian: apt-get install "
                          "docker-compose)")
    return [v1]


@dataclass
class Compose:
    daemon: Daemon
    files: list[Path]
    cli: list[str] = field(default_factory=list)

    def __call__(self, *args: str, timeout: float = 300, check: bool = True,
                 profiles: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        files = [a for f in self.files for a in ("-f", str(f))]
        chosen = [a for p in profiles for a in ("--profile", p)]
        return run([*self.cli, "-p", PROJECT, *files, *chosen, *args], timeout, self.daemon.env, check)

    def containers(self, service: str) -> list[str]:
        out = self.daemon.docker("ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}",
                                 "--filter", f"label=com.docker.compose.service={service}",
                                 "--format", "{{.Names}}").stdout
        return sorted(out.split())

    def down(self) -> float:
        started = time.monotonic()
        self("down", "--remove-orphans", "--timeout", str(STOP_TIMEOUT_S), timeout=600, check=False,
             profiles=("loadtest", "fleet", "gpu"))
        seconds = round(time.monotonic() - started, 1)
        log(f"compose: down in {seconds} s")
        return seconds


def ports_in_use(ports: list[int]) -> list[int]:
    return [p for p in ports if accepts("127.0.0.1", p)]


def short_sweep(compose: Compose, sweep_s: int) -> dict:
    """`run --rm loadtest` with its own command and a short sweep appended; the report must land on the host."""
    config = compose("config", profiles=("loadtest",)).stdout
    command = _yaml_list(config, "loadtest", "command")
    extra = ["--modes", "ar,adaflash", "--concurrency", "1,4", "--duration", str(sweep_s), "--quiet"]
    report = ROOT / "bench-out" / "sweep" / "report.md"
    started_wall, started = time.time(), time.monotonic()
    result = compose("run", "--rm", "loadtest", *command, *extra, timeout=1800, check=False, profiles=("loadtest",))
    seconds = round(time.monotonic() - started, 1)
    fresh = report.is_file() and report.stat().st_mtime >= started_wall
    log(f"loadtest ({' '.join(extra)}): exit {result.returncode} after {seconds} s; "
        f"{report.relative_to(ROOT)} {'written' if fresh else 'NOT written'}")
    if result.returncode != 0 or not fresh:
        raise CheckFailed(f"the loadtest failed: {result.stdout[-3000:]}")
    return {"command": command + extra, "seconds": seconds, "report": str(report.relative_to(ROOT)),
            "report_bytes": report.stat().st_size, "report_owner_uid": report.stat().st_uid}


def _yaml_list(config: str, service: str, key: str) -> list[str]:
    """A service's list value from `compose config` output (YAML; PyYAML comes with the dev extra)."""
    import yaml

    return [str(v) for v in yaml.safe_load(config)["services"][service][key]]


def compose_server(compose: Compose) -> dict:
    started = time.monotonic()
    compose("up", "-d", "--no-build", "server", timeout=300)
    [server] = compose.containers("server")
    result = wait_healthy(compose.daemon, [server], HEALTHY_TIMEOUT_S, "http://127.0.0.1:8000/v2/health/ready")
    result["healthy_s"] = round(time.monotonic() - started, 1)
    log(f"compose: {server} healthy {result['healthy_s']} s after `up -d server`")
    return result | {"container": server}


# The fleet ------------------------------------------------------------------------------------------------------

@dataclass
class Member:
    """A replica container as failover.per_replica reads it: a name and the address the balancer logs."""

    name: str
    address: str


def container_ip(daemon: Daemon, container: str) -> str:
    return daemon.docker("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                         container).stdout.strip()


async def fleet_load(url: str, duration_s: float, kill_after_s: float, users: int, max_tokens: int,
                     kill: Callable[[], object]) -> tuple[list, object]:
    """Closed-loop gRPC streams through the balancer for `duration_s`; `kill()` (blocking, in a thread) after
    `kill_after_s`, which returns the failover.Kill it measured."""
    import tritonclient.grpc.aio as grpcaio

    from adaflash_client.client import GenerationParams
    from adaflash_tools.failover import Sent
    from adaflash_tools.reliability import PROMPTS, one_stream

    params = GenerationParams(max_tokens=max_tokens, spec_mode="adaflash")
    client = grpcaio.InferenceServerClient(url)
    stop_at = time.monotonic() + duration_s
    sent: list[Sent] = []
    count = 0

    async def user(u: int) -> None:
        nonlocal count
        while time.monotonic() < stop_at:
            count += 1
            began = time.monotonic()
            outcome = await one_stream(client, PROMPTS[(u + count) % len(PROMPTS)], params)
            sent.append(Sent(began, outcome.ended, outcome.ok, outcome.error))

    async def killer():
        await asyncio.sleep(kill_after_s)
        return await asyncio.to_thread(kill)

    try:
        results = await asyncio.gather(killer(), *(user(u) for u in range(users)))
    finally:
        await client.close()
    return sent, results[0]


def fleet(compose: Compose, load_s: float, kill_after_s: float, users: int) -> dict:
    from adaflash_tools import failover

    daemon = compose.daemon
    started = time.monotonic()
    compose("up", "-d", "--no-build", "replica", "balancer", timeout=HEALTHY_TIMEOUT_S + 120, profiles=("fleet",))
    replicas = compose.containers("replica")
    [balancer] = compose.containers("balancer")
    wait_healthy(daemon, replicas, HEALTHY_TIMEOUT_S)
    up_s = round(time.monotonic() - started, 1)
    if len(replicas) < 2:
        raise CheckFailed(f"the fleet has {len(replicas)} replica(s): {replicas}")
    members = [Member(name, f"{container_ip(daemon, name)}:8001") for name in replicas]
    nginx = daemon.docker("exec", balancer, "nginx", "-v").stdout.strip().removeprefix("nginx version: ")
    log(f"fleet up in {up_s} s: {', '.join(f'{m.name} ({m.address})' for m in members)} behind {balancer} ({nginx})")
    url = "127.0.0.1:8201"
    deadline = time.monotonic() + 60
    while not accepts("127.0.0.1", 8201):
        if time.monotonic() > deadline:
            raise CheckFailed("the balancer's port 8201 does not accept connections")
        time.sleep(0.5)
    victim = members[0]
    victim_ip = victim.address.split(":")[0]

    def kill() -> failover.Kill:
        at, wall = time.monotonic(), time.time()
        daemon.docker("kill", victim.name)  # SIGKILL to the container's init: every process in it dies
        while accepts(victim_ip, 8001):
            if time.monotonic() > at + 30:
                raise CheckFailed(f"{victim.address} still accepts connections 30 s after the kill")
            time.sleep(0.005)
        return failover.Kill(at, wall, round(time.monotonic() - at, 3))

    log(f"load: {users} streams through {url} for {load_s:.0f} s; `docker kill {victim.name}` after "
        f"{kill_after_s:.0f} s")
    sent, killed = asyncio.run(fleet_load(url, load_s, kill_after_s, users, 32, kill))
    access = daemon.docker("logs", balancer, check=False).stdout
    log_path = Path(tempfile.mkstemp(prefix="adaflash-balancer-", suffix=".log")[1])
    try:
        log_path.write_text(access)
        answered = failover.access_log(log_path)
    finally:
        log_path.unlink(missing_ok=True)
    by_replica = failover.per_replica(answered, members, killed.wall)
    summary = failover.summarize(sent, killed, by_replica, victim.name)
    # By the balancer's log: every request that failed had reached the killed replica (its last upstream), i.e. no
    # request was lost that had not reached it; and the balancer saw as many failures as the clients.
    failed_logged = [a for a in answered if not a.ok]
    summary["checks"]["every_failure_had_reached_the_killed_replica"] = all(
        a.upstreams[-1] == victim.address for a in failed_logged)
    summary["checks"]["the_balancer_logged_every_request"] = len(answered) == len(sent)
    summary["balancer_logged"] = {"requests": len(answered), "failed": len(failed_logged)}
    summary["passed"] = all(summary["checks"].values())
    phases = summary["by_phase"]
    log(f"fleet: {summary['requests']} requests, {summary['failed']} failed; in flight at the kill "
        f"{phases['in_flight_at_kill']['requests']} ({phases['in_flight_at_kill']['failed']} failed), sent while "
        f"it died {phases['started_while_it_died']['requests']} ({phases['started_while_it_died']['failed']} "
        f"failed), after its port closed {phases['started_after_its_port_closed']['requests']} "
        f"({phases['started_after_its_port_closed']['failed']} failed); recovery {summary['recovery_s']} s; "
        f"checks {'all passed' if summary['passed'] else summary['checks']}")
    return {"up_s": up_s, "replicas": [asdict(m) for m in members], "balancer": balancer, "nginx": nginx,
            "users": users, "load_s": load_s, "kill_after_s": kill_after_s} | summary


def compose_check(daemon: Daemon, args: argparse.Namespace) -> dict:
    busy = ports_in_use(COMPOSE_PORTS)
    if busy:
        raise CheckFailed(f"docker-compose.yml publishes {COMPOSE_PORTS}; in use here: {busy}")
    files = [ROOT / "docker-compose.yml"]
    balancer_image = NGINX_IMAGE
    if not daemon.has_image(NGINX_IMAGE) and \
            daemon.docker("pull", NGINX_IMAGE, timeout=args.pull_timeout_s, check=False).returncode != 0:
        files.append(NGINX_FALLBACK)
        balancer_image = "adaflash-nginx:bookworm (Debian's nginx, deploy/docker/nginx)"
        started = time.monotonic()
        run([build_cli(daemon.env), "build", "--network", "host", "-t", "adaflash-nginx:bookworm",
             str(ROOT / "deploy" / "docker" / "nginx")], 900, daemon.env | {"DOCKER_BUILDKIT": "1"})
        log(f"{NGINX_IMAGE} cannot be pulled: built adaflash-nginx:bookworm from Debian's nginx in "
            f"{time.monotonic() - started:.0f} s; compose runs with {NGINX_FALLBACK.relative_to(ROOT)}")
    compose = Compose(daemon, files, compose_cli(daemon))
    version = run([*compose.cli, "version"], 30, daemon.env).stdout.splitlines()[0]
    log(f"compose: {' '.join(compose.cli)} ({version}), project {PROJECT}, "
        f"files {', '.join(str(f.relative_to(ROOT)) for f in files)}")
    result: dict = {"compose": version, "files": [str(f.relative_to(ROOT)) for f in files],
                    "balancer_image": balancer_image}
    try:
        result["server"] = compose_server(compose)
        result["loadtest"] = short_sweep(compose, args.sweep_s)
    finally:
        compose.down()
    try:
        result["fleet"] = fleet(compose, args.fleet_load_s, args.kill_after_s, args.fleet_users)
    finally:
        compose.down()
    left = daemon.docker("ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}", "-q").stdout.split()
    result["containers_left"] = len(left)
    if not result["fleet"]["passed"]:
        raise CheckFailed(f"fleet checks failed: {result['fleet']['checks']}")
    return result


# Running it ----------------------------------------------------------------------------------------------------







def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compose", action="store_true", help="after the image check, docker-compose.yml's server, "
                                                          "loadtest and fleet")
    p.add_argument("--skip-run", action="store_true", help="with --compose: build, but skip `docker run`'s check")
    p.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT,
                   help="the daemon's data when it starts one (images stay cached there)")
    p.add_argument("--own-daemon", action="store_true", help="start a daemon of its own even when one answers")
    p.add_argument("--torch-index-url", help="the build's TORCH_INDEX_URL (default: pip's local torch wheel "
                                             "served on 127.0.0.1 when there is one, else the Dockerfile's)")
    p.add_argument("--pip-index-url", help="the build's PIP_INDEX_URL (default: the Dockerfile's, PyPI)")
    p.add_argument("--ca-file", type=Path, help="the build secret pip_ca (default: pip's `cert` here, if any)")
    p.add_argument("--pull-timeout-s", type=float, default=60.0)
    p.add_argument("--sweep-s", type=int, default=10, help="seconds per level of the loadtest's short sweep")
    p.add_argument("--fleet-load-s", type=float, default=60.0)
    p.add_argument("--kill-after-s", type=float, default=20.0)
    p.add_argument("--fleet-users", type=int, default=4)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    for signum in (signal.SIGTERM, signal.SIGINT):  # a background job starts with SIGINT ignored: not here
        signal.signal(signum, _interrupt)
    run_id = f"{os.getpid()}"
    report: dict = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu_count": os.cpu_count()}
    daemon = Daemon(args.data_root, args.own_daemon)
    started = time.monotonic()
    failure = None
    work = Path(tempfile.mkdtemp(prefix="adaflash-image-check-"))
    try:
        daemon.start()
        report["daemon"] = {"started_here": daemon.process is not None, "host": daemon.env.get("DOCKER_HOST"),
                            "server": daemon.docker("version", "--format", "{{.Server.Version}}").stdout.strip()}
        report["base"] = base_image(daemon, work, args.pull_timeout_s)
        log(f"base {BASE}: {report['base']['source']}")
        report["build"] = build_image(daemon, work, args.torch_index_url, args.pip_index_url,
                                      args.ca_file or ca_bundle())
        if not args.skip_run:
            report["run"] = image_run(daemon, run_id)
        if args.compose:
            report["compose"] = compose_check(daemon, args)
    except (CheckFailed, Interrupted, subprocess.SubprocessError, OSError) as exc:
        failure = str(exc)
        log(f"FAILED: {failure}")
    finally:
        with contextlib.suppress(CheckFailed, OSError):  # the daemon may not have started
            mine = daemon.docker("ps", "-aq", "--filter", f"label=adaflash.check={run_id}", check=False).stdout
            for container in mine.split():
                daemon.docker("rm", "-f", container, check=False)
        report["left_running"] = daemon.stop()
        unmount_under(work)  # debootstrap's /proc in the base's root, when it was interrupted
        shutil.rmtree(work, ignore_errors=True)
    report["total_s"] = round(time.monotonic() - started, 1)
    report["passed"] = failure is None and not report["left_running"]
    report["failure"] = failure
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    log(f"{'passed' if report['passed'] else 'FAILED'} in {report['total_s']} s"
        + (f"; report {args.json}" if args.json else ""))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
