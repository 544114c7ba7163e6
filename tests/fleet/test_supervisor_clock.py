"""The supervisor's policy paths in virtual time: injected wall and monotonic clocks, no processes, no sleeps."""

from datetime import datetime

import pytest

from fleetserve.api.graceful import EXIT_PORT_TAKEN
from fleetserve.autoscale.controller import Controller
from fleetserve.autoscale.policy import ScalingPolicy, ScalingState
from fleetserve.clock import ManualClock
from fleetserve.fleet.lifecycle import Phase
from fleetserve.fleet.state import ReplicaState
from fleetserve.fleet.supervisor import Replica, StartupError, Supervisor
from fleetserve.spec.load import load_spec_text

SPEC = """apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: clocked}
spec:
  model: {source: /models/m}
  engine: {drainTimeoutSeconds: 45}
  replicas: 1
  autoscaling:
    minReplicaCount: %d
    maxReplicaCount: 5
    pollingInterval: 10
    cooldownPeriod: 60
    initialCooldownPeriod: 0
    scaleDownStabilizationTime: 120
    triggers: [{metric: concurrency, target: 4}]
"""


def load(in_flight: int) -> dict:
    return {"in_flight": in_flight, "pending": 0, "waiting": 0, "requests_total": 0, "backends": []}


@pytest.fixture
def make(tmp_path):
    made = []

    def supervisor(min_replicas: int) -> tuple[Supervisor, ManualClock, ManualClock]:
        path = tmp_path / "e.yaml"
        path.write_text(SPEC % min_replicas)
        loaded = load_spec_text(path.read_text())
        wall = ManualClock(datetime.fromisoformat("2026-01-05T10:00:00+00:00").timestamp())
        mono = ManualClock(100.0)
        sup = Supervisor(loaded, str(path), say=lambda _m: None, clock=wall, monotonic=mono)
        policy = ScalingPolicy.from_spec(loaded.endpoint.spec.autoscaling)
        sup.controller = Controller(policy, ScalingState.initial(policy, 1, wall()), read_load=lambda: None)
        made.append(sup)
        return sup, wall, mono

    yield supervisor
    for sup in made:
        sup._http.close()


def health_answers(sup):
    """A stand-in for the supervisor's GET: every replica's /health answers as its last start would."""
    from fleetserve.engine.instance import CHALLENGE_HEADER, proof

    class Answer:
        def __init__(self, url: str, headers: dict | None):
            self.url, self.challenge = url, (headers or {}).get(CHALLENGE_HEADER, "")

        def json(self) -> dict:
            r = next(r for r in sup.replicas if self.url.startswith(r.state.url))
            return {"status": "ok", **({"instance": proof(r.instance, self.challenge)} if r.instance else {})}

    return lambda url, headers=None: Answer(url, headers)


def test_scale_down_stabilization_holds_then_releases_as_the_virtual_clock_advances(make):
    sup, wall, _ = make(1)
    assert sup._autoscale(load(16)).desired == 4  # 16 in flight at 4 per replica
    up_at = wall()
    wall.advance(9.9)
    assert sup._autoscale(load(0)) is None  # not due: the polling interval runs on the injected clock
    wall.advance(0.1)
    held = [(round(wall() - up_at, 6), sup._autoscale(load(0)).desired)]
    while held[-1][0] < 120:
        wall.advance(10)
        held.append((round(wall() - up_at, 6), sup._autoscale(load(0)).desired))
    # the recommendation of 4 counts while strictly inside the 120 s window, then the fleet goes to its min
    assert all(d == 4 for t, d in held if t < 120), held
    assert held[-1] == (120, 1), held
    assert sup._desired() == 1


def test_cooldown_to_zero_waits_for_the_cooldown_period_in_virtual_time(make):
    sup, wall, _ = make(0)
    assert sup._autoscale(load(2)).desired == 1
    last_active = wall()
    while True:
        wall.advance(10)
        decision = sup._autoscale(load(0))
        if decision.desired == 0:
            break
        assert wall() - last_active < 60, decision.reason
    assert wall() - last_active == 60 and "cooldownPeriod 60s" in decision.reason


class ReadyChild:
    pid = 4242

    def exit_code(self):
        return None


def test_cold_start_and_drain_deadline_use_the_injected_monotonic_clock(make):
    sup, _, mono = make(1)
    r = Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.STARTING, node="n0"), 9, "n0",
                requested_at=mono(), child=ReadyChild(), started_at=mono())
    sup.replicas.append(r)
    mono.advance(42.5)
    sup._get = health_answers(sup)  # /health answers, as the process started last
    sup._tend(r, sup.monotonic(), starting_up=False)
    assert r.state.state == Phase.READY and r.state.cold_start_s == 42.5
    sup._drain(r, sup.monotonic())
    assert r.state.state == Phase.DRAINING and r.drain_deadline == mono() + 45  # engine.drainTimeoutSeconds


def test_a_drained_replica_is_stopped_at_its_deadline_and_its_engine_waits_no_longer(make):
    """The engine got SIGTERM when its drain time was spent and then waited its own default 5 s (uvicorn's
    graceful shutdown): a stream was cut 13 s into an 8 s drain. The local engine's wait is ENGINE_STOP_GRACE_S."""
    from fleetserve.fleet.supervisor import ENGINE_STOP_GRACE_S

    sup, _, mono = make(1)
    cmd = sup._engine_command("r0", 8001, "local")
    assert float(cmd[cmd.index("--drain-timeout") + 1]) == ENGINE_STOP_GRACE_S
    assert float(cmd[cmd.index("--stream-keepalive") + 1]) == 15  # under the router's 60 s stream idle timeout
    r = Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.READY, node="n0"), 9, "n0",
                requested_at=mono(), child=StoppingChild(), started_at=mono())
    sup.replicas.append(r)
    sup._drain(r, mono())
    sup._pushed = object()
    busy = {"backends": [{"url": r.state.url, "in_flight": 1}]}
    mono.advance(44.9)
    sup._finish_drains(mono(), busy)
    assert r.child.stopped is None  # a stream is under way and time is left
    mono.advance(0.1)
    sup._finish_drains(mono(), busy)
    assert r.child.stopped == 10 and r not in sup.replicas  # at the deadline, whatever is under way


def test_a_draining_replica_wanted_again_serves_instead_of_a_new_one(make):
    """A request that woke a fleet while it drained its last replica asked for a new replica: on one machine its
    slot was still taken (503 for every request for three minutes), elsewhere a cold start while a warm replica
    stopped. The draining replica is put back instead: no launch, no slot, no cold start."""
    sup, _, mono = make(0)
    said = []
    sup.say = said.append
    assert sup._launch(mono())
    (r,) = sup.replicas
    r.child, r.state.state = StoppingChild(), Phase.READY
    sup._scale_to(0, mono())
    assert r.state.state == Phase.DRAINING and r.drain_deadline is not None
    sup._scale_to(1, mono())
    assert sup.replicas == [r] and r.state.state == Phase.READY and r.drain_deadline is None
    assert not r.drain_announced and not sup.state.error and r.child.stopped is None
    assert said == ["replica r0 was draining and is wanted again: back to ready (no cold start)"]
    starting = Replica(ReplicaState("r9", "http://127.0.0.1:8", state=Phase.STARTING, node="local"), 8, "local",
                       requested_at=mono(), child=StoppingChild(), started_at=mono())
    sup.replicas.append(starting)
    sup._scale_to(1, mono())  # the one still starting goes (drained), the ready one stays
    assert starting.state.state == Phase.DRAINING
    sup._scale_to(2, mono())
    assert starting.state.state == Phase.STARTING  # back to what it was: its health check decides when it serves


def test_a_draining_replica_whose_process_died_is_not_brought_back(make):
    sup, _, mono = make(0)
    assert sup._launch(mono())
    (r,) = sup.replicas
    r.child, r.state.state = StoppingChild(), Phase.READY
    sup._scale_to(0, mono())
    r.child = ExitedChild(code=-9)  # killed while it drained
    sup._scale_to(1, mono())
    assert r.state.state == Phase.DRAINING and len(sup.replicas) == 2  # a new one is launched instead


def test_a_drain_is_finished_only_by_a_load_report_read_after_the_router_knew_of_it(make):
    """The round's load report (read before the replica was marked draining) showed it idle: it was stopped before
    the router was told, which sent it new requests (connection refused, retried elsewhere)."""
    sup, _, mono = make(1)
    r = Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.READY, node="n0"), 9, "n0",
                requested_at=mono(), child=StoppingChild(), started_at=mono())
    sup.replicas.append(r)
    idle = {"backends": [{"url": r.state.url, "in_flight": 0}]}
    sup._pushed = object()
    sup._drain(r, mono())
    sup._finish_drains(mono(), idle)  # the same round: the report predates the drain
    assert r.child.stopped is None and r in sup.replicas
    sup.router_url, sup.admin_token = "http://router", "t"
    sup._http.put = lambda *a, **k: type("Ok", (), {"raise_for_status": lambda self: None})()
    sup._push_backends()  # the router learns it drains
    sup._finish_drains(mono(), idle)  # a report read after that
    assert r.child.stopped == 10 and r not in sup.replicas


def test_scale_down_drains_the_idle_replica_not_the_newest_busy_one():
    """The newest replica went first even when it carried the only stream (cut at the drain timeout) and an older
    one was idle."""
    from fleetserve.autoscale.scaledown import Candidate, victims

    old_idle, new_busy = Candidate("r0", "ready", "n0", 0, in_flight=0), Candidate("r1", "ready", "n1", 1, 1)
    assert victims([old_idle, new_busy], {"n0": 1, "n1": 1}, 1) == [old_idle]
    # among busy ones, the emptiest node still goes first (it frees a node); in-flight counts only break ties
    alone, shared = Candidate("r1", "ready", "a", 1, 5), Candidate("r2", "ready", "b", 2, 4)
    assert victims([alone, shared, Candidate("r3", "ready", "b", 3, 6)], {"a": 1, "b": 2}, 1) == [alone]
    assert victims([Candidate("r0", "ready", "n0", 0), Candidate("r1", "ready", "n1", 1)], {}, 1)[0].id == "r1"
    assert victims([old_idle, Candidate("r2", "starting", "n2", 2, 0)], {}, 1)[0].id == "r2"  # not yet useful first


def test_scale_down_empties_the_dearest_node_it_can():
    """r0 alone on a $0.805/h g6.xlarge, r1 and r2 on a $5.672/h g5.12xlarge (4 slots): the emptiest node went
    first, so a scale-down from 3 to 1 kept the dear node at $5.672/h where the cheap one could carry the replica.
    With prices, whole nodes go first, the dearest that the count can empty; equal prices keep the old order."""
    from fleetserve.autoscale.scaledown import Candidate, victims

    r0, r1, r2 = Candidate("r0", "ready", "cheap", 0), Candidate("r1", "ready", "dear", 1), \
        Candidate("r2", "ready", "dear", 2)
    used, prices = {"cheap": 1, "dear": 2}, {"cheap": 0.805, "dear": 5.672}
    assert {c.id for c in victims([r0, r1, r2], used, 2, prices)} == {"r1", "r2"}
    assert victims([r0, r1, r2], used, 2)[0] == r0  # without prices: the emptiest node, as before
    assert victims([r0, r1, r2], used, 1, prices) == [r0]  # one cannot empty the dear node: the cheap one frees $0.8
    same = {"cheap": 1.0, "dear": 1.0}
    assert victims([r0, r1, r2], used, 1, same) == victims([r0, r1, r2], used, 1)
    starting = Candidate("r3", "starting", "dear", 3)  # not yet useful: still first
    assert victims([r0, r1, r2, starting], {"cheap": 1, "dear": 3}, 1, prices) == [starting]


def test_revivals_take_the_nearest_deadline_first_and_none_on_a_node_that_goes():
    from fleetserve.autoscale.scaledown import revivals

    early, late, noticed = ("r1", "n1", 50.0), ("r0", "n0", 10.0), ("r2", "spot", 5.0)
    pick = [early, late, noticed]
    assert revivals(pick, lambda r: r[1], lambda r: r[2], {"spot"}, 1) == [late]  # its streams are cut first
    assert revivals(pick, lambda r: r[1], lambda r: r[2], {"spot"}, 5) == [late, early]
    assert revivals(pick, lambda r: r[1], lambda r: r[2], set(), 0) == []


def test_a_crash_looping_replica_is_said_in_the_status_until_it_is_ready_again(make):
    """`status` showed a fleet whose replica crash-looped as ready with no error; the cause was only in the logs."""
    sup, _, mono = make(1)
    r = Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.READY, node="n0"), 9, "n0",
                requested_at=mono(), child=ExitedChild(), started_at=mono())
    sup.replicas.append(r)
    sup._tend(r, mono(), starting_up=False)
    assert r.state.state == Phase.RESTARTING
    assert sup.state.error.startswith("replica r0 exited with code 1 and is restarting; its last error: "
                                      "SafetensorError")
    r.child, r.state.state = ReadyChild(), Phase.STARTING
    sup._get = health_answers(sup)  # /health answers, as the process started last
    sup._tend(r, mono(), starting_up=False)
    assert r.state.state == Phase.READY and sup.state.error == ""
    r.child = ExitedChild()
    sup._tend(r, mono(), starting_up=False)
    assert sup.state.error.startswith("replica r0 ")
    healthy = Replica(ReplicaState("r1", "http://127.0.0.1:8", state=Phase.READY, node="n0"), 8, "n0",
                      requested_at=mono(), child=ReadyChild(), started_at=mono())
    sup.replicas.append(healthy)
    sup._remove(r)  # scaled away while it crash-looped: its error goes with it (it stayed on a healthy fleet)
    assert sup.state.error == ""


def test_a_crash_loop_scaled_to_zero_stays_in_the_status_until_a_replica_is_ready(make):
    """The only replica crash-looped, its clients got 503 "the fleet's status and its replica logs say why", and
    the fleet scaled to zero: `status` read "ready (scaled to zero)" with no error, while every next start failed
    the same way. The error stays, said as past, until a replica is ready."""
    sup, _, mono = make(0)
    r = Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.STARTING, node="n0"), 9, "n0",
                requested_at=mono(), child=ExitedChild(), started_at=mono())
    sup.replicas.append(r)
    sup._tend(r, mono(), starting_up=False)
    sup._remove(r)
    error = sup.state.error
    assert error.startswith("replica r0 exited with code 1; its last error: SafetensorError") and error.endswith(
        " (it was stopped by a scale-down before it started again; the next replica may fail alike)"), error
    fresh = Replica(ReplicaState("r1", "http://127.0.0.1:8", state=Phase.STARTING, node="n0"), 8, "n0",
                    requested_at=mono(), child=ReadyChild(), started_at=mono())
    sup.replicas.append(fresh)
    sup._get = health_answers(sup)  # /health answers, as the process started last
    sup._tend(fresh, mono(), starting_up=False)
    assert fresh.state.state == Phase.READY and sup.state.error == ""


def test_the_router_is_told_when_no_replica_can_start(make):
    """Held requests waited out the buffer timeout while the only replica crash-looped or found no capacity."""
    sup, _, mono = make(0)
    from dataclasses import replace

    sup.controller.state = replace(sup.controller.state, current=1)  # woken: one replica wanted
    pushed = []
    sup.router_url, sup.admin_token = "http://router", "t"
    sup._http.put = lambda url, json, headers: pushed.append(json) or type(
        "Ok", (), {"raise_for_status": lambda self: None})()
    # restarted before, long ago (the fleet's whole life counts in `restarts`): its next crash is no crash loop
    r = Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.READY, node="n0", restarts=3), 9, "n0",
                requested_at=mono(), child=ExitedChild(), started_at=mono())
    sup.replicas.append(r)
    sup._tend(r, mono(), starting_up=False)  # the first crash: it may come back
    sup._push_backends()
    assert pushed[-1]["failing"] is None
    r.state.restarts, r.child = 4, ExitedChild()
    r.state.state = Phase.STARTING
    sup._tend(r, mono(), starting_up=False)  # crashed again after a restart, before it was ready
    sup._push_backends()
    # clients hear that no replica can start; the replica's own error (its log line) stays the operator's
    from fleetserve.autoscale.failing import CRASH_LOOP

    assert pushed[-1]["failing"] == CRASH_LOOP and "SafetensorError" not in pushed[-1]["failing"]
    assert sup.state.error.startswith("replica r0 exited with code 1 and is restarting")
    sup.state.error = "cannot place a replica: no offering fits"
    assert sup._failing() == "cannot place a replica: no offering fits"
    r.state.state = Phase.READY  # one serves again: nothing to tell
    assert sup._failing() is None


class ExitedChild:
    """An engine process that exited with `code`, its log ending in `log`."""

    pid = 4245
    log_path = "r0.log"

    def __init__(self, log: str = "loading the model\nSafetensorError: Error while deserializing header: invalid "
                                  "header length\n", code: int = 1):
        self.log, self.code = log, code

    def exit_code(self):
        return self.code

    def log_tail(self, lines=20, this_run=False):
        return self.log

    def stop(self, timeout=10.0):
        pass


class StoppingChild:
    pid = 4244
    log_path = "r0.log"
    stopped = None

    def exit_code(self):
        return None

    def stop(self, timeout=10.0):
        self.stopped = timeout


PORT_TAKEN_LOG = ("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 9): address already "
                  "in use")


def test_a_replica_whose_port_another_process_took_starts_again_on_a_new_one(make):
    """A free port chosen for a replica was bound by another process before the engine bound it (a busy machine):
    `up` failed with "exited with code 3 during start-up", and a restart on the same port would fail again."""
    sup, _, mono = make(1)
    r = Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.STARTING, node="n0"), 9, "n0",
                requested_at=mono(), child=ExitedChild(PORT_TAKEN_LOG), started_at=mono())
    sup.replicas.append(r)
    sup._tend(r, sup.monotonic(), starting_up=True)  # no StartupError
    assert r.state.state == Phase.RESTARTING and r.port != 9 and r.state.url.endswith(f":{r.port}")
    assert r.child is None and r.backoff.due(sup.monotonic()) and r.port_moves == 1
    # the built-in engines say it by their exit code: a log rotated away (logMaxBytes: 1) no longer hides it
    moved_from = r.port
    r.state.state, r.child = Phase.STARTING, ExitedChild("", code=EXIT_PORT_TAKEN)
    sup._tend(r, sup.monotonic(), starting_up=True)
    assert r.state.state == Phase.RESTARTING and r.port != moved_from and r.port_moves == 2
    r.state.state, r.child = Phase.STARTING, ExitedChild(PORT_TAKEN_LOG)
    r.port_moves = 3  # bounded: past it, the crash is one
    with pytest.raises(StartupError, match="during start-up"):
        sup._tend(r, sup.monotonic(), starting_up=True)


def test_a_childs_log_of_this_run_leaves_out_the_earlier_runs_lines(tmp_path):
    """The log is appended to across restarts: an earlier run's "address already in use" must not make a later,
    unrelated crash read as a taken port."""
    from fleetserve.fleet.process import Child

    child = Child("c", ["sh", "-c", "echo first run"], tmp_path / "c.log")
    child.start()
    child.proc.wait(timeout=10)
    child.cmd = ["sh", "-c", "echo second run"]
    child.start()
    child.proc.wait(timeout=10)
    assert child.log_tail(this_run=True) == "second run"
    assert child.log_tail() == "first run\nsecond run"


SPOT_SPEC = """apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: spotted}
spec:
  model: {source: /models/m}
  engine: {drainTimeoutSeconds: 30}
  replicas: 1
  placement: {instanceTypes: [ml.g5.xlarge]}
  capacity:
    provider: simulated
    capacityTypes: [spot]
    simulated: {provisioningDelaySeconds: 0}
"""


@pytest.fixture
def spotted(tmp_path):
    """A supervisor of SPOT_SPEC (or `spec`) in virtual time: (supervisor, wall clock, monotonic clock, what it
    said); closed at teardown."""
    made = []

    def supervisor(spec: str = SPOT_SPEC):
        path = tmp_path / "e.yaml"
        path.write_text(spec)
        said: list[str] = []
        wall = ManualClock(datetime.fromisoformat("2026-01-05T10:00:00+00:00").timestamp())
        mono = ManualClock(100.0)
        sup = Supervisor(load_spec_text(spec), str(path), say=said.append, clock=wall, monotonic=mono)
        made.append(sup)
        return sup, wall, mono, said

    yield supervisor
    for sup in made:
        sup._http.close()


def advance(seconds: float, *clocks: ManualClock) -> None:
    for clock in clocks:
        clock.advance(seconds)


def test_a_spot_notice_keeps_the_replica_serving_until_its_replacement_is_ready_or_its_drain_is_due(spotted):
    """A spot notice drained the fleet's only replica at once: no ready replica for the replacement's whole cold
    start, 90 s of the 120 s notice unused. It moves (make-before-break) and drains at the latest
    drainTimeoutSeconds before the node goes; the emptied node is released then, not at the end of the notice."""
    sup, wall, mono, said = spotted()
    assert sup._launch(mono())
    old = sup.replicas[0]
    old.state.state, old.child = Phase.READY, StoppingChild()
    sup._capacity_events(mono())  # the node's "ready"
    sup.capacity.provider.interrupt(old.node_id, wall())
    sup._capacity_events(mono())
    assert old.state.state == Phase.MOVING and any("moving 1 serving replica(s)" in m for m in said)
    assert any(f"spot interruption notice: node {old.node_id} terminates in 120s" in m for m in sup.capacity.log)
    sup._scale_to(1, mono())
    new = sup.replicas[1]
    assert new.state.state == Phase.PENDING and new.node_id != old.node_id  # not on the noticed node
    advance(89.9, wall, mono)
    sup._drain_interrupted(mono())
    sup._cancel_moves("no capacity")  # a cancelled consolidation does not keep it: its node goes
    assert old.state.state == Phase.MOVING  # it serves on: 30.1 s left before the node goes
    advance(0.1, wall, mono)
    sup._drain_interrupted(mono())
    assert old.state.state == Phase.DRAINING and old.drain_deadline == mono() + 30  # ends with the notice
    sup._remove(old)
    sup.capacity.release_interrupted(wall())
    assert old.node_id not in {n.id for n in sup.capacity.nodes()}
    assert any("interrupted node emptied: released" in m for m in sup.capacity.log)


def test_a_noticed_replica_drains_as_soon_as_its_replacement_is_ready(spotted):
    sup, wall, mono, _ = spotted()
    assert sup._launch(mono())
    old = sup.replicas[0]
    old.state.state, old.child = Phase.READY, StoppingChild()
    sup.capacity.provider.interrupt(old.node_id, wall())
    sup._capacity_events(mono())
    sup._scale_to(1, mono())
    assert old.state.state == Phase.MOVING
    advance(20, wall, mono)
    new = sup.replicas[1]
    new.state.state, new.child = Phase.READY, ReadyChild()
    sup._scale_to(1, mono())
    assert old.state.state == Phase.DRAINING and new.state.state == Phase.READY


def test_a_moving_replica_that_crashes_is_not_restarted_on_the_node_that_goes(spotted):
    """It restarted in place, counted as active again, its replacement was scaled away as the least useful
    replica, and it served on the noticed node until the node was terminated under it."""
    sup, wall, mono, said = spotted(SPOT_SPEC.replace("provisioningDelaySeconds: 0", "provisioningDelaySeconds: 90"))
    assert sup._launch(mono())
    advance(90, wall, mono)
    sup._capacity_events(mono())
    old = sup.replicas[0]
    old.state.state, old.child = Phase.READY, StoppingChild()
    sup.capacity.provider.interrupt(old.node_id, wall())
    sup._capacity_events(mono())
    sup._scale_to(1, mono())
    assert old.state.state == Phase.MOVING and len(sup.replicas) == 2
    old.child = ExitedChild()
    sup._tend(old, mono(), starting_up=False)  # it crashes while its replacement's node provisions
    sup._scale_to(1, mono())
    assert [(r.state.id, r.state.state) for r in sup.replicas] == [("r1", Phase.PENDING)]
    assert any("not restarted there" in m for m in said)


def test_a_replica_on_a_fallback_node_moves_to_the_cheaper_node_consolidation_makes(spotted):
    """The live fleet applies consolidation's replacement as it applies a spot notice: the cheaper node first, the
    replica's replacement there, and the old replica drains once the new one is ready."""
    spec = SPOT_SPEC.replace("[ml.g5.xlarge]", "[ml.g5.xlarge, ml.g6e.xlarge]").replace("[spot]", "[on-demand]")
    spec = spec.replace("provisioningDelaySeconds: 0}", "provisioningDelaySeconds: 0, shortages: [{instanceType: "
                        "ml.g5.xlarge, startSeconds: 0, endSeconds: 100}]}\n    consolidation: {consolidateAfter: 0, "
                        "budgets: [{nodes: '100%'}]}")
    sup, wall, mono, said = spotted(spec)
    assert sup._launch(mono())
    old = sup.replicas[0]
    old.state.state, old.child = Phase.READY, StoppingChild()
    old_node = next(n for n in sup.capacity.nodes() if n.id == old.node_id)
    assert old_node.offering.instance_type == "g6e.xlarge"  # g5.xlarge was short: the fallback
    advance(181, wall, mono)  # the shortage is over, and so is its out-of-capacity mark
    sup._apply_consolidation(sup.capacity.consolidate(wall(), 0.5))
    assert old.state.state == Phase.MOVING and any("a cheaper node replaces it; moving 1" in m for m in said)
    sup._scale_to(1, mono())
    new = sup.replicas[1]
    (new_node,) = [n for n in sup.capacity.nodes() if n.id == new.node_id]
    assert new_node.offering.instance_type == "g5.xlarge"
    new.state.state, new.child = Phase.READY, ReadyChild()
    sup._scale_to(1, mono())
    assert old.state.state == Phase.DRAINING and new.state.state == Phase.READY


def test_a_replica_the_router_has_out_is_not_counted_as_serving(make, tmp_path, monkeypatch):
    """A stalled replica (SIGSTOP) kept running, so `status` read "ready 2" while the router sent it nothing."""
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "home"))
    sup, _, mono = make(1)
    r = Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.READY, node="n0"), 9, "n0",
                requested_at=mono(), child=ReadyChild(), started_at=mono())
    sup.replicas.append(r)
    sup._router_out = {"http://127.0.0.1:9": "failing health checks"}  # the router's last load report
    sup._save()
    assert sup.state.ready == 0 and r.state.router_healthy is False and r.state.router_why == "failing health checks"
    sup._router_out = {}
    sup._save()
    assert sup.state.ready == 1 and r.state.router_healthy is True and r.state.router_why == ""
    # its probes pass but its breaker is open: out too, and `status` says which (it said failing health checks)
    from fleetserve.fleet.supervisor import router_out

    sup._router_out = router_out({"backends": [
        {"url": "http://127.0.0.1:9", "healthy": False, "breaker": "open", "in_flight": 0},
        {"url": "http://127.0.0.1:8", "healthy": False, "breaker": "closed", "in_flight": 0},
        {"url": "http://127.0.0.1:7", "healthy": True, "breaker": "half-open", "in_flight": 0}]})
    assert sup._router_out == {"http://127.0.0.1:9": "circuit breaker open",
                               "http://127.0.0.1:8": "failing health checks"}
    sup._save()
    assert sup.state.ready == 0 and r.state.router_why == "circuit breaker open"
    assert router_out(None) == {}


def test_each_scaling_change_is_logged_once_with_its_numbers_and_its_own_time(make, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "home"))
    sup, wall, _ = make(1)
    said: list[str] = []
    sup.say = said.append
    first = sup._autoscale(load(16))  # 1 -> 4
    wall.advance(10)
    assert sup._autoscale(load(16)).desired == 4  # held at 4 (steady): not logged
    decided = wall()
    assert [m for m in said if m.startswith("autoscaler:")] == ["autoscaler: " + first.reason]
    assert said[0].startswith("autoscaler: scale up 1 -> 4") and "concurrency=16" in said[0], said
    wall.advance(5)  # the state is written later than the decision: `at` is the decision's time
    sup._save()
    assert sup.state.last_decision["at"] == decided
    for _ in range(100):  # bounded: a regression fails, not hangs
        if sup._autoscale(load(0)) is not None and sup.controller.last.desired != 4:
            break
        wall.advance(10)
    assert said[-1].startswith("autoscaler: scale down 4 -> 1"), said


def test_the_scale_to_zero_is_logged_with_its_counts(make, tmp_path, monkeypatch):
    """It read "autoscaler: no activity for 10s >= cooldownPeriod 10s" where every other change gives the counts."""
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "home"))
    sup, wall, _ = make(0)
    said: list[str] = []
    sup.say = said.append
    sup._autoscale(load(2))
    for _ in range(100):  # bounded: a regression fails, not hangs
        wall.advance(10)
        decided = sup._autoscale(load(0))
        if decided is not None and decided.desired == 0:
            break
    assert said[-1].startswith("autoscaler: scale to zero 1 -> 0: no activity for"), said
    assert sup.metrics.decisions.labels(reason="cooldownPeriod elapsed")._value.get() == 1  # the label stays


def test_a_decision_that_holds_is_logged_once_and_the_metrics_coming_back_are_logged(make, tmp_path, monkeypatch):
    """Polled every pollingInterval, "holding (metrics not ready)" would be a line per poll; and its last word
    stood in the log after the metrics came back."""
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "home"))
    sup, wall, _ = make(1)
    said: list[str] = []
    sup.say = said.append
    for reading in (None, None, None, load(4), load(4)):  # three failed reads, then the trigger reads again
        assert sup._autoscale(reading) is not None
        wall.advance(10)
    lines = [m for m in said if m.startswith("autoscaler:")]
    assert len(lines) == 2 and "metrics not ready" in lines[0], lines
    assert lines[1].startswith("autoscaler: steady at 1") and lines[1].endswith("(metrics read again)"), lines


def test_a_prometheus_port_in_use_is_refused_naming_its_field_before_the_model_is_prepared(tmp_path, monkeypatch):
    import socket

    from fleetserve.fleet import prometheus

    monkeypatch.setattr(prometheus, "binary", lambda: "/usr/bin/prometheus")  # wherever the binary is missing
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        section = f"  observability: {{prometheus: {{port: {port}}}}}\n"
        text = (SPEC % 1).replace("  replicas: 1\n", "  replicas: 1\n" + section)
        sup = Supervisor(load_spec_text(text), str(tmp_path / "e.yaml"), say=lambda _m: None)
        try:
            with pytest.raises(StartupError, match=f"spec.observability.prometheus.port: port {port} on 127.0.0.1"):
                sup._check_addresses()
        finally:
            sup._http.close()


def test_down_waits_for_the_fleets_own_stop_its_drain_included(make):
    """`down` SIGKILLed the supervisor after a fixed 60 s: a stream the default 120 s drain lets finish was cut
    with no error event. The supervisor says how long its stop takes, and `down` waits that and a margin."""
    from fleetserve.fleet.control import STOP_MARGIN_S, stop_wait_s
    from fleetserve.fleet.state import FleetState

    sup, _, _ = make(1)
    assert sup.state.stop_timeout_s == 45 + 5 + 10  # engine.drainTimeoutSeconds 45: the router's drain, its exit,
    assert stop_wait_s(sup.state) == 60 + STOP_MARGIN_S  # then the children's stop
    old = FleetState(name="o", namespace="default", model="m", spec_path="s.yaml", supervisor_pid=1)
    assert stop_wait_s(old) == 60 + STOP_MARGIN_S  # a state from before: as it was, with the margin


def test_a_replica_killed_by_a_signal_is_said_so_and_no_request_line_is_quoted_as_its_error(make):
    """After a kill -9 the error quoted the log's last line, an earlier request's, as if it had crashed it."""
    sup, _, mono = make(1)
    access = 'request id=abc kind=chat status=200 finish_reason=length latency_ms=812.4\n'
    r = Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.READY, node="n0"), 9, "n0",
                requested_at=mono(), child=ExitedChild(access, code=-9), started_at=mono())
    sup.replicas.append(r)
    sup._tend(r, mono(), starting_up=False)
    assert sup.state.error == "replica r0 exited with code -9 (killed by SIGKILL) and is restarting"


def test_the_last_error_of_a_log_is_never_a_request_line_that_names_an_error():
    from fleetserve.fleet.supervisor import last_error

    text = ("RuntimeError: CUDA out of memory\n"
            "2026-12-05 06:48:28,216 engine INFO request kind=completion status=503 latency_ms=0.2 error=overloaded\n")
    assert last_error(text) == "RuntimeError: CUDA out of memory"
    as_json = '{"logger": "fleetserve.engine.access", "status": 503, "error": "engine_stopping"}\n'
    assert last_error(as_json) == ""
    # redis-server says "Could not", never "error": its restart showed `restarting (exit code 1)` and no cause
    redis = ("1:M 05 Dec 2026 12:00:00.000 * Server initialized\n"
             "1:M 05 Dec 2026 12:00:00.001 # Warning: Could not create server TCP listening socket 127.0.0.1:6379: "
             "bind: Address already in use\n")
    assert "Could not create server TCP listening socket" in last_error(redis)


def alerts_server(alerts: list[dict], answering: list[bool]):
    """A stand-in Prometheus: /api/v1/alerts lists `alerts` while `answering[0]`, else 503; other paths 404."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Alerts(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "success", "data": {"alerts": alerts}}).encode()
            self.send_response(404 if self.path != "/api/v1/alerts" else 200 if answering[0] else 503)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Alerts)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def reading_alerts(make, server):
    """A supervisor that reads its alerts from `server` and keeps what it says."""
    sup, _, mono = make(1)
    said: list[str] = []
    sup.say, sup._save = said.append, lambda: None
    sup._prometheus_query_url = f"http://127.0.0.1:{server.server_address[1]}"
    return sup, mono, said


def test_the_alerts_its_prometheus_fires_reach_status_and_the_log(make):
    """They were evaluated by the fleet's own Prometheus and reached nobody: no Alertmanager is wired locally, and
    status said nothing while the error budget burned."""
    firing = [{"labels": {"alertname": "FleetserveErrorBudgetBurnFast", "severity": "critical"}, "state": "firing"},
              {"labels": {"alertname": "FleetserveHighErrorRate", "severity": "warning"}, "state": "pending"}]
    server = alerts_server(firing, [True])
    try:
        sup, mono, said = reading_alerts(make, server)
        sup._read_alerts(mono())
        assert sup.state.alerts == ["FleetserveErrorBudgetBurnFast (critical)"]  # pending is not firing yet
        assert said == ["warning: alert firing: FleetserveErrorBudgetBurnFast (critical)"]
        firing.clear()
        sup._read_alerts(mono())  # within ALERTS_EVERY_S: not asked again
        assert sup.state.alerts == ["FleetserveErrorBudgetBurnFast (critical)"]
        mono.advance(16)
        sup._read_alerts(mono())
        assert sup.state.alerts == [] and said[-1] == "alert resolved: FleetserveErrorBudgetBurnFast (critical)"
    finally:
        server.shutdown()
        server.server_close()
    mono.advance(16)
    sup._read_alerts(mono())  # its Prometheus gone: no reading, not the last one shown as if current
    assert sup.state.alerts == ["unknown (the fleet's Prometheus does not answer)"]


def test_a_restarted_prometheus_neither_resolves_nor_fires_again_what_fired_before_it(make):
    """After a supervised Prometheus restart its alerts read pending until it restored their state, and the
    supervisor logged them resolved (and fired again a while later): the cost alert had gone silent in status."""
    burn = {"labels": {"alertname": "FleetserveCostOverBudget", "severity": "warning"}, "state": "firing"}
    alerts, answering = [burn], [True]
    server = alerts_server(alerts, answering)
    try:
        sup, mono, said = reading_alerts(make, server)
        sup._read_alerts(mono())
        assert said == ["warning: alert firing: FleetserveCostOverBudget (warning)"]
        answering[0] = False  # restarting: no reading
        mono.advance(16)
        sup._read_alerts(mono())
        assert sup.state.alerts == ["unknown (the fleet's Prometheus does not answer)"]
        sup._alerts_settling = True  # as _supervise sets it when it restarts Prometheus
        mono.advance(48)  # a slow start (its WAL replayed): the settling is timed from its first answer
        sup._read_alerts(mono())
        answering[0], alerts[0] = True, {**burn, "state": "pending"}  # back, its state not restored yet
        mono.advance(16)
        sup._read_alerts(mono())
        assert sup.state.alerts == ["FleetserveCostOverBudget (warning)"] and len(said) == 1, said
        alerts[0] = burn  # restored: firing again, which is no news
        mono.advance(16)
        sup._read_alerts(mono())
        assert sup.state.alerts == ["FleetserveCostOverBudget (warning)"] and len(said) == 1, said
        alerts.clear()  # past the settling (4 evaluations from its first answer), a resolution is one
        mono.advance(16)
        sup._read_alerts(mono())
        assert sup.state.alerts == ["FleetserveCostOverBudget (warning)"] and len(said) == 1, said
        mono.advance(30)
        sup._read_alerts(mono())
        assert sup.state.alerts == [] and said[-1] == "alert resolved: FleetserveCostOverBudget (warning)"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("provider, types, expected", [("simulated", ["ml.g5.xlarge"], "g5.xlarge"),
                                                        ("local", ["ml.g5.xlarge"], "local"),
                                                        ("simulated", ["ml.g5.xlarge", "ml.g6e.xlarge"], "local")])
def test_the_router_labels_a_replica_with_the_instance_type_its_engine_reports(tmp_path, provider, types, expected):
    """The router's model_* series carried the spec's `ml.g5.xlarge` while the engines (and status) said
    `g5.xlarge`: one replica had two sets of series, and filtering the dashboard by instance type hid the router's
    errors. It takes the placed node's name, as the engines do."""
    text = SPEC % 1 + f"  placement: {{instanceTypes: [{', '.join(types)}]}}\n  capacity: {{provider: {provider}}}\n"
    path = tmp_path / "e.yaml"
    path.write_text(text)
    sup = Supervisor(load_spec_text(text), str(path), say=lambda _m: None)
    try:
        args = sup._engine_kind_router_args()
        assert args[args.index("--instance-type") + 1] == expected
    finally:
        sup._http.close()


def test_a_state_file_that_cannot_be_written_stops_nothing(make, tmp_path, monkeypatch):
    """A full disk under FLEETSERVE_HOME: the state write raised ENOSPC inside the control loop, the supervisor
    failed and stopped the router and every replica (16,730 requests refused), leaving .state-* files behind."""
    import errno

    from fleetserve.fleet import state as state_module

    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "home"))
    sup, _, mono = make(1)
    said: list[str] = []
    sup.say = said.append
    real_dump = state_module.json.dump

    def full_disk(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_module.json, "dump", full_disk)
    sup._save()  # no exception: the fleet serves on
    mono.advance(2)
    sup._save()
    folder = state_module.fleet_dir(sup.state.name)
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".state-")]  # no temporary files left
    assert sum("could not be written" in m for m in said) == 1, said  # said once, not every round
    monkeypatch.setattr(state_module.json, "dump", real_dump)
    mono.advance(2)
    sup._save()
    assert (folder / "state.json").exists() and said[-1] == "the fleet's state is written again"


def test_a_run_folder_too_deep_for_a_socket_puts_redis_in_a_private_folder_of_its_own(tmp_path, monkeypatch):
    """The fleet's Redis listens on a unix socket in its run folder; a folder too deep for a socket's path (108
    bytes) had fallen back to a TCP port, where a process that bound it while Redis restarted got the engines'
    AUTH. It goes in a short 0700 folder of its own, removed at the stop."""
    import shutil
    import stat

    import pytest

    from fleetserve.fleet import supervisor as module

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / ("deep" * 30)))
    monkeypatch.setattr(module, "MAX_SOCKET_PATH", 10)
    text = SPEC % 1 + "  kvCache: {l2: {enabled: true, maxBytes: 16777216}}\n"
    sup = Supervisor(load_spec_text(text), str(tmp_path / "e.yaml"), say=lambda _m: None)
    sup.dir.mkdir(parents=True, exist_ok=True)
    try:
        sup._start_redis()
        assert sup.l2_url.startswith("unix:///tmp/fleetserve-redis-") and sup._socket_dir is not None
        assert stat.S_IMODE(sup._socket_dir.stat().st_mode) == 0o700
        from fleetserve.kvcache.tiers import redis_health

        assert redis_health(sup.l2_url, (sup.dir / module.REDIS_PASSWORD).read_text()) == "up"
        sup._shutdown()
        assert not sup._socket_dir.exists()
    finally:
        if sup.redis is not None and sup.redis.alive():
            sup.redis.stop(timeout=5)
        sup._http.close()


def test_a_shortage_is_no_longer_said_once_no_replica_wanted_lacks_a_place(make):
    """Two streams on a one-slot machine asked for a second replica; "cannot place a replica" stayed in status
    after the load was gone (and at zero read "no replica wanted; see error"), since only a later launch cleared
    it (found in review)."""
    from fleetserve.autoscale.failing import unplaced

    sup, _, mono = make(0)
    sup.replicas.append(Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.READY, node="n0"), 9, "n0",
                                requested_at=mono()))
    sup.state.error = unplaced("every replica slot of this machine is taken (1 of capacity.localSlots = 1)")
    sup._scale_to(1, mono())
    assert sup.state.error == ""
    sup.state.error = "replica r0 exited with code 1 and is restarting"  # a crash loop's error is not a shortage's
    sup._scale_to(1, mono())
    assert sup.state.error.startswith("replica r0 exited")


def test_redis_and_prometheus_stop_after_the_replicas_that_use_them():
    """Every child was told to stop at once: a stopping replica's last KV writes went to a Redis already exiting."""
    from fleetserve.fleet.supervisor import stop_groups

    assert stop_groups("router", ["r0", None, "r1"], "redis", "prom") == [["router", "r0", "r1"], ["redis", "prom"]]
    assert stop_groups(None, ["r0"], None, None) == [["r0"]]
    assert stop_groups(None, [], "redis", None) == [["redis"]]


def test_a_router_alive_that_does_not_answer_is_said_and_then_killed_to_be_restarted(make, tmp_path):
    """A SIGSTOPped router (or one whose event loop is blocked) read "up" in status while every request hung,
    and was never restarted: the supervisor logged "could not update the router's backends" every few seconds."""
    import sys

    from fleetserve.fleet.process import Child, free_port
    from tests.helpers import wait_until

    sup, _, mono = make(1)
    said = []
    sup.say, sup._save = said.append, lambda: None
    port = free_port()  # it accepts connections (the kernel does) and answers none, as a SIGSTOPped router
    sup.router = Child("router", [sys.executable, "-c", "import socket, time; s = socket.socket(); "
                                  f"s.bind(('127.0.0.1', {port})); s.listen(64); time.sleep(120)"],
                       tmp_path / "router.log")
    sup.router.start()
    try:
        sup.router_url, sup.admin_token = f"http://127.0.0.1:{port}", "t"
        wait_until(lambda: socket_open(port), 30, what="the stand-in router listening")
        sup.state.router_status = "up"
        sup._reconcile(mono())
        assert sup.state.router_status == "up" and sup.router.alive()
        mono.advance(6)
        sup._reconcile(mono())
        assert sup.state.router_status.startswith("not answering") and sup.router.alive()
        mono.advance(25)
        sup._reconcile(mono())
        sup.router.proc.wait(timeout=10)  # killed: _keep_alive restarts it after its back-off
        assert sup.router.exit_code() == -9 and any("killed, to be restarted" in m for m in said), said
    finally:
        sup.router.stop(timeout=1)
    sup.router = Child("router", [sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "router2.log")
    sup.router.start()  # alive, and refusing connections (still binding its port): no hang, never killed for it
    try:
        sup.router_url = f"http://127.0.0.1:{free_port()}"
        for _ in range(3):
            mono.advance(20)
            sup._reconcile(mono())
        assert sup.router.alive()
    finally:
        sup.router.stop(timeout=1)


def socket_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_service_restarted_after_it_exited_is_counted_in_state_and_metrics(make, tmp_path):
    """A Redis (or router, or Prometheus) crash and restart left no trace but a supervisor.log line: status read
    "up" and no metric moved."""
    import sys

    from prometheus_client import generate_latest

    from fleetserve.fleet.process import Child

    sup, _, mono = make(1)
    sup.say = lambda _m: None
    sup.redis = Child("redis", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "redis.log")
    assert 'fleetserve_service_restarts_total{service="redis"} 0.0' in generate_latest(sup.metrics.registry).decode()
    sup.redis.start()
    sup.redis.proc.wait(timeout=30)
    assert not sup._keep_alive(sup.redis, sup._redis_backoff, mono(), "redis-server")  # its back-off first
    mono.advance(60)
    assert sup._keep_alive(sup.redis, sup._redis_backoff, mono(), "redis-server")
    sup.redis.proc.wait(timeout=30)
    assert sup.state.service_restarts == {"redis": 1}
    text = generate_latest(sup.metrics.registry).decode()
    assert 'fleetserve_service_restarts_total{service="redis"} 1.0' in text
    assert 'fleetserve_service_restarts_total{service="router"} 0.0' in text


def test_scrape_targets_that_cannot_be_written_stop_nothing(make, tmp_path, monkeypatch):
    """Found by a black-box pass: on a full disk the first replica change (a crash's restart, a scale-down) raised
    ENOSPC from the write of Prometheus' engine targets, and the supervisor failed, stopping the router and every
    replica; status then read `dead`. The state write had been guarded, this one not."""
    import errno

    from fleetserve.fleet import prometheus

    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "home"))
    sup, _, _ = make(1)
    said: list[str] = []
    sup.say = said.append
    sup._prometheus_dir = tmp_path / "prometheus"
    sup._prometheus_targets = ["a replica that left"]  # what the file says differs from the replicas now
    real_dump = prometheus.json.dump

    def full_disk(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prometheus.json, "dump", full_disk)
    sup._write_prometheus_targets()  # no exception: the fleet serves on
    sup._write_prometheus_targets()
    assert sum("scrape targets could not be written" in m for m in said) == 1, said  # said once
    assert sup._prometheus_targets == ["a replica that left"]  # so the next round tries again
    assert [p.name for p in (tmp_path / "prometheus").rglob("*")
            if p.is_file()] == []  # no cut-off temporary file left for Prometheus to find
    monkeypatch.setattr(prometheus.json, "dump", real_dump)
    sup._write_prometheus_targets()
    assert said[-1] == "Prometheus' scrape targets are written again"
    assert prometheus.read_targets(tmp_path / "prometheus", "engine") == []


def test_a_router_port_taken_after_the_check_is_said_as_the_check_says_it(tmp_path, monkeypatch):
    """Found by a black-box pass: two fleets started at once on one router.port; the loser's router exited 2 on the
    taken port and `up` printed the router's usage panel and exited 1, where a port taken before the start is
    exit 2 naming spec.router.port."""
    import socket

    from fleetserve.fleet import supervisor as module
    from fleetserve.fleet.process import free_port

    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path / "home"))
    port = free_port("127.0.0.1")
    text = f"""apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: racer}}
spec:
  model: {{source: /models/m}}
  replicas: 1
  router: {{port: {port}}}
"""
    sup = module.Supervisor(load_spec_text(text), str(tmp_path / "e.yaml"), say=lambda _m: None)
    (sup.dir / "logs").mkdir(parents=True, exist_ok=True)

    class ExitedOnTheTakenPort:  # the router process: it found the port taken and exited 2
        pid, log_path = 1, tmp_path / "router.log"

        def __init__(self, *_a, **_k):
            pass

        def start(self):
            pass

        def exit_code(self):
            return 2

        def log_tail(self):
            return "Usage: python -m fleetserve router ... Invalid value for --port"

    monkeypatch.setattr(module, "Child", ExitedOnTheTakenPort)
    monkeypatch.setattr(sup, "_check_addresses", lambda: None)  # it passed: the other router bound the port after
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(module.StartupError) as info:
            sup._start_router([])
    assert info.value.exit_code == 2 and str(info.value).startswith(f"spec.router.port: port {port} on 127.0.0.1 "
                                                                    "is already in use")


def test_a_fork_server_that_died_is_started_again_a_minute_later_in_virtual_time(make):
    """Replicas start as new interpreters meanwhile; the running ones never noticed (they are the supervisor's).
    One that dies again without getting ready is retried after twice the wait (it had been every minute, for
    ever, a server that cannot import paying a partial torch import each time)."""
    import threading

    from fleetserve.fleet.supervisor import FORK_SERVER_RETRY_S

    sup, _, mono = make(1)

    class DeadServer:
        pid = None

        def __init__(self):
            self.dead, self.ready = threading.Event(), threading.Event()
            self.dead.set()

    started = []

    def start_again():
        started.append(mono())
        sup.forks = type("Fresh", (), {"dead": threading.Event(), "ready": threading.Event(), "pid": 4321})()

    sup.forks, sup.state.forkserver_pid = DeadServer(), 1234
    sup._start_fork_server = start_again
    sup._tend_fork_server(mono())
    assert sup.state.forkserver_pid is None and started == []  # said dead; not restarted at once
    mono.advance(FORK_SERVER_RETRY_S - 1)
    sup._tend_fork_server(mono())
    assert started == []
    mono.advance(1)
    sup._tend_fork_server(mono())
    assert started == [mono()]
    mono.advance(FORK_SERVER_RETRY_S * 3)
    sup._tend_fork_server(mono())
    assert len(started) == 1  # the new one lives: nothing more
    sup.forks.dead.set()  # and dies before it got ready
    sup._tend_fork_server(mono())
    mono.advance(FORK_SERVER_RETRY_S * 2 - 1)
    sup._tend_fork_server(mono())
    assert len(started) == 1
    mono.advance(1)
    sup._tend_fork_server(mono())
    assert len(started) == 2


def test_a_serving_replica_the_routers_probes_hear_nothing_from_is_killed_to_be_restarted(make):
    """A SIGSTOPped engine stayed "ready" for good (its requests held or 502) while Kubernetes' livenessProbe
    restarts the same engine: after REPLICA_HANG_S of silence in the router's load report it is killed, and its
    exit is a crash like any other."""
    import signal

    from fleetserve.fleet.supervisor import REPLICA_HANG_S

    class Stopped(ReadyChild):
        def __init__(self):
            self.signals: list[int] = []

        def signal(self, sig: int) -> None:
            self.signals.append(sig)

        def log_tail(self, lines: int = 20, this_run: bool = False) -> str:
            return ""

    said: list[str] = []
    sup, _, mono = make(1)
    sup.say = said.append
    ready, starting = Stopped(), Stopped()
    for i, (child, phase) in enumerate(((ready, Phase.READY), (starting, Phase.STARTING))):
        sup.replicas.append(Replica(ReplicaState(f"r{i}", f"http://127.0.0.1:{9 + i}", state=phase, node="n0"),
                                    9 + i, "n0", requested_at=mono(), child=child, started_at=mono()))

    def report(quiet: float) -> dict:
        return {"backends": [{"url": f"http://127.0.0.1:{port}", "healthy": False, "silent_s": quiet}
                             for port in (9, 10)]}

    sup._kill_hung(report(REPLICA_HANG_S - 0.1))
    sup._kill_hung(None)  # no report (the router restarting): nothing judged
    assert ready.signals == [] and starting.signals == []
    sup._kill_hung(report(REPLICA_HANG_S))
    assert ready.signals == [signal.SIGKILL] and starting.signals == []  # a start is judged by its own timeout
    assert len(said) == 1 and "replica r0" in said[0] and "killed, to be restarted" in said[0], said


def test_an_l2_redis_going_down_and_coming_back_is_one_line_each(make):
    """Only `status` (and each engine) had said that the fleet's L2 Redis stopped answering or came back."""
    said: list[str] = []
    sup, _, _ = make(1)
    sup.say = said.append
    sup._l2_changed("the L2 Redis", "", "up")  # the first word: nothing to say
    sup._l2_changed("the L2 Redis", "up", "up")
    sup._l2_changed("the L2 Redis", "up", "unreachable (ConnectionError)")
    sup._l2_changed("the L2 Redis", "unreachable (ConnectionError)", "unreachable (ConnectionError)")
    sup._l2_changed("the L2 Redis", "unreachable (ConnectionError)", "not answering (TimeoutError)")
    sup._l2_changed("the L2 Redis", "not answering (TimeoutError)", "up")
    assert said == ["the L2 Redis: unreachable (ConnectionError) (was up)",
                    "the L2 Redis: not answering (TimeoutError) (was unreachable (ConnectionError))",
                    "the L2 Redis: up again"], said


def test_every_flag_the_fleet_gives_its_engines_is_one_engine_args_may_not_repeat(make):
    """`up` refuses engine.args that repeat a flag the fleet sets (FLEET_SETS): a flag `_engine_command` gains must
    be listed there too, or a spec could set it a second time, and the engine takes the last."""
    from fleetserve.fleet.engine_args import FLEET_SETS, builtin_args_problem

    sup, _, _ = make(1)
    sup.model_dir = "/models/m"
    given = {a.split("=", 1)[0] for a in sup._engine_command("r0", 9000, "local") if a.startswith("--")}
    assert given and given <= set(FLEET_SETS), given - set(FLEET_SETS)
    assert builtin_args_problem([]) is None and builtin_args_problem(["--max-batch", "4"]) is None


def test_a_router_that_does_not_answer_is_said_once_and_one_that_exited_is_not_asked(make, caplog):
    """A router down (killed, its port held) got a "could not update the router's backends" warning every tick, ~5 a
    second, for as long as it stayed down, burying its exit and restart lines (found in a black-box pass)."""
    import logging

    import httpx

    sup, _, mono = make(1)
    sup.router_url, sup.admin_token = "http://router", "t"
    tries = []

    def refuse(url, json, headers):
        tries.append(json)
        raise httpx.ConnectError("[Errno 111] Connection refused")

    def accept(url, json, headers):
        tries.append(json)
        return type("Ok", (), {"raise_for_status": lambda self: None})()

    sup.replicas.append(Replica(ReplicaState("r0", "http://127.0.0.1:9", state=Phase.READY, node="n0"), 9, "n0",
                                requested_at=mono(), child=StoppingChild(), started_at=mono()))
    sup._http.put = refuse
    with caplog.at_level(logging.DEBUG, logger="fleetserve.fleet.supervisor"):
        for _ in range(10):
            sup._push_backends()
        sup._http.put = accept
        sup._push_backends()
    said = [r for r in caplog.records if r.levelno >= logging.INFO and "router's backends" in r.getMessage()]
    assert len(tries) == 11 and [r.levelname for r in said] == ["WARNING", "INFO"]
    assert "after 10 failed tries" in said[1].getMessage()
    sup.router, sup._pushed, tries[:] = ExitedChild(code=-9), None, []
    sup.router.alive = lambda: False
    sup._push_backends()
    assert tries == []  # exited: its restart pushes again


def test_a_service_killed_with_an_empty_log_says_so_and_names_the_signal(make, caplog):
    """"router exited with code -9; last log lines:" was followed by nothing."""
    import logging

    from fleetserve.fleet.restarts import Backoff

    sup, _, mono = make(1)
    said = []
    sup.say = said.append
    with caplog.at_level(logging.WARNING, logger="fleetserve.fleet.supervisor"):
        sup._keep_alive(ExitedChild(log="", code=-9), Backoff(), mono(), "prometheus")
    assert said == ["prometheus exited with code -9 (killed by SIGKILL); restarting in 1s"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == "prometheus exited with code -9 (killed by SIGKILL); its log (r0.log) is empty"


def test_a_schedule_floor_holding_the_fleet_is_logged_once(make):
    """`status` said "held by the schedule floor 2: lunch" and the log had no line from the window's start to the
    scale-down at its end (found in a black-box pass); other steady decisions stay unlogged."""
    from fleetserve.autoscale.policy import ScaleDecision

    sup, _, _ = make(0)
    said: list[str] = []
    sup.say = said.append
    state = sup.controller.state
    held = ScaleDecision(2, "steady at 2: concurrency=0 (target 4/replica) (held by the schedule floor 2: lunch)",
                         True, 2, state)
    sup._log_decision("steady", held)
    sup._log_decision("steady", held)  # the next poll: the same decision, not repeated
    sup._log_decision("steady", ScaleDecision(2, "steady at 2: concurrency=8 (target 4/replica)", True, 0, state))
    assert said == ["autoscaler: " + held.reason]
