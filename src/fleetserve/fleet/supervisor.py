"""`fleetserve up`: run a spec's router and engine replicas as child processes and keep them as desired.

Start order: resolve the model once (a child process, so the supervisor never loads torch), start the
router (it holds requests while no replica is ready), then launch the initial replicas and wait for them.
From then on one loop, every `poll_interval`:
- replicas move through pending (waiting for a node) -> starting -> ready; a new replica counts only once
  its /health answers, and the router learns about it at once (cold start is measured and exported);
- a crashed replica restarts on the same port with exponential backoff; the router keeps traffic away;
- the autoscale controller decides (KEDA semantics) and the supervisor applies: launch through capacity
  placement, or drain (no new requests, in-flight ones finish, then stop);
- capacity events: spot interruption notices drain the node's replicas (replacements launch), empty nodes
  are consolidated, cost is accounted.
Any stop (signal, failed start, error) stops the router first, then the replicas; nothing outlives it.
Policy paths read the injected clocks (`clock`: wall time, `monotonic`), so tests drive them in virtual time;
only the start-up waits on child processes, which sleep for real, read `time.monotonic` themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import secrets
import shutil
import signal
import ssl
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from fleetserve.api.graceful import EXIT_PORT_TAKEN, ORPHAN_SIGNAL
from fleetserve.api.internal import router_trust_args, write_token_file
from fleetserve.api.limits import engine_body_limit, engine_header_limit, stream_keepalive_s
from fleetserve.autoscale.controller import Controller
from fleetserve.autoscale.failing import STATIC_ZERO, UNPLACED, unplaced, why_failing
from fleetserve.autoscale.policy import ScaleDecision, ScalingPolicy, ScalingState
from fleetserve.autoscale.scaledown import Candidate, moves_to_finish, revivals, spot_drain_due, victims
from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.placement import InsufficientCapacity
from fleetserve.capacity.utilization import load_ratio, target_per_replica
from fleetserve.clock import Clock
from fleetserve.engine.instance import CHALLENGE_HEADER, answered_by, new_challenge, new_instance_id
from fleetserve.engine.instance import ENV as INSTANCE_ENV
from fleetserve.fleet import forkserver, logfiles, prometheus
from fleetserve.fleet.capacity import build_capacity
from fleetserve.fleet.engine_args import builtin_args_problem
from fleetserve.fleet.lifecycle import ROUTER_STATE, SERVING, Phase, advance
from fleetserve.fleet.metrics import SupervisorMetrics
from fleetserve.fleet.process import Child, bind_refusal, fleetserve_command, free_port
from fleetserve.fleet.restarts import Backoff
from fleetserve.fleet.state import (
    FleetState,
    NodeState,
    ReplicaState,
    fleet_dir,
    pid_alive,
    private_fleet_dir,
    process_start,
    read_previous_state,
    write_state,
)
from fleetserve.kvcache.tiers import has_credentials
from fleetserve.observe.vocabulary import decision_reason
from fleetserve.router.auth import key_digest, write_key_file
from fleetserve.router.engine_queue import QUEUE_GAUGES
from fleetserve.router.model_metrics import router_args, scope_for
from fleetserve.router.policies import registered_policies
from fleetserve.router.served import body_check_args, served_model_args
from fleetserve.router.tls import certificate_hosts, ensure_self_signed
from fleetserve.spec.effects import tls_files_problem
from fleetserve.spec.load import LoadedSpec

log = logging.getLogger(__name__)

RESTART_BACKOFF_MAX = 30.0
PORT_TAKEN = "address already in use"  # an engine's log when its port was bound first (errno 98)
MAX_PORT_MOVES = 3
# a replica is stopped once its drain is over (idle, or engine.drainTimeoutSeconds spent): the engine's own wait
# after SIGTERM (uvicorn's graceful shutdown, 5 s by default) only pushed the cut of a stream past the drain time
ENGINE_STOP_GRACE_S = 1.0
CHILD_STOP_S = 10.0  # a child's time to exit after SIGTERM at the fleet's stop, before SIGKILL
ROUTER_EXIT_S = 5.0  # a stopping router's time to exit after its drain, before the replicas stop anyway
REDIS_PASSWORD = "redis.password"  # in the fleet's run folder, 0600
REDIS_SOCKET = "redis.sock"  # the fleet's own Redis listens here, in the 0700 run folder
MAX_SOCKET_PATH = 100  # bytes: sun_path holds 108 with its NUL, and redis-server wants some margin
STOPPED_FAILING = " (it was stopped by a scale-down before it started again; the next replica may fail alike)"
L2_PROBE_S = 10.0  # how often the L2 Redis is pinged for `status` (an external one was never checked)
ALERTS_UNKNOWN = "unknown (the fleet's Prometheus does not answer)"
# evaluations of a restarted Prometheus, from its first answer, before what it no longer fires counts as
# resolved: its alerts read pending until it restored their `for` state (fleet/prometheus.py), which it does at
# its second evaluation, firing again at the third (measured: 14.9 s after its start at a 5 s interval)
ALERTS_SETTLE_EVALUATIONS = 4
MODEL_CARDS_FILE = "model-cards.json"  # the router's learnt model cards, kept across its restarts in a run
ALERTS_EVERY_S = 15.0  # how often the fleet's own Prometheus is asked which alerts fire (for `status`)
# a router alive whose admin API times out: said in status after this, killed (and so restarted) after
# ROUTER_HANG_S, as a Kubernetes liveness probe with its default period and threshold (10 s x 3) would
ROUTER_SILENT_STATUS_S = 5.0
ROUTER_HANG_S = 30.0
# a serving replica whose health checks the router has had no answer to (timeouts, not refusals) for this long is
# killed and restarted (SIGSTOPped, a wedged GPU or event loop): it had stayed "ready" for good, its requests
# held or 502, while Kubernetes' livenessProbe restarts the same engine after 3 x 10 s of 5 s timeouts. Longer
# here: the router's probes time out at 2 s, and a CPU replica busy on two cores may answer one late
REPLICA_HANG_S = 60.0


def engine_url(port: int) -> str:
    """A local replica's address: engines listen on loopback only."""
    return f"http://127.0.0.1:{port}"


BOX = str.maketrans("", "", "│╭╮╰╯─")


# a request line of the access log (observe/logs.py), text or JSON: it carries `error=overloaded` and the like
ACCESS_LINE = re.compile(r"\brequest (request_id|kind)=|\bstatus=\d{3}\b|\"logger\": ?\"fleetserve\.\w+\.access\"")


def killed_by(code: int | None) -> str:
    """" (killed by SIGKILL)" for an exit code that is a signal's, else nothing."""
    if code is not None and code < 0 and -code in signal.valid_signals():
        return f" (killed by {signal.Signals(-code).name})"
    return ""


def log_lines(child: Child | None, lines: int = 20) -> str:
    """The child's last log lines with its log's path, or that the log is empty: "last log lines:" had been
    followed by nothing after a kill -9 of a service that logged nothing."""
    path = child.log_path if child is not None else "-"
    tail = child.log_tail(lines) if child is not None else ""
    return f"last log lines ({path}):\n{tail}" if tail.strip() else f"its log ({path}) is empty"


def last_error(tail: str) -> str:
    """A child's own last error from its log's tail: the message of a CLI error box (an input its restart refuses,
    a port in use), else the last line that says error; never an access-log line."""
    lines = [" ".join(line.translate(BOX).split()) for line in tail.splitlines()]
    boxed = max((i for i, line in enumerate(lines) if line == "Error"), default=None)
    if boxed is not None:
        return " ".join(line for line in lines[boxed + 1:] if line)
    return next((line for line in reversed(lines) if ("error" in line.lower() or "could not" in line.lower())
                 and not ACCESS_LINE.search(line)), "")  # redis-server: "Could not create server TCP listening ..."


FORK_SERVER_RETRY_S = 60.0  # a fork server that died is started again this long after
REAP_EVERY_S = 5.0  # how often orphans adopted as the subreaper are looked for


def reap_adopted(known: set[int | None]) -> None:
    """Reap the exited children this process adopted as a subreaper and did not start (`known`: the pids whose
    exit is someone's to read, Popen's or a ForkedProcess's), so that no zombie of theirs stays behind."""
    for pid in _children() - known:
        try:
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(") ", 1)[1].startswith("Z")
        except (OSError, IndexError):
            continue
        if zombie:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _children() -> set[int]:
    """This process's children: the kernel's list per thread, or a scan of /proc where it keeps none."""
    found: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                found.update(int(p) for p in f.read().split())
        return found
    except OSError:
        pass
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if f.read().rsplit(") ", 1)[1].split()[1] == me:
                        found.add(int(entry))
            except (OSError, IndexError):
                continue
    return found


def router_out(load: dict | None) -> dict[str, str]:
    """The replica URLs the router's load report has out, and why: its breaker open (its probes pass), or its
    health checks failing. `status` had said "failing health checks" for both."""
    return {b["url"]: "circuit breaker open" if b.get("breaker") == "open" else "failing health checks"
            for b in (load or {}).get("backends", []) if b.get("healthy") is False}


class StartupError(Exception):
    """The fleet could not start; the message says which part failed and shows its log. `exit_code` 2: the spec
    names something that is not there (a model source), as the CLI answers bad input."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def local_start_problem(loaded: LoadedSpec) -> str | None:
    """Why `fleetserve up` cannot run this spec's engines on this machine, named by the user's own field (a
    HyperPod file has no engine.kind: its worker image decides), with what does run it; None when it can. Asked
    before a fleet is recorded: a HyperPod spec had left a failed fleet behind, its message naming engine.kind."""
    from fleetserve.spec.effects import local_auth_problem

    if (auth := local_auth_problem(loaded.endpoint)) is not None:  # before anything starts (Redis had)
        return f"{auth.path}: {auth.message.removesuffix(': `fleetserve up` in this environment will refuse to start')}"
    spec = loaded.endpoint.spec
    kind = spec.engine.kind
    if kind == "builtin":
        from fleetserve.spec.effects import local_slots_problem

        return builtin_args_problem(spec.engine.args) or local_slots_problem(spec)
    if kind not in ("vllm", "sglang", "container"):
        return None
    hyperpod = loaded.source_format == "hyperpod"
    field = "spec.worker.image" if hyperpod else "spec.engine.kind"
    image = spec.engine.image
    if kind == "container":
        what, why = f"{field} runs the image {image!r} as given", "and `fleetserve up` runs no containers"
        here = "start the image yourself and give its URL in engine.urls with engine.kind external"
    else:
        what = f"{field} {image!r} is a {kind} server" if hyperpod and image else \
            f"{field} {kind!r} runs the {kind} server"
        why, here = "which needs a GPU; this machine has none", \
            "a fleetserve spec with engine.kind builtin serves a model here"
    return (f"{what}, {why}: `fleetserve simulate` and `verify` run this spec here in virtual time, `fleetserve render "
            f"k8s` deploys it; {here}")


class Interrupted(Exception):
    """A stop was requested while starting."""


@dataclass
class Replica:
    state: ReplicaState
    port: int
    node_id: str
    requested_at: float  # monotonic: when the controller asked for it (cold start starts here)
    child: Child | None = None
    started_at: float = 0.0
    backoff: Backoff = field(default_factory=lambda: Backoff(cap=RESTART_BACKOFF_MAX))
    drain_deadline: float | None = None
    drain_announced: bool = False  # the router was told it drains: its load reports since count no new requests
    drained_from: Phase | None = None  # what it was when its drain began (what it returns to if wanted again)
    port_moves: int = 0  # new ports taken after another process bound the one chosen for it
    crashes_since_ready: int = 0  # crashes since it was last ready: 2 is a crash loop (0 once it is ready)
    instance: str | None = None  # this start's secret, proved in its /health (engine/instance.py)


def stop_groups(router, replicas, redis, prometheus) -> list[list]:
    """The fleet's processes in the order they stop, each group told at once and awaited before the next: what
    serves (router, replicas), then what they use (Redis, Prometheus). A stopping replica writes its queued KV
    blocks to Redis, which had been told to stop with it (those writes failed); Prometheus scrapes to the end."""
    serving = [c for c in [router, *replicas] if c is not None]
    return [g for g in (serving, [c for c in (redis, prometheus) if c is not None]) if g]


def _never_raising(say: Callable[[str], None]) -> Callable[[str], None]:
    """`say`, whose failure to write is ignored: a progress line must never end the supervisor. A closed
    terminal (EIO) or the `| tee` that Ctrl-C ended with it (EPIPE) made the stop's first line raise, and the
    supervisor died halfway through the stop, its fleet marked dead and its requests in flight cut."""
    def quiet(message: str) -> None:
        try:
            say(message)
        except OSError:
            pass
        except ValueError as exc:  # a closed file; anything else is a fault of its own
            if "closed file" not in str(exc):
                raise
        except SystemExit as exc:  # rich's console turns a broken pipe into SystemExit(1); a real exit goes on
            if not isinstance(exc.__context__, OSError):
                raise

    return quiet


class Supervisor:
    def __init__(self, loaded: LoadedSpec, spec_path: str, *, say: Callable[[str], None] = print,
                 poll_interval: float = 0.2, clock: Clock = time.time, monotonic: Clock = time.monotonic,
                 owner_pid: int | None = None):
        self.loaded = loaded
        self.endpoint = loaded.endpoint
        self.spec = loaded.endpoint.spec
        self.name = loaded.endpoint.metadata.name
        self.dir = fleet_dir(self.name)
        self.say = _never_raising(say)
        self.poll_interval = poll_interval
        self.clock = clock  # wall time: cron floors, the controller's windows, cost
        self.monotonic = monotonic  # cold starts, drain deadlines, restart back-off
        self._stop = False
        self._force = False  # a second stop signal: no more waiting for the router's drain
        self.owner_pid = owner_pid  # `up --stop-with`: the fleet lives only as long as this process
        self.replicas: list[Replica] = []
        self._ids = 0
        self.model_dir = ""
        self.router: Child | None = None
        self.router_url = ""
        self.admin_token = secrets.token_hex(16)
        self._token_file: Path | None = None
        self._router_backoff = Backoff(cap=RESTART_BACKOFF_MAX)
        self._redis_backoff = Backoff(cap=RESTART_BACKOFF_MAX)
        self._l2_probe_at = 0.0
        self._l2_prober: threading.Thread | None = None
        self._redis_generation = 0  # moves when our own Redis goes down or comes back: a probe from before is stale
        self.redis: Child | None = None
        self._socket_dir: Path | None = None  # Redis's socket folder when the run folder is too deep for one
        self.l2_url = ""
        self.prometheus: Child | None = None
        self._prometheus_backoff = Backoff(cap=RESTART_BACKOFF_MAX)
        self._prometheus_targets: list | None = None
        self._prometheus_dir: Path | None = None  # set when the fleet runs its own Prometheus
        self._prometheus_query_url = ""  # the fleet's Prometheus with its basic auth (never written to state)
        self._alerts_at = 0.0  # when its firing alerts are read next (monotonic)
        self._router_silent_since: float | None = None  # the router's admin API has not answered since (monotonic)
        self._router_answered = False  # the last read of its /admin/load got an answer, of any status
        self._alerts_known: list[str] = []  # the firing alerts of the last reading (status shows unknown meanwhile)
        self._alerts_settle_until = 0.0  # a restarted Prometheus resolves nothing before this (monotonic)
        self._alerts_settling = False  # restarted, not read since: its first answer starts the settling
        self._rotate_at = 0.0  # when the log files' sizes are checked next (monotonic)
        self.capacity = build_capacity(self.spec, self.endpoint.metadata.namespace, clock())
        self.controller: Controller | None = None
        self._decided_at: float | None = None  # the controller's last decision: its time, and what was logged
        self._logged_decision: tuple[str, int] | None = None
        self.metrics = SupervisorMetrics()
        self.previous = read_previous_state(self.name)  # an earlier supervisor's last word, if it left one
        self.state = FleetState(
            name=self.name,
            namespace=self.endpoint.metadata.namespace,
            model=self.endpoint.served_model_name,
            spec_path=os.path.abspath(spec_path),
            supervisor_pid=os.getpid(),
            served=False,
            supervisor_start=process_start(os.getpid()) or "",
            warnings=[str(w) for w in loaded.warnings],
            # _shutdown: the router's drain and its exit, then every child's stop together
            stop_timeout_s=self.spec.router_drain_seconds + ROUTER_EXIT_S + CHILD_STOP_S,
        )
        self._http = httpx.Client(timeout=1.0, trust_env=False)
        self._pushed: list | None = None
        self._pushed_failing: str | None = None  # the failure the router was last told of, with `_pushed`
        self._push_failures = 0  # failed pushes in a row (the first is said, the rest are not)
        self._in_flight_by_url: dict[str, int] = {}  # the router's last load report, per replica (scale-down order)
        # replica URLs the router's last load report has out, and why (health checks, or an open breaker)
        self._router_out: dict[str, str] = {}
        self._written: tuple | None = None
        self._written_at = 0.0
        self._unwritten: set[str] = set()  # files whose last write failed (a full disk): said once each
        self.forks: forkserver.ForkServer | None = None  # starts the engines warm (fleet/forkserver.py)
        self._subreaper = False  # forked engines are re-parented to this process
        self._forks_retry_at: float | None = None  # when a fork server that died is started again
        self._forks_failures = 0  # fork servers in a row that died without getting ready: the back-off's exponent
        self._reap_at = 0.0  # when adopted orphans are looked for next

    # --- public --------------------------------------------------------------------------------------------

    def request_stop(self, *_args) -> None:
        """The first SIGINT/SIGTERM stops the fleet gracefully (the router lets what it serves finish); a second
        one stops it now."""
        if self._stop:
            self._force = True
        self._stop = True

    def hang_up(self, *_args) -> None:
        """SIGHUP (the terminal of a foreground `up` closed): a graceful stop like SIGTERM, not the default death
        that cut every request in flight; what the stop prints goes nowhere, the terminal being gone."""
        with contextlib.suppress(OSError):
            for fd in (1, 2):
                # a log file (a detached fleet's, `up > log`) keeps what the stop says; a terminal is a character
                # device (isatty asks the terminal itself, which answers EIO once it hung up: it read "no tty")
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, fd)
                    os.close(devnull)
        self.request_stop()

    def run(self, on_ready: Callable[[FleetState], None] | None = None) -> int:
        """Start, supervise until a stop is requested, stop. Returns the process exit code."""
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self.hang_up)
        code = 0
        try:
            self._start()
            self._await_prometheus()
            self.state.status, self.state.served = "ready", True
            self._save()
            if on_ready:  # what announces the fleet: a reader gone (`up | head -3`) does not stop it
                _never_raising(lambda _: on_ready(self.state))("")
            self._supervise()
        except Interrupted:
            self.say("stop requested during start-up")
        except StartupError as exc:
            self.state.status, self.state.error = "failed", str(exc)
            self._save()
            self.say(f"error: {exc}")
            code = exc.exit_code
        except Exception as exc:  # never leave children behind, whatever went wrong
            log.exception("supervisor failed")
            self.state.status, self.state.error = "failed", f"{type(exc).__name__}: {exc}"
            self._save()
            self.say(f"error: {self.state.error}")
            code = 1
        finally:
            self._shutdown()
        return code

    # --- state ---------------------------------------------------------------------------------------------

    def _save(self) -> None:
        s = self.state
        s.replicas = [r.state for r in self.replicas]
        for r in self.replicas:
            # a forked start's pid comes once the fork server has made the process
            if r.state.pid is None and r.child is not None and r.state.state not in (Phase.STOPPED, Phase.RESTARTING) \
                    and r.child.pid is not None and r.child.exit_code() is None:
                r.state.pid = r.child.pid
            r.state.router_healthy = None if r.state.state not in SERVING else r.state.url not in self._router_out
            r.state.router_why = self._router_out.get(r.state.url, "") if r.state.router_healthy is False else ""
        # serving: ready here and not taken out by the router's health checks (a stalled process is both running
        # and useless; status said "ready 2" while the router sent one of them nothing)
        s.ready = sum(1 for r in self.replicas if r.state.state in SERVING and r.state.url not in self._router_out)
        s.desired = self._desired()
        if self.controller and self.controller.last:
            d = self.controller.last
            s.last_decision = {"desired": d.desired, "reason": d.reason, "active": d.active, "floor": d.floor,
                               "at": self._decided_at}
            s.scaling_state = self.controller.state.to_json()
        now = self.clock()
        s.nodes = [NodeState(n.id, n.offering.instance_type, n.offering.capacity_type, n.price_per_hour, n.slots,
                             n.used, n.ready(now), n.interrupt_at is not None) for n in self.capacity.nodes()]
        totals = self.capacity.ledger.totals(now)
        s.cost_per_hour, s.cost_total = totals["per_hour"], totals["total"]
        s.cost_by_replica = totals["by_replica"]
        s.cost_unattributed = round(totals["total"] - sum(s.cost_by_replica.values()), 6)
        s.capacity_log = list(self.capacity.log)[-10:]
        self.metrics.update(s)
        # the loop runs every 0.2 s: write the file when something other than the running cost changed,
        # or once a second for the cost
        snapshot = {**s.to_json(), "cost_total": None, "cost_by_replica": None, "last_decision": None}
        decision = (s.last_decision or {}).get("reason"), (s.last_decision or {}).get("desired")
        now = self.monotonic()
        if (snapshot, decision) != self._written or now - self._written_at >= 1.0:
            if self._written_or_said(lambda: write_state(s), "the fleet's state",
                                     "`fleetserve status` shows the last state written until it can be"):
                self._written, self._written_at = (snapshot, decision), now

    def _written_or_said(self, write, what: str, meanwhile: str, be: str = "is") -> bool:
        """A file the fleet serves on without (a full disk had stopped the whole fleet, "supervisor failed", at
        the state's write and again at the scrape targets'): a failure is said once, the caller tries again at
        the next round, and the write that succeeds again is said."""
        try:
            write()
        except OSError as exc:
            if what not in self._unwritten:
                self.say(f"warning: {what} could not be written ({exc}); serving goes on, {meanwhile}")
            self._unwritten.add(what)
            return False
        if what in self._unwritten:
            self._unwritten.discard(what)
            self.say(f"{what} {be} written again")
        return True

    def _owner_gone(self) -> bool:
        """True (once, and the stop is requested) when the process named by --stop-with has exited."""
        if self.owner_pid is None or self._stop or pid_alive(self.owner_pid):
            return False
        self.say(f"process {self.owner_pid} (--stop-with) exited; stopping the fleet")
        self._stop = True
        return True

    def _check_stop(self) -> None:
        self._owner_gone()
        if self._stop:
            raise Interrupted()

    def _desired(self) -> int:
        if self.controller is not None:
            return self.controller.desired
        return self.spec.replicas if self.spec.engine.kind == "builtin" else 0

    # --- start ---------------------------------------------------------------------------------------------

    def _initial_scaling_state(self, policy: ScalingPolicy) -> ScalingState:
        """After an unclean stop (the previous supervisor was killed), carry on from its scaling state: its
        stabilization windows, cooldown countdown and replica count, instead of starting from the spec."""
        previous = self.previous
        if previous is not None and previous.scaling_state and previous.status not in ("stopped", "failed"):
            try:
                restored = ScalingState.from_json(previous.scaling_state)
            except (KeyError, TypeError, ValueError) as exc:
                self.say(f"previous scaling state not restored ({type(exc).__name__}); starting from the spec")
            else:
                current = min(policy.max_replicas, max(policy.floor(self.clock()), restored.current))
                self.say(f"restored the scaling state of the previous supervisor (pid {previous.supervisor_pid}): "
                         f"{current} replica(s)")
                return dataclasses.replace(restored, current=current)
        return ScalingState.initial(policy, self.spec.replicas, self.clock())

    def _start_fork_server(self) -> None:
        """The engine fork server (fleet/forkserver.py): replicas, restarts and wakes from zero start without
        importing torch again. Not having one only makes starts slower. The supervisor becomes the subreaper its
        forked engines are re-parented to (their parent, as a plain start's)."""
        if not forkserver.enabled() or not (self._subreaper or forkserver.become_subreaper()):
            return
        self._subreaper = True
        drop = self._engine_env_drop()  # no secret of ours in it, as in the engines it forks
        server = forkserver.ForkServer(self.dir / "logs" / "forkserver.log",
                                       {k: v for k, v in os.environ.items() if k not in drop}, self.say)
        try:
            server.start()
        except OSError as exc:
            self.say(f"warning: the engine fork server did not start ({exc}); replicas start as new processes")
            return
        self.forks = server
        self.state.forkserver_pid = server.pid

    def _tend_fork_server(self, mono: float) -> None:
        """A fork server that died is started again a while later (replicas start as new interpreters meanwhile;
        the running ones are the supervisor's children and never noticed); orphans adopted as the subreaper (a
        router's workers after the router was killed) are reaped once they exit."""
        if self.forks is not None and self.forks.ready.is_set():
            self._forks_failures = 0
        if self.forks is not None and self.forks.dead.is_set():
            if self._forks_retry_at is None:  # 1, 2, 4, ... minutes while it never gets ready, at most an hour
                self._forks_retry_at = mono + min(FORK_SERVER_RETRY_S * 2 ** self._forks_failures, 3600.0)
                self._forks_failures += 1
                self.state.forkserver_pid = None
            elif mono >= self._forks_retry_at:
                self._forks_retry_at = None
                self._start_fork_server()
                if self.forks is not None and not self.forks.dead.is_set():
                    self.say("the engine fork server was started again")
        if self._subreaper and mono >= self._reap_at and not (self.forks is not None and self.forks.in_flight()):
            # not while a fork's pid is on its way: that engine is a child of ours no one knows yet
            self._reap_at = mono + REAP_EVERY_S
            known = {c.pid for c in (self.router, self.redis, self.prometheus, self.forks,
                                     *(r.child for r in self.replicas)) if c is not None}
            reap_adopted(known)

    def _engine_env_drop(self) -> frozenset[str]:
        return self._key_env_names() | {"FLEETSERVE_L2_URL", "FLEETSERVE_L2_TENANTS"}

    def _prepare_model(self) -> str:
        """Resolve the model source once, in a child process, and return the local directory."""
        model = self.spec.model
        cmd = fleetserve_command("model", "prepare", model.source)
        if model.revision:
            cmd += ["--revision", model.revision]
        if model.s3_region:
            cmd += ["--region", model.s3_region]
        self.say(f"preparing model {model.source} ...")
        drop = self._key_env_names()  # the download is a child too: no plaintext API key in its environment
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={k: v for k, v in os.environ.items() if k not in drop})
        deadline = time.monotonic() + self.spec.engine.startup_timeout_seconds
        while proc.poll() is None:
            if self._stop or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                self._check_stop()
                raise StartupError(f"model preparation of {model.source} did not finish within "
                                   f"spec.engine.startupTimeoutSeconds ({self.spec.engine.startup_timeout_seconds:g}s)")
            time.sleep(0.1)
        out, err = proc.communicate()
        if proc.returncode != 0:
            self._check_stop()  # a terminal's Ctrl-C reaches the preparing child too: a stop, not a bad model
            last = (err or out).strip().splitlines()[-1:] or ["no output"]
            reason = last[0].removeprefix("error: ")
            raise StartupError(f"spec.model.source: cannot prepare model {model.source}: {reason}", exit_code=2)
        return out.strip().splitlines()[-1]

    def _start(self) -> None:
        private_fleet_dir(self.name)
        self.state.metrics_url = self.metrics.serve()
        self._save()
        kind = self.spec.engine.kind
        problem = local_start_problem(self.loaded)
        if problem:
            raise StartupError(problem, exit_code=2)
        if kind == "builtin":
            self._check_addresses()
            self._start_fork_server()  # its imports overlap the model's preparation and the router's start
            self.model_dir = self._prepare_model()
            self._start_redis()
        self._start_router(list(self.spec.engine.urls) if kind == "external" else [])
        self._start_prometheus()
        if kind != "builtin":
            return
        autoscaling = self.spec.autoscaling
        if autoscaling is not None and autoscaling.enabled:
            policy = ScalingPolicy.from_spec(autoscaling)
            # a trigger without serverAddress asks the fleet's own Prometheus
            own = self._prometheus_query_url or self.state.prometheus_url  # with its basic auth
            queries = tuple((t.server_address or own, t.query) if t.metric == "prometheus"
                            else None for t in autoscaling.triggers)
            self.controller = Controller(policy, self._initial_scaling_state(policy), self._router_load, queries)
        initial = self._desired()
        if initial:
            self.say(f"starting {initial} engine replica(s) ...")
        deadline = time.monotonic() + self.spec.engine.startup_timeout_seconds + \
            self.spec.capacity.simulated.provisioning_delay_seconds
        while True:
            self._check_stop()
            self._reconcile(self.monotonic(), starting_up=True)
            ready = sum(1 for r in self.replicas if r.state.state in SERVING)
            if ready >= initial:
                return
            if self.spec.capacity.provider == "local" and self.state.error.startswith(UNPLACED):  # this machine's
                # slots free up only as replicas drain, and none does while starting: it had waited out the timeout
                raise StartupError(f"{initial} replica(s) wanted at the start and {self.state.error}: raise "
                                   "spec.capacity.localSlots or ask for fewer", exit_code=2)
            if time.monotonic() > deadline:
                why = f": {self.state.error}" if self.state.error else ""  # no capacity: not in any log file
                raise StartupError(f"{ready} of {initial} replica(s) ready after "
                                   f"{self.spec.engine.startup_timeout_seconds:.0f}s{why}; see {self.dir / 'logs'}")
            time.sleep(self.poll_interval)

    def _engine_kind_router_args(self) -> list[str]:
        """What the router counts for engines that do not: HyperPod's model_* series per replica, and the queue
        vLLM and SGLang publish on /metrics only (/admin/load's `waiting`: a queue_depth trigger read nothing
        from them but the router's own queue)."""
        kind, args = self.spec.engine.kind, []
        scope = scope_for(kind)
        if scope is not None:  # the built-in engine's labels: the instance type it reports, its node's (EC2's name
            # on the simulated cloud, `local` on this machine): the spec's `ml.g5.xlarge` split a replica's series
            types = self.spec.placement.instance_types
            placed = len(types) == 1 and self.spec.capacity.provider == "simulated"
            args += router_args(self.endpoint.metadata.namespace, self.endpoint.served_model_name,
                                self.spec.model.version, Catalog.canonical(types[0]) if placed else "local", scope)
        if kind in QUEUE_GAUGES:
            args += ["--queue-metrics", kind]
        return args

    def _check_addresses(self) -> None:
        """The router (and the fleet's Prometheus on a port the spec gives) would exit at once on an address it
        cannot listen on; a port another fleet's router held even read as ready. Checked before the model is
        prepared (a download can take minutes) and again at the router's start."""
        field, problem = bind_refusal(self.spec.router.host, self.spec.router.port)
        if problem:  # the spec's field to change, as `fleetserve router --port` on a taken port says (exit 2)
            raise StartupError(f"spec.router.{field}: {problem}", exit_code=2)
        if (problem := tls_files_problem(self.spec.tls)) is not None:  # a missing file had been a traceback
            raise StartupError(problem, exit_code=2)  # after the model was prepared
        port = self.spec.observability.prometheus.port
        if port and prometheus.wanted(self.spec) and (problem := bind_refusal("127.0.0.1", port)[1]):
            # Prometheus's own "address already in use" came as log lines after the model was prepared
            raise StartupError(f"spec.observability.prometheus.port: {problem}", exit_code=2)

    def _previous_port(self, host: str, url: str | None = None, what: str = "the router",
                       field: str = "spec.router.port") -> int | None:
        """The port this fleet's last router (or `url`: its Prometheus) listened on, while it is free: a start after
        `down` or after a crash keeps the URL its clients (a Grafana data source) were given (every `up` had
        picked a new one). `field` fixes one."""
        if url is None:
            url = self.previous.url if self.previous is not None else None
        try:
            port = urlsplit(url).port if url else None
        except ValueError:
            return None
        if not port:
            return None
        if bind_refusal(host, port)[1] is None:
            return port
        self.say(f"the last run's port {port} is taken: {what} listens on another one ({field} keeps one for good)")
        return None

    def _start_router(self, backends: list[str]) -> None:
        strategy = self.spec.routing.strategy
        if strategy not in registered_policies():
            strategy = "leastload"
        host = self.spec.router.host
        self._check_addresses()
        port = self.spec.router.port or self._previous_port(host) or free_port(host)
        security = self._security_args()
        cmd = fleetserve_command("router", "--host", host, "--port", str(port), "--strategy", strategy,
                                 "--health-path", self.spec.engine.health_path,
                                 "--buffer-size", str(self.spec.router.buffer_size),
                                 "--buffer-timeout", str(self.spec.router.buffer_timeout_seconds),
                                 "--upstream-timeout", str(self.spec.router.upstream_timeout_seconds),
                                 "--stream-idle-timeout", str(self.spec.router.stream_idle_timeout_seconds))
        for url in backends:
            cmd += ["--backend", url]
        if self.spec.router.workers > 1:
            cmd += ["--workers", str(self.spec.router.workers)]
        if self.spec.routing.session_key:
            cmd += ["--session-key", self.spec.routing.session_key]
        if self.spec.engine.invocation_path:
            cmd += ["--invocation-path", self.spec.engine.invocation_path]
        limits = self.spec.request_limits
        if limits.max_concurrent_requests:
            cmd += ["--max-concurrent-per-replica", str(limits.max_concurrent_requests),
                    "--overflow-status", str(limits.overflow_status_code)]
        if limits.max_queue_size is not None:
            cmd += ["--max-queue", str(limits.max_queue_size)]
        cmd += security + self._limit_args() + self._log_args()
        cmd += router_trust_args(self.spec.engine.kind, self.spec.auth.enabled)
        cmd += ["--drain-timeout", str(self.spec.router_drain_seconds)]  # what it serves finishes on a stop
        cmd += self._engine_kind_router_args()
        cmd += served_model_args(self.endpoint.served_model_name, self.spec.engine.kind, self.spec.engine.args)
        cmd += body_check_args(self.spec.engine.kind)
        if served_model_args(self.endpoint.served_model_name, self.spec.engine.kind, self.spec.engine.args):
            # this run's router keeps the cards a replica gave across its own restarts; a new run (another model,
            # another context length) starts without the last run's
            cards = self.dir / MODEL_CARDS_FILE
            cards.unlink(missing_ok=True)
            cmd += ["--model-cards-file", str(cards)]
        self.router = Child("router", cmd, self.dir / "logs" / "router.log",
                            env={"FLEETSERVE_ADMIN_TOKEN": self.admin_token,
                                 "FLEETSERVE_SUPERVISOR_METRICS": self.state.metrics_url},  # /dashboard reads it
                            env_drop=self._key_env_names(),
                            death_signal=signal.SIGTERM)
        self.router.start()
        scheme = "https" if self.spec.tls.enabled else "http"
        self.router_url = f"{scheme}://{host}:{port}"
        self.state.router_pid, self.state.strategy = self.router.pid, strategy
        self.state.url = f"{self.router_url}/v1"
        self._save()
        deadline = time.monotonic() + 60
        while True:
            self._check_stop()
            if self.router.exit_code() is not None:
                taken = bind_refusal(host, port) if self.spec.router.port else ("port", None)
                if taken[1] is not None:  # another server took it since `up` checked it (two fleets started at once):
                    # said as `up` says it, exit 2, not the router's usage panel and exit 1
                    raise StartupError(f"spec.router.{taken[0]}: {taken[1]}", exit_code=2)
                raise StartupError(f"router exited with code {self.router.exit_code()} during start-up; "
                                   f"last log lines ({self.router.log_path}):\n{self.router.log_tail()}")
            # an admin path, which answers only this fleet's token: another server on the port is not our router
            if self._router_load() is not None:
                self.state.router_status = "up"
                return
            if time.monotonic() > deadline:
                raise StartupError(f"router was not ready after 60s; see {self.router.log_path}")
            time.sleep(self.poll_interval)

    def _key_env_names(self) -> frozenset[str]:
        """Environment variables that hold plaintext API keys: the supervisor hashes them for the router, and no
        child sees them (engines, the router, Redis and Prometheus: /proc/PID/environ of Prometheus had held them)."""
        return frozenset(k.key_env for k in self.spec.auth.api_keys if k.key_env)

    def _internal_token_file(self) -> Path:
        """The router-engine shared secret, made once per fleet start (0600, in the fleet's run folder)."""
        path = self.dir / "internal.token"
        if self._token_file is None:
            self._token_file = write_token_file(path)
        return self._token_file

    def _limit_args(self, engine: bool = False) -> list[str]:
        """The size limits: the router's are the spec's; an engine's leave room for what the router adds
        (api/limits.engine_body_limit, engine_header_limit)."""
        limits = self.spec.request_limits
        body = engine_body_limit(limits.max_body_bytes) if engine else limits.max_body_bytes
        headers = engine_header_limit(limits.max_header_bytes) if engine else limits.max_header_bytes
        return ["--internal-token-file", str(self._internal_token_file()),
                "--max-body-bytes", str(body), "--max-header-bytes", str(headers)]

    def _log_args(self) -> list[str]:
        """spec.observability.logFormat / logPrompts (observe/logs.py), for the router and every engine."""
        obs = self.spec.observability
        return ["--log-format", obs.log_format] + (["--log-prompts"] if obs.log_prompts else [])

    def _security_args(self) -> list[str]:
        """Router flags for API keys (hashed into a 0600 file) and TLS (given or self-signed, made here)."""
        args: list[str] = []
        auth = self.spec.auth
        if auth.enabled:
            digests: dict[str, str] = {}
            owner: dict[str, int] = {}
            for i, key in enumerate(auth.api_keys):
                if key.key_sha256:
                    digest = key.key_sha256.lower()
                else:
                    secret = os.environ.get(key.key_env or "")
                    if not secret:
                        raise StartupError(f"spec.auth.apiKeys[{i}].keyEnv: environment variable {key.key_env!r} "
                                           "is not set", exit_code=2)
                    digest = key_digest(secret)
                if digest in digests and digests[digest] != key.tenant:  # the last tenant took the key: the first
                    # vanished, its requests counted, salted and billed as the other's
                    raise StartupError(f"spec.auth.apiKeys[{i}] (tenant {key.tenant!r}) holds the same key as "
                                       f"apiKeys[{owner[digest]}] (tenant {digests[digest]!r}): one key can name one "
                                       "tenant only", exit_code=2)
                digests[digest] = key.tenant
                owner.setdefault(digest, i)
            path = self.dir / "auth.json"
            write_key_file(path, digests)
            args += ["--auth-file", str(path)]
        tls = self.spec.tls
        if tls.enabled:
            if tls.cert_file and tls.key_file:
                cert, key = tls.cert_file, tls.key_file
            else:
                cert_path, key_path = ensure_self_signed(self.dir / "tls", certificate_hosts(self.spec.router.host))
                cert, key = str(cert_path), str(key_path)
            args += ["--tls-cert", cert, "--tls-key", key]
            self.state.tls_cert = cert
            self._http.close()
            self._http = httpx.Client(timeout=1.0, trust_env=False, verify=ssl.create_default_context(cafile=cert))
        return args

    # --- router I/O ----------------------------------------------------------------------------------------

    def _proves_instance(self) -> bool:
        """The built-in engines (and their simulated kind) prove their start's secret in /health; vLLM and SGLang
        do not, and are known by their health answer alone."""
        return self.spec.engine.kind == "builtin"

    def _answers_as(self, r: Replica) -> bool:
        """Its port answers /health 200, as the process started last (another process that bound the port after
        a crash had been taken for the replica, `ready again`, and sent requests and the internal token)."""
        challenge = new_challenge()
        answer = self._get(r.state.url + self.spec.engine.health_path, {CHALLENGE_HEADER: challenge})
        if answer is None:
            return False
        try:
            body = answer.json()
        except ValueError:
            body = None
        return answered_by(body, r.instance if self._proves_instance() else None, challenge)

    def _get(self, url: str, headers: dict | None = None) -> httpx.Response | None:
        try:
            r = self._http.get(url, headers=headers)
            return r if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    def _router_load(self) -> dict | None:
        """The router's /admin/load, or None; `_router_answered` is False only when it timed out (a process that
        answers any status, or refuses the connection, is not hung)."""
        try:
            r = self._http.get(self.router_url + "/admin/load", headers={"x-fleetserve-admin": self.admin_token})
        except httpx.TimeoutException:  # accepted and never answered: a stopped process, a blocked event loop
            self._router_answered = False
            return None
        except httpx.HTTPError:  # refused, or TLS the supervisor does not trust (a certificate rotated on disk):
            self._router_answered = True  # no hang, and a kill would not help
            return None
        self._router_answered = True
        return r.json() if r.status_code == 200 else None

    def _kill_hung(self, load: dict | None) -> None:
        """Kill a serving replica the router's probes have heard nothing from for REPLICA_HANG_S: its exit is then
        a crash like any other, restarted with the crash back-off. Without a load report (the router restarting)
        nothing is judged."""
        silent = {b["url"]: b.get("silent_s") or 0.0 for b in (load or {}).get("backends", [])}
        for r in self.replicas:
            quiet = silent.get(r.state.url, 0.0)
            if quiet < REPLICA_HANG_S or r.state.state not in SERVING or r.child is None or \
                    r.child.exit_code() is not None:
                continue
            self.say(f"replica {r.state.id} (pid {r.child.pid}) has not answered the router's health checks for "
                     f"{quiet:.0f}s (hung: a stopped process, a wedged GPU or event loop): killed, to be restarted")
            log.warning("replica %s hung; last log lines:\n%s", r.state.id, r.child.log_tail(5))
            r.child.signal(signal.SIGKILL)

    def _router_not_answering(self, mono: float) -> None:
        """A router process alive whose admin API times out (SIGSTOPped, its event loop blocked): status
        says so after ROUTER_SILENT_STATUS_S, and after ROUTER_HANG_S it is killed, so it is restarted (it had
        read "up" while every request hung, until someone sent it SIGCONT; `--workers` routers restart a hung
        worker themselves, a single process had nothing)."""
        if self._router_silent_since is None:
            self._router_silent_since = mono
        silent = mono - self._router_silent_since
        if silent >= ROUTER_SILENT_STATUS_S and self.state.router_status in ("up", ""):
            self.state.router_status = "not answering (its admin API times out or refuses)"
            self.say(f"the router (pid {self.router.pid}) does not answer its admin API")
        if silent >= ROUTER_HANG_S:
            self.say(f"the router (pid {self.router.pid}) has not answered for {silent:.0f}s (hung: a stopped "
                     "process, a blocked event loop): killed, to be restarted")
            log.warning("router hung for %.0fs; last log lines:\n%s", silent, self.router.log_tail(5))
            self.router.signal(signal.SIGKILL)
            self._router_silent_since = None

    def _push_backends(self) -> None:
        """The router's backends are the replicas this fleet runs; engines outside it (`engine.urls`) are the
        router's own from its start (pushing the empty list of replicas took them away: every request waited
        in the scale-from-zero buffer until it timed out)."""
        if self.spec.engine.kind == "external":
            return
        entries = [{"url": r.state.url, "state": ROUTER_STATE[Phase(r.state.state)], "name": r.state.id,
                    **({"instance": r.instance} if r.instance else {})}  # the name: its engine's replica label;
                   for r in self.replicas if r.state.state in ROUTER_STATE]  # the instance: what must answer there
        failing = self._failing()
        if entries == self._pushed and failing == self._pushed_failing:
            return
        if self.router is not None and not self.router.alive():
            return  # exited, to be restarted (its restart pushes again): asking it flooded the log 5 times a second
        try:
            self._http.put(self.router_url + "/admin/backends", json={"backends": entries, "failing": failing},
                           headers={"x-fleetserve-admin": self.admin_token}).raise_for_status()
            self._pushed, self._pushed_failing = entries, failing
            for r in self.replicas:
                if r.state.state == Phase.DRAINING:
                    r.drain_announced = True
            if self._push_failures:
                log.info("the router's backends are updated again, after %d failed tries", self._push_failures)
                self._push_failures = 0
        except httpx.HTTPError as exc:
            # said once until it works again: a router that does not answer is retried every tick (~5 a second),
            # and each try's warning buried the lines that say why (its exit, its restart)
            (log.debug if self._push_failures else log.warning)(
                "could not update the router's backends: %s%s", exc,
                "" if self._push_failures else " (retried every tick; said again when it works)")
            self._push_failures += 1
            self._pushed = None

    def _failing(self) -> str | None:
        """Why no replica can start now, for the router to tell the requests it holds (`autoscale/failing.py`,
        which the simulator asks too)."""
        reason = why_failing(
            self._desired(), self.controller is not None, self.spec.engine.kind == "external",
            any(r.state.state in SERVING for r in self.replicas),
            any(r.state.state in (Phase.PENDING, Phase.STARTING) for r in self.replicas), self.state.error,
            # not `restarts`, which counts the fleet's whole life: one crash of a replica that had served, and
            # restarted once long before, told clients no replica could start and to come back in 30 s
            any(r.state.state == Phase.RESTARTING and r.crashes_since_ready >= 2 for r in self.replicas))
        if reason == STATIC_ZERO:
            self.state.error = STATIC_ZERO  # status read "the next request wakes it"
        return reason

    # --- replicas ------------------------------------------------------------------------------------------

    def _engine_command(self, replica_id: str, port: int, instance_type: str) -> list[str]:
        spec, meta = self.spec, self.endpoint.metadata
        slots = max(1, self._desired(), spec.replicas)
        threads = spec.engine.threads or max(1, (os.cpu_count() or 1) // slots)
        cmd = fleetserve_command(
            "engine", "--model", self.model_dir, "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", self.endpoint.served_model_name, "--model-version", spec.model.version,
            "--namespace", meta.namespace, "--instance-type", instance_type, "--replica", replica_id,
            "--threads", str(threads), "--dtype", spec.model.dtype, "--drain-timeout", str(ENGINE_STOP_GRACE_S),
            "--orphan-drain", str(spec.router_drain_seconds + ROUTER_EXIT_S),
            "--stream-keepalive", f"{stream_keepalive_s(spec.router.stream_silence_seconds):g}",
        )
        if spec.model.context_length:
            cmd += ["--context-length", str(spec.model.context_length)]
        kv = spec.kv_cache
        cmd += ["--block-size", str(kv.block_size)]
        if kv.l1.enabled:
            cmd += ["--l1-bytes", str(kv.l1.max_bytes)]
        if self.l2_url and not has_credentials(self.l2_url):  # one with credentials: `_engine_env`
            cmd += ["--l2-url", self.l2_url]
        if self.l2_url and self.redis is not None:  # our own Redis requires a password (a file, never the command
            cmd += ["--l2-password-file", str(self.dir / REDIS_PASSWORD)]  # line)
        if kv.l2.enabled and not any(has_credentials(u) for u in kv.l2.tenant_urls.values()):
            for tenant, url in kv.l2.tenant_urls.items():
                cmd += ["--l2-tenant", f"{tenant}={url}"]
        return cmd + self._limit_args(engine=True) + self._log_args() + list(spec.engine.args)

    def _start_prometheus(self) -> None:
        """The fleet's Prometheus (fleet/prometheus.py), when the spec wants one; its targets follow the replicas."""
        section = self.spec.observability.prometheus
        if not prometheus.wanted(self.spec):
            return
        if prometheus.binary() is None:
            raise StartupError("spec.observability.prometheus.enabled needs the prometheus binary "
                               "(apt-get install prometheus), or set it to false")
        self._prometheus_dir = folder = self.dir / "prometheus"
        prometheus.write_files(folder, self.endpoint, self.name,
                               scrape_interval_s=self.spec.metrics.scrape_interval_seconds,
                               token_file=self._internal_token_file(),
                               router_scheme="https" if self.spec.tls.enabled else "http",
                               router_ca=self.state.tls_cert)
        ns = self.endpoint.metadata.namespace
        prometheus.write_targets(folder, "router", self.name, [prometheus.Target(self.router_url, "router")], ns)
        prometheus.write_targets(folder, "supervisor", self.name,
                                 [prometheus.Target(self.state.metrics_url, "supervisor")], ns)
        self._write_prometheus_targets()
        last = self.previous.prometheus_url if self.previous is not None else ""
        port = section.port or (self._previous_port("127.0.0.1", last, "its Prometheus",
                                                    "spec.observability.prometheus.port") if last else None) \
            or free_port()
        password = prometheus.kept_password(self.dir / prometheus.PASSWORD_FILE) or \
            write_token_file(self.dir / prometheus.PASSWORD_FILE).read_text()
        prometheus.write_web_config(folder, password)
        self.prometheus = prometheus.child(folder, port, section.retention, self.dir / "logs" / "prometheus.log",
                                           self.spec.observability.log_format, env_drop=self._key_env_names())
        self.prometheus.start()
        # not waited for here: it gets ready while the replicas start (see _await_prometheus)
        self.state.prometheus_url, self.state.prometheus_pid = f"http://127.0.0.1:{port}", self.prometheus.pid
        self._prometheus_query_url = prometheus.with_credentials(self.state.prometheus_url, password)
        self._save()

    def _await_prometheus(self) -> None:
        if self.prometheus is None:
            return
        deadline = time.monotonic() + 60
        while self._get(self._prometheus_query_url + "/-/ready") is None:
            self._check_stop()
            if self.prometheus.exit_code() is not None:
                raise StartupError(f"prometheus exited with code {self.prometheus.exit_code()} during start-up; "
                                   f"last log lines ({self.prometheus.log_path}):\n{self.prometheus.log_tail()}")
            if time.monotonic() > deadline:
                raise StartupError(f"prometheus was not ready after 60s; see {self.prometheus.log_path}")
            time.sleep(self.poll_interval)

    def _write_prometheus_targets(self) -> None:
        """Rewrite the engine targets file when the replicas whose process may serve have changed."""
        if self._prometheus_dir is None:
            return
        # ready ones only (and draining): Prometheus scrapes with the internal token, and a starting replica's port
        # may be held by another process (one that bound a crashed replica's port got the token from its scrapes)
        live = (*SERVING, Phase.DRAINING)
        targets = [prometheus.Target(r.state.url, "engine", r.state.id, r.state.instance_type)
                   for r in self.replicas if r.state.state in live]
        if targets != self._prometheus_targets and self._written_or_said(
                lambda: prometheus.write_targets(self._prometheus_dir, "engine", self.name, targets,
                                                 self.endpoint.metadata.namespace),
                "Prometheus' scrape targets", "the replicas that came or went are scraped once they can be", "are"):
            self._prometheus_targets = targets

    def _start_redis(self) -> None:
        """The L2 tier: the spec's Redis URL, or a redis-server of our own that evicts LRU at its cap; each
        tenant's own Redis is probed with it (status shows each)."""
        l2 = self.spec.kv_cache.l2
        if not l2.enabled:
            return
        if l2.url:
            from fleetserve.kvcache.tiers import split_credentials

            self.l2_url = l2.url
            self.state.l2_url = split_credentials(l2.url)[0]  # shown by status: never its password
            self._probe_l2(self.monotonic(), wait=True)
            if self.state.l2_status != "up":
                self.say(f"L2 Redis at {self.state.l2_url} is {self.state.l2_status}: engines serve from L1 and "
                         "recompute until it answers")
            self._probe_tenant_l2s()  # after l2_url: a tenant on the shared server takes its password
            return
        self._probe_tenant_l2s()  # none is on our own Redis (a socket in the fleet's private folder)
        if not shutil.which("redis-server"):
            raise StartupError("spec.kvCache.l2.enabled needs redis-server (apt-get install redis-server) "
                               "or spec.kvCache.l2.url pointing at a Redis")
        # AUTH: any local process could otherwise read blocks or plant forged ones under a tenant's keys. The
        # password lives in 0600 files (Redis's config, the engines' password file), never on a command line.
        password = write_token_file(self.dir / REDIS_PASSWORD).read_text()
        config = self.dir / "redis.conf"
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"requirepass {password}\n")
        # a unix socket in the run folder (0700): no other user can bind it or reach it. On a TCP port, a process
        # that bound it while Redis restarted got every engine's AUTH, password and all, and the restart kept the
        # password (`redis-cli -a` then read and planted blocks). A run folder too deep for a socket's path: it
        # lies in a short private folder of its own (mkdtemp: 0700, removed at the stop)
        sock = self.dir / REDIS_SOCKET
        if len(str(sock).encode()) > MAX_SOCKET_PATH:
            import tempfile

            self._socket_dir = Path(tempfile.mkdtemp(prefix="fleetserve-redis-", dir="/tmp"))
            sock = self._socket_dir / REDIS_SOCKET
        sock.unlink(missing_ok=True)
        self.l2_url = f"unix://{sock}?db=0"
        self.redis = Child("redis", ["redis-server", str(config), "--port", "0", "--unixsocket", str(sock),
                                     "--unixsocketperm", "600", "--save", "",
                                     "--appendonly", "no", "--maxmemory", str(l2.max_bytes),
                                     "--maxmemory-policy", "allkeys-lru", "--dir", str(self.dir)],
                           self.dir / "logs" / "redis.log", env_drop=self._key_env_names())
        self.redis.start()
        self.state.l2_url, self.state.l2_status, self.state.redis_pid = self.l2_url, "up", self.redis.pid
        deadline = time.monotonic() + 30
        import socket

        while True:
            if self.redis.exit_code() is not None:
                raise StartupError(f"redis-server exited during start-up:\n{self.redis.log_tail()}")
            with socket.socket(socket.AF_UNIX) as probe:
                if probe.connect_ex(str(sock)) == 0:
                    return
            if time.monotonic() > deadline:
                raise StartupError("redis-server did not listen within 30s")
            time.sleep(0.1)

    def _launch(self, mono: float) -> bool:
        """Ask capacity for a slot and create a replica on it; False when there is no capacity now."""
        rid = f"r{self._ids}"
        slot = self.capacity.acquire(rid, self.clock())
        if isinstance(slot, InsufficientCapacity):
            self.state.error = unplaced(slot.reason)
            return False
        self._ids += 1
        if self.state.error.startswith(UNPLACED):  # placed now; a crash loop's error stays
            self.state.error = ""
        port = free_port()
        node = slot.node
        state = ReplicaState(rid, engine_url(port), state=Phase.PENDING, node=node.id,
                             instance_type=node.offering.instance_type)
        self.replicas.append(Replica(state, port, node.id, requested_at=mono))
        return True

    def _engine_env(self) -> dict[str, str]:
        """L2 URLs that carry a password go to the engine in its environment (/proc/PID/environ is its owner's
        alone), not on its command line, which any local user reads (`ps`): a spec's l2.url with a password had
        been there in full."""
        env = {}
        if self.l2_url and has_credentials(self.l2_url):
            env["FLEETSERVE_L2_URL"] = self.l2_url
        tenants = self.spec.kv_cache.l2.tenant_urls if self.spec.kv_cache.l2.enabled else {}
        if any(has_credentials(u) for u in tenants.values()):
            env["FLEETSERVE_L2_TENANTS"] = " ".join(f"{t}={u}" for t, u in tenants.items())
        return env

    def _spawn(self, r: Replica, mono: float) -> None:
        if r.child is None:
            r.child = Child(r.state.id, self._engine_command(r.state.id, r.port, r.state.instance_type),
                            self.dir / "logs" / f"{r.state.id}.log", env=self._engine_env(),
                            env_drop=self._engine_env_drop(),
                            death_signal=ORPHAN_SIGNAL)  # this supervisor dies: it drains as the router does
        r.child.forks = self.forks  # the fork server of now: one started again after a death is a new one
        if self._proves_instance():  # a fresh secret per start: what answers its port must be this process
            r.instance = new_instance_id()
            r.child.env = {**(r.child.env or {}), INSTANCE_ENV: r.instance}
        r.child.start()
        r.started_at = mono
        r.state.state = advance(r.state.state, Phase.STARTING)
        r.state.pid = r.child.pid

    def _crashed(self, r: Replica, code: int | None, mono: float, why: str, starting_up: bool) -> None:
        if r.instance is not None:  # until its restart, no process answers as it: a /health body the dead one
            r.instance = new_instance_id()  # gave, replayed by whatever binds the port, is not taken for it
        if r.node_id in self.capacity.interrupting() and not starting_up:
            # its node goes: restarted there, it counted as active again, its replacement was scaled away, and
            # it served until the node was terminated under it
            self.say(f"replica {r.state.id} {why} on node {r.node_id}, which has a spot interruption notice; "
                     "not restarted there (its replacement starts elsewhere)")
            self._remove(r)
            return
        if code is not None and r.port_moves < MAX_PORT_MOVES and r.child is not None and (
                code == EXIT_PORT_TAKEN  # the built-in engines say so by their exit (api/graceful.bind_port)
                or PORT_TAKEN in r.child.log_tail(this_run=True).lower()):  # vLLM, SGLang: not an earlier run's line
            # another process bound the free port between its choice and the engine's bind (a busy machine):
            # not a crash of the engine, and the same port would fail every restart, and `up` with it
            r.port_moves += 1
            r.port = free_port()
            r.state.url = engine_url(r.port)
            r.child = None  # the command names the port: built again
            r.state.state = advance(r.state.state, Phase.RESTARTING)
            r.state.last_exit, r.state.pid = code, None
            r.backoff.restart_at = mono  # at once
            self.say(f"replica {r.state.id}: another process took its port; starting it on {r.port}")
            return
        if starting_up:
            raise StartupError(f"replica {r.state.id} {why} during start-up; {log_lines(r.child)}")
        delay = r.backoff.crashed(mono)
        r.crashes_since_ready += 1
        r.state.state = advance(r.state.state, Phase.RESTARTING)
        r.state.last_exit, r.state.pid = code, None
        r.requested_at = mono  # the restart's cold start counts from the crash, not from the first launch
        self.say(f"replica {r.state.id} {why}; restarting in {delay:.0f}s")
        # `status` says it (it showed a fleet crash-looping at zero as ready, the cause only in the logs)
        # its own last error, never an access-log line: after a kill -9 the last line was an earlier request's, as
        # if that request had crashed it; a signal is named
        cause = last_error(r.child.log_tail() if r.child else "")
        killed = killed_by(code)
        # no counts: the error stands until the replica is ready again, and counts in it went stale beside the
        # table's `restarts` ("restart 2" beside 1, then "restarts: 0" beside 1)
        self.state.error = (f"replica {r.state.id} {why}{killed} and is restarting"
                            + (f"; its last error: {cause[:300]}" if cause else ""))

    def _tend(self, r: Replica, mono: float, starting_up: bool) -> None:
        s = r.state
        if s.state == Phase.PENDING:
            node = next((n for n in self.capacity.nodes() if n.id == r.node_id), None)
            if node is None:
                self._remove(r)  # its node went away before the replica started
            elif node.ready(self.clock()):
                self._spawn(r, mono)
            return
        if s.state == Phase.RESTARTING:
            if r.backoff.due(mono):
                s.restarts += 1
                self._spawn(r, mono)
            return
        code = r.child.exit_code() if r.child else None
        if s.state in (Phase.STARTING, *SERVING) and code is not None:
            self._crashed(r, code, mono, f"exited with code {code}", starting_up)
            return
        if s.state == Phase.STARTING:
            if self._answers_as(r):
                s.state = advance(s.state, Phase.READY)
                r.crashes_since_ready = 0
                cold = mono - r.requested_at
                s.cold_start_s = round(cold, 3)
                self.metrics.cold_start.observe(cold)
                if s.restarts:
                    self.say(f"replica {s.id} is ready again")
                if self.state.error.startswith(f"replica {s.id} ") or self.state.error.endswith(STOPPED_FAILING):
                    self.state.error = ""  # its crash loop is over, or a replica starts where a gone one failed
            elif mono - r.started_at > self.spec.engine.startup_timeout_seconds:
                r.child.stop(timeout=5)
                self._crashed(r, None, mono, "did not become ready within spec.engine.startupTimeoutSeconds "
                              f"({self.spec.engine.startup_timeout_seconds:g}s)", starting_up)

    def _drain(self, r: Replica, mono: float) -> None:
        if r.state.state in (Phase.DRAINING, Phase.STOPPED):
            return
        if r.state.state in (Phase.PENDING, Phase.RESTARTING) or r.child is None:
            self._remove(r)
            return
        r.drained_from = Phase(r.state.state)
        r.state.state = advance(r.state.state, Phase.DRAINING)
        r.drain_deadline = mono + self.spec.engine.drain_timeout_seconds

    def _revive(self, r: Replica) -> None:
        """A draining replica wanted again: it serves on (or goes on starting) instead of a new one."""
        back = Phase.STARTING if r.drained_from == Phase.STARTING else Phase.READY
        r.state.state = advance(r.state.state, back)
        r.drain_deadline, r.drain_announced, r.drained_from = None, False, None
        self.say(f"replica {r.state.id} was draining and is wanted again: back to {back.value} (no cold start)")

    def _finish_drains(self, mono: float, load: dict | None) -> None:
        in_flight = {b["url"]: b["in_flight"] for b in (load or {}).get("backends", [])}
        for r in [r for r in self.replicas if r.state.state == Phase.DRAINING]:
            # idle by a load report read after the router knew it drains: one read earlier in the same round
            # showed 0 in flight, the replica was stopped, and the router, not told yet, sent it new requests
            idle = r.drain_announced and self._pushed is not None and in_flight.get(r.state.url) == 0
            if idle or (r.drain_deadline is not None and mono >= r.drain_deadline):
                self._remove(r)

    def _remove(self, r: Replica) -> None:
        if self.state.error.startswith(f"replica {r.state.id} "):
            if r.crashes_since_ready and not any(o is not r and o.state.state in SERVING for o in self.replicas):
                # it never started again and none serves: the next replica may fail alike, and the 503 its clients
                # got sends them to `status` (which had read "ready, scaled to zero" at once)
                self.state.error = self.state.error.replace(" and is restarting", "", 1) + STOPPED_FAILING
            else:  # it had served since: its crash is over
                self.state.error = ""
        if r.child is not None:
            r.child.stop(timeout=10)
        r.state.state, r.state.pid = advance(r.state.state, Phase.STOPPED), None
        self.capacity.release(r.state.id, r.node_id, self.clock())
        self.replicas.remove(r)

    def _scale_to(self, desired: int, mono: float) -> None:
        """Launch or drain to `desired`. Moving replicas (on a node being consolidated) do not count: their
        replacements are launched here, and they drain once enough replacements are ready."""
        active = [r for r in self.replicas if r.state.state not in (Phase.DRAINING, Phase.MOVING)]
        if len(active) >= desired and self.state.error.startswith(UNPLACED):  # nothing is wanted that lacks a
            self.state.error = ""  # place now: the shortage's error had stayed for good (status, the router's 503)
        if len(active) < desired:
            # a draining replica whose process died is not brought back (its next round would find it gone)
            draining = [r for r in self.replicas if r.state.state == Phase.DRAINING
                        and r.child is not None and r.child.exit_code() is None]
            for r in revivals(draining, lambda r: r.node_id, lambda r: r.drain_deadline, self.capacity.leaving(),
                              desired - len(active)):
                self._revive(r)
                active.append(r)
            for _ in range(desired - len(active)):
                if not self._launch(mono):
                    self._cancel_moves("no capacity for the replacement replicas")
                    break
        elif len(active) > desired:
            used = {n.id: n.used for n in self.capacity.nodes()}
            by_id = {r.state.id: r for r in active}
            in_flight = self._in_flight_by_url
            candidates = [Candidate(r.state.id, str(r.state.state), r.node_id, int(r.state.id[1:]),
                                    in_flight.get(r.state.url, 0)) for r in active]
            prices = {n.id: n.price_per_hour for n in self.capacity.nodes()}
            for c in victims(candidates, used, len(active) - desired, prices):
                self._drain(by_id[c.id], mono)
        moving = [r for r in self.replicas if r.state.state == Phase.MOVING]
        ready = sum(1 for r in self.replicas if r.state.state == Phase.READY)
        for r in moves_to_finish(moving, lambda r: r.node_id, self.capacity.interrupting(), ready, desired):
            self._drain(r, mono)  # its replacement is ready: make-before-break

    def _apply_consolidation(self, removals) -> None:
        """Underutilized nodes are cordoned by the capacity manager; their ready replicas start moving."""
        for removal in removals:
            if removal.reason != "Underutilized":
                continue
            on_node = [r for r in self.replicas if r.node_id == removal.node_id and r.state.state == Phase.READY]
            for r in on_node:
                r.state.state = advance(r.state.state, Phase.MOVING)
            if on_node:
                why = "a cheaper node replaces it" if removal.replacement is not None else "it is underutilized"
                self.say(f"consolidation: node {removal.node_id}: {why}; moving {len(on_node)} replica(s)")

    def _drain_interrupted(self, mono: float) -> None:
        """Replicas moving off a noticed spot node drain at the latest a drain timeout before it goes."""
        going, now = self.capacity.interrupting(), self.clock()
        for r in self.replicas:
            if r.state.state == Phase.MOVING and r.node_id in going and \
                    spot_drain_due(going[r.node_id], now, self.spec.engine.drain_timeout_seconds):
                self._drain(r, mono)

    def _cancel_moves(self, why: str) -> None:
        going = self.capacity.interrupting()  # a replica on a node that goes cannot stay: it drains at its deadline
        moving = [r for r in self.replicas if r.state.state == Phase.MOVING and r.node_id not in going]
        if not moving:
            return
        for r in moving:
            r.state.state = advance(r.state.state, Phase.READY)
        self.capacity.uncordon_all(why)
        self.say(f"consolidation cancelled: {why}")

    def _capacity_events(self, mono: float) -> None:
        for event in self.capacity.poll(self.clock()):
            on_node = [r for r in self.replicas if r.node_id == event.node_id]
            if event.kind == "interruption-notice":  # make-before-break: the ready ones move (scaledown.py)
                serving = sum(1 for r in on_node if r.state.state in (Phase.READY, Phase.MOVING))
                self.say(f"spot interruption notice for node {event.node_id}: moving {serving} serving replica(s), "
                         f"stopping {len(on_node) - serving} not serving yet")
                for r in on_node:
                    if r.state.state == Phase.READY:
                        r.state.state = advance(r.state.state, Phase.MOVING)
                    elif r.state.state != Phase.MOVING:  # not serving yet: nothing to keep
                        self._drain(r, mono)
            elif event.kind == "terminated":
                for r in on_node:
                    self._remove(r)

    def _autoscale(self, load: dict | None) -> ScaleDecision | None:
        """One controller step at the injected wall clock (no processes: tests drive it in virtual time)."""
        if self.controller is None:
            return None
        now = self.clock()
        if not self.controller.due(now, int(load["pending"]) if load else 0):
            return None
        decision = self.controller.tick(now, load)
        kind = decision_reason(decision.reason)
        self.metrics.decisions.labels(reason=kind).inc()
        self._decided_at = now
        self._log_decision(kind, decision)
        return decision

    def _log_decision(self, kind: str, decision: ScaleDecision) -> None:
        """The metric's label is the decision's kind; its full text (the trigger's value, the target, the counts)
        goes to the supervisor's log, once per change: a decision that holds (the same kind and count, polled
        every pollingInterval) is not repeated, and steady ones are not written, but for a schedule window's floor
        holding the fleet (the log had nothing from a window's start to the scale-down at its end)."""
        logged = (kind, decision.desired)
        if logged == self._logged_decision:
            return
        previous, self._logged_decision = self._logged_decision, logged
        if kind == "cooldownPeriod elapsed" and previous is not None:  # the counts, as every other change says them
            self.say(f"autoscaler: scale to zero {previous[1]} -> 0: {decision.reason}")
        elif kind != "steady" or "(held by the schedule floor" in decision.reason:
            self.say(f"autoscaler: {decision.reason}")
        elif previous is not None and previous[0] in ("metrics not ready", "fallback"):  # its last word had stood
            self.say(f"autoscaler: {decision.reason} (metrics read again)")

    def _reconcile(self, mono: float, starting_up: bool = False) -> None:
        self._capacity_events(mono)
        load = self._router_load() if self.router else None
        if load is not None:
            self.state.router_status = "up"
            self._router_silent_since = None
        elif self.router is not None and self.router.alive() and not starting_up and not self._router_answered:
            self._router_not_answering(mono)
        else:
            self._router_silent_since = None
        self._in_flight_by_url = {b["url"]: b["in_flight"] for b in (load or {}).get("backends", [])}
        # unknown without a report (the router restarting): the supervisor's own view stands, not a stale one
        self._router_out = router_out(load)
        self._kill_hung(load)
        if not starting_up:
            self._autoscale(load)
        self._scale_to(self._desired(), mono)
        self._drain_interrupted(mono)
        for r in list(self.replicas):
            self._tend(r, mono, starting_up)
        self._finish_drains(mono, load)
        serving = sum(1 for r in self.replicas if r.state.state in SERVING)
        target = target_per_replica(self.controller.policy if self.controller else None)
        ratio = load_ratio(load["in_flight"], load["pending"], target, serving) if load is not None else 0.0
        self._apply_consolidation(self.capacity.consolidate(self.clock(), ratio))
        self.capacity.release_interrupted(self.clock())
        self._push_backends()
        self._write_prometheus_targets()
        self._save()

    # --- supervise -----------------------------------------------------------------------------------------

    def _supervise(self) -> None:
        while not self._stop and not self._owner_gone():
            mono = self.monotonic()
            self._reconcile(mono)
            if self._keep_alive(self.router, self._router_backoff, mono, "router"):
                self.state.router_pid = self.router.pid
                self.state.router_status = "restarted, not answering yet"
                self._pushed = None
            if self._keep_alive(self.redis, self._redis_backoff, mono, "redis-server (the L2 tier)"):
                self.state.l2_status, self.state.redis_pid = "up", self.redis.pid
                self._redis_generation += 1
            if self._keep_alive(self.prometheus, self._prometheus_backoff, mono, "prometheus"):
                self.state.prometheus_pid = self.prometheus.pid
                # its first evaluations see its alerts pending until it restored their state from its TSDB: the
                # settling is timed from its first answer (a slow WAL replay had outlasted a window from its start)
                self._alerts_settling = True
            self._probe_l2(mono)
            self._read_alerts(mono)
            self._rotate_logs(mono)
            self._tend_fork_server(mono)
            time.sleep(self.poll_interval)

    def _rotate_logs(self, mono: float) -> None:
        """The run folder's log files past observability.logMaxBytes, rotated (fleet/logfiles.py)."""
        if mono < self._rotate_at:
            return
        self._rotate_at = mono + logfiles.ROTATE_EVERY_S
        paths = [*sorted((self.dir / "logs").glob("*.log")), self.dir / "supervisor.log"]
        rotated = set(logfiles.rotate_over(paths, self.spec.observability.log_max_bytes))
        for path in sorted(rotated):
            log.info("rotated %s (past %d bytes)", path, self.spec.observability.log_max_bytes)
        for child in (self.router, self.redis, self.prometheus, *(r.child for r in self.replicas)):
            if child is not None and child.log_path in rotated:  # this run's lines now start at the top
                child.log_start = 0

    def _read_alerts(self, mono: float) -> None:
        """The alerts the fleet's own Prometheus fires now, for `status` (every ALERTS_EVERY_S). They were evaluated
        and reached nobody: no Alertmanager is wired to a local Prometheus, and status said nothing."""
        if not self._prometheus_query_url or mono < self._alerts_at:
            return
        self._alerts_at = mono + ALERTS_EVERY_S
        r = self._get(self._prometheus_query_url + "/api/v1/alerts")
        if r is None:  # not answering (starting, restarting): the last reading is no reading
            if self.state.alerts != [ALERTS_UNKNOWN]:
                self.state.alerts = [ALERTS_UNKNOWN]
                self._save()
            return
        try:
            alerts = r.json()["data"]["alerts"]
            firing = {f"{a['labels']['alertname']} ({a['labels'].get('severity', 'none')})"
                      for a in alerts if a.get("state") == "firing"}
        except (ValueError, KeyError, TypeError):
            return
        if self._alerts_settling:
            self._alerts_settling = False
            self._alerts_settle_until = mono + ALERTS_SETTLE_EVALUATIONS * self.spec.metrics.scrape_interval_seconds
        before = set(self._alerts_known)  # a Prometheus that did not answer for a while neither resolved nor fired
        if mono < self._alerts_settle_until:  # restarted: what fired before still does until it says otherwise
            firing |= before
        for alert in sorted(firing - before):  # a warning in the log: a WARNING filter had missed a critical page
            self.say(f"warning: alert firing: {alert}")
        for alert in sorted(before - firing):
            self.say(f"alert resolved: {alert}")
        self._alerts_known = sorted(firing)
        if self._alerts_known != self.state.alerts:
            self.state.alerts = self._alerts_known
            self._save()

    def _tenant_l2_password(self, url: str) -> str | None:
        """What the engines send a tenant's Redis: the shared L2's password when it is on that server."""
        from fleetserve.kvcache.redis_urls import same_server_password

        own = (self.dir / REDIS_PASSWORD).read_text() if self.redis is not None else None
        return same_server_password(url, self.l2_url, own)

    def _probe_tenant_l2s(self) -> None:
        from fleetserve.kvcache.tiers import redis_health, split_credentials

        for tenant, url in sorted(self.spec.kv_cache.l2.tenant_urls.items()):
            entry = self.state.l2_tenants[tenant] = {"url": split_credentials(url)[0],
                                                     "status": redis_health(url, self._tenant_l2_password(url))}
            if entry["status"] != "up":
                self.say(f"L2 Redis of tenant {tenant} at {entry['url']} is {entry['status']}: that tenant's "
                         "requests are served from L1 and recompute until it answers")

    def _probe_l2(self, mono: float, wait: bool = False) -> None:
        """Ping the L2 Redis and each tenant's every L2_PROBE_S: `status` said nothing of an unreachable external
        one, and a stopped (SIGSTOP) own one still read "up". On a thread of its own (`wait`: here), so that Redis
        servers that do not answer (0.5 s each, DNS unbounded) never hold the loop that tends the replicas."""
        if not (self.l2_url or self.state.l2_tenants) or mono < self._l2_probe_at:
            return
        if self._l2_prober is not None and self._l2_prober.is_alive():
            return
        self._l2_probe_at = mono + L2_PROBE_S
        if wait:
            self._probe_l2_now()
            return
        self._l2_prober = threading.Thread(target=self._probe_l2_now, name="l2-probe", daemon=True)
        self._l2_prober.start()

    def _probe_l2_now(self) -> None:
        from fleetserve.kvcache.tiers import redis_health

        try:
            generation = self._redis_generation
            if self.l2_url and not self.state.l2_status.startswith("restarting"):
                password = (self.dir / REDIS_PASSWORD).read_text() if self.redis is not None else None
                status = redis_health(self.l2_url, password)
                # our own one went down, or came back, while it was asked: what the loop said then stays
                if generation == self._redis_generation and not self.state.l2_status.startswith("restarting"):
                    self._l2_changed("the L2 Redis", self.state.l2_status, status)
                    self.state.l2_status = status
            for tenant, entry in list(self.state.l2_tenants.items()):  # a tenant's own: it was never checked
                url = self.spec.kv_cache.l2.tenant_urls[tenant]
                status = redis_health(url, self._tenant_l2_password(url))
                self._l2_changed(f"tenant {tenant}'s L2 Redis", entry.get("status", ""), status)
                entry["status"] = status
        except Exception:  # noqa: BLE001 - a probe that fails says so in the log, and the next one tries again
            log.exception("probing the L2 Redis failed")

    def _l2_changed(self, what: str, before: str, now: str) -> None:
        """One line when an L2 Redis goes down, read-only or back (only `status` had said so, and each engine)."""
        word = lambda status: status.split(" ", 1)[0]  # noqa: E731  up, unreachable, not, read-only, refused...
        if before and word(before) != word(now):
            self.say(f"{what}: {now}" + (" again" if now == "up" else f" (was {before})"))

    def _keep_alive(self, child: Child | None, backoff: Backoff, mono: float, what: str) -> bool:
        """Restart a supervised service that exited, after its back-off; True when it was restarted now."""
        if child is None or self._stop:
            return False
        if backoff.restart_at is None:
            code = child.exit_code()
            if code is None:
                return False
            delay = backoff.crashed(mono)
            self.say(f"{what} exited with code {code}{killed_by(code)}; restarting in {delay:.0f}s")
            log.warning("%s exited with code %s%s; %s", what, code, killed_by(code), log_lines(child, 5))
            last = last_error(child.log_tail(12))
            restarting = f"restarting (exit code {code}{': ' + last[-200:] if last else ''})"
            if child is self.redis:  # its cause too (a port taken: "bind: Address already in use"), as the router's
                self.state.l2_status = restarting
                self._redis_generation += 1
            if child is self.router:  # the fleet serves nothing meanwhile: status must not read plain "ready"
                self.state.router_status = restarting
            return False
        if not backoff.due(mono):
            return False
        child.start()
        service = "router" if child is self.router else "redis" if child is self.redis else "prometheus"
        self.state.service_restarts[service] = self.state.service_restarts.get(service, 0) + 1
        self.metrics.service_restarts.labels(service).inc()
        self.say(f"{what} restarted (pid {child.pid})")
        return True

    # --- stop ----------------------------------------------------------------------------------------------

    def _drain_router(self) -> None:
        """Stop the router first and wait while it lets the streams it proxies finish (its --drain-timeout), the
        replicas still running: stopping everything at once cut every stream with a bare connection reset
        (`fleetserve down` 4 s into a 400-token stream). A second Ctrl-C stops waiting."""
        router = self.router
        if router is None or not router.alive():
            return
        grace = self.spec.router_drain_seconds
        router.signal(signal.SIGTERM)
        started = time.monotonic()
        told = False
        while router.alive() and time.monotonic() < started + grace + ROUTER_EXIT_S and not self._force:
            if not told and time.monotonic() > started + 1.0:
                self.say(f"letting requests under way finish (up to {grace}s; Ctrl-C again to stop now) ...")
                told = True
            time.sleep(0.05)

    def _shutdown(self) -> None:
        if self.state.status != "failed":
            self.state.status = "stopping"
            self._save()
        running = sum(1 for r in self.replicas if r.child)
        self.say(f"stopping fleet {self.name}: the router, then {running} replica(s)")
        self._drain_router()
        if self._l2_prober is not None:  # it writes the state, which is saved last
            self._l2_prober.join(timeout=5)
        for group in stop_groups(self.router, [r.child for r in self.replicas], self.redis, self.prometheus):
            for child in group:
                child.signal(signal.SIGTERM)
            for child in group:
                child.stop(timeout=CHILD_STOP_S)
        if self.forks is not None:  # after its engines (which are this process's children, not its)
            self.forks.stop()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        now = self.clock()
        for r in self.replicas:
            r.state.state, r.state.pid = advance(r.state.state, Phase.STOPPED), None
            self.capacity.release(r.state.id, r.node_id, now)
        self.capacity.release_all(now)
        self.state.router_pid = self.state.prometheus_pid = self.state.forkserver_pid = None
        self.state.router_status = "stopped"  # `status --json` had said "up" of a stopped fleet's router
        if self.state.status != "failed":
            self.state.status = "stopped"
        self._save()
        self.say(f"fleet {self.name} {self.state.status}; it cost ${self.state.cost_total:.4f}")
        self.metrics.stop()
        self._http.close()
