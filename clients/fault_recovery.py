"""Kill each model process of a running server in turn and time the recovery: how long until readiness
turns false, until it is true again, and until a request succeeds; how many requests failed meanwhile.

    .venv/bin/python clients/fault_recovery.py --json bench-out/fault-recovery.json

Starts its own server on free loopback ports (the tiny random models unless --model-dir), with one
client thread sending short greedy requests back to back during each fault.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from adaflash_build.repository import RepositoryConfig, build_repository, tiny_model_dir
from adaflash_client import AdaFlashClient, GenerationError, GenerationParams
from adaflash_server.launcher import ServerConfig, TritonServer, stub_pids

MODELS = ("target", "drafter", "orchestrator", "preprocessing", "postprocessing")
POLL_S = 0.02


def ready(server: TritonServer) -> bool:
    try:
        return urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=2).status == 200
    except (urllib.error.URLError, OSError):
        return False


class Traffic(threading.Thread):
    """Short requests back to back; records when each ended and whether it succeeded."""

    def __init__(self, server: TritonServer) -> None:
        super().__init__(daemon=True)
        self.server, self.stopped, self.outcomes = server, threading.Event(), []

    def run(self) -> None:
        with AdaFlashClient(self.server.grpc_url, timeout_s=60) as client:
            while not self.stopped.is_set():
                try:
                    client.generate("canary", GenerationParams(max_tokens=8, spec_mode="adaflash"))
                    self.outcomes.append((time.monotonic(), True))
                except GenerationError:
                    self.outcomes.append((time.monotonic(), False))
                    time.sleep(0.05)


def until(condition, timeout_s: float) -> float | None:
    """Seconds until `condition()` held (None: not within `timeout_s`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(POLL_S)
    return None


def kill_and_recover(server: TritonServer, model: str, timeout_s: float) -> dict:
    traffic = Traffic(server)
    traffic.start()
    until(lambda: any(ok for _, ok in traffic.outcomes), timeout_s)
    killed = stub_pids(server.pid)[model][0]
    t0 = time.monotonic()
    os.kill(killed, signal.SIGKILL)
    not_ready = until(lambda: not ready(server), 5.0)
    back = until(lambda: ready(server) and killed not in stub_pids(server.pid).get(model, [killed]), timeout_s)
    served = until(lambda: any(ok and t > t0 + (back or 0) for t, ok in traffic.outcomes), timeout_s)
    traffic.stopped.set()
    traffic.join(60)
    after = [ok for t, ok in traffic.outcomes if t > t0]
    return {"model": model, "s_to_not_ready": _round(not_ready), "s_to_ready_again": _round(back),
            "s_to_first_success_after_ready": _round(served), "requests_after_kill": len(after),
            "failed_after_kill": after.count(False)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, help="target/ and drafter/ (default: the tiny random models)")
    p.add_argument("--timeout-s", type=float, default=180.0)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="adaflash-faults-") as tmp:
        root = Path(tmp)
        model_dir = args.model_dir or tiny_model_dir(root)
        cfg = RepositoryConfig(max_active=4, max_batch_size=8, max_len=512, max_prompt_tokens=64,
                               max_output_tokens=256)
        repo = build_repository(root / "model_repository", model_dir, "drafter", cfg)
        with TritonServer(ServerConfig(model_repository=repo, state_dir=root / "server")) as server:
            rows = [kill_and_recover(server, m, args.timeout_s) for m in MODELS]
    report = {"model_dir": str(args.model_dir or "tiny-random"), "cpu_count": os.cpu_count(), "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
