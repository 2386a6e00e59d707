"""Locust load for the `adaflash` Triton model: gRPC streaming requests, one per task, no think time.

    .venv/bin/locust -f tools/locust/locustfile.py --headless -u 8 -r 8 -t 30s --host 127.0.0.1:8001 \
        --spec-mode adaflash --max-tokens 128 --prompts prompts/ --csv out/run

Closed loop by default: each user sends a request, waits for its end, sends the next. With `--request-rate R`
the load is open: requests arrive as a Poisson process of rate R in all (each of the N users draws its own of rate
R/N, and independent Poisson processes add up to one), each in a greenlet of its own, whatever is still running
(`arrivals.py` says why Locust's `constant_throughput` is not that). Requests still running when the test stops
finish before the process exits.

What each request reports through Locust's request events (request_type, name = "<spec_mode>/<domain>"):
* `grpc`: the request; response_time = latency in ms (sending to the last response carrying output),
  response_length = output tokens (0 when unknown: Locust takes numbers only; the records say None).
  A server error (or a failed connection) is a failure here.
* `ttft`: time to first token, ms.
* `itl`: the request's mean inter-token latency, (latency - ttft) / (tokens - 1), ms; only with >= 2 tokens.
* `tau_x1000`: 1000 x tau, tau = (tokens - 1) / verify steps (tokens per target forward, bonus
  included: 1.0 is plain decoding); response_length = verify steps. Not a time: Locust's tables
  print it in the time columns. x1000 because Locust rounds small "times" to integers.
Locust's "Aggregated" row mixes these four kinds, so read the rows by type. With `--records FILE`
every request is also written as a JSON line with all its figures (acceptance lists summed:
`accepted`, `drafted`, `steps`; `sweep.completion_record`), which is what `adaflash sweep` aggregates.

Against a stock TensorRT-LLM ensemble (`--model-name ensemble`, no `--spec-mode`): the client library sends only
the inputs the model has, and this server's statistics are None in the records (`tau_x1000` and `itl` are not
fired without them); output tokens come from TensorRT-LLM's count, else from `--tokenizer`, else are None.

Why `grpc.experimental.gevent.init_gevent()`: importing Locust monkey-patches the standard
library, so every thread (tritonclient's stream reader, gRPC's own helpers) becomes a greenlet of
the one OS thread, while gRPC's C core blocks the thread that polls it. Without the call a
streaming request blocks the whole hub: measured with 8 users, no request ever reached the server
and Locust did not even stop at --run-time. With it, gRPC polls cooperatively and N users keep N
requests in flight on the server (its `adaflash_active_sequences` gauge reads N; checked up to
64). Each user closes its client in on_stop, and a second close (tritonclient's `__del__`) is
skipped: see `_close_once`. `--summary-json` records how late a greenlet and an OS thread of this
process wake from 20 ms sleeps: equal delays mean the process waited for a CPU (the server shares
the machine); a hub delay far above the thread's would mean a greenlet held the hub.

Stopping: requests still running when Locust stops a user without grace are cancelled on the
server and not reported; use --stop-timeout to let them finish.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import gevent
from gevent import GreenletExit, monkey
from gevent.pool import Group
from locust import User, events, task
from locust.exception import StopUser
from locust.stats import CSV_STATS_INTERVAL_SEC

if monkey.is_module_patched("threading"):  # not when LOCUST_SKIP_MONKEY_PATCH is set
    from grpc.experimental import gevent as grpc_gevent

    grpc_gevent.init_gevent()  # after the monkey patching, before any gRPC channel exists

import tritonclient.grpc as grpcclient  # noqa: E402
from arrivals import PoissonArrivals  # noqa: E402 (this folder is on sys.path)
from prompt_sets import PromptSampler, load_prompt_set, parse_weights  # noqa: E402

from adaflash.cli_args import split_csv  # noqa: E402
from adaflash.models.tokenizer import load_tokenizer  # noqa: E402
from adaflash_client.cli import add_connection_arguments, headers_from_args, tls_from_args  # noqa: E402
from adaflash_client.client import SPEC_MODES, AdaFlashClient, GenerationError, GenerationParams  # noqa: E402
from adaflash_tools.sweep import completion_record  # noqa: E402


def _close_once(close):
    """tritonclient's `__del__` closes an already closed client again; under gevent gRPC's Channel.close then
    decrements its gevent channel count a second time, from inside the garbage collector, and that can hang
    the process (seen: Locust hung at exit in 1 run of 3, its stack in `gevent_decrement_channel_count`
    under "Garbage-collecting"; 0 of 16 runs after this change). Every client is closed explicitly, once."""

    def wrapper(self) -> None:
        if getattr(self, "_adaflash_closed", False):
            return
        self._adaflash_closed = True
        close(self)

    return wrapper


grpcclient.InferenceServerClient.close = _close_once(grpcclient.InferenceServerClient.close)

HUB_TICK_S = 0.02


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    g = parser.add_argument_group("adaflash", "request contents and records of the AdaFlash load")
    g.add_argument("--model-name", default="adaflash",
                   help="the model to load: adaflash, or a TensorRT-LLM ensemble (then without --spec-mode, --max-draft)")
    g.add_argument("--tokenizer", default=None,
                   help="a folder with tokenizer.json: counts the output tokens of a model that reports none")
    g.add_argument("--spec-mode", choices=SPEC_MODES, default=None, help="speculation mode (default: the server's)")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--min-tokens", type=int, default=None,
                   help="TensorRT-LLM's min_tokens: no end before this many tokens (= --max-tokens holds the length)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None, help="sampling seed sent with every request")
    g.add_argument("--max-draft", type=int, default=None, help="most draft tokens per step (default: the server's)")
    g.add_argument("--stop-word", action="append", default=None, help="stop word (repeatable)")
    g.add_argument("--prompts", action="append", default=None,
                   help="JSON lines / .txt file or folder of them (repeatable; default: the adaflash sample prompts)")
    g.add_argument("--domains", default="", help="comma-separated domains to use (default: all)")
    g.add_argument("--domain-weights", default="", help="e.g. code=2,chat=1 (default: equal per domain)")
    g.add_argument("--max-prompt-chars", type=int, default=None, help="keep each prompt's last characters")
    g.add_argument("--prompt-seed", type=int, default=0, help="seed of the prompt choice (user i uses seed + i)")
    g.add_argument("--max-requests", type=int, default=0, help="stop after this many requests in all (0: no limit)")
    g.add_argument("--request-rate", type=float, default=None,
                   help="open loop: requests per second in all, Poisson arrivals (default: closed loop)")
    g.add_argument("--request-timeout", type=float, default=300.0, help="seconds before a stream is given up")
    g.add_argument("--records", default="", help="write every request as a JSON line to this file")
    g.add_argument("--summary-json", default="", help="write client-side figures (in-flight peak, hub stalls) here")
    add_connection_arguments(parser.add_argument_group("adaflash connection", "TLS and headers of the gRPC calls"))


class _Load:
    """What the users of this process share: prompts, the request budget, counters, the records file."""

    def __init__(self) -> None:
        self.sampler_args: tuple | None = None
        self.records = None
        self.started = 0
        self.completed = 0
        self.inflight = 0
        self.inflight_max = 0
        self.hub_lags: list[float] = []
        self.thread_lags: list[float] = []
        self.thread_stop = False
        self.monitor: gevent.Greenlet | None = None
        self.quitting = False
        self.open_requests = Group()  # open loop: the requests in flight, awaited before the process exits
        self.idle_clients: list[AdaFlashClient] = []  # open loop: a stream per client, so one client per request
        self.tokenizer = None  # --tokenizer's, shared by the users


LOAD = _Load()


@events.init.add_listener
def _on_init(environment, **_kw) -> None:
    opts = environment.parsed_options
    if opts is None:  # run_single_user / library use without our arguments
        return
    by_domain = load_prompt_set(opts.prompts, split_csv(opts.domains),
                                opts.max_prompt_chars)
    LOAD.sampler_args = (by_domain, parse_weights(opts.domain_weights))
    if opts.tokenizer:
        LOAD.tokenizer = load_tokenizer(opts.tokenizer)
    if opts.records:
        Path(opts.records).parent.mkdir(parents=True, exist_ok=True)
        LOAD.records = open(opts.records, "a", encoding="utf-8")  # noqa: SIM115 (closed when quitting)


def _watch_hub() -> None:
    """Sleep HUB_TICK_S in a loop; any extra delay is time some greenlet held the hub."""
    while True:
        t = time.perf_counter()
        gevent.sleep(HUB_TICK_S)
        LOAD.hub_lags.append(time.perf_counter() - t - HUB_TICK_S)


def _watch_os_thread() -> None:
    """The same in a real OS thread (outside gevent): its delays are the process waiting for a CPU, which
    the hub suffers too. Hub stalls well above these are greenlets holding the hub."""
    sleep = monkey.get_original("time", "sleep")
    while not LOAD.thread_stop:
        t = time.perf_counter()
        sleep(HUB_TICK_S)
        LOAD.thread_lags.append(time.perf_counter() - t - HUB_TICK_S)


@events.test_start.add_listener
def _on_test_start(environment, **_kw) -> None:
    if LOAD.monitor is None:
        LOAD.monitor = gevent.spawn(_watch_hub)
        monkey.get_original("_thread", "start_new_thread")(_watch_os_thread, ())


@events.quitting.add_listener
def _on_quitting(environment, **_kw) -> None:
    opts = environment.parsed_options
    if opts is not None and getattr(opts, "csv_prefix", None):
        # Locust rewrites its CSVs once a second and not at exit, so requests of the last second would be
        # missing; by now every user has stopped, so one more round of its writer holds them all.
        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.2)
    if opts is not None:
        LOAD.open_requests.join(timeout=opts.request_timeout)
    for client in LOAD.idle_clients:
        client.close()
    if LOAD.monitor is not None:
        LOAD.monitor.kill()
    LOAD.thread_stop = True
    if LOAD.records is not None:
        LOAD.records.close()
        LOAD.records = None
    if opts is not None and opts.summary_json:
        summary = {"requests_started": LOAD.started, "requests_completed": LOAD.completed,
                   "inflight_max": LOAD.inflight_max}
        for name, values in (("hub", LOAD.hub_lags), ("os_thread", LOAD.thread_lags)):
            lags = sorted(values)
            summary[f"{name}_ticks"] = len(lags)
            for key, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
                summary[f"{name}_lag_{key}_ms"] = round(lags[int(q * (len(lags) - 1))] * 1000, 3) if lags else None
        Path(opts.summary_json).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.summary_json).write_text(json.dumps(summary, indent=1) + "\n")


def params_from_options(opts) -> GenerationParams:
    return GenerationParams(max_tokens=opts.max_tokens, min_tokens=opts.min_tokens, temperature=opts.temperature,
                            top_k=opts.top_k, top_p=opts.top_p, seed=opts.seed, stop_words=opts.stop_word,
                            spec_mode=opts.spec_mode, max_draft=opts.max_draft)


class AdaFlashUser(User):
    """One client: closed loop (a streaming request, wait for its end, the next one), or with --request-rate an
    arrival process that hands each request to a greenlet and waits only for the next arrival."""

    host = "127.0.0.1:8001"
    _count = 0
    arrivals: PoissonArrivals | None = None

    def wait_time(self) -> float:
        """Locust waits this long after each task; stopping during the wait ends the user at once, so no request
        is sent after the test's time is up."""
        return 0.0 if self.arrivals is None else self.arrivals.wait(time.monotonic())

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        AdaFlashUser._count += 1
        self.index = AdaFlashUser._count
        self.params = params_from_options(opts)
        self.mode = opts.spec_mode or "default"
        by_domain, weights = LOAD.sampler_args
        self.sampler = PromptSampler(by_domain, weights, seed=opts.prompt_seed + self.index)
        self.max_requests = opts.max_requests
        self.url = self.host.split("://", 1)[-1].rstrip("/")  # tritonclient wants host:port
        if opts.request_rate:
            users = opts.num_users or 1
            self.arrivals = PoissonArrivals(opts.request_rate / users, time.monotonic(),
                                            seed=f"arrivals:{opts.prompt_seed}:{self.index}")
        else:
            self.client = self._new_client()

    def _new_client(self) -> AdaFlashClient:
        opts = self.environment.parsed_options
        return AdaFlashClient(self.url, model_name=opts.model_name, timeout_s=opts.request_timeout,
                              tls=tls_from_args(opts), headers=headers_from_args(opts), tokenizer=LOAD.tokenizer)

    def on_stop(self) -> None:
        if self.arrivals is None:
            self.client.close()

    @task
    def generate(self) -> None:
        if self.max_requests and LOAD.started >= self.max_requests:
            raise StopUser()
        LOAD.started += 1
        prompt = self.sampler.sample()
        if self.arrivals is None:
            self._request(self.client, prompt)
        else:
            LOAD.open_requests.spawn(self._open_request, prompt)

    def _open_request(self, prompt) -> None:
        """A request of the open loop, on an idle pooled client (a new one when all are busy)."""
        client = LOAD.idle_clients.pop() if LOAD.idle_clients else self._new_client()
        try:
            self._request(client, prompt)
        finally:
            LOAD.idle_clients.append(client)

    def _request(self, client: AdaFlashClient, prompt) -> None:
        name = f"{self.mode}/{prompt.domain}"
        runner = self.environment.runner
        record = {"mode": self.mode, "domain": prompt.domain, "prompt_id": prompt.id, "user": self.index,
                  "users": runner.user_count if runner else None, "t_start": time.time()}
        LOAD.inflight += 1
        LOAD.inflight_max = max(LOAD.inflight_max, LOAD.inflight)
        start = time.perf_counter()
        error: Exception | None = None
        try:
            completion = client.generate_streaming(prompt.text, self.params)
        except GreenletExit:
            raise  # stopped by Locust mid-request: cancelled on the server, not reported
        except Exception as e:  # GenerationError, or anything unexpected: a failed request either way
            error = e
        finally:
            LOAD.inflight -= 1
        record["t_end"] = time.time()
        if error is None and completion.finish_reason == "cancelled":
            error = GenerationError(None, "cancelled before the final response")
        if error is not None:
            record.update(ok=False, error=str(error), latency_s=time.perf_counter() - start)
            self._report(name, record, error)
            return
        record.update(ok=True, error=None, **completion_record(completion))
        self._report(name, record, None)

    def _report(self, name: str, record: dict, error: Exception | None) -> None:
        fire = self.environment.events.request.fire
        fire(request_type="grpc", name=name, response_time=record["latency_s"] * 1000,
             response_length=record.get("tokens") or 0, exception=error, context=record)
        if error is None:
            if record["ttft_s"] is not None:
                fire(request_type="ttft", name=name, response_time=record["ttft_s"] * 1000, response_length=0)
            if record["itl_s"] is not None:
                fire(request_type="itl", name=name, response_time=record["itl_s"] * 1000, response_length=0)
            if record["tau"] is not None:
                fire(request_type="tau_x1000", name=name, response_time=record["tau"] * 1000,
                     response_length=record["steps"])
        if LOAD.records is not None:
            LOAD.records.write(json.dumps(record) + "\n")
            LOAD.records.flush()
        LOAD.completed += 1
        if self.max_requests and LOAD.completed >= self.max_requests and not LOAD.quitting:
            LOAD.quitting = True
            gevent.spawn(self.environment.runner.quit)
