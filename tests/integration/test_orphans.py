"""No server outlives its launcher: however `adaflash serve` ends (SIGKILL, or SIGTERM with a supervisor's SIGKILL a
second later), tritonserver and its model processes are gone within seconds and the ports are free; a launcher that
finds a server its state folder's last launcher left stops it before it starts its own."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_until
from test_launcher_served import port_is_free

from adaflash_server.launcher import PID_FILE, clear_stale_server, free_ports, group_members

GONE_S = 5.0  # the bound: no process of the server left, ports free


def _serve(state: Path) -> tuple[subprocess.Popen, list[int]]:
    """`adaflash serve --tiny-random` in a session of its own, as a supervisor starts it: (launcher, ports)."""
    ports = free_ports(4)
    cmd = [sys.executable, "-m", "adaflash.entry", "serve", "--tiny-random", "--state-dir", str(state),
           "--grpc-port", str(ports[0]), "--http-port", str(ports[1]), "--metrics-port", str(ports[2]),
           "--openai-port", str(ports[3]), "--max-active", "2"]
    log = (state / "serve.log").open("w")
    launcher = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until(lambda: "Ctrl-C stops the server" in (state / "serve.log").read_text() or launcher.poll() is not None,
               300, "the server")
    assert launcher.poll() is None, (state / "serve.log").read_text()[-3000:]
    return launcher, ports


def _pid_file(state: Path) -> Path:
    found = list(state.rglob(PID_FILE))
    assert found, f"no {PID_FILE} under {state}"
    return found[0]


@pytest.mark.parametrize("ending", ["sigkill", "sigterm-then-sigkill"])
def test_the_server_ends_with_its_launcher(tmp_path, ending):
    launcher, ports = _serve(tmp_path)
    server = int(_pid_file(tmp_path).read_text())
    assert len(group_members(server)) >= 2, "the server and its model processes"
    if ending == "sigterm-then-sigkill":
        launcher.send_signal(signal.SIGTERM)
        time.sleep(1.0)
    killed = time.monotonic()
    launcher.kill()
    launcher.wait()
    wait_until(lambda: not group_members(server), GONE_S, "every process of the server to end")
    wait_until(lambda: all(port_is_free(p) for p in ports), GONE_S - (time.monotonic() - killed) + 1.0,
               "the ports to be free")


def test_a_server_left_by_a_launcher_of_the_same_state_folder_is_stopped(tmp_path):
    """A process named tritonserver in a session of its own, named by the state folder's pid file, as a launcher
    killed before servers died with it would have left one."""
    binary = tmp_path / "tritonserver"
    shutil.copy(shutil.which("sleep"), binary)
    left = subprocess.Popen([str(binary), "600"], start_new_session=True)
    try:
        cmdline = Path("/proc") / str(left.pid) / "cmdline"
        wait_until(lambda: cmdline.read_bytes().startswith(str(binary).encode()), 10, "the program to start")
        (tmp_path / PID_FILE).write_text(f"{left.pid}\n")
        assert clear_stale_server(tmp_path) == left.pid
        assert left.wait(10) == -signal.SIGKILL
        assert not (tmp_path / PID_FILE).exists()
        (tmp_path / PID_FILE).write_text(f"{os.getpid()}\n")  # a pid reused by another program: left alone
        assert clear_stale_server(tmp_path) is None and not (tmp_path / PID_FILE).exists()
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()


def test_the_server_a_healing_restart_starts_ends_with_its_launcher(tmp_path):
    """The launcher killed while its healer starts the server again (the first one killed): the new server, still
    loading its models, goes with it."""
    launcher, ports = _serve(tmp_path)
    pid_file = _pid_file(tmp_path)
    first = int(pid_file.read_text())
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() not in ("", str(first)), 60,
               "the healer to start the server again")
    second = int(pid_file.read_text())
    launcher.kill()
    launcher.wait()
    wait_until(lambda: not group_members(second) and not group_members(first), GONE_S, "every process of both servers to end")
    wait_until(lambda: all(port_is_free(p) for p in ports), GONE_S, "the ports to be free")
