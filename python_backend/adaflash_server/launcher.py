"""Start and stop the `tritonserver` binary bundled in the nvidia-pytriton wheel, as a child process.

The wheel ships a full Triton (CPU-capable) with the Python backend, so a plain `pip install` is
enough to serve: no container, no /opt/tritonserver. Its files are laid out for PyTriton's own
launcher, so a few things have to be put in place before the binary can load Python models:

* Triton looks for `<backend-directory>/python/triton_python_backend_stub` next to the backend
  library, but the wheel keeps one stub per Python version elsewhere. We stage a backend directory
  that holds the backend plus the stub for the running interpreter.
* Copied there, the backend library and the stub lose their `$ORIGIN`-relative rpath into
  `nvidia_pytriton.libs` (they need its libtritonserver and libcudart, even on CPU), so that
  folder goes on LD_LIBRARY_PATH. Without it the stub fails to start and the model load hangs.
* The stub runs models with the first `python` on PATH, so this interpreter's bin folder comes
  first: models then see the same packages (torch, numpy<2) as the caller.
"""

from __future__ import annotations

import ctypes
import importlib.util
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
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING

from adaflash.serving.threads import openmp_wait_env
from adaflash_contract.connection import Tls, grpc_options
from adaflash_server import shm
from adaflash_server.security import ServerTls

if TYPE_CHECKING:
    import tritonclient.grpc as grpcclient

LOG_TAIL_LINES = 60
_POLL_INTERVAL_S = 0.1
_IDLE_SETTLE_S = 1.0  # the orchestrator's gauges are updated off its loop: idle counts once it has lasted this long
_READY_PROBE_TIMEOUT_S = 2.0
_WILDCARD_HOSTS = ("0.0.0.0", "::")
# How gRPC says that a client refused the server's certificate (an untrusted issuer, a name not in it).
_CERTIFICATE_REFUSED = re.compile(r"CERTIFICATE_VERIFY_FAILED|Hostname Verification Check failed")
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when the thread that forked it ends
PID_FILE = "tritonserver.pid"  # in the state folder: the server a launcher started, for the next one to find
# Every tritonserver is forked from this one thread, which lives as long as the launcher's process. Why: the kernel
# sends a child its parent-death signal when the *thread* that forked it ends, so a server forked by the healer's
# thread would be killed when that thread ended, and one forked by a thread that lives on would outlive the launcher.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tritonserver-spawner")
# A watchdog process per server (`_watch`): while the launcher ($1) and the server ($2) live it waits; once either is
# gone it kills what is left of the server's process group, its model processes. A process of its own, because a
# model process whose server died can be stuck holding its interpreter's lock, where no thread of its own could act.
# (A launcher that lives cleans the same group up itself; the group's id stays taken while any member lives.)
_WATCHDOG = ('while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 0.5; done; '
             'kill -9 "-$2" 2>/dev/null')  # dash's kill takes no "--"


class TritonServerError(RuntimeError):
    """The bundled server is missing, failed to start, or was used in the wrong state."""


@dataclass
class ServerConfig:
    """What to serve and where. Ports left as None are replaced by free ports on `host`."""

    model_repository: Path
    grpc_port: int | None = None
    http_port: int | None = None
    metrics_port: int | None = None
    host: str = "127.0.0.1"
    http_host: str | None = None  # Triton's HTTP endpoint (no TLS of its own); None: `host`
    tls: ServerTls | None = None  # TLS on the gRPC endpoint
    model_control_mode: str = "explicit"  # lets `load_model` bring in published drafter versions at runtime
    load_models: list[str] | None = None  # explicit mode only; ["*"] loads all; None: `models_to_load`
    log_file: Path | None = None  # default: <state_dir>/tritonserver.log
    state_dir: Path | None = None  # staged backends (and default log); default: a new temp dir
    extra_args: list[str] = field(default_factory=list)
    # Triton's auto-complete phase starts a Python process per model only to ask it for its configuration (each
    # imports PyTorch): our repositories' configurations are complete, and without it a server starts in less
    # than half the time (docs/history.md). On only for a repository whose models complete their own.
    auto_complete_config: bool = False
    ready_timeout_s: float = 180.0
    exit_timeout_s: int = 10  # in-flight grace on shutdown; stop() kills after this plus a margin
    drain_timeout_s: float = 60.0  # on SIGTERM or Ctrl-C, how long admitted requests may run to their end
    entry_model: str = "adaflash"  # the public model: a drain stops admitting by unloading it
    heal_interval_s: float | None = 0.5  # how often to look for dead model processes (None: never)
    max_restarts: int = 5  # the healer's restarts of a server that exits on its own, before giving up


def find_bundled_server() -> Path:
    """The `tritonserver/` folder inside the installed nvidia-pytriton package.

    Located without importing pytriton, so nothing of PyTriton runs in our process.
    """
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonServerError(
            "tritonserver not found: the 'nvidia-pytriton' package is not installed "
            "(pip install 'nvidia-pytriton==0.7.0', or pip install -e '.[serve]')"
        )
    root = Path(spec.submodule_search_locations[0]) / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise TritonServerError(f"nvidia-pytriton is installed but has no server binary at {root}/bin/tritonserver")
    return root


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` right now (all held open together so they differ)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _with_ports(config: ServerConfig) -> ServerConfig:
    ports = iter(free_ports(3, config.host))
    return replace(
        config,
        grpc_port=config.grpc_port or next(ports),
        http_port=config.http_port or next(ports),
        metrics_port=config.metrics_port or next(ports),
    )


def stage_backends(server_root: Path, state_dir: Path) -> Path:
    """A backend directory Triton can use: the Python backend plus the stub for this interpreter."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server_root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonServerError(f"nvidia-pytriton has no Python backend stub for Python {version} ({stub})")
    backends = state_dir / "backends"
    target = backends / "python"
    shutil.copytree(server_root / "backends" / "python", target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"), copy_function=_copy_if_changed)
    _copy_if_changed(stub, target / stub.name)
    (target / stub.name).chmod(0o755)  # the wheel ships it execute-only for the owner
    return backends


def _copy_if_changed(src: str | Path, dst: str | Path) -> None:
    """Copy unless `dst` is already this copy: a restart stages again while the last server's stub processes
    may still be exiting, and a running program's file cannot be written ("Text file busy")."""
    a, b = os.stat(src), (os.stat(dst) if os.path.exists(dst) else None)
    if b is None or (a.st_size, a.st_mtime_ns) != (b.st_size, b.st_mtime_ns):
        shutil.copy2(src, dst)


def _load_models(config: ServerConfig) -> list[str]:
    """The configured models, else those the repository says to load (every model where it is not yet written)."""
    if config.load_models is not None or not Path(config.model_repository).is_dir():
        return config.load_models or ["*"]
    from adaflash_server.repository import models_to_load

    return models_to_load(config.model_repository)


def server_command(server_root: Path, backends: Path, config: ServerConfig) -> list[str]:
    """The tritonserver argv for `config` (ports already resolved)."""
    cmd = [
        str(server_root / "bin" / "tritonserver"),
        f"--model-repository={config.model_repository}",
        f"--backend-directory={backends}",
        f"--cache-directory={server_root / 'caches'}",
        f"--model-control-mode={config.model_control_mode}",
        *(f"--load-model={name}" for name in _load_models(config)),
        f"--grpc-address={config.host}",
        f"--grpc-port={config.grpc_port}",
        *grpc_tls_flags(config.tls),
        f"--http-address={config.http_host or config.host}",
        f"--http-port={config.http_port}",
        "--allow-metrics=true",
        f"--metrics-address={config.host}",
        f"--metrics-port={config.metrics_port}",
        "--log-verbose=0",
        f"--exit-timeout-secs={config.exit_timeout_s}",
        *([] if config.auto_complete_config else ["--disable-auto-complete-config"]),
    ]
    return cmd + list(config.extra_args)


def grpc_tls_flags(tls: ServerTls | None) -> list[str]:
    """tritonserver's gRPC TLS flags (`--grpc-use-ssl-mutual` stands in for `--grpc-use-ssl` when client
    certificates are required, and `--grpc-root-cert` names their CA)."""
    if tls is None:
        return []
    flags = [f"--grpc-server-cert={tls.cert}", f"--grpc-server-key={tls.key}"]
    if tls.mutual:
        return ["--grpc-use-ssl-mutual=true", *flags, f"--grpc-root-cert={tls.client_ca}"]
    return ["--grpc-use-ssl=true", *flags]


def own_client_tls(config: ServerConfig) -> Tls | None:
    """The TLS of the server's own gRPC clients (readiness probe, drain, healer, the OpenAI front).

    They trust exactly the certificate the server presents (gRPC accepts a trusted leaf), so they need no CA named
    and work with a self-signed certificate; under mutual TLS they present that certificate as their own, so it must
    be issued by the client CA and allow client authentication. They check it against `tls.server_name`, else the
    host they connect to, which a wildcard address is not.
    """
    tls = config.tls
    if tls is None:
        return None
    if tls.server_name is None and config.host in _WILDCARD_HOSTS:
        raise TritonServerError(f"TLS on {config.host!r}: name the certificate's host (ServerTls.server_name, "
                                "`adaflash serve --tls-server-name`) for the server's own clients to check it against")
    if not tls.mutual:
        return Tls(root_cert=tls.cert, server_name=tls.server_name)
    return Tls(root_cert=tls.cert, client_cert=tls.cert, client_key=tls.key, server_name=tls.server_name)


def connect(url: str, tls: Tls | None = None) -> grpcclient.InferenceServerClient:
    """A tritonclient (sync) control connection to a server's gRPC endpoint `url` (host:port), over TLS when `tls`
    is given: the one place the server's own clients (readiness probe, drain, healer, `adaflash publish-drafter`,
    the OpenAI front's description of the target) make one."""
    import tritonclient.grpc as grpcclient  # late: `import adaflash_server` needs no serve extra

    return grpcclient.InferenceServerClient(url, **grpc_options(tls))


def server_env(server_root: Path) -> dict[str, str]:
    """Our environment, with this interpreter's bin first on PATH and the wheel's libraries findable."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(openmp_wait_env(env))
    libs = server_root.parent.parent / "nvidia_pytriton.libs"
    if libs.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (env.get("LD_LIBRARY_PATH"), str(libs)) if p)
    return env


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' if it does not exist)."""
    if not path.is_file():
        return ""
    with path.open(encoding="utf-8", errors="replace") as f:
        return "".join(deque(f, maxlen=lines))


def _answers_http(url: str) -> bool:
    """True when `url` answers 200: Triton starts its HTTP and metrics services after gRPC, so a server
    that is ready over gRPC may refuse HTTP connections for a moment yet."""
    try:
        with urllib.request.urlopen(url, timeout=_READY_PROBE_TIMEOUT_S) as response:
            return response.status == 200
    except OSError:  # refused, reset, timed out, or an HTTPError status
        return False


def stub_pids(server_pid: int) -> dict[str, list[int]]:
    """The server's live Python backend processes by model (Linux: read from /proc).

    Triton goes on reporting a model ready after its stub process died, so the processes are the truth.
    """
    pids: dict[str, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state, ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if argv[0].endswith(b"triton_python_backend_stub") and int(ppid) == server_pid and state != "Z":
            model = Path(argv[1].decode()).parts[-3]  # .../<model>/<version>/model.py
            pids.setdefault(model, []).append(int(proc.name))
    return pids


class Healer(threading.Thread):
    """Keeps a started server serving without an operator, looking every `interval_s`:

    * a model whose process died is unloaded, so that the server says it is not ready while the model is
      away (a load balancer stops sending), then loaded again. Requests running on it end with its error;
      the others go on (without the drafter, exactly, while it reloads);
    * a decoupled model (`adaflash`, the orchestrator) is the exception: Triton never ends the requests that were
      inside its dead process, so they would hang; the whole server is restarted at once instead, which
      ends them (their clients see the connection close) and serves again;
    * a server that exits on its own is started again on the same ports after a growing pause (1, 2,
      4 ... 30 s); after `max_restarts` restarts without a minute of service in between it gives up and
      sets `gave_up` to the exit code.
    """

    def __init__(self, server: TritonServer, interval_s: float) -> None:
        super().__init__(name="adaflash-healer", daemon=True)
        self.server, self.interval_s = server, interval_s
        self.stopped = threading.Event()
        self.gave_up: int | None = None
        self.restarts = 0
        self.planned_restart = False
        self.up_since = time.monotonic()
        self.configs: dict[str, dict] = {}  # model -> its config, as Triton reports it

    def run(self) -> None:
        client = self.server.connect()  # the ports survive restarts
        try:
            while self.gave_up is None and not self.stopped.wait(self.interval_s):
                try:
                    if self.server.pid is None or self.server.exit_code() is not None:
                        self.restart()
                    else:
                        self.check(client)
                except Exception as exc:  # noqa: BLE001 - a failed look is retried at the next interval
                    print(f"self-healing: check failed: {exc}", file=sys.stderr, flush=True)
        finally:
            client.close()

    def restart(self) -> None:
        """Start the exited server again, after a pause unless the healer itself stopped it."""
        code = self.server.exit_code()  # None: the last start failed
        self.server._cleanup()
        if self.planned_restart:
            self.planned_restart, pause = False, 0
        else:
            self.restarts = 1 if time.monotonic() - self.up_since > 60 else self.restarts + 1
            if self.restarts > self.server.config.max_restarts:
                print(f"tritonserver exited with code {code} {self.restarts} times in a row; giving up "
                      f"(log: {self.server.log_path})", file=sys.stderr, flush=True)
                self.gave_up = code or 1
                return
            pause = min(2 ** (self.restarts - 1), 30)
            print(f"tritonserver exited with code {code}; restarting in {pause} s ({self.restarts} of "
                  f"{self.server.config.max_restarts}; log: {self.server.log_path})", file=sys.stderr, flush=True)
        if self.stopped.wait(pause):
            return
        try:
            self.server._spawn()
        except TritonServerError as exc:
            print(f"self-healing: restart failed: {exc}", file=sys.stderr, flush=True)
        self.up_since = time.monotonic()

    def check(self, client) -> None:
        pid = self.server.pid
        if pid is None:
            return
        self.server.note_regions()
        dead = self._dead(client, pid)
        if dead:
            dead = self._dead(client, pid)  # again: a model being unloaded (a hot swap) ends its process too
        if dead and not self.stopped.is_set():
            self.heal(client, dead)

    def _dead(self, client, pid: int) -> list[str]:
        """Models Triton calls ready with fewer live processes than instances; an ensemble (a stock-contract one)
        runs no process of its own."""
        index = client.get_model_repository_index(as_json=True).get("models", [])
        ready = [m["name"] for m in index if m.get("state") == "READY"]
        live = stub_pids(pid)
        return [m for m in ready
                if self._config(client, m).get("platform") != "ensemble" and len(live.get(m, [])) < self._instances(client, m)]

    def _config(self, client, model: str) -> dict:
        if model not in self.configs:
            self.configs[model] = client.get_model_config(model, as_json=True)["config"]
        return self.configs[model]

    def _instances(self, client, model: str) -> int:
        groups = self._config(client, model).get("instance_group", [])
        return sum(int(g.get("count", 1)) for g in groups) or 1

    def _decoupled(self, client, model: str) -> bool:
        return bool(self._config(client, model).get("model_transaction_policy", {}).get("decoupled"))

    def heal(self, client, dead: list[str]) -> None:
        stuck = [m for m in dead if self._decoupled(client, m)]
        if stuck:
            print(f"self-healing: the process of {', '.join(stuck)} died with requests Triton never ends; "
                  "restarting the server", file=sys.stderr, flush=True)
            self.planned_restart = True
            self.server._kill()
            self.restart()
            return
        print(f"self-healing: the process of {', '.join(dead)} died; reloading", file=sys.stderr, flush=True)
        for model in dead:
            client.unload_model(model)
        for model in dead:
            client.load_model(model)
        print(f"self-healing: {', '.join(dead)} reloaded", file=sys.stderr, flush=True)


def _kill_group(pgid: int, wait_s: float = 10.0) -> None:
    """SIGKILL what is left of the server's process group and wait until it is gone. A server stopped while
    a model is still loading exits at once but leaves that model's stub orphaned for seconds, and a stub
    still running keeps its program file busy for the next start's staging."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return  # the usual case: everything already exited
    deadline = time.monotonic() + wait_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(_POLL_INTERVAL_S / 10)


def _die_with_parent(launcher_pid: int):
    """The child's first step after fork: SIGKILL when the launcher ends, however it ends (an OOM kill, a crash, a
    supervisor's SIGKILL), so no server is left serving unsupervised; its model processes go with its process group
    (`_watch`). Linux only; elsewhere nothing is set. libc's `prctl` is looked up here, in the launcher: after
    a fork in a threaded process the child should do no more than call it."""
    prctl = getattr(ctypes.CDLL(None), "prctl", None) if sys.platform == "linux" else None

    def set_signal() -> None:
        if prctl is None:
            return
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != launcher_pid:  # the launcher ended between the fork and the prctl
            os._exit(1)
    return set_signal


def _watch(server_pid: int) -> subprocess.Popen:
    """The watchdog of a server this process started (`_WATCHDOG`), in a session of its own."""
    return subprocess.Popen(["sh", "-c", _WATCHDOG, "adaflash-watchdog", str(os.getpid()), str(server_pid)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def clear_stale_server(state_dir: Path) -> int | None:
    """Kill the process group of a tritonserver a launcher of `state_dir` started and left running (it was killed
    before the parent-death signal existed, or on another kernel). Returns its pid, None when there was none. A pid
    file naming a process that is no tritonserver (the pid reused) is only removed."""
    pid_file = state_dir / PID_FILE
    try:
        pid = int(pid_file.read_text())
        argv0 = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")[0]
    except (OSError, ValueError):
        pid_file.unlink(missing_ok=True)
        return None
    pid_file.unlink(missing_ok=True)
    if not argv0.endswith(b"tritonserver") or pid == os.getpid():
        return None
    print(f"a tritonserver this state folder's launcher left (pid {pid}) is still running: stopping it",
          file=sys.stderr, flush=True)
    _kill_group(pid)  # it leads its own process group (a session of its own), its model processes in it
    return pid


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, parents before their children (Linux: read from /proc)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(proc.name))
    found = sorted(children.get(pid, []))
    for parent in found:
        found += sorted(children.get(parent, []))
    return found


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group (Linux: read from /proc)."""
    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            state, _, pgrp = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state != "Z":
            members.append(int(proc.name))
    return members


class TritonServer:
    """One tritonserver child process; usable as a context manager.

    >>> with TritonServer(ServerConfig(Path("model_repository"))) as server:
    ...     client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
    """

    def __init__(self, config: ServerConfig) -> None:
        self._owns_state_dir = config.state_dir is None
        state_dir = config.state_dir or Path(tempfile.mkdtemp(prefix="adaflash-triton-"))
        self.config = _with_ports(replace(config, state_dir=Path(state_dir)))
        self.client_tls = own_client_tls(self.config)  # how the server's own clients reach its gRPC endpoint
        self._process: subprocess.Popen | None = None  # set while started and not yet cleaned up
        self._watchdog: subprocess.Popen | None = None  # the started server's (`_watch`)
        self._healer: Healer | None = None
        self._log: IO[bytes] | None = None
        # After a drain: Triton still counts requests in flight that the orchestrator has ended (cancelled
        # streams), so its own shutdown would wait out its exit timeout and fail; stopping kills it instead.
        self._stranded = False
        self._regions: set[Path] = set()  # the server's shared-memory regions (`note_regions`)

    @property
    def grpc_url(self) -> str:
        """host:port, the form tritonclient.grpc expects (no scheme)."""
        return f"{self.config.host}:{self.config.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.config.http_host or self.config.host}:{self.config.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.config.host}:{self.config.metrics_port}/metrics"

    def connect(self) -> grpcclient.InferenceServerClient:
        """A control connection to this server's gRPC endpoint, with its own clients' TLS."""
        return connect(self.grpc_url, self.client_tls)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def log_path(self) -> Path:
        return self.config.log_file or self.config.state_dir / "tritonserver.log"

    def start(self) -> TritonServer:
        """Spawn the server and return once it reports ready (all models loaded in mode "none"), with
        its healer watching it (`Healer`).

        Raises TritonServerError with the log tail if the server exits or is not ready in time,
        so a broken model repository fails fast instead of hanging the caller.
        """
        if self._process is not None:
            raise TritonServerError(f"tritonserver already started (pid {self.pid}); stop() it first")
        self._spawn()
        if self.config.heal_interval_s:
            self._healer = Healer(self, self.config.heal_interval_s)
            self._healer.start()
        return self

    def _spawn(self) -> None:
        """Start the process and wait until it is ready; on failure nothing is left running."""
        root = find_bundled_server()
        cmd = server_command(root, stage_backends(root, self.config.state_dir), self.config)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")  # a restart's log follows the one before
        # Own session: a terminal Ctrl-C reaches only us (we then stop the server in order), and
        # the Python stub processes share a group we can clean up as one. The server dies with the launcher,
        # however the launcher ends (`_die_with_parent`); a server a killed launcher left is cleared first.
        clear_stale_server(self.config.state_dir)
        self._process = _SPAWNER.submit(subprocess.Popen, cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=server_env(root), start_new_session=True,
                                        preexec_fn=_die_with_parent(os.getpid())).result()
        (self.config.state_dir / PID_FILE).write_text(f"{self._process.pid}\n")
        self._watchdog = _watch(self._process.pid)
        try:
            self._wait_ready()
        except BaseException:  # also Ctrl-C during a long model load: never leave a server behind
            self._terminate()
            raise
        self.note_regions()

    def note_regions(self) -> None:
        """Remember the shared-memory regions the server maps now (models reloaded since map new ones), for
        `_cleanup` to remove once the server is gone (`shm`: a killed server leaves them in /dev/shm)."""
        if self._process is not None:
            self._regions |= shm.mapped_regions(self._process.pid)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.ready_timeout_s
        while not self._endpoints_ready():
            code = self._process.poll()
            if code is not None:
                raise self._startup_error(f"tritonserver exited with code {code} during startup")
            if time.monotonic() > deadline:
                raise self._startup_error(f"tritonserver not ready after {self.config.ready_timeout_s:g} s")
            time.sleep(_POLL_INTERVAL_S)

    def _endpoints_ready(self) -> bool:
        """gRPC, HTTP and metrics all answer: a caller may use any of them as soon as start() returns."""
        return (self._grpc_ready() and _answers_http(f"{self.http_url}/v2/health/ready")
                and _answers_http(self.metrics_url))

    def _grpc_ready(self) -> bool:
        """Whether gRPC answers ready; a certificate the server's own clients refuse fails at once (it never will
        be accepted, and waiting out the ready timeout would hide why)."""
        from tritonclient.utils import InferenceServerException  # late: `import adaflash_server` needs no serve extra

        client = self.connect()
        try:
            return client.is_server_ready(client_timeout=_READY_PROBE_TIMEOUT_S)
        except InferenceServerException as exc:
            if _CERTIFICATE_REFUSED.search(exc.message()):
                raise TritonServerError(f"the server's own gRPC clients refuse its TLS certificate ({exc.message()});"
                                        " is the host they check it against in it (--tls-server-name)?") from None
            return False  # not listening yet, or too busy loading to answer
        finally:
            client.close()

    def _startup_error(self, what: str) -> TritonServerError:
        return TritonServerError(f"{what}; last {LOG_TAIL_LINES} lines of {self.log_path}:\n{log_tail(self.log_path)}")

    def exit_code(self) -> int | None:
        """The exit code of a server process that has exited (None while it runs or when none was started)."""
        process = self._process
        return None if process is None else process.poll()

    def drain(self, timeout_s: float) -> bool:
        """Stop admitting and let the admitted requests finish; True when they all did within `timeout_s`.

        Triton's own SIGTERM drain does not work for this pipeline: every step of a running request is
        a new BLS request to the target, which a stopping server refuses, so in-flight requests would
        fail at their next step. Unloading only the entry model instead makes readiness false and refuses
        new requests at once, while the requests it admitted (queued ones included) run to their end with
        the models behind it; Triton finishes the unload when the last one ends. Triton may count a stream
        its client cancelled as in flight after the model ended it (Triton 2.51 did behind an ensemble: the
        unload would wait out the timeout), so the drain is also over when the model reports nothing running
        and nothing queued (the server is then stopped with a kill: nothing is left to finish).
        """
        client = self.connect()
        try:
            client.unload_model(self.config.entry_model)
            deadline = time.monotonic() + timeout_s
            idle_since = None
            while self._entry_state(client) == "UNLOADING":
                idle_since = (idle_since or time.monotonic()) if self._orchestrator_idle() else None
                if idle_since is not None and time.monotonic() - idle_since >= _IDLE_SETTLE_S:
                    self._stranded = True
                    return True
                if time.monotonic() > deadline:
                    return False
                time.sleep(_POLL_INTERVAL_S)
            return True
        finally:
            client.close()

    def _orchestrator_idle(self) -> bool:
        """No request running or queued, as the orchestrator's gauges say (False when they cannot be read)."""
        try:
            text = urllib.request.urlopen(self.metrics_url, timeout=2).read().decode()
        except OSError:
            return False
        gauges = re.findall(r"^adaflash_(?:active_sequences|queued_requests)(?:{[^}]*})? (\S+)$", text, re.M)
        return bool(gauges) and all(float(v) == 0 for v in gauges)

    def _entry_state(self, client) -> str:
        index = client.get_model_repository_index(as_json=True).get("models", [])
        return next((m.get("state", "") for m in index if m["name"] == self.config.entry_model), "")

    def stop(self) -> int | None:
        """SIGTERM (Triton drains in-flight requests and unloads models), SIGKILL if that takes too
        long. Safe to call any number of times: returns the exit code, or None if nothing was running."""
        self._stop_healer()
        return self._terminate()

    def _terminate(self) -> int | None:
        process = self._process
        if process is None:
            return None
        if process.poll() is None and self._stranded:
            _kill_group(process.pid)
            process.wait()
            self._cleanup()
            return 0
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self.config.exit_timeout_s + 10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._cleanup()
        return process.returncode

    def _kill(self) -> None:
        """SIGKILL the server and its model processes at once (the healer's restart)."""
        _kill_group(self._process.pid)
        self._process.wait()

    def _stop_healer(self) -> None:
        if self._healer is not None:
            self._healer.stopped.set()
            self._healer.join()
            self._healer = None

    def _cleanup(self) -> None:
        """Once, after the server has exited: end leftover Python stubs, close the log, drop staged files."""
        if self._process is None:
            return
        _kill_group(self._process.pid)  # once, right after the exit: the group id is still ours
        shm.remove_unmapped(self._regions)  # a clean exit removed them; a killed server left them
        self._regions = set()
        (self.config.state_dir / PID_FILE).unlink(missing_ok=True)
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        self._process = None
        self._log.close()
        if self._owns_state_dir:
            shutil.rmtree(self.config.state_dir / "backends", ignore_errors=True)  # keep the log

    def wait(self) -> int:
        """Block until stopped, for a foreground `serve` command; the healer restarts a server that exits
        on its own and returns its exit code here when it gives up.

        Ctrl-C (and SIGTERM, e.g. from a process supervisor) drain and stop the server cleanly instead of
        leaving it running in its own session. Call from the main thread.
        """
        if self._process is None:
            raise TritonServerError("tritonserver is not running")
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            if self._healer is None:
                code = self._process.wait()
                self._cleanup()
                return code
            while self._healer.is_alive():
                self._healer.join(_POLL_INTERVAL_S)
            code, self._healer = self._healer.gave_up, None
            self._cleanup()
            return 1 if code is None else code
        except KeyboardInterrupt:
            if self._process is not None:
                self._drain_before_stop()
        finally:
            signal.signal(signal.SIGTERM, previous)
        return self.stop()

    def _drain_before_stop(self) -> None:
        """A first signal drains (`drain`); a second one, or the drain timeout, stops at once."""
        print(f"draining: no new requests; running ones may take up to {self.config.drain_timeout_s:g} s "
              "(signal again to stop now)", file=sys.stderr, flush=True)
        try:
            if not self.drain(self.config.drain_timeout_s):
                print("drain timeout: stopping with requests still running", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            pass

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
