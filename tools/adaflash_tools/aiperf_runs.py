"""NVIDIA's aiperf as the load generator of `adaflash sweep --tool aiperf`: its command line and its exports read
back into the per-request records the Locust users write, so that one function (`sweep.summarize_level`) computes
every figure of both tools and their rows share the tidy CSV, plots and SLO report.

Why a virtual environment of its own (`.venv-aiperf`, made on first use from `clients/aiperf/requirements.txt`,
every package pinned): aiperf pulls in ~140 packages (1.2 GB) the server neither needs nor should have to agree
with. It is only ever run as a program, never imported.

Why the OpenAI endpoint and aiperf's `completions` endpoint type: it is how aiperf is meant to be pointed at a
server, it streams with `usage` (the server's own token counts, `--use-server-token-count`, instead of aiperf
re-tokenizing text), and the prompt goes in as the same raw text the Locust users send over gRPC (`chat` would wrap
it in the target's chat template). Request fields beyond aiperf's own go in `--extra-inputs` (`spec_mode`,
`min_tokens`, sampling). The prompts are the sweep's: a file of them in the order Locust's sampler draws, read
sequentially, so both tools send the same mix.

What the records hold: aiperf's per-request export (`profile_export.jsonl`: wall-clock start and end, TTFT,
latency, output tokens) joined by request id with its raw export (`profile_export_raw.jsonl`: the responses, whose
finishing chunks carry the finish reason and the server's `adaflash` statistics, hence tau and acceptance).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parents[2] / "clients" / "aiperf" / "requirements.txt"
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-aiperf"  # beside .venv (an editable install's checkout)
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


def ensure_aiperf(venv: Path) -> Path:
    """The aiperf program of `venv`, installing it there first when the venv is missing or was made from other
    requirements (a first install takes a few minutes)."""
    exe = venv / "bin" / "aiperf"
    stamp = venv / ".requirements.txt"
    wanted = REQUIREMENTS.read_text()
    if exe.is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return exe
    print(f"installing aiperf into {venv} from {REQUIREMENTS} (once, a few minutes)", file=sys.stderr, flush=True)
    if not (venv / "bin" / "python").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)
    stamp.write_text(wanted)
    return exe


def write_inputs(prompts: list[str], path: Path) -> None:
    """aiperf's `single_turn` dataset: one {"text": ...} per line, sent in file order."""
    with path.open("w", encoding="utf-8") as f:
        for text in prompts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


def aiperf_command(exe: Path, *, openai_url: str, model: str, tokenizer_dir: Path, inputs: Path, artifacts: Path,
                   body: dict, concurrency: int | None, request_rate: float | None, duration: float, requests: int,
                   request_timeout: float, seed: int, headers: dict[str, str] | None = None) -> list[str]:
    """`aiperf profile` for one level: closed loop at `concurrency`, or open loop at `request_rate` with Poisson
    arrivals; for `duration` seconds (or `requests` requests), in-flight requests allowed to finish."""
    cmd = [str(exe), "profile", "--model", model, "--url", openai_url, "--endpoint-type", "completions",
           "--streaming", "--use-server-token-count", "--tokenizer", str(tokenizer_dir),
           "--input-file", str(inputs), "--custom-dataset-type", "single_turn",
           "--dataset-sampling-strategy", "sequential", "--extra-inputs", json.dumps(body),
           "--request-timeout-seconds", f"{request_timeout:g}", "--random-seed", str(seed),
           "--output-artifact-dir", str(artifacts), "--export-level", "raw",
           "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry"]
    if request_rate is not None:
        cmd += ["--request-rate", f"{request_rate:g}", "--arrival-pattern", "poisson"]
    else:
        cmd += ["--concurrency", str(concurrency)]
    if requests:
        cmd += ["--request-count", str(requests)]
    else:
        cmd += ["--benchmark-duration", f"{duration:g}", "--benchmark-grace-period", f"{request_timeout:g}"]
    for name, value in (headers or {}).items():
        cmd += ["--header", f"{name}:{value}"]
    return cmd


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _seconds(metrics: dict, name: str) -> float | None:
    metric = metrics.get(name)
    return None if metric is None else metric["value"] * _SECONDS[metric["unit"]]


def _chunks(raw: dict | None) -> list[dict]:
    """The JSON chunks of a request's server-sent events, in order (the closing `[DONE]` left out)."""
    return [json.loads(packet["value"]) for response in (raw or {}).get("responses", [])
            for packet in response.get("packets", [])
            if packet.get("name") == "data" and packet.get("value", "").startswith("{")]


def _record(row: dict, raw: dict | None, mode: str) -> dict:
    meta, metrics = row["metadata"], row.get("metrics", {})
    record = {"tool": "aiperf", "mode": mode, "request_id": meta["x_request_id"],
              "t_start": meta["request_start_ns"] / 1e9, "t_end": meta["request_end_ns"] / 1e9}
    if row.get("error") or meta.get("was_cancelled"):
        error = row.get("error") or {"message": "cancelled"}
        return {**record, "ok": False, "error": f"{error.get('code', '')} {error.get('message', '')}".strip(),
                "latency_s": record["t_end"] - record["t_start"]}
    latency = _seconds(metrics, "request_latency")
    ttft = _seconds(metrics, "time_to_first_token")
    tokens = int(metrics["output_sequence_length"]["value"])
    chunks = _chunks(raw)
    stats = next((c["adaflash"] for c in reversed(chunks) if "adaflash" in c), {})
    finish = [choice["finish_reason"] for c in chunks for choice in c.get("choices", []) if choice.get("finish_reason")]
    return {**record, "ok": True, "error": None, "latency_s": latency, "ttft_s": ttft,
            "itl_s": (latency - ttft) / (tokens - 1) if ttft is not None and tokens > 1 else None,
            "tokens": tokens, "target_forwards": stats.get("target_forwards"), "steps": stats.get("verify_steps"),
            "accepted": stats.get("accepted_draft_tokens"), "drafted": stats.get("draft_tokens"),
            "tau": stats.get("tau"), "finish_reason": finish[-1] if finish else None}


def read_records(artifacts: Path, mode: str) -> list[dict]:
    """The profiling phase's requests of one aiperf run, as Locust-format records (`tool` "aiperf")."""
    raw = {r["metadata"]["x_request_id"]: r for r in _jsonl(artifacts / "profile_export_raw.jsonl")}
    return [_record(row, raw.get(row["metadata"]["x_request_id"]), mode)
            for row in _jsonl(artifacts / "profile_export.jsonl")
            if row["metadata"].get("benchmark_phase", "profiling") == "profiling"]


def own_summary(artifacts: Path) -> dict:
    """A few of aiperf's own figures from its summary export, kept beside ours in the level's summary (aiperf
    computes percentiles and its duration its own way, so they differ from ours by a little)."""
    path = artifacts / "profile_export_aiperf.json"
    if not path.is_file():
        return {}
    summary = json.loads(path.read_text())
    picked = {"aiperf_version": summary.get("aiperf_version")}
    for name, stat in (("request_count", "avg"), ("error_request_count", "avg"), ("request_throughput", "avg"),
                       ("output_token_throughput", "avg"), ("benchmark_duration", "avg"),
                       ("time_to_first_token", "p50"), ("time_to_first_token", "p95"),
                       ("inter_token_latency", "p50"), ("request_latency", "p50")):
        metric = summary.get(name)
        if isinstance(metric, dict) and stat in metric:
            picked[f"{name}_{stat}" if stat != "avg" else name] = metric[stat]
    return picked
