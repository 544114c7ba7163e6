"""The fleet in virtual time: the live router policy and admission, the live autoscaler, the live capacity code.

Arrivals go through the gateway's admission (`router.admission`: scale-from-zero buffer, per-replica
limits and their queue), then the spec's routing policy (`create_policy(...).choose(RouteRequest,
FleetSnapshot)`) on a snapshot built like the gateway's (`router.backlog` in-flight and prefill backlog),
then a replica step model (`sim.replica`). Every `reconcile_s` the control loop does what the fleet
supervisor does: capacity events (spot notices drain, terminations kill), the live `Controller` when its
polling interval is due (on the fleet's load as it was `metric_lag_s` ago), scale to the desired count
(`autoscale.scaledown.victims` picks who drains), and consolidation (`capacity.utilization.load_ratio`).
A new replica waits for its node (provisioning delay of the simulated cloud) and then loads the model
(`profile.load_s`): that is the cold start.
"""

from __future__ import annotations

import bisect
import collections
import math
import random
from collections.abc import Callable

from fleetserve.autoscale.controller import Controller
from fleetserve.autoscale.failing import UNPLACED, unplaced, why_failing
from fleetserve.autoscale.policy import ScalingState
from fleetserve.autoscale.scaledown import Candidate, moves_to_finish, revivals, spot_drain_due, victims
from fleetserve.capacity.consolidation import NODE_TERMINATION_S
from fleetserve.capacity.placement import InsufficientCapacity
from fleetserve.capacity.utilization import load_ratio, target_per_replica
from fleetserve.router.admission import (
    BUFFER,
    GO,
    AdmissionSettings,
    Rejection,
    admit,
    buffer_timeout,
    overflow,
    replicas_failing,
)
from fleetserve.router.backlog import LoadBook
from fleetserve.router.feedback import report as feed_back
from fleetserve.router.kvindex import KVIndex
from fleetserve.router.policies import (
    FleetSnapshot,
    ReplicaView,
    RouteRequest,
    create_policy,
    needs_of,
    registered_policies,
)
from fleetserve.router.retry import exclude
from fleetserve.sim.core import Simulation
from fleetserve.sim.memory import BlockLRU
from fleetserve.sim.replica import ReplicaModel, Seq
from fleetserve.sim.setup import (
    SimOptions,
    build_capacity,
    fake_prometheus,
    gpu_types,
    profile_for,
    replica_kv_tokens,
    scaling_policy,
)
from fleetserve.sim.workload import SimRequestSpec
from fleetserve.spec.context import context_limit

TTFT_WINDOW = 60.0  # the router's TTFT p95 window
RATE_WINDOW = 60.0  # the request rate /admin/load reports is counted over this many seconds
SERVING = frozenset({"ready", "moving"})  # take new requests (moving: its node is being consolidated)
ROUTED = SERVING | {"draining"}  # backends the router knows
KV_BOUND = "the replicas' KV memory: no context length is declared, and no engine serves more"  # `_kv_bound`
MAX_DECODE_RUN = 1 << 20  # decode steps one event may cover (cut short when a request arrives)


_EMPTY: dict = {}  # shared, never written: policies only read bodies and headers


class Req:
    __slots__ = ("i", "spec", "arrival", "replica", "prefill", "excluded", "first", "done", "error", "seq",
                 "cached", "choice", "overhead", "held", "buffered_at", "attempt")

    def __init__(self, i: int, spec: SimRequestSpec, arrival: float):
        self.i = i
        self.spec = spec
        self.arrival = arrival
        self.replica: SimReplica | None = None
        self.prefill = 0
        self.excluded: frozenset[str] = frozenset()
        self.first: float | None = None
        self.done: float | None = None
        self.error: str | None = None
        self.seq: Seq | None = None
        self.cached = 0
        self.choice = None  # the policy's Choice, kept while the policy learns from responses
        self.overhead = 0.0  # client-visible time outside the engine's steps (the profile's, or a draw)
        self.held = 0.0  # seconds in the scale-from-zero buffer: a cold start, left out of the ttft_p95 signal
        self.buffered_at = 0.0
        self.attempt = 0  # sends to a replica so far (a retry's upstream deadline is its own)


class SimReplica:
    __slots__ = ("id", "url", "ordinal", "node_id", "instance_type", "state", "model", "busy", "reported", "pos",
                 "stale", "drain_deadline", "profile", "started_at", "ready_at", "gen", "step_start")

    def __init__(self, rid: str, ordinal: int, node_id: str, instance_type: str, model: ReplicaModel, now: float):
        self.id = rid
        self.url = f"http://{rid}"  # what the gateway's Backend.view() would say
        self.ordinal = ordinal
        self.node_id = node_id
        self.instance_type = instance_type
        self.state = "pending"  # pending -> starting -> ready -> draining -> stopped
        self.model = model
        self.profile = model.profile
        self.busy = False
        self.pos = -1  # index in the routable views
        self.stale = False
        self.gen = 0  # generation of the pending step event (a newer one supersedes it)
        self.step_start = now
        self.reported = (0, 0, None)  # (running, waiting, ours in flight then) from the last health probe (informed)
        self.drain_deadline: float | None = None
        self.started_at = now
        self.ready_at: float | None = None


class SimFleet:
    def __init__(self, endpoint, workload: list[SimRequestSpec], options: SimOptions,
                 progress: Callable[[float], None] | None = None):
        spec = endpoint.spec
        self.spec = spec
        self.options = options
        self.workload = workload
        self.sim = Simulation(options.seed, options.start_epoch)
        self.t0 = self.sim.now
        self.catalog = options.catalog(local_price=spec.capacity.local_price_per_hour)
        self.capacity = build_capacity(spec, self.catalog, options, self.t0)
        self.informed = options.knowledge == "informed"
        strategy = spec.routing.strategy if spec.routing.strategy in registered_policies() else "leastload"
        self.strategy = strategy
        # ties broken with the run's seed: seed 0 is the live router's own (it had been 0 whatever --seed said)
        self.policy = create_policy(strategy, session_key=spec.routing.session_key, seed=options.seed)
        self.learns = hasattr(self.policy, "observe")  # responses' cached tokens go back (router.feedback)
        self.kv_index = KVIndex() if self.informed and needs_of(self.policy).kv_events else None
        self.admission = AdmissionSettings.from_spec(spec)
        self.limit = self.admission.max_concurrent_per_replica
        # an engine answers 400 to a request that does not fit its context: (tokens, where declared) or None
        self.context = context_limit(spec) or self._kv_bound(spec, options)
        self.context_tokens = self.context[0] if self.context else None
        self.book = LoadBook()
        # the router's wait for a replica's first byte (router.upstreamTimeoutSeconds): one deadline per send, in
        # send order (the timeout is one constant), checked by one pending event (`_upstream_deadlines`)
        self.upstream_timeout = spec.router.upstream_timeout_seconds
        self._deadlines: collections.deque[tuple[float, Req, int]] = collections.deque()
        self._deadline_armed = False
        kv = spec.kv_cache
        self.l1_bytes = kv.l1.max_bytes if kv.l1.enabled else 0
        self.l2: BlockLRU | None = None
        self._l2_bytes = kv.l2.max_bytes if kv.l2.enabled else 0
        self.replicas: list[SimReplica] = []
        self._by_id: dict[str, SimReplica] = {}
        self._ids = 0
        self._views: tuple[ReplicaView, ...] | None = None
        self._members: list[SimReplica] | None = None  # replicas the router knows (ready or draining)
        self._view_list: list[ReplicaView] = []
        self._stale: list[SimReplica] = []
        self._any_ready = False
        self.buffer: collections.deque[Req] = collections.deque()
        self.queue: collections.deque[Req] = collections.deque()
        self.requests: list[Req] = []
        self.arrived = 0
        self.routed = 0  # requests sent to a replica (retries too), as the gateway's routed_total
        self.outstanding = 0
        self.ticks = 0  # control-loop rounds run (idle stretches are skipped: `_next_tick`)
        self._active_at = self.t0  # the last arrival, first token, completion or refusal
        self.last_done = self.t0  # when the last request was answered or failed, as its client saw it
        self.profile_notes: set[str] = set()  # what the replicas' performance profiles had to guess
        self.unplaced: collections.Counter[str] = collections.Counter()  # launches that found no capacity, by why
        self.error = ""  # the fleet's last error, as the supervisor keeps it (`unplaced(...)`), for `why_failing`
        self.failing: str | None = None  # why no replica can start now: held and new requests are refused with it
        self._ttfts: collections.deque[tuple[float, float]] = collections.deque()
        self._loads: collections.deque[tuple[float, dict]] = collections.deque()
        # draws of the token that first shows text (profiles that measured it); its own stream, so profiles
        # without it keep every other draw
        self._text_rng = random.Random(options.seed * 7919 + 17)
        self._overhead_rng = random.Random(options.seed * 7919 + 29)
        self._arrivals: collections.deque[tuple[float, int]] = collections.deque([(self.t0, 0)])
        self.progress = progress
        # time series for the report: (t, replicas ready, replicas total, nodes, $/h, gpus)
        self.series: list[tuple[float, int, int, int, float, int]] = []
        self.decisions: list[tuple[float, int, str]] = []
        self.rejected: collections.Counter[str] = collections.Counter()
        self.hits: collections.Counter[str] = collections.Counter()  # prompt tokens, of replicas gone
        self.disruptions: collections.Counter[str] = collections.Counter()  # spot notices, retries, lost streams
        self._noticed: set[str] = set()  # nodes a spot notice came for: their replicas' drains are the notice's
        self.policy_scaling = scaling_policy(spec, options)
        self._track_ttft = self.policy_scaling is not None and any(  # only a TTFT trigger reads them
            t.metric == "ttft_p95" or (t.metric == "prometheus" and "ttf" in (t.query or "").lower())
            for t in spec.autoscaling.triggers)
        self.controller: Controller | None = None
        initial = options.static_replicas if options.static_replicas is not None else spec.replicas
        if self.policy_scaling is not None:
            state = ScalingState.initial(self.policy_scaling, initial, self.t0)
            queries = tuple((t.server_address or "", t.query or "") if t.metric == "prometheus" else None
                            for t in spec.autoscaling.triggers)
            self.controller = Controller(self.policy_scaling, state, read_load=self._lagged_load, queries=queries,
                                         prometheus=fake_prometheus(self._lagged_load))
            initial = state.current
        self.static = initial
        self.end = self.t0 + (workload[-1].arrival if workload else 0.0)
        self.finished_at = self.end  # the run's end as its clients saw it: set when it has run
        for _ in range(initial):
            rep = self._launch()
            if rep is not None and options.warm_start:
                self._ready(rep, warm=True)
        self._check_failing()

    def _kv_bound(self, spec, options: SimOptions) -> tuple[int, str] | None:
        """With no context length declared or known, for GPU engines the most one replica's KV memory holds (of
        the instance types the spec places on, the largest): an engine's context is never longer (vLLM refuses to
        start when its max_model_len does not fit the KV cache), so a longer request is refused as an engine
        refuses it. It had been run alone for simulated days: a 16 M-token completion walked minutes of wall time.
        Not for the built-in engine (its model's own context) nor an external one (its own, unknown here)."""
        types = gpu_types(spec, self.catalog)
        if not types or spec.engine.kind not in ("vllm", "sglang", "container"):
            return None  # the built-in engine's context is its model's own; an external engine's is not known here
        sizes = [n for t in types if (n := replica_kv_tokens(t, self.catalog, options, spec)) is not None]
        if not sizes or max(sizes) <= 0:
            return None
        return max(sizes), KV_BOUND

    # --- replicas ------------------------------------------------------------------------------------------

    @property
    def desired(self) -> int:
        return self.controller.desired if self.controller is not None else self.static

    def _launch(self) -> SimReplica | None:
        now = self.sim.now
        rid = f"r{self._ids}"
        slot = self.capacity.acquire(rid, now)
        if isinstance(slot, InsufficientCapacity):
            self.unplaced[slot.reason] += 1
            self.error = unplaced(slot.reason)
            return None
        self._ids += 1
        if self.error.startswith(UNPLACED):  # placed now
            self.error = ""
        node = slot.node
        prof = profile_for(node.offering.instance_type, self.catalog, self.options, self.spec, self.profile_notes)
        if self.l2 is None and self._l2_bytes:
            self.l2 = BlockLRU("l2", prof.blocks_for_bytes(self._l2_bytes))
        listener = self._listener(rid) if self.kv_index is not None else None
        model = ReplicaModel(prof, prof.blocks_for_bytes(self.l1_bytes), self.l2, listener)
        rep = SimReplica(rid, self._ids, node.id, node.offering.instance_type, model, now)
        self.replicas.append(rep)
        self._by_id[rid] = rep
        self.sim.at(max(now, node.ready_at) + prof.load_s, self._ready, rep)
        self._record()
        return rep

    def _listener(self, rid: str):
        index = self.kv_index

        def on_event(kind: str, keys: list, tier: str) -> None:
            if kind == "stored":
                index.stored(rid, keys, tier)
            else:
                index.removed(rid, keys, tier)

        return on_event

    def _ready(self, rep: SimReplica, warm: bool = False) -> None:
        if rep.state != "pending":
            return
        rep.state = "ready"
        rep.ready_at = self.sim.now
        self._serving_again()

    def _check_failing(self) -> None:
        """The supervisor's word to the router (`autoscale.failing`): while no replica can start, what the buffer
        holds is refused now, with the reason, and so is what would join it (a `replicas: 0` fleet had held every
        request for the buffer timeout where the live router refuses at once)."""
        self.failing = why_failing(
            self.desired, self.controller is not None, self.spec.engine.kind == "external",
            any(r.state in SERVING for r in self.replicas),
            any(r.state in ("pending", "starting") for r in self.replicas), self.error)
        while self.failing and self.buffer:
            self._fail(self.buffer.popleft(), replicas_failing(self.failing).code)

    def _serving_again(self) -> None:
        """A replica takes traffic (ready, or back from a drain): what the router held is released to it."""
        self._membership()
        self._record()
        self.views()
        while self.buffer and self._any_ready:
            req = self.buffer.popleft()
            req.held += self.sim.now - req.buffered_at
            self._dispatch(req)
        if self.queue:
            self._drain_queue()

    def _membership(self) -> None:
        """The set of replicas the router knows, or one's state, changed."""
        self._members = None
        self._views = None

    def _touch(self, rep: SimReplica) -> None:
        """A replica's counters changed: its view is rebuilt before the next decision."""
        if not rep.stale:
            rep.stale = True
            self._stale.append(rep)
            self._views = None

    def _view(self, rep: SimReplica) -> ReplicaView:
        """The gateway's view of a backend (Backend.view() with the per-replica limit of router.admission)."""
        running, waiting, then = rep.reported if self.informed else (0, 0, None)
        in_flight = self.book.in_flight[rep.id]
        healthy = rep.state in SERVING and (not self.limit or in_flight < self.limit)
        return ReplicaView(rep.id, rep.url, healthy, in_flight, waiting, running, self.book.backlog[rep.id],
                           rep.profile.cache_blocks if self.informed else 0, then)

    def views(self) -> tuple[ReplicaView, ...]:
        views = self._views
        if views is not None:
            return views
        members = self._members
        if members is None:
            members = self._members = [r for r in self.replicas if r.state in ROUTED]
            for i, r in enumerate(members):
                r.pos, r.stale = i, False
            self._view_list = [self._view(r) for r in members]
            self._any_ready = any(r.state in SERVING for r in members)
        else:
            vl = self._view_list
            for r in self._stale:
                r.stale = False
                if 0 <= r.pos < len(members) and members[r.pos] is r:
                    vl[r.pos] = self._view(r)
        self._stale.clear()
        views = self._views = tuple(self._view_list)
        return views

    def _remove(self, rep: SimReplica, killed: bool = False, cause: str = "drain") -> None:
        """`killed`: requests still on it are lost; `cause` (spot, drain) names what cut the streams among them."""
        if rep.state == "stopped":
            return
        rep.state = "stopped"
        self.replicas.remove(rep)
        self.capacity.release(rep.id, rep.node_id, self.sim.now)
        self._membership()
        if killed:
            model = rep.model
            for seq in list(model.waiting) + list(model.prefilling) + list(model.running):
                req: Req = seq.payload
                model.cancel(seq)
                self._lost(req, rep, cause)
        self._retire(rep.model)
        self.book.forget(rep.id)
        if self.kv_index is not None:
            self.kv_index.forget(rep.id)
        self._membership()
        self._record()

    def _retire(self, model: ReplicaModel) -> None:
        h = self.hits
        h["queried"] += model.queried
        h["engine"] += model.hit_engine
        h["l1"] += model.hit_l1_tokens
        h["l2"] += model.hit_l2_tokens
        h["oversized"] += model.oversized
        model.queried = model.hit_engine = model.hit_l1_tokens = model.hit_l2_tokens = model.oversized = 0

    def _drain(self, rep: SimReplica) -> None:
        if rep.state in ("pending", "starting"):
            self._remove(rep)
            return
        if rep.state in SERVING:
            rep.state = "draining"
            rep.drain_deadline = self.sim.now + self.spec.engine.drain_timeout_seconds
            self._membership()
            self._record()

    # --- requests ------------------------------------------------------------------------------------------

    def _arrive(self, i: int) -> None:
        self._active_at = self.sim.now
        req = Req(i, self.workload[i], self.sim.now)
        self.requests.append(req)
        self.arrived += 1
        self.outstanding += 1
        if self.context_tokens and req.spec.prompt + req.spec.output > self.context_tokens:
            self._fail(req, "context_length_exceeded")  # prompt + completion as the trace has them
            return
        self._dispatch(req)

    def _dispatch(self, req: Req) -> None:
        if self._any_ready and not self.limit and self._members is not None:
            self._route(req, self._views or self.views())  # admit() says GO: a replica is ready, no limits
            return
        views = self.views()
        any_ready = self._any_ready
        any_slot = any(v.healthy for v in views) if self.limit else any_ready
        verdict = admit(self.admission, any_ready, any_slot, len(self.buffer), len(self.queue))
        if verdict is GO:
            self._route(req, views)
        elif isinstance(verdict, Rejection):
            self._fail(req, verdict.code)
        elif verdict is BUFFER and self.failing:
            self._fail(req, replicas_failing(self.failing).code)
        elif verdict is BUFFER:
            req.buffered_at = self.sim.now
            self.buffer.append(req)
            self.sim.after(self.admission.buffer_timeout, self._buffer_timeout, req)
        else:
            self.queue.append(req)
            self.sim.after(self.admission.buffer_timeout, self._queue_timeout, req)

    def _buffer_timeout(self, req: Req) -> None:
        if req in self.buffer:
            self.buffer.remove(req)
            self._fail(req, buffer_timeout(self.admission).code)

    def _queue_timeout(self, req: Req) -> None:
        if req in self.queue:
            self.queue.remove(req)
            self._fail(req, overflow(self.admission, "no slot became free in time").code)

    def _route(self, req: Req, views: tuple[ReplicaView, ...]) -> None:
        spec = req.spec
        headers = {"x-session-id": spec.session} if spec.session else _EMPTY
        route = RouteRequest("/v1/completions", _EMPTY, headers, None, req.excluded, spec.router_keys,
                             spec.router_block, spec.router_prompt or spec.prompt, spec.exact)
        choice = self.policy.choose(route, FleetSnapshot(views, self.sim.now, self.kv_index))
        if choice is None:
            if req.excluded and self._any_ready:
                req.excluded = frozenset()  # every replica was tried: start over on the next slot
            self.queue.append(req)
            return
        rep = self._by_id[choice.replica.id]
        self.routed += 1  # as the gateway's count_decision: the autoscaler's activity
        req.replica = rep
        req.prefill = choice.prefill_tokens
        if self.learns:
            req.choice = choice
        self.book.sent(rep.id, choice.prefill_tokens)
        self._touch(rep)
        seq = req.seq = Seq(spec.prompt, spec.output, spec.engine_keys, req)
        prof = rep.profile
        samples = prof.request_overhead_samples
        req.overhead = samples[self._overhead_rng.randrange(len(samples))] if samples else prof.request_overhead_s
        text = prof.first_text_tokens
        if text:  # the streaming client's first text: token k of the output (0: none until the end)
            k = text[self._text_rng.randrange(len(text))]
            seq.visible = k if k > 0 else spec.output
        rep.model.add(seq)
        req.attempt += 1
        self._deadlines.append((self.sim.now + self.upstream_timeout, req, req.attempt))
        if not self._deadline_armed:
            self._deadline_armed = True
            self.sim.at(self._deadlines[0][0], self._upstream_deadlines)
        if not rep.busy:
            self._step(rep)
        elif rep.model.planned_steps > 1:  # it is in a run of decode steps: stop the run at the current step
            now = self.sim.now
            j = rep.model.steps_by(now - rep.step_start)
            if j < rep.model.planned_steps:
                rep.gen += 1
                self.sim.at(rep.step_start + rep.model.truncate(j), self._step_done, (rep, rep.gen))

    def _upstream_deadlines(self, _arg=None) -> None:
        """Sends whose replica gave no first byte within router.upstreamTimeoutSeconds fail 504 upstream_timeout,
        as the live router answers them (router/dispatch.py: not retried elsewhere), and their replica drops them
        (the client is gone). An overloaded fleet's requests had waited 40 minutes in the simulator and counted
        as answered where the live router refused them after 30."""
        self._deadline_armed = False
        now, deadlines = self.sim.now, self._deadlines
        while deadlines:
            deadline, req, attempt = deadlines[0]
            answered = req.done is not None or req.attempt != attempt or req.replica is None or (
                req.seq is not None and req.seq.first_at is not None)
            if not answered and deadline > now:
                break
            deadlines.popleft()
            if not answered:
                self._upstream_timeout(req)
        if deadlines:
            self._deadline_armed = True
            self.sim.at(deadlines[0][0], self._upstream_deadlines)

    def _upstream_timeout(self, req: Req) -> None:
        rep = req.replica
        rep.model.cancel(req.seq)
        self.book.failed(rep.id, req.prefill)
        req.choice = None  # no response: nothing for a learning policy
        self._fail(req, "upstream_timeout")
        self._touch(rep)
        if rep.state == "draining":
            self._maybe_drained(rep)
        if self.queue:
            self._drain_queue()

    def _fail(self, req: Req, code: str) -> None:
        self._active_at = self.last_done = self.sim.now
        req.error = code
        req.done = self.sim.now
        self.rejected[code] += 1
        self.outstanding -= 1

    def _lost(self, req: Req, rep: SimReplica, cause: str = "drain") -> None:
        """Its replica died: before the first byte the router retries elsewhere, after it the stream fails."""
        prefilled = req.seq is not None and req.seq.first_at is not None  # its backlog went at its first token
        self.book.failed(rep.id, req.prefill, prefilled)
        self.disruptions["retried" if req.first is None else "lost_mid_stream"] += 1
        if req.first is not None:
            self.disruptions[f"cut_by_{cause}"] += 1  # verify says which: a spot notice's, or the drain timeout's
        if req.first is None:
            req.excluded = exclude(req.excluded, rep.id)
            req.replica = None
            self._dispatch(req)
        else:
            self._fail(req, "upstream_failed")

    # --- replica steps -------------------------------------------------------------------------------------

    def _step(self, rep: SimReplica) -> None:
        duration = rep.model.begin_step(MAX_DECODE_RUN)
        if duration is None:
            rep.busy = False
            if rep.state == "draining":
                self._maybe_drained(rep)
            return
        rep.busy = True
        rep.gen += 1
        rep.step_start = self.sim.now
        self.sim.after(duration, self._step_done, (rep, rep.gen))

    def _step_done(self, arg: tuple[SimReplica, int]) -> None:
        rep, gen = arg
        if gen != rep.gen or rep.state == "stopped":
            return  # superseded by a shorter run, or the replica is gone
        now = self.sim.now
        firsts, finished = rep.model.end_step(now)
        if firsts or finished:
            self._active_at = now
        if firsts:
            book, ttfts = self.book, self._ttfts if self._track_ttft else None
            for seq in firsts:
                req: Req = seq.payload
                if seq.visible <= 1 or seq.state == "done":
                    req.first = now + req.overhead  # HTTP/router/tokenizer time, if measured
                req.cached = seq.cached
                book.backlog[rep.id] -= req.prefill
                if ttfts is not None:  # the router's served TTFT: less a cold start in its buffer
                    ttfts.append((now, now - req.arrival - req.held))
            self._touch(rep)
        if rep.model.shown:  # first text after the first token (a client that streams sees nothing before)
            for seq in rep.model.shown:
                seq.payload.first = now + seq.payload.overhead
        if finished:
            in_flight = self.book.in_flight
            for seq in finished:
                req = seq.payload
                req.done = now + req.overhead
                if req.done > self.last_done:
                    self.last_done = req.done
                in_flight[rep.id] -= 1
                if req.choice is not None:  # the response's usage.prompt_tokens_details.cached_tokens
                    feed_back(self.policy, req.choice, seq.cached, seq.prompt)
                    req.choice = None
            self.outstanding -= len(finished)
            self._touch(rep)
            if self.queue:
                self._drain_queue()
        self._step(rep)

    def _drain_queue(self) -> None:
        while self.queue:
            views = self.views()
            if not any(v.healthy for v in views):
                return
            self._route(self.queue.popleft(), views)

    def _maybe_drained(self, rep: SimReplica) -> None:
        if self.book.in_flight[rep.id] <= 0 and rep.model.idle:
            self._remove(rep)

    # --- control loop --------------------------------------------------------------------------------------

    def load(self) -> dict:
        """What the router's /admin/load says now."""
        reps = self.replicas
        now = self.sim.now
        ttfts = self._ttfts
        while ttfts and ttfts[0][0] < now - TTFT_WINDOW - self.options.metric_lag_s:
            ttfts.popleft()
        marks = self._arrivals
        marks.append((now, self.arrived))
        while len(marks) > 2 and marks[1][0] <= now - RATE_WINDOW:
            marks.popleft()
        mark_t, mark_n = marks[0]
        rate = (self.arrived - mark_n) / (now - mark_t) if now > mark_t else 0.0
        # `waiting`: the engines' queues as their own gauges say, in both modes (the router's knowledge is not the
        # autoscaler's: KEDA reads vllm:num_requests_waiting from Prometheus, the local fleet the built-in engine's
        # health bodies), plus the router's own queue, as /admin/load counts it
        return {"pending": len(self.buffer), "in_flight": sum(self.book.in_flight[r.id] for r in reps),
                "waiting": sum(r.model.num_waiting for r in reps) + len(self.queue), "requests_total": self.arrived,
                "routed_total": self.routed,
                "request_rate": rate, "ttft_p95_ms": None}

    def _lagged_load(self) -> dict | None:
        cutoff = self.sim.now - self.options.metric_lag_s
        loads = self._loads
        best = None
        for t, load in loads:
            if t <= cutoff + 1e-9:
                best = load
            else:
                break
        if best is None:
            if not loads:
                return None
            best = loads[0][1]  # the run is younger than the lag: the oldest sample
        if best["ttft_p95_ms"] is None:  # computed only when the controller reads it (sorting is not free)
            values = sorted(v for t, v in self._ttfts if cutoff - TTFT_WINDOW <= t <= cutoff)
            best["ttft_p95_ms"] = values[min(len(values) - 1, int(0.95 * len(values)))] * 1000 if values else 0.0
        # the requests the router buffers (no replica can take them) are read as they are now, like the live
        # supervisor reads the router: with the lagged count, every activation from zero but the first (whose
        # sample is the oldest) waited one metric lag more (8 s, then 23 s, for the same cold start)
        return {**best, "pending": len(self.buffer)}

    def _reconcile(self, _arg=None) -> None:
        now = self.sim.now
        self.ticks += 1
        load = self.load()
        self._loads.append((now, load))
        while len(self._loads) > 2 and self._loads[1][0] <= now - self.options.metric_lag_s - 1e-9:
            self._loads.popleft()
        for event in self.capacity.poll(now):
            on_node = [r for r in list(self.replicas) if r.node_id == event.node_id]
            if event.kind == "interruption-notice":  # make-before-break: the ready ones move (scaledown.py)
                self.disruptions["spot_notices"] += 1
                self._noticed.add(event.node_id)
                for r in on_node:
                    if r.state == "ready":
                        r.state = "moving"
                        self._membership()
                    elif r.state != "moving":
                        self._drain(r)
            elif event.kind == "terminated":
                for r in on_node:
                    self._remove(r, killed=True, cause="spot")
                self._record()  # a node whose replica had already drained away stops costing now (the series,
                # which the cost and GPU-hours read, kept it until the next change: 11 s more than the ledger)
        if self.controller is not None and self.controller.due(now, len(self.buffer)):
            decision = self.controller.tick(now, self._lagged_load())
            self.decisions.append((now - self.t0, decision.desired, decision.reason))
        self._scale_to(self.desired)
        self._check_failing()
        going = self.capacity.interrupting()
        for r in [r for r in self.replicas if r.state == "moving" and r.node_id in going]:
            if spot_drain_due(going[r.node_id], now, self.spec.engine.drain_timeout_seconds):
                self._drain(r)
        for r in [r for r in self.replicas if r.state == "draining"]:
            if (self.book.in_flight[r.id] <= 0 and r.model.idle) or now >= (r.drain_deadline or now):
                self._remove(r, killed=self.book.in_flight[r.id] > 0,
                             cause="spot" if r.node_id in self._noticed else "drain")
        ready = sum(1 for r in self.replicas if r.state in SERVING)
        ratio = load_ratio(load["in_flight"], load["pending"], target_per_replica(self.policy_scaling), ready)
        before = len(self.capacity.nodes())
        self._apply_consolidation(self.capacity.consolidate(now, ratio))
        self.capacity.release_interrupted(now)
        if len(self.capacity.nodes()) != before:
            self._record()
        if self.progress is not None:
            self.progress(now - self.t0)
        if self.outstanding > 0 or now < self.end:
            self.sim.at(self._next_tick(now), self._reconcile)

    def _next_tick(self, now: float) -> float:
        """When the control loop looks next: one `reconcile_s` later, or, through an idle stretch, the first round
        on the same grid that can see or do anything (a scaling poll, a node's consolidateAfter timer, an offering's
        out-of-capacity mark expiring, a deleted node leaving the disruption budget, the run-up to the next
        arrival). Such a round finds what every skipped one
        would have: no request anywhere, every replica ready, the fleet at its desired size, no node starting,
        cordoned or exposed to spot interruptions (their draws are per round), and load samples that stopped
        changing: the last activity is older than the rate, TTFT and lag windows together, and rounds resume
        that long before the next arrival, so every window it reads is filled as without the skip. A day of
        silence costs a poll interval's rounds instead of 86,400."""
        step = self.options.reconcile_s
        tick = now + step
        if not self.options.fast_forward or self.outstanding or self.buffer or self.queue:
            return tick
        quiet = RATE_WINDOW + TTFT_WINDOW + self.options.metric_lag_s + 2 * step
        if now - self._active_at < quiet or self.arrived >= len(self.workload):
            return tick
        if any(r.state != "ready" or r.busy for r in self.replicas) or len(self.replicas) != self.desired:
            return tick
        capacity = self.capacity
        if capacity.cordoned or any(b.schedule is not None for b in capacity.consolidation.budgets):
            return tick
        spot = getattr(capacity.provider, "spot_interruption_rate", 0.0)
        must = float("inf")  # a round at or after this time must run
        for node in capacity.nodes():
            if node.ready_at > now or node.interrupt_at is not None or (spot and node.offering.capacity_type == "spot"):
                return tick
            settle = node.last_change + capacity.consolidation.consolidate_after
            if settle > now:
                must = min(must, settle)
        # a node consolidation deleted stops counting against the disruption budgets: what waited for it may go
        must = min([must, *(t + NODE_TERMINATION_S for t in capacity.terminating if t + NODE_TERMINATION_S > now)])
        if any(n.offering.capacity_type == "on-demand" for n in capacity.nodes()):
            # an offering out of capacity comes back when its mark expires: consolidation may then replace a node
            must = min([must, *(t for t in capacity.availability.until.values() if t > now)])
        if self.controller is not None:
            must = min(must, self.controller.next_poll)
        resume = self.t0 + self.workload[self.arrived].arrival - quiet  # the last round at or before this runs
        while tick < must and tick + step <= resume:
            tick += step  # the grid as repeated `after(step)` would build it, float for float
        return tick

    def _apply_consolidation(self, removals) -> None:
        """Underutilized nodes are cordoned by the capacity manager; their serving replicas start moving
        (the supervisor's make-before-break: replacements first, then the moving ones drain)."""
        for removal in removals:
            if removal.reason != "Underutilized":
                continue
            for r in self.replicas:
                if r.node_id == removal.node_id and r.state == "ready":
                    r.state = "moving"
                    self._membership()

    def _cancel_moves(self, why: str) -> None:
        going = self.capacity.interrupting()  # these drain at their deadline
        moving = [r for r in self.replicas if r.state == "moving" and r.node_id not in going]
        for r in moving:
            r.state = "ready"
        if moving:
            self.capacity.uncordon_all(why)
            self._membership()

    def _scale_to(self, desired: int) -> None:
        """The supervisor's `_scale_to`: launch or drain to `desired`; moving replicas do not count."""
        active = [r for r in self.replicas if r.state not in ("draining", "moving")]
        if len(active) < desired:
            draining = [r for r in self.replicas if r.state == "draining"]
            revived = revivals(draining, lambda r: r.node_id, lambda r: r.drain_deadline, self.capacity.leaving(),
                               desired - len(active))
            for r in revived:  # the supervisor's `_revive`: it was serving when its drain began
                r.state, r.drain_deadline = "ready", None
                active.append(r)
            if revived:
                self._serving_again()
            for _ in range(desired - len(active)):
                if self._launch() is None:
                    self._cancel_moves("no capacity for the replacement replicas")
                    break
        elif len(active) > desired:
            used = {n.id: n.used for n in self.capacity.nodes()}
            in_flight = self.book.in_flight
            cands = [Candidate(r.id, "starting" if r.state == "pending" and self._node_ready(r) else r.state,
                               r.node_id, r.ordinal, in_flight[r.id]) for r in active]
            prices = {n.id: n.price_per_hour for n in self.capacity.nodes()}
            for c in victims(cands, used, len(active) - desired, prices):
                self._drain(self._by_id[c.id])
        moving = [r for r in self.replicas if r.state == "moving"]
        ready = sum(1 for r in self.replicas if r.state == "ready")
        going = self.capacity.interrupting()
        for r in moves_to_finish(moving, lambda r: r.node_id, going, ready, desired):
            self._drain(r)  # its replacement is ready: make-before-break

    def _node_ready(self, rep: SimReplica) -> bool:
        node = next((n for n in self.capacity.nodes() if n.id == rep.node_id), None)
        return node is not None and node.ready(self.sim.now)

    def _probe(self, _arg=None) -> None:
        for r in self.replicas:
            reported = (r.model.num_running, r.model.num_waiting, self.book.in_flight[r.id])
            if reported != r.reported:
                r.reported = reported
                self._touch(r)
        if self.outstanding > 0 or self.sim.now < self.end:
            self.sim.after(self.options.health_interval_s, self._probe)

    def _record(self) -> None:
        reps = self.replicas
        nodes = self.capacity.nodes()
        gpus = 0
        for n in nodes:
            t = n.offering.instance_type
            gpus += self.catalog.get(t).gpus if t != "local" else 0
        point = (self.sim.now - self.t0, sum(1 for r in reps if r.state in ROUTED), len(reps),
                 len(nodes), self.capacity.cost_per_hour(), gpus)  # the L2 Redis's price too (ledger)
        if self.series and self.series[-1][0] == point[0]:
            self.series[-1] = point
        else:
            self.series.append(point)

    def feedback_summary(self) -> dict | None:
        """What the policy learned from the responses (router.feedback), per replica; None if it does not."""
        policy = getattr(self.policy, "policy", self.policy)  # a recording wrapper keeps the policy inside
        learner = getattr(policy, "learner", None) or getattr(getattr(policy, "fallback", None), "learner", None)
        return learner.summary() if learner is not None else None

    # --- run -----------------------------------------------------------------------------------------------

    def run(self) -> SimFleet:
        self.sim.stream([self.t0 + r.arrival for r in self.workload], self._arrive)
        self.sim.at(self.t0, self._reconcile)
        if self.informed:
            self.sim.at(self.t0, self._probe)
        self.sim.run()
        # the run ends when the last request was answered, not at the last event: timers that find nothing to
        # do (a buffer or queue timeout of a request long answered) kept the fleet billed up to 10 minutes on
        self.finished_at = max(self.end, self.last_done)
        for r in self.replicas:
            self._retire(r.model)
        self._record()
        return self


def series_at(series: list[tuple], t: float) -> tuple:
    """The step-function value of a series at time t."""
    i = bisect.bisect_right([p[0] for p in series], t) - 1
    return series[max(i, 0)]


def span_hours(series: list[tuple], start: float, end: float, column: int) -> float:
    """Integral of a step-function column over [start, end], in hours (e.g. $/h -> $, GPUs -> GPU-hours)."""
    total = 0.0
    for (t, *vals), nxt in zip(series, [*series[1:], None], strict=False):
        a = max(t, start)
        b = min(nxt[0] if nxt is not None else math.inf, end)
        if b > a:
            total += vals[column - 1] * (b - a)
    return total / 3600
