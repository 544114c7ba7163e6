"""The fleet's state file: how `status` and `down` find a detached fleet, written atomically by its supervisor."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleetserve.engine.paths import home

log = logging.getLogger(__name__)


@dataclass
class ReplicaState:
    id: str
    url: str
    pid: int | None = None
    state: str = "starting"  # pending | starting | ready | restarting | draining | stopped
    restarts: int = 0
    last_exit: int | None = None
    node: str = ""
    instance_type: str = ""
    cold_start_s: float | None = None
    # the router's view of a ready replica: False while its health checks fail (a stalled process the supervisor
    # still sees running read "ready" while the router sent it nothing); None: not known
    router_healthy: bool | None = None
    router_why: str = ""  # why the router sends it nothing: "failing health checks" or "circuit breaker open"


@dataclass
class NodeState:
    id: str
    instance_type: str
    capacity_type: str
    price_per_hour: float
    slots: int
    used: int
    ready: bool
    interrupting: bool = False


@dataclass
class FleetState:
    name: str
    namespace: str
    model: str
    spec_path: str
    supervisor_pid: int
    status: str = "starting"  # starting | ready | stopping | stopped | failed
    # whether this run got as far as ready (None: a state written before this was kept): a start that failed
    # displaces neither the last run's state (its port, its scaling state) nor its logs (fleet/control.py)
    served: bool | None = None
    url: str = ""
    router_pid: int | None = None
    strategy: str = ""
    replicas: list[ReplicaState] = field(default_factory=list)
    error: str = ""
    warnings: list[str] = field(default_factory=list)
    desired: int = 0
    ready: int = 0
    last_decision: dict | None = None
    scaling_state: dict | None = None
    nodes: list[NodeState] = field(default_factory=list)
    cost_per_hour: float = 0.0
    cost_total: float = 0.0
    cost_by_replica: dict[str, float] = field(default_factory=dict)  # each replica's share of its node's slots
    # node time no replica held (a free slot, a node starting or draining) and services (the fleet's Redis): with
    # cost_by_replica they add up to cost_total (a 2-slot machine running one replica had left half unattributed)
    cost_unattributed: float = 0.0
    capacity_log: list[str] = field(default_factory=list)
    metrics_url: str = ""
    tls_cert: str = ""  # the certificate clients should trust (https endpoints)
    l2_url: str = ""  # the Redis the fleet started for the L2 tier
    l2_status: str = ""  # "up", or "restarting (...)" while the supervisor brings it back
    # each tenant's own Redis (kvCache.l2.tenantUrls): {tenant: {"url": without its password, "status": as l2_status}}
    l2_tenants: dict[str, dict[str, str]] = field(default_factory=dict)
    # the fleet's own services restarted after they exited (router, redis, prometheus): a Redis crash and restart
    # had left no trace outside supervisor.log
    service_restarts: dict[str, int] = field(default_factory=dict)
    router_status: str = ""  # "up" once it answers this fleet's admin token; "restarting (exit code ...)"
    redis_pid: int | None = None
    prometheus_url: str = ""  # the fleet's own Prometheus (spec.observability.prometheus), if it runs one
    prometheus_pid: int | None = None
    forkserver_pid: int | None = None  # the engine fork server (fleet/forkserver.py), while one runs
    # the fleet's Prometheus alerts that fire now ("FleetserveErrorBudgetBurnFast (critical)"), read every
    # ALERTS_EVERY_S: they were computed and reached nobody (no Alertmanager is wired locally)
    alerts: list[str] = field(default_factory=list)
    supervisor_start: str = ""  # process_start(supervisor_pid): tells the supervisor from a process reusing its pid
    stop_timeout_s: float = 0.0  # how long a stop may take (the router's drain, then the children): `down` waits so

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> FleetState:
        data = dict(data)
        data["replicas"] = [ReplicaState(**r) for r in data.get("replicas", [])]
        data["nodes"] = [NodeState(**n) for n in data.get("nodes", [])]
        return cls(**data)


def runs_dir() -> Path:
    return home() / "run"


def fleet_dir(name: str) -> Path:
    return runs_dir() / name


def private_fleet_dir(name: str) -> Path:
    """The fleet's run folder, made (or, at a fleet's start, made again) closed to other users. Besides the 0600
    token and key files it holds what their modes alone do not cover: Prometheus's TSDB and WAL (the series name
    the tenants, written 0644 by Prometheus), logs that carry prompts with `logPrompts`, and Redis's files. A
    folder of another owner (a shared FLEETSERVE_HOME) is left as it is, with a warning."""
    folder = fleet_dir(name)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        mode = folder.stat().st_mode & 0o777
        if mode & 0o077 and folder.stat().st_uid == os.geteuid():
            folder.chmod(mode & ~0o077)  # a folder an earlier version made 0755
        elif mode & 0o077:
            log.warning("run folder %s belongs to another user and is readable by others (mode %o): Prometheus's "
                        "data there names the tenants", folder, mode)
    except OSError as exc:
        log.warning("cannot close run folder %s to other users: %s", folder, exc)
    return folder


def write_state(state: FleetState) -> None:
    """Atomically (a temporary file renamed over state.json); a write that fails (a full disk) leaves no temporary
    file behind and raises OSError."""
    folder = fleet_dir(state.name)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".state-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(state.to_json(), f, indent=2)
        os.replace(tmp, folder / "state.json")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_state(name: str) -> FleetState | None:
    """The fleet's state; None when it has none, or one that cannot be read, which is said: such a fleet had
    vanished from `status` and `down` without a word."""
    path = fleet_dir(name) / "state.json"
    try:
        return FleetState.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        if path not in _UNREADABLE_SAID:  # once per command: `down` reads the state several times
            _UNREADABLE_SAID.add(path)
            log.warning("fleet %s: its state %s cannot be read (%s); status and down do not see it: remove the "
                        "file once its processes are stopped", name, path, exc)
        return None


_UNREADABLE_SAID: set[Path] = set()


PREVIOUS = "state.previous.json"


def read_previous_state(name: str) -> FleetState | None:
    """The state an earlier supervisor of this fleet left, if it is gone: `up` after a crash carries on from it.

    `up` moves state.json aside (PREVIOUS) before its supervisor starts (fleet/control.set_aside_last_run); one
    still in place is a supervisor's that started otherwise."""
    folder = fleet_dir(name)
    for file in ("state.json", PREVIOUS):
        try:
            state = FleetState.from_json(json.loads((folder / file).read_text()))
        except (OSError, json.JSONDecodeError, TypeError):
            continue
        if not supervisor_alive(state) and not _failed_start(state.status, state.served):
            return state  # a start that failed is not the last run
    return None


def _failed_start(status: str, served: bool | None) -> bool:
    """A start that failed before it was ready, or whose supervisor died while starting (SIGKILLed: its state
    still reads starting). One stopped by Ctrl-C while starting is a run of its own: its logs are the last run's."""
    return served is False and status in ("failed", "starting")


def failed_start(folder: Path) -> bool:
    """Whether the state this fleet's folder holds is of a start that failed (`_failed_start`); asked while no
    supervisor of the fleet runs (its lock is held)."""
    try:
        data = json.loads((folder / "state.json").read_text())
        return _failed_start(data.get("status"), data.get("served"))
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def serving_note(state: FleetState) -> str:
    """What a running fleet serves, beside its status: "ready" alone read as serving while no replica could be
    placed or none had started yet. Empty when every wanted replica serves."""
    if state.status == "ready" and state.router_status not in ("", "up"):
        return f"router {state.router_status}: nothing is served"
    if state.status != "ready" or state.ready >= max(state.desired, 1):
        return ""
    if state.desired == 0:
        return "no replica wanted; see error" if state.error else "scaled to zero: the next request wakes it"
    # a wake read "no replica serving", as if it were stuck; and once a poll shorter than the cold start had
    # replaced the decision that woke it, so did the rest of the wake: a replica on its way says it too
    woken = str((state.last_decision or {}).get("reason", "")).startswith("activated from zero")
    starting = any(r.state in ("pending", "starting") for r in state.replicas)
    if state.ready == 0 and not state.error:
        if woken:
            return "waking from zero: requests are held until a replica is ready"
        if starting:
            return "a replica is starting: requests are held until one is ready"
    if state.ready == 0 and woken and starting:  # a wake some replicas could not join (no slot for the third):
        # "no replica serving; see error" read as an outage while the held requests were answered
        return "waking from zero: requests are held until a replica is ready; see error"
    serving = "no replica serving" if state.ready == 0 else f"{state.ready} of {state.desired} replicas serving"
    return serving + ("; see error" if state.error else "")


SILENT_AFTER_S = 15.0  # a running supervisor rewrites state.json at least once a second


def _state_age(name: str) -> float | None:
    try:
        return time.time() - (fleet_dir(name) / "state.json").stat().st_mtime
    except OSError:
        return None


def mark_stale(state: FleetState) -> FleetState:
    """What `status` shows for a fleet whose supervisor vanished without writing its end: nothing is ready. One
    whose supervisor lives but has not written its state for SILENT_AFTER_S (stopped with SIGSTOP, hung, or a full
    disk) reads so, and its replicas whose processes are gone read `gone`: `status` had shown a hung supervisor's
    dead replicas ready."""
    if state.status in ("stopped", "failed"):
        return state
    if supervisor_alive(state):
        age = _state_age(state.name)
        # not while it starts: preparing the model (a download of minutes) and Redis block its loop, unwritten
        if age is not None and age > SILENT_AFTER_S and state.status != "starting":
            for r in state.replicas:
                if r.pid and not pid_alive(r.pid):
                    r.state, r.pid = "gone", None
            state.ready = sum(1 for r in state.replicas if r.state in ("ready", "moving"))
            state.error = (f"its supervisor (pid {state.supervisor_pid}) has not written the fleet's state for "
                           f"{age:.0f} s: stopped (SIGSTOP), hung, or its disk is full; this is its last word, "
                           "checked against the processes that still run")
        return state
    state.status = "dead"
    state.ready = 0
    running = False
    for r in state.replicas:
        alive = pid_alive(r.pid)
        running |= alive
        r.state = "stale (process alive)" if alive else "stale"
        r.pid = r.pid if alive else None
        r.router_healthy, r.router_why = None, ""  # the router's last word, from a supervisor that is gone
    # the router's and Prometheus's pids and the router's "up" were the dead supervisor's last word too
    router_alive = pid_alive(state.router_pid)
    state.router_pid = state.router_pid if router_alive else None
    state.router_status = "stale (process alive)" if router_alive else "gone"
    state.prometheus_pid = state.prometheus_pid if pid_alive(state.prometheus_pid) else None
    state.forkserver_pid = state.forkserver_pid if pid_alive(state.forkserver_pid) else None
    if not running:  # nothing runs, so nothing costs: the last $/h and nodes were shown as if billing went on
        state.cost_per_hour, state.nodes = 0.0, []
    return state


def process_start(pid: int) -> str | None:
    """When the process started (clock ticks since boot, /proc/PID/stat), None where that cannot be read: with
    the pid it names one process, which a reused pid does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def supervisor_alive(state: FleetState) -> bool:
    """The fleet's supervisor still runs: its pid is alive and is the same process (a pid reused after the
    supervisor died, or after a reboot, made `status` read ready and `down` SIGTERM an unrelated process)."""
    pid = state.supervisor_pid
    if not pid_alive(pid):
        return False
    now = process_start(pid)
    if state.supervisor_start and now is not None:
        return now == state.supervisor_start
    try:  # a state written before start times were recorded: the process must at least be ours
        return b"fleetserve" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def list_fleets() -> list[FleetState]:
    folder = runs_dir()
    if not folder.is_dir():
        return []
    states = [read_state(p.name) for p in sorted(folder.iterdir()) if p.is_dir()]
    return [s for s in states if s is not None]


def running_fleets() -> list[FleetState]:
    return [s for s in list_fleets() if supervisor_alive(s) and s.status not in ("stopped", "failed")]
