"""The served step loop (Scheduler over RemoteBackend) through the wire protocol, with the target and drafter
services in process: the same output as the engine, one target call per step, and the failure rules."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import pytest
from helpers import clone_target, fixed_costs, random_prompts

from adaflash.decoding.engine import Engine
from adaflash.decoding import gate as gate_rules
from adaflash.decoding.gate import PlanGate
from adaflash_contract.modes import MODE_NAMES
from adaflash.decoding.backend import BackendError
from adaflash.decoding.limits import Limits
from adaflash.decoding.scheduler import Scheduler
from adaflash.decoding.speculation import build_speculation
from adaflash.decoding.sequence import Request, Sequence
from adaflash.serving import protocol
from adaflash.serving.protocol import Op
from adaflash.serving.remote import RemoteBackend, TargetInProcess
from adaflash.serving.slots import DrafterSlots, TargetSlots

MAX_TOKENS = 32
MAX_LEN = 30 + MAX_TOKENS + 16 + 10


def loop(backend, bundle, max_active: int, run_steps: int | None = None, gate: PlanGate | None = None) -> Scheduler:
    """The served step loop over `backend` with the test's fixed cost table and the given gate (None: none)."""
    block_size = bundle.drafter.config.block_size
    policy = build_speculation(fixed_costs(), block_size, MAX_LEN, True, served=True, plan_gate=False,
                               run_steps=run_steps)
    policy.gate = gate
    return Scheduler(backend, policy, Limits(bundle.target.config.vocab_size, MAX_LEN, block_size), max_active)


class Models:
    """The target and drafter models as the orchestrator sees them: tensors in, tensors out, by model name."""

    def __init__(self, bundle, slots: int, drafters: tuple[str, ...] = ("drafter",)) -> None:
        target = clone_target(bundle.target)
        self.target = TargetSlots(target, slots, MAX_LEN, bundle.drafter.config.target_layer_ids)
        self.drafters = {name: DrafterSlots(bundle.drafter, target, slots, MAX_LEN) for name in drafters}
        self.newest = drafters[-1]
        self.calls: list[tuple[str, Op, int]] = []  # (model, op, sequences)
        self.feature_rows: dict[int, list[int]] = {}  # sequence -> feature rows the target sent, call by call
        self.failing: set[str] = set()

    async def call(self, model: str, tensors: protocol.Tensors) -> protocol.Tensors:
        await asyncio.sleep(0)  # a real transport suspends here
        op = Op(int(tensors["op"][0]))
        self.calls.append((model, op, len(tensors["keys"])))
        if model in self.failing:
            raise BackendError(f"{model}: stub process is not healthy")
        if model == protocol.TARGET:
            call = protocol.decode_target_call(tensors)
            timed = self.target.run(call)
            if op is Op.RELEASE:
                return {}
            result = protocol.encode_target_result(timed.value, timed.ms)
            rows = result["feature_rows"].tolist() if "feature_rows" in result else [0] * len(call.keys)
            for key, n in zip(call.keys, rows):
                self.feature_rows.setdefault(key, []).append(n)
            return result
        if op is Op.RELEASE:
            for key in protocol.decode_keys(tensors):
                self.drafters[model].release(key)
            return {}
        timed = self.drafters[model].run(protocol.decode_draft_call(tensors))
        return protocol.encode_draft(timed.value, timed.ms)

    def empty(self) -> bool:
        return len(self.target.slots) == 0 and all(len(d.slots) == 0 for d in self.drafters.values())


def serve(bundle, requests: list[Request], models: Models, before_step=None,
          max_active: int | None = None, run_steps: int | None = 1,
          gate: PlanGate | None = None, target: TargetInProcess | None = None,
          called=lambda model, op, n: None) -> tuple[list[Sequence], dict]:
    """Run the requests through the served loop; returns the sequences and what was streamed per sequence.
    `run_steps`: plain decoding steps per target call (1: a call per step; None: the live choice). `target`: the
    target in process instead of `models.target` behind the wire; `called`: told of every model call."""
    backend = RemoteBackend(models.call, lambda: models.newest, target=target, called=called)
    scheduler = loop(backend, bundle, max_active or len(requests), run_steps, gate)
    seqs = [Sequence(id=1000 + i, request=r, tokens=list(r.prompt_ids), generator=None, stop_ids=frozenset())
            for i, r in enumerate(requests)]
    for s in seqs:
        scheduler.add(s)
    streamed: dict[int, list[int]] = {}
    sent: dict[int, int] = {}

    async def run() -> None:
        step = 0
        while scheduler.has_work:
            if before_step:
                before_step(step)
            for seq in await scheduler.step():
                streamed.setdefault(seq.id, []).extend(seq.output[sent.get(seq.id, 0):])
                sent[seq.id] = len(seq.output)
            step += 1

    asyncio.run(run())
    return seqs, streamed


def reference(bundle, prompts):
    engine = Engine(clone_target(bundle.target), None, num_slots=len(prompts), max_len=MAX_LEN)
    return [s.output for s in engine.generate([Request(p, MAX_TOKENS, stop_ids=()) for p in prompts])]


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_served_loop_equals_the_engine_with_one_target_call_per_step(trained_tiny, mode):
    prompts = random_prompts(12, seed=11)
    models = Models(trained_tiny, 12)
    seqs, streamed = serve(trained_tiny, [Request(p, MAX_TOKENS, mode=mode, stop_ids=()) for p in prompts], models)
    want = reference(trained_tiny, prompts)
    engine = Engine(clone_target(trained_tiny.target), trained_tiny.drafter, num_slots=12, max_len=MAX_LEN,
                    cost_model=fixed_costs(), plan_gate=False)
    in_process = engine.generate([Request(p, MAX_TOKENS, mode=mode, stop_ids=()) for p in prompts])
    for seq, ref, local in zip(seqs, want, in_process):
        assert seq.output == ref == streamed[seq.id]
        if mode != "adaflash":  # (adaflash's choices follow the live cost scales: timing)
            assert [(s.draft_len, s.accepted) for s in seq.steps] == [(s.draft_len, s.accepted) for s in local.steps]
    steps = [n for model, op, n in models.calls if model == protocol.TARGET and op is Op.STEP]
    assert steps[0] == 12 and steps[1] == 12  # every sequence in one call: the prefills, then the first verify
    assert len(steps) == 1 + max(len(s.steps) for s in seqs)  # one target call per step, the admitting one too
    drafts = [(model, op) for model, op, _ in models.calls if op is Op.DRAFT]
    assert len(drafts) < len(steps)
    if mode in ("dflash", "adaflash-published"):
        assert any(st.accepted > 0 for s in seqs for st in s.steps)
    assert models.empty()


def test_the_plan_gate_s_plain_arm_runs_several_steps_per_call_and_sends_their_features(trained_tiny, monkeypatch):
    """Served adaflash under the plan gate (blocks of one call, so that every arm runs in a short test): on its plain
    arm a target call carries several steps, and every committed position's features travel to the drafter
    (prompt, verifies, copies and runs: len(tokens) - 1 rows per sequence); the output and its stream are plain
    decoding's."""
    monkeypatch.setattr(gate_rules, "BLOCK_CALLS", 1)
    monkeypatch.setattr(gate_rules, "BLOCK_SEQUENCE_STEPS", 1)
    monkeypatch.setattr(gate_rules, "PLAIN_BLOCK_SEQUENCE_STEPS", 1)
    prompts = random_prompts(6, seed=13)
    models = Models(trained_tiny, 6)
    gate = PlanGate()
    seqs, streamed = serve(trained_tiny, [Request(p, MAX_TOKENS, mode="adaflash", stop_ids=()) for p in prompts],
                           models, run_steps=4, gate=gate)
    for seq, ref in zip(seqs, reference(trained_tiny, prompts)):
        assert seq.output == ref == streamed[seq.id]
        assert sum(models.feature_rows[seq.id]) == len(seq.tokens) - 1
    assert None not in gate.loads[6 .bit_length()].rates.values()  # every arm ran
    steps = [n for model, op, n in models.calls if model == protocol.TARGET and op is Op.STEP]
    assert len(steps) < 1 + max(len(s.steps) for s in seqs)  # runs: fewer calls than steps
    assert any(op is Op.DRAFT for _, op, _ in models.calls)
    assert models.empty()


def test_plain_decoding_runs_several_steps_per_target_call(trained_tiny):
    """Where every running sequence decodes plainly, a target call carries several steps (`runs`), each
    sequence's cut to its max_tokens: the output and its stream are plain decoding's, in fewer calls."""
    prompts = random_prompts(6, seed=12)
    models = Models(trained_tiny, 6)
    max_tokens = [MAX_TOKENS, MAX_TOKENS, 9, 10, 11, 3]
    seqs, streamed = serve(trained_tiny, [Request(p, n, mode="ar", stop_ids=()) for p, n in zip(prompts, max_tokens)],
                           models, run_steps=4)
    for seq, ref, n in zip(seqs, reference(trained_tiny, prompts), max_tokens):
        assert seq.output == ref[:n] == streamed[seq.id] and len(seq.steps) == n - 1
    steps = [n for model, op, n in models.calls if model == protocol.TARGET and op is Op.STEP]
    assert len(steps) == 1 + -(-(MAX_TOKENS - 1) // 4)  # the prefills, then runs of 4 steps
    assert steps[:5] == [6, 6, 5, 4, 2]  # a sequence leaves the calls once its max_tokens ends its run
    assert models.empty()


def test_features_travel_only_for_sequences_that_draft(trained_tiny):
    """The target captures and returns hidden features for the drafter's context only for drafting sequences:
    a plain or prompt-lookup sequence beside them costs no feature traffic."""
    prompts = random_prompts(6, seed=15)
    models = Models(trained_tiny, 6)
    modes = ["ar", "dflash", "ngram", "adaflash", "ar", "ar"]
    seqs, _ = serve(trained_tiny, [Request(p, MAX_TOKENS, mode=m, stop_ids=()) for p, m in zip(prompts, modes)], models)
    for seq, mode in zip(seqs, modes):
        rows = models.feature_rows[seq.id]
        assert (sum(rows) > 0) == (mode in ("dflash", "adaflash")), (mode, rows)
        if sum(rows):
            assert rows[0] == len(seq.request.prompt_ids) and all(r > 0 for r in rows)


def test_releases_ride_on_the_next_call_and_nothing_is_held_at_the_end(trained_tiny):
    """Sequences that finish at different steps are freed by the models' next calls (before those claim slots),
    so a busy loop makes no release calls of its own; only the loop going idle sends one per model."""
    prompts = random_prompts(8, seed=14)
    models = Models(trained_tiny, 4)  # 8 requests through 4 slots: later prefills need the slots freed
    reqs = [Request(p, 4 + 3 * i, mode="dflash", stop_ids=()) for i, p in enumerate(prompts)]
    seqs, _ = serve(trained_tiny, reqs, models, max_active=4)
    plain = Engine(clone_target(trained_tiny.target), None, num_slots=8, max_len=MAX_LEN)
    assert [s.output for s in seqs] == [s.output for s in plain.generate([replace(r, mode="ar") for r in reqs])]
    releases = [(i, model) for i, (model, op, _) in enumerate(models.calls) if op is Op.RELEASE]
    assert sorted(model for _, model in releases) == ["drafter", protocol.TARGET]
    assert min(i for i, _ in releases) >= len(models.calls) - 2  # the last two calls: the loop idles
    assert models.empty()


def test_sampled_output_equals_the_engine_for_the_same_seeds(trained_tiny):
    from adaflash.decoding.sampling import SamplingParams
    prompts = random_prompts(6, seed=13)
    reqs = [Request(p, MAX_TOKENS, mode=m, stop_ids=(), sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=i))
            for i, (p, m) in enumerate(zip(prompts, ["ar", "ngram", "dflash"] * 2))]
    engine = Engine(clone_target(trained_tiny.target), trained_tiny.drafter, num_slots=6, max_len=MAX_LEN,
                    cost_model=fixed_costs(), plan_gate=False)
    local = [s.output for s in engine.generate(reqs)]
    seqs, _ = serve(trained_tiny, reqs, Models(trained_tiny, 6))
    assert [s.output for s in seqs] == local


def test_a_failing_drafter_leaves_plain_decoding(trained_tiny):
    prompts = random_prompts(4, seed=12)
    models = Models(trained_tiny, 4)
    models.failing.add("drafter")
    seqs, _ = serve(trained_tiny, [Request(p, MAX_TOKENS, mode="dflash", stop_ids=()) for p in prompts], models)
    assert [s.output for s in seqs] == reference(trained_tiny, prompts)
    assert all(st.draft_len == 0 for s in seqs for st in s.steps)
    assert sum(op is Op.DRAFT for _, op, _ in models.calls) == 1  # tried once, then never again
    assert len(models.target.slots) == 0


def test_a_failing_target_ends_its_sequences_with_the_reason(trained_tiny):
    prompts = random_prompts(3, seed=14)
    models = Models(trained_tiny, 3)
    seqs, _ = serve(trained_tiny, [Request(p, MAX_TOKENS, mode="adaflash", stop_ids=()) for p in prompts], models,
                    before_step=lambda step: step == 3 and models.failing.add("target"))
    assert all(s.finish_reason == "error" and "not healthy" in s.error for s in seqs)
    assert all(0 < len(s.output) < MAX_TOKENS for s in seqs)


def test_a_hot_swap_keeps_running_sequences_on_their_drafter(trained_tiny):
    prompts = random_prompts(6, seed=15)
    models = Models(trained_tiny, 6, drafters=("drafter", "drafter_2"))
    models.newest = "drafter"

    def swap(step: int) -> None:
        if step == 1:  # after their prefill, before their first draft
            models.newest = "drafter_2"

    reqs = [Request(p, MAX_TOKENS, mode="dflash", stop_ids=()) for p in prompts]
    backend_seqs, _ = serve(trained_tiny, reqs[:3], models, before_step=swap)
    assert [s.output for s in backend_seqs] == reference(trained_tiny, prompts[:3])
    used = {model for model, op, _ in models.calls if op is Op.DRAFT}
    assert used == {"drafter"}  # they started there and stayed
    models.calls.clear()
    later, _ = serve(trained_tiny, reqs[3:], models)
    assert {model for model, op, _ in models.calls if op is Op.DRAFT} == {"drafter_2"}
    assert [s.output for s in later] == reference(trained_tiny, prompts[3:])
    assert models.empty()


def test_failing_everything_ends_and_releases_every_sequence(trained_tiny):
    """What the orchestrator does when a step itself raised: no request is left waiting, no slot held."""
    prompts = random_prompts(4, seed=16)
    models = Models(trained_tiny, 2)
    scheduler = loop(RemoteBackend(models.call, lambda: models.newest), trained_tiny, 2)
    seqs = [Sequence(id=i, request=Request(p, MAX_TOKENS, mode="dflash", stop_ids=()), tokens=list(p), generator=None,
                     stop_ids=frozenset()) for i, p in enumerate(prompts)]
    for s in seqs:
        scheduler.add(s)

    async def run() -> list[Sequence]:
        await scheduler.step()
        await scheduler.step()
        return await scheduler.fail_all("internal error: boom")

    ended = asyncio.run(run())
    assert sorted(s.id for s in ended) == [0, 1, 2, 3] and not scheduler.has_work
    assert all(s.finish_reason == "error" and s.error == "internal error: boom" for s in seqs)
    assert seqs[0].output and not seqs[3].output  # two ran, two waited
    assert models.empty()


class ThreadRecordingSlots(TargetSlots):
    """The target's slots, recording the threads its calls run on; `fail_at`: the call that raises instead."""

    def __init__(self, *args, fail_at: int | None = None) -> None:
        super().__init__(*args)
        self.threads: set[threading.Thread] = set()
        self.calls, self.fail_at = 0, fail_at

    def run(self, call, stop_early=None):
        self.threads.add(threading.current_thread())
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("out of memory")
        return super().run(call, stop_early)


def _target_in_process(bundle, slots: int, fail_at: int | None = None) -> TargetInProcess:
    return TargetInProcess(lambda: (ThreadRecordingSlots(clone_target(bundle.target), slots, MAX_LEN,
                                                         bundle.drafter.config.target_layer_ids, fail_at=fail_at),
                                    None))


@pytest.mark.parametrize("mode", ["ar", "dflash", "adaflash"])
def test_the_target_in_process_serves_the_engine_s_output_on_a_thread_of_its_own(trained_tiny, mode):
    """The target in the orchestrator's process: the engine's output, every call on the one thread that loaded
    it (not the event loop's), each counted as a model call is, and no slot held once the loop idles."""
    prompts = random_prompts(8, seed=16)
    models = Models(trained_tiny, 8)
    target, counted = _target_in_process(trained_tiny, 8), []
    seqs, streamed = serve(trained_tiny, [Request(p, MAX_TOKENS, mode=mode, stop_ids=()) for p in prompts], models,
                           target=target, called=lambda model, op, n: model == protocol.TARGET and counted.append(op))
    for seq, ref in zip(seqs, reference(trained_tiny, prompts)):
        assert seq.output == ref == streamed[seq.id]
    assert len(target.slots.threads) == 1 and threading.current_thread() not in target.slots.threads
    assert counted.count(Op.STEP) == 1 + max(len(s.steps) for s in seqs)
    assert counted[-1] is Op.RELEASE and len(target.slots.slots) == 0
    assert not any(model == protocol.TARGET for model, _, _ in models.calls)  # nothing crossed the wire to it
    if mode != "ar":
        assert any(op is Op.DRAFT for _, op, _ in models.calls)
    target.close()


def test_a_failing_target_in_process_ends_its_sequences_with_the_reason(trained_tiny):
    prompts = random_prompts(3, seed=14)
    target = _target_in_process(trained_tiny, 3, fail_at=4)
    seqs, _ = serve(trained_tiny, [Request(p, MAX_TOKENS, mode="adaflash", stop_ids=()) for p in prompts],
                    Models(trained_tiny, 3), target=target)
    assert all(s.finish_reason == "error" and s.error == "target: out of memory" for s in seqs)
    assert all(0 < len(s.output) < MAX_TOKENS for s in seqs)
    target.close()


class ArrivalDuringRuns:
    """The target in process, with `arrive()` called as each plain decoding run begins: a client's request
    reaching the loop while the target computes. Records each run's (steps asked, steps run)."""

    def __init__(self, inner: TargetInProcess, arrive) -> None:
        self.inner, self.arrive = inner, arrive
        self.runs: list[tuple[list[int], list[int]]] = []

    async def run(self, call, stop_early=None):
        if call.runs is not None:
            self.arrive()
        done = await self.inner.run(call, stop_early)
        if call.runs is not None:
            self.runs.append((list(call.runs), [len(r.committed) for r in done.value]))
        return done


@pytest.mark.parametrize("room", [True, False])
def test_a_request_arriving_during_a_plain_run_ends_it_after_the_current_step(trained_tiny, room):
    """A request queued while the target runs a call of plain decoding steps is admitted after the current step,
    not after the whole run, when a slot is free for it; with none free the run goes on. The outputs stay plain
    decoding's either way."""
    prompts = random_prompts(2, seed=17)
    models = Models(trained_tiny, 2)
    seqs = [Sequence(id=2000 + i, request=Request(p, MAX_TOKENS, mode="ar", stop_ids=()), tokens=list(p),
                     generator=None, stop_ids=frozenset()) for i, p in enumerate(prompts)]
    later = [seqs[1]]
    target = ArrivalDuringRuns(_target_in_process(trained_tiny, 2),
                               lambda: later and scheduler.add(later.pop()))
    scheduler = loop(RemoteBackend(models.call, lambda: models.newest, target=target), trained_tiny, 2 if room else 1,
                     run_steps=8)
    scheduler.add(seqs[0])
    first_seen: dict[int, int] = {}  # sequence -> runs done when a step first returned it

    async def run() -> None:
        while scheduler.has_work:
            for seq in await scheduler.step():
                first_seen.setdefault(seq.id, len(target.runs))

    asyncio.run(run())
    assert target.runs[0] == ([8], [1] if room else [8])
    assert first_seen[seqs[1].id] == (1 if room else 4)  # admitted after the cut run, or after the first ended
    for seq, ref in zip(seqs, reference(trained_tiny, prompts)):
        assert seq.output == ref
    assert all(asked == ran for asked, ran in target.runs[1:])  # nothing arrived after the first run
    target.inner.close()
