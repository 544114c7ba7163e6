"""The live gateway and the simulator make the same routing decisions (issue 9: one test drives both from a
recorded sequence).

`test_the_gateway_in_process_chooses_what_the_simulator_chose` is the end-to-end one: a simulation runs a
trace, and its timeline (each request's arrival, its first token and its end on the replica the simulator
chose, the engine's `usage`) is replayed into a real `Gateway` in virtual time. The requests are the bodies the
live replay sends (`bench.replay`: chat messages, or token-id prompts for a hash trace); an upstream stand-in
answers each one when the simulator's engine did, with the usage it reported. The gateway therefore builds its
own prefix keys from the bodies, keeps its own in-flight and prefill-backlog book, admits through its own gate
(per-replica limit and queue), learns from the answers' tails and snapshots the fleet its own way; every choice
must be the simulator's, and a learning policy must end with the same learned state.

`test_same_snapshots_same_decisions` replays each recorded snapshot (KV index included, so `kvaware` on
engine events is covered too) into a fresh policy built the gateway's way.
"""

import asyncio
import copy
from dataclasses import replace

import orjson
import pytest

from fleetserve.bench.replay import _body as replay_body
from fleetserve.router import feedback
from fleetserve.router.admission import limit_views
from fleetserve.router.gateway import Gateway, RouterSettings
from fleetserve.router.http1 import Request
from fleetserve.router.policies import FleetSnapshot, create_policy
from fleetserve.router.pool import BackendPool
from fleetserve.sim.fleet import SimFleet
from fleetserve.sim.run import engine_block
from fleetserve.sim.setup import SimOptions
from fleetserve.sim.workload import build_workload
from fleetserve.spec.load import load_spec_data
from fleetserve.traces.generate import WorkloadSpec, generate
from tests.recording_responder import Recorder as Responder
from tests.virtual_loop import run_virtual, settle


class Recorder:
    def __init__(self, policy, fleet):
        self.policy = policy
        self.name = policy.name
        self.fleet = fleet
        self.log = []
        self.predictions = {}

    def choose(self, request, snapshot):
        states = {r.id: r.state for r in self.fleet.replicas}
        index = copy.deepcopy(snapshot.kv_index)
        choice = self.policy.choose(request, snapshot)
        if choice is not None and choice.prediction is not None:
            self.predictions[id(choice.prediction)] = len(self.log)
        self.log.append((request, snapshot, states, index, choice.replica.id if choice else None))
        return choice

    def observe(self, prediction, cached_tokens, prompt_tokens=None):
        """A response's usage (router.feedback.report), replayed into the gateway's policy in order."""
        self.log.append(("observe", self.predictions[id(prediction)], prediction, cached_tokens, prompt_tokens))
        self.policy.observe(prediction, cached_tokens, prompt_tokens)


def endpoint(strategy: str, limit: int | None, autoscaling: bool = True, low: int = 2):
    spec = {"model": {"source": "hf:meta-llama/Llama-3.1-8B-Instruct"}, "replicas": low + 1 if low else 0,
            "placement": {"instanceTypes": ["g6e.xlarge"]}, "routing": {"strategy": strategy}}
    if autoscaling:
        spec["autoscaling"] = {"minReplicaCount": low, "maxReplicaCount": 4, "pollingInterval": 15,
                               "triggers": [{"metric": "concurrency", "target": 4}]}
    if limit:
        spec["requestLimits"] = {"maxConcurrentRequests": limit, "maxQueueSize": 1000}
    return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "p"},
                           "spec": spec}).endpoint


@pytest.mark.parametrize(("strategy", "knowledge", "limit"), [
    ("prefixaware", "blind", None), ("kvaware", "informed", None), ("leastload", "blind", 3),
    ("session", "blind", None),
])
def test_same_snapshots_same_decisions(mooncake, strategy, knowledge, limit):
    ep = endpoint(strategy, limit)
    options = SimOptions(knowledge=knowledge)  # seed 0: the live router's tie-breaks (create_policy's default)
    trace = mooncake[:250]
    if strategy == "session":
        from dataclasses import replace

        trace = [replace(r, session=f"s{i % 7}") for i, r in enumerate(trace)]
    workload = build_workload(trace, engine_block(ep, options), knowledge == "informed")
    fleet = SimFleet(ep, workload, options)
    recorder = fleet.policy = Recorder(fleet.policy, fleet)
    fleet.run()
    assert len(recorder.log) >= len(trace)

    gateway_policy = create_policy(strategy, session_key=ep.spec.routing.session_key)
    pool = BackendPool([])
    gateway_choices = {}
    observed = 0
    for i, entry in enumerate(recorder.log):
        if entry[0] == "observe":  # the gateway feeds the same response figures (router.feedback.report)
            _, at, prediction, cached, prompt_tokens = entry
            assert gateway_choices[at].prediction == prediction
            assert feedback.report(gateway_policy, gateway_choices[at], cached, prompt_tokens)
            observed += 1
            continue
        request, snapshot, states, index, chosen = entry
        urls = [v.url for v in snapshot.replicas]
        pool.set_backends(urls, ready=set(urls), draining={f"http://{i}" for i, s in states.items() if s == "draining"})
        for v in snapshot.replicas:
            b = pool.get(v.id)
            b.in_flight, b.running, b.waiting = v.in_flight, v.running, v.waiting
            b.reported_in_flight = v.reported_in_flight  # what the probe saw of ours with the report
            b.prefill_backlog, b.cache_blocks = v.prefill_backlog, v.cache_blocks
        views = limit_views(pool.snapshot().replicas, limit)
        assert views == snapshot.replicas
        choice = gateway_policy.choose(request, FleetSnapshot(views, snapshot.now, index))
        assert (choice.replica.id if choice else None) == chosen
        gateway_choices[i] = choice
    if strategy == "prefixaware":  # blind: the router-side index learned from the responses, on both sides
        assert observed >= len(trace) // 2
        assert gateway_policy.learner.summary() == recorder.policy.learner.summary()


class ScriptedResponse:
    """An engine's answer as the gateway's upstream client returns it: the first body bytes at once (the
    request returned at the first token), the rest with `usage` when the simulator's engine finished."""

    def __init__(self, end_at: float, tail: bytes):
        self.status = 200
        self.headers = [(b"content-type", b"application/json")]
        self.content_length = None
        self.complete = False
        self._parts = [b'{"id":"x",', end_at, tail]

    def header(self, name: bytes):
        return dict(self.headers).get(name)

    async def read(self) -> bytes:
        while self._parts:
            part = self._parts.pop(0)
            if isinstance(part, float):
                await asyncio.sleep(max(0.0, part - asyncio.get_running_loop().time()))
                continue
            return part
        return b""

    def close(self) -> None:
        pass


class MembershipRecorder(SimFleet):
    """A simulation that notes the replicas the router knows each time that set changes (the supervisor's PUT
    /admin/backends of a live fleet: replicas ready, or draining)."""

    def __init__(self, *args, **kwargs):
        self.membership: list[tuple[float, tuple]] = []
        super().__init__(*args, **kwargs)

    def views(self):
        changed = self._members is None
        views = super().views()
        if changed:
            now = tuple((r.url, r.state) for r in self._members)
            if not self.membership or self.membership[-1][1] != now:
                self.membership.append((self.sim.now - self.t0, now))
        return views


class SimulatedTimeline:
    """The gateway's upstream client: answers each request when, and as, the simulator's engine did."""

    def __init__(self, fleet: SimFleet):
        self.t0 = fleet.t0
        self.by_index = {req.i: req for req in fleet.requests}
        self.chosen: dict[int, str] = {}
        self.queued = 0  # requests the gateway sent later than they arrived (its gate held them)

    async def request(self, base_url, method, path, headers=(), body=b"", read_timeout=None, credentials=True):
        i = int(dict(headers)[b"x-request-id"])
        req = self.by_index[i]
        loop = asyncio.get_running_loop()
        self.chosen[i] = base_url.split("://", 1)[1]
        self.queued += loop.time() > req.arrival - self.t0 + 1e-9
        if self.chosen[i] != req.replica.id:  # the timeline below is the simulator's replica's: stop here
            raise AssertionError(f"request {i} at t={loop.time():.3f}: the gateway chose {self.chosen[i]}, the "
                                 f"simulator {req.replica.id}")
        seq = req.seq
        await asyncio.sleep(max(0.0, seq.first_at - self.t0 - loop.time()))
        usage = {"usage": {"prompt_tokens": seq.prompt, "prompt_tokens_details": {"cached_tokens": seq.cached}}}
        return ScriptedResponse(seq.done_at - self.t0, b'"choices":[],' + orjson.dumps(usage)[1:])

    async def aclose(self) -> None:
        pass


def text_trace():
    """A shared-system-prompt workload as a prompt log would carry it (text only: the router keys text)."""
    spec = WorkloadSpec.for_kind("system-prompt", seed=5, duration_s=120, rate=3, system_prompts=6,
                                 system_tokens=600)
    return [replace(r, hash_ids=()) for r in generate(spec)]


@pytest.mark.parametrize(("strategy", "limit", "workload", "scaling"), [
    ("prefixaware", None, "text", "static"), ("prefixaware", 2, "text", "static"),
    ("prefixaware", None, "tokens", "static"), ("leastload", 3, "text", "static"),
    ("roundrobin", 2, "tokens", "static"), ("session", None, "text", "static"),
    ("prefixaware", None, "text", "from zero"), ("leastload", 2, "tokens", "from zero"),
])
def test_the_gateway_in_process_chooses_what_the_simulator_chose(mooncake, strategy, limit, workload, scaling):
    """`from zero`: the fleet starts with no replica (the first requests wait in the gateway's scale-from-zero
    buffer) and the autoscaler adds replicas as the load grows; their arrivals in the router's backend set are
    replayed into the gateway when the simulator's router saw them."""
    ep = endpoint(strategy, limit, autoscaling=scaling != "static", low=0 if scaling == "from zero" else 2)
    trace = text_trace() if workload == "text" else mooncake[:250]
    if strategy == "session":
        trace = [replace(r, session=f"s{i % 7}") for i, r in enumerate(trace)]
    trace = sorted(trace, key=lambda r: r.arrival_s)  # the simulator's request i is the i-th arrival
    options = SimOptions()  # seed 0: the live router's tie-breaks
    workload = build_workload(trace, engine_block(ep, options), False)
    fleet = MembershipRecorder(ep, workload, options).run()
    assert len(fleet.requests) == len(trace)
    refused = {req.i: req.error for req in fleet.requests if req.error}
    assert scaling == "from zero" or not refused  # a cold start of ~160 s overflows the 256-request buffer
    timeline = SimulatedTimeline(fleet)
    settings = RouterSettings(strategy=strategy, session_key=ep.spec.routing.session_key, access_log=False,
                              max_concurrent_per_replica=limit, max_queue=1000 if limit else None)

    async def replay():
        loop = asyncio.get_running_loop()
        pool = BackendPool([], clock=loop.time)
        gw = Gateway(pool, settings, upstream=timeline)

        # one timeline: the router's backend set as the simulator's router knew it, and the arrivals; at one
        # instant a change of the set comes first (the replicas a warm start readies before the first request)
        events = sorted([(at, 0, members) for at, members in fleet.membership] +
                        [(r.arrival_s, 1, i) for i, r in enumerate(trace)], key=lambda e: e[:2])
        answers = []
        for at, kind, what in events:
            await asyncio.sleep(max(0.0, at - loop.time()))
            if kind == 0:
                urls = [url for url, _ in what]
                gw.set_backends(urls, ready=set(urls), draining={url for url, state in what if state == "draining"})
                await settle()  # requests it woke go where the simulator sent them, before anything else
                continue
            r = trace[what]
            body = replay_body(r, what, "m", None, False)
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            headers = [(b"content-type", b"application/json"), (b"x-request-id", str(what).encode())]
            if r.session:
                headers.append((b"x-session-id", r.session.encode()))
            out = Responder()
            answers.append((out, asyncio.ensure_future(gw.handle(
                Request("POST", path, b"", headers, orjson.dumps(body), ("127.0.0.1", 1), "1.1", True), out))))
        try:
            await asyncio.gather(*(task for _, task in answers))
        finally:  # a diverging choice fails its request: stop the others before the loop closes
            for _, task in answers:
                task.cancel()
        return gw, [out for out, _ in answers]

    gw, answers = run_virtual(replay())
    # the same requests answered, the same refused with the same error code, the same replicas chosen
    assert {i: out.json()["error"]["code"] for i, out in enumerate(answers) if out.status != 200} == refused
    assert all(out.status == 200 for i, out in enumerate(answers) if i not in refused)
    assert timeline.chosen == {req.i: req.replica.id for req in fleet.requests if not req.error}
    if scaling == "static":
        assert len(set(timeline.chosen.values())) == len(fleet.replicas)
    if limit or scaling == "from zero":  # held in the gateway's queue or buffer, as in the simulator's
        assert timeline.queued > 0
    if scaling == "from zero":
        assert fleet.membership[0][1] == () and fleet.membership[1][0] > 0  # the first replica came later
        assert len(fleet.replicas) > 1 and any(r.held > 0 for r in fleet.requests)
    assert all(v == 0 for v in gw.pool.book.in_flight.values()) and all(v == 0 for v in gw.pool.book.backlog.values())
    if strategy == "prefixaware":  # learned from the answers' tails as the simulator from its engines' usage
        summary = gw.policy.learner.summary()
        assert summary == fleet.policy.learner.summary()
        answered = sum(1 for i, w in enumerate(workload) if w.router_keys and i not in refused)
        assert sum(s["observations"] for s in summary.values()) == answered
