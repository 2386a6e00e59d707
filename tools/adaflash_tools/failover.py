"""Failover through the gRPC load balancer: two `adaflash serve` replicas behind NGINX, configured from the Helm
chart's balancer template (the one docker-compose.yml's `fleet` profile mounts), streaming requests through it,
and one replica killed mid-run as a lost node is: SIGKILL to every process group it has.

    .venv/bin/python -m adaflash_tools.failover --json bench-out/failover.json

Reports the requests sent and failed by phase (ended before the kill, in flight at it, sent while the replica
died, sent after its port closed), the recovery time (from the kill until every later request succeeded), and per
replica the requests the balancer's access log says it answered. `tests/deploy/test_fleet.py` runs it and holds it to
the same checks. Needs `nginx` on PATH (Debian: `apt-get install nginx`). Everything listens on free 127.0.0.1
ports; the load is bounded in time and count, and every wait has a deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tritonclient.grpc.aio as grpcaio

from adaflash_client.client import GenerationParams
from adaflash_tools.net import accepts, http_ok, log_tail
from adaflash_tools.probes import PROMPTS, one_stream
from adaflash_server.launcher import descendants, free_ports

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "adaflash"
TEMPLATE = CHART / "files" / "grpc-balancer.conf.template"
# Marked failed after one error, a replica gets no request for this long; then one request tries it again (a
# refused connection passes that request on to the next replica, so the client never sees it).
REPLICA_PARAMS = "max_fails=1 fail_timeout=2s"
READY_TIMEOUT_S = 300.0  # two replicas loading their models at once on 2 cores
STOP_TIMEOUT_S = 30.0
# What each replica runs besides its ports and state folder: the seeded tiny random models without a drafter
# (fewer model processes, no cost table to measure: a faster start; failover is the subject here).
SERVE_ARGS = ["--tiny-random", "--drafter", "", "--openai-port", "0"]
REPLICA_COMMAND = shlex.join(["adaflash", "serve", *SERVE_ARGS]) \
    + " --state-dir <own> --{grpc,http,metrics}-port <free>"


@dataclass
class Settings:
    """The load: `users` closed-loop streams through the balancer, `before_s` seconds, the kill, `after_s` more;
    no more than `max_requests` in all."""

    users: int = 4
    before_s: float = 4.0
    after_s: float = 6.0
    max_tokens: int = 32
    spec_mode: str = "ar"  # what a replica without a drafter serves
    max_requests: int = 2000


# The balancer --------------------------------------------------------------------------------------------------

def render(template: str, env: dict[str, str]) -> str:
    """The template with its ${ADAFLASH_*} placeholders filled, as the nginx image's envsubst fills them; one left
    unfilled raises KeyError instead of reaching nginx as text."""
    return re.sub(r"\$\{(ADAFLASH_\w+)\}", lambda m: env[m[1]], template)


def balancer_env(listen: str, replicas: list[str]) -> dict[str, str]:
    """The template's environment for fixed replica addresses (host:port), as on loopback here."""
    servers = "\n    ".join(f"server {address} {REPLICA_PARAMS};" for address in replicas)
    return {"ADAFLASH_LB_LISTEN": listen, "ADAFLASH_RESOLVER": "# fixed addresses: no resolver",
            "ADAFLASH_REPLICAS": servers}


def nginx_conf(root: Path, include: Path) -> str:
    """The main context around the template's http-context file, with every path nginx writes under `root`."""
    temp = "\n".join(f"    {kind}_temp_path {root / 'tmp' / kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""daemon off;
worker_processes 1;
pid {root / 'nginx.pid'};
error_log {root / 'error.log'} notice;
events {{ worker_connections 1024; }}
http {{
{temp}
    include {include};
}}
"""


class Balancer:
    """NGINX in front of `replicas` (host:port each); its access log (stdout) is `access_log`."""

    def __init__(self, root: Path, replicas: list[str], template: Path = TEMPLATE) -> None:
        self.root, self.replicas, self.template = root, replicas, template
        self.access_log = root / "access.log"
        self.port: int | None = None
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> Balancer:
        """Configure and start it on a port found free just now, and return once it accepts connections."""
        nginx = shutil.which("nginx")
        if nginx is None:
            raise RuntimeError("nginx is not on PATH (Debian: apt-get install nginx)")
        self.port = free_ports(1)[0]
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        site = self.root / "grpc-balancer.conf"
        site.write_text(render(self.template.read_text(), balancer_env(self.url, self.replicas)))
        conf = self.root / "nginx.conf"
        conf.write_text(nginx_conf(self.root, site))
        with self.access_log.open("ab") as out:
            self.process = subprocess.Popen([nginx, "-p", str(self.root), "-e", str(self.root / "error.log"),
                                             "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None and not accepts("127.0.0.1", self.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.process.poll() is not None or not accepts("127.0.0.1", self.port):
            self.stop()
            raise RuntimeError(f"nginx did not start: {log_tail(self.root / 'error.log')}")
        return self

    def stop(self) -> None:
        """SIGQUIT: nginx's graceful stop (the load is over by then); SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGQUIT)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def version(self) -> str:
        result = subprocess.run([shutil.which("nginx") or "nginx", "-v"], capture_output=True, text=True, timeout=10)
        return result.stderr.strip().removeprefix("nginx version: ")


# The replicas --------------------------------------------------------------------------------------------------

@dataclass
class Replica:
    """One `adaflash serve` process (the tiny random models, no drafter), with its own ports and state."""

    name: str
    process: subprocess.Popen
    grpc_port: int
    http_port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def start_replica(root: Path, name: str) -> Replica:
    """Start `adaflash serve` in a session of its own, so that its process group is this replica's alone."""
    grpc_port, http_port, metrics_port = free_ports(3)
    state = root / name
    state.mkdir(parents=True, exist_ok=True)
    log = state / "serve.log"
    cmd = [sys.executable, "-m", "adaflash.entry", "serve", *SERVE_ARGS, "--state-dir", str(state),
           "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port)]
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Replica(name, process, grpc_port, http_port, log)


def wait_ready(replica: Replica, deadline: float) -> None:
    while not http_ok(f"http://127.0.0.1:{replica.http_port}/v2/health/ready"):
        if replica.process.poll() is not None:
            raise RuntimeError(f"replica {replica.name} exited during startup: {log_tail(replica.log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"replica {replica.name} not ready in time: {log_tail(replica.log)}")
        time.sleep(0.2)


def process_groups(replica: Replica) -> list[int]:
    """The process groups of the replica's process tree: `adaflash serve`'s own first (so that its self-healing
    cannot start a new server), then tritonserver's, which holds the model processes (the launcher gives it a
    session of its own)."""
    pids = [replica.process.pid, *descendants(replica.process.pid)]
    return [g for g in dict.fromkeys(map(_group, pids)) if g is not None]


def kill(groups: list[int]) -> None:
    """SIGKILL each group at once, as a lost node ends every process."""
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


# The load ------------------------------------------------------------------------------------------------------

@dataclass
class Sent:
    """One streaming request through the balancer: when it started and ended (time.monotonic()) and how."""

    started: float
    ended: float
    ok: bool
    error: str = ""


@dataclass
class Kill:
    """When the victim was killed, on both clocks (monotonic; wall for the access log), and how long its gRPC
    port went on accepting connections: the kernel completes handshakes on a dying process's listening socket
    until the process is gone, so a request sent in that window fails like one in flight."""

    at: float
    wall: float
    port_closed_after_s: float


async def load_with_kill(url: str, settings: Settings, victim: Replica) -> tuple[list[Sent], Kill]:
    """Closed-loop streams for `before_s`, then the kill, with the streams going on for `after_s`."""
    params = GenerationParams(max_tokens=settings.max_tokens, spec_mode=settings.spec_mode)
    client = grpcaio.InferenceServerClient(url)
    start = time.monotonic()
    stop_at = start + settings.before_s + settings.after_s
    sent: list[Sent] = []
    count = 0

    async def user(u: int) -> None:
        nonlocal count
        while time.monotonic() < stop_at and count < settings.max_requests:
            count += 1
            began = time.monotonic()
            outcome = await one_stream(client, PROMPTS[(u + count) % len(PROMPTS)], params)
            sent.append(Sent(began, outcome.ended, outcome.ok, outcome.error))

    async def killer() -> Kill:
        await asyncio.sleep(settings.before_s)
        groups = await asyncio.to_thread(process_groups, victim)
        at, wall = time.monotonic(), time.time()
        kill(groups)
        closed = await asyncio.to_thread(_until_refused, victim.grpc_port, at + STOP_TIMEOUT_S)
        await asyncio.to_thread(victim.process.wait, STOP_TIMEOUT_S)
        return Kill(at, wall, round(closed - at, 3))

    try:
        results = await asyncio.gather(killer(), *(user(u) for u in range(settings.users)))
    finally:
        await client.close()
    return sent, results[0]


def _until_refused(port: int, deadline: float) -> float:
    """The moment connections to `port` are refused (time.monotonic())."""
    while accepts("127.0.0.1", port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"port {port} still accepts connections after the kill")
        time.sleep(0.005)
    return time.monotonic()


# The figures ---------------------------------------------------------------------------------------------------

def phases(sent: list[Sent], kill: Kill) -> dict[str, list[Sent]]:
    closed = kill.at + kill.port_closed_after_s
    return {"ended_before_kill": [s for s in sent if s.ended < kill.at],
            "in_flight_at_kill": [s for s in sent if s.started < kill.at <= s.ended],
            "started_while_it_died": [s for s in sent if kill.at <= s.started < closed],
            "started_after_its_port_closed": [s for s in sent if s.started >= closed]}


def recovery_s(sent: list[Sent], killed_at: float) -> float | None:
    """From the kill until the first success after which no request failed; None when no request succeeded
    after the last failure."""
    after = sorted((s for s in sent if s.ended >= killed_at), key=lambda s: s.ended)
    last_failure = max((s.ended for s in after if not s.ok), default=killed_at)
    first_success = next((s.ended for s in after if s.ok and s.ended >= last_failure), None)
    return None if first_success is None else round(first_success - killed_at, 3)


@dataclass
class Answered:
    """One access-log line: when nginx received the request (epoch s), the replicas it sent it to in turn, and
    whether the last one answered with grpc-status 0."""

    started: float
    upstreams: list[str]
    ok: bool


def access_log(path: Path) -> list[Answered]:
    lines = re.findall(r"^(\d+\.\d+) upstream=(.*?) status=\d+ grpc_status=(\S+) request_s=(\S+)$",
                       path.read_text(), re.M)
    return [Answered(float(end) - float(took), [u.strip() for u in ups.split(",")], grpc == "0")
            for end, ups, grpc, took in lines]


def per_replica(answered: list[Answered], replicas: list[Replica], killed_wall: float) -> dict[str, dict[str, int]]:
    """By the balancer's log, per replica: the requests it answered (it was the last one tried) that started
    before and after the kill, the requests it failed, and those it was tried for and passed on to another."""
    out = {}
    for replica in replicas:
        mine = [a for a in answered if a.upstreams[-1] == replica.address]
        out[replica.name] = {"ok_started_before_kill": sum(a.ok and a.started < killed_wall for a in mine),
                             "ok_started_after_kill": sum(a.ok and a.started >= killed_wall for a in mine),
                             "failed": sum(not a.ok for a in mine),
                             "passed_on_to_another": sum(replica.address in a.upstreams[:-1] for a in answered)}
    return out


def summarize(sent: list[Sent], kill: Kill, by_replica: dict[str, dict[str, int]], victim: str) -> dict:
    by_phase = phases(sent, kill)
    survivors = [name for name in by_replica if name != victim]
    recovery = recovery_s(sent, kill.at)
    checks = {
        "every_replica_served_before_the_kill": all(r["ok_started_before_kill"] > 0 for r in by_replica.values()),
        "failures_only_in_flight_or_sent_while_it_died": all(s.ok for s in by_phase["ended_before_kill"])
        and all(s.ok for s in by_phase["started_after_its_port_closed"]),
        "new_requests_went_to_the_survivor": by_replica[victim]["ok_started_after_kill"] == 0
        and sum(by_replica[name]["ok_started_after_kill"] for name in survivors) > 0,
        "recovered_within_the_run": recovery is not None,
    }
    return {
        "requests": len(sent), "failed": sum(not s.ok for s in sent),
        "by_phase": {name: {"requests": len(group), "failed": sum(not s.ok for s in group)}
                     for name, group in by_phase.items()},
        "recovery_s": recovery, "port_closed_after_s": kill.port_closed_after_s,
        "failure_examples": sorted({s.error[:200] for s in sent if not s.ok})[:3],
        "per_replica": by_replica, "killed": victim, "checks": checks, "passed": all(checks.values()),
    }


# Running it ----------------------------------------------------------------------------------------------------

@dataclass
class Report:
    settings: dict
    balancer: str
    replica_command: str
    startup_s: float = 0.0
    cpu_count: int | None = os.cpu_count()
    result: dict = field(default_factory=dict)


def run(root: Path, settings: Settings) -> Report:
    """Start two replicas and the balancer under `root`, run the load with the kill, stop everything."""
    started = time.monotonic()
    replicas = [start_replica(root, name) for name in ("a", "b")]
    balancer = Balancer(root / "balancer", [r.address for r in replicas])
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for replica in replicas:
            wait_ready(replica, deadline)
        balancer.start()
        report = Report(asdict(settings), balancer.version(), REPLICA_COMMAND, round(time.monotonic() - started, 1))
        victim = replicas[0]
        sent, killed = asyncio.run(load_with_kill(balancer.url, settings, victim))
    finally:
        balancer.stop()
        for replica in replicas:
            if replica.process.poll() is None:
                kill(process_groups(replica))
                replica.process.wait(STOP_TIMEOUT_S)
    by_replica = per_replica(access_log(balancer.access_log), replicas, killed.wall)
    report.result = summarize(sent, killed, by_replica, victim.name)
    return report








def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    p.add_argument("--users", type=int, default=defaults.users, help="concurrent streams through the balancer")
    p.add_argument("--before-s", type=float, default=defaults.before_s, help="load before the kill")
    p.add_argument("--after-s", type=float, default=defaults.after_s, help="load after the kill")
    p.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--work", type=Path, help="replicas' state, logs and the balancer's files (default: a temporary "
                                             "folder, removed after)")
    args = p.parse_args(argv)
    settings = Settings(users=args.users, before_s=args.before_s, after_s=args.after_s, max_tokens=args.max_tokens)
    with tempfile.TemporaryDirectory(prefix="adaflash-failover-") as tmp:
        report = run(args.work or Path(tmp), settings)
    report_json = asdict(report) | {"run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report_json, indent=1) + "\n")
    print(json.dumps(report.result, indent=1))
    return 0 if report.result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
