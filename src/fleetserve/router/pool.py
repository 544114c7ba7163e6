"""The router's view of its backends: health (active probes and passive failures) and load counters."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

from fleetserve.clock import Clock
from fleetserve.engine.instance import CHALLENGE_HEADER, answered_by, new_challenge
from fleetserve.router.backlog import LoadBook
from fleetserve.router.engine_queue import QUEUE_GAUGES, read_queue
from fleetserve.router.outliers import AnswerWindow, OutlierSettings, is_outlier
from fleetserve.router.policies import FleetSnapshot, ReplicaView
from fleetserve.router.upstream import Impostor, Upstream, UpstreamError

log = logging.getLogger(__name__)

IMPOSTOR = "health check answered by another process than the replica's (another program bound its port)"
REFUSED_DRAIN_S = 180.0  # longer than a replica's drain once its supervisor is gone (up: --orphan-drain 125 s)
SILENT = frozenset({"timeout", "unreachable", "dropped", "stalled"})  # probe failures with no answer at all


@dataclass
class Backend:
    id: str
    url: str
    healthy: bool = False
    running: int = 0
    waiting: int = 0
    reported_in_flight: int | None = None  # ours in flight when running/waiting were reported (ReplicaView.load)
    # the queue of an engine that reports none in its health body, from its /metrics gauge (router/engine_queue.py):
    # the autoscaler's signal (/admin/load), not the routing score's; None: not read, or not read this time
    engine_waiting: int | None = None
    engine_running: int | None = None
    failures: int = 0
    successes: int = 0
    last_error: str = ""
    draining: bool = False  # takes no new requests; in-flight ones finish
    cache_blocks: int = 0
    # refused a connection since it was last healthy: its process was gone, and back it is a new one, whose
    # prefix cache is empty (BackendPool.on_restart)
    refused: bool = False
    refusing_since: float | None = None  # when its probes began to be refused (None: they are not)
    # when its probes began to get no answer at all (a timeout, a cut): a stopped or wedged process, which its
    # supervisor restarts after a while (fleet/supervisor.py REPLICA_HANG_S); None: it answers
    silent_since: float | None = None
    # circuit breaker (see BackendPool.request_failed): closed -> open -> half-open -> closed
    request_failures: int = 0  # in a row, while closed
    open_until: float = 0.0
    tripped: bool = False  # opened and not yet closed again by successes (open, then half-open)
    half_open_successes: int = 0
    answers: AnswerWindow = field(default_factory=lambda: AnswerWindow(OutlierSettings.window), repr=False)
    clock: Clock = field(default=time.monotonic, repr=False)
    # the replica's name as its fleet knows it (`up`: r0, r1, ...), which its engine's own model_* series carry:
    # the router's series of a replica used its address, and one replica read as two ("" when not given)
    name: str = ""
    # the secret of the process its supervisor started last, whose HMAC of each probe's challenge must answer its
    # /health (engine/instance.py): a process that bound the port after a crash had been taken for the replica.
    # None: not given (any answer)
    instance: str | None = None
    announced_ready: bool = False  # the supervisor last said it is ready (a later "starting" is a restart)

    @property
    def label(self) -> str:
        """The `replica` label of the model_* series the router counts for this replica."""
        return self.name or self.id
    book: LoadBook = field(default_factory=LoadBook, repr=False)  # the pool's, shared by its backends

    # in flight and prefill backlog (prompt tokens sent that have not produced a first byte) live in the
    # shared LoadBook, the one the simulator keeps too
    @property
    def in_flight(self) -> int:
        return self.book.in_flight[self.id]

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        self.book.in_flight[self.id] = value

    @property
    def prefill_backlog(self) -> int:
        return self.book.backlog[self.id]

    @prefill_backlog.setter
    def prefill_backlog(self, value: int) -> None:
        self.book.backlog[self.id] = value

    @property
    def breaker(self) -> str:
        if not self.tripped:
            return "closed"
        return "open" if self.clock() < self.open_until else "half-open"

    @property
    def eligible(self) -> bool:
        return self.healthy and not self.draining and self.clock() >= self.open_until

    @property
    def silent_s(self) -> float:
        """Seconds its probes have had no answer at all (0: it answers, or refuses: a process that is gone)."""
        return 0.0 if self.silent_since is None else max(0.0, self.clock() - self.silent_since)

    @property
    def takes_traffic(self) -> bool:
        """Healthy and its breaker not open (draining aside): what /admin/load and the healthy gauge report. They
        had said healthy while an open breaker sent it nothing, and `status` counted it ready."""
        return self.healthy and self.clock() >= self.open_until

    def new_process(self) -> None:
        """Another process answers for it (a restart): what tripped the breaker, or counted toward it, was the one
        before. A crash that cut ten streams had opened it for 60 s, and the restarted replica, its probes passing,
        took nothing all that time."""
        if self.tripped:
            log.info("circuit breaker closed for %s: a new process answers", self.url)
        self.tripped, self.open_until, self.request_failures, self.half_open_successes = False, 0.0, 0, 0
        self.silent_since = None  # the silence was the last one's
        self.answers.clear()

    def view(self) -> ReplicaView:
        return ReplicaView(self.id, self.url, self.eligible, self.in_flight, self.waiting, self.running,
                           self.prefill_backlog, self.cache_blocks, self.reported_in_flight)


@dataclass(frozen=True)
class BreakerSettings:
    failures_to_open: int = 10  # failures in a row (no answer, a timeout, a 502-504) that open the breaker
    open_seconds: float = 60.0
    successes_to_close: int = 3
    outliers: OutlierSettings = OutlierSettings()  # server errors (500s) open it by ratio (router/outliers.py)


class BackendPool:
    """Backends in, health out.

    A backend is taken out after `unhealthy_after` failed probes in a row, or at once when a request cannot
    connect to it; one successful probe puts it back. Probes run every `interval` seconds.
    """

    def __init__(
        self,
        urls: list[str],
        *,
        health_path: str = "/health",
        interval: float = 1.0,
        timeout: float = 2.0,
        unhealthy_after: int = 2,
        healthy_after: int = 1,
        breaker: BreakerSettings | None = None,
        clock: Clock = time.monotonic,
        queue_metrics: str | None = None,
    ):
        self.clock = clock  # injected: breaker tests run in virtual time
        self.book = LoadBook()
        self.backends: dict[str, Backend] = {}
        self.health_path = health_path
        self.interval = interval
        self.unhealthy_after = unhealthy_after
        self.healthy_after = healthy_after
        self.breaker = breaker or BreakerSettings()
        self.timeout = timeout
        if queue_metrics is not None and queue_metrics not in QUEUE_GAUGES:
            raise ValueError(f"queue_metrics {queue_metrics!r}; allowed: {', '.join(QUEUE_GAUGES)}")
        self.queue_metrics = queue_metrics  # an engine kind of engine_queue.QUEUE_GAUGES: read its /metrics too
        self._queue_reads: dict[str, asyncio.Task] = {}  # at most one /metrics read in flight per backend
        # health probes share the gateway's pooled client (router/upstream.py) once it hands it over
        self._client = Upstream(connect_timeout=timeout, read_timeout=timeout)
        self._client.identity = self.expected_identity
        self._ready = asyncio.Event()
        self.on_change: list = []  # called when backends join, leave or change health (the gate's queue looks again)
        # called with a backend's id when it is healthy again after refusing connections: a restarted process,
        # whose cache is empty (a router-side index still predicted its old prefixes there)
        self.on_restart: list = []
        self.set_backends(urls)

    @property
    def client(self) -> Upstream:
        return self._client

    @client.setter
    def client(self, client: Upstream) -> None:
        """The gateway hands over its pooled client: its fresh connections prove the replica as the probes do."""
        self._client = client
        client.identity = self.expected_identity
        client.proof_timeout = max(getattr(client, "proof_timeout", 0.0), self.timeout)  # no shorter than a probe

    def expected_identity(self, base_url: str) -> tuple[str, str] | None:
        """(secret, health path) that the process answering `base_url` must prove on each fresh connection before
        a request goes on it (router/upstream.py), or None: any process (no secret given)."""
        backend = self.backends.get(base_url.split("://", 1)[-1])
        return (backend.instance, self.health_path) if backend is not None and backend.instance else None

    def set_backends(self, urls: list[str], ready: set[str] | None = None, draining: set[str] | None = None,
                     names: dict[str, str] | None = None, instances: dict[str, str] | None = None) -> None:
        """Replace the backend list, keeping the state of backends that stay.

        URLs in `ready` were just checked by the supervisor and take traffic at once; those in `draining`
        get no new requests while their in-flight ones finish; `names`: the replicas' names by URL; `instances`:
        the secret of the process that must answer each one's /health probes (engine/instance.py). A backend the
        supervisor had said ready and now says starting has crashed and restarts: it takes nothing until its
        probes pass again (its port had kept taking requests until a probe failed, whatever bound it meanwhile).
        """
        kept = {}
        for url in urls:
            url = url.rstrip("/")
            backend_id = url.split("://", 1)[-1]  # host:port, stable across restarts on the same port
            backend = self.backends.get(backend_id) or Backend(
                backend_id, url, clock=self.clock, book=self.book, answers=AnswerWindow(self.breaker.outliers.window))
            backend.draining = url in (draining or set())
            backend.name = (names or {}).get(url, backend.name)
            instance = (instances or {}).get(url)
            now_ready = url in (ready or set())
            if instances is not None and instance != backend.instance:
                if backend.instance is not None:  # what its idle connections reach is the start before this one
                    self._client.forget_idle(backend.url)
                backend.new_process()
                backend.instance, backend.successes = instance, 0  # another start: its own probes count, and
                if not now_ready and backend.healthy:  # until they pass it takes nothing (a replica the router's
                    backend.healthy, backend.last_error = False, "restarting (a new process)"  # probes had taken in
                    # before its supervisor said ready kept taking requests through its restart)
            if backend.announced_ready and not now_ready and not backend.draining and backend.healthy:
                backend.healthy, backend.last_error = False, "restarting (its supervisor says)"
            backend.announced_ready = now_ready
            if now_ready and not backend.healthy:
                backend.healthy, backend.failures, backend.last_error = True, 0, ""
                self._answering(backend)  # the supervisor's word that the process is ready
            kept[backend_id] = backend
        self.backends = kept
        for gone in [b for b in self._queue_reads if b not in kept]:  # replicas come and go: so do their reads
            self._queue_reads.pop(gone).cancel()
        self._signal()

    def _signal(self) -> None:
        """Wake requests waiting for capacity when some backend can take traffic, and tell `on_change`: a replica
        that joined has free slots for requests queued at the per-replica limit."""
        if any(b.eligible for b in self.backends.values()):
            self._ready.set()
        else:
            self._ready.clear()
        for listener in self.on_change:
            listener()

    async def wait_eligible(self, timeout: float) -> bool:
        """Wait until some backend takes traffic; False on timeout."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def snapshot(self) -> FleetSnapshot:
        return FleetSnapshot(tuple(b.view() for b in self.backends.values()))

    def get(self, backend_id: str) -> Backend:
        return self.backends[backend_id]

    def healthy(self) -> list[Backend]:
        return [b for b in self.backends.values() if b.eligible]

    def any_eligible(self) -> bool:
        return any(b.eligible for b in self.backends.values())

    def request_failed(self, backend: Backend, error: str, server_error: bool = False) -> None:
        """A request failed on the backend (5xx or broken connection).

        Closed: `failures_to_open` failures in a row open the breaker for `open_seconds` (no traffic, even if
        health probes pass). Half-open (the open period is over): traffic again, but one failure (a timeout, no
        answer, a 502-504) re-opens it at once; `successes_to_close` successes in a row close it.
        `server_error`: an answer the request itself may have caused (a 500). It does not count in a row, in
        either state: it opens the breaker when the replica is an outlier (router/outliers.py: it fails much of
        what it answers, and clearly more than the replicas that take traffic beside it), while fewer than half
        of the backends are out (open or half-open), as Envoy caps ejections, so one client's poison requests
        cannot take every replica out."""
        now = self.clock()
        state = backend.breaker
        if state == "open":
            return  # an answer to a request sent before it opened
        backend.half_open_successes = 0
        if server_error:
            backend.answers.record(True)
            others = (b.answers for b in self.backends.values() if b is not backend and b.eligible)
            if not is_outlier(backend.answers, others, self.breaker.outliers):
                return
            out = sum(1 for b in self.backends.values() if b is not backend and b.tripped)  # open or half-open
            if out + 1 > len(self.backends) // 2:
                return  # the cap is reached: it stays in (a replica failing everything is still one of them)
        else:
            backend.request_failures += 1
            if state == "closed" and backend.request_failures < self.breaker.failures_to_open:
                return
        backend.tripped = True
        backend.open_until = now + self.breaker.open_seconds
        backend.answers.clear()  # judged afresh on what it answers when it is back
        log.warning("circuit breaker open for %s (%.0fs): %s", backend.url, self.breaker.open_seconds, error)
        self._signal()

    def request_succeeded(self, backend: Backend) -> None:
        state = backend.breaker
        if state == "open":
            return  # an answer to a request sent before it opened: no evidence that it is back
        backend.answers.record(False)
        if state == "closed":
            backend.request_failures = 0  # failures count in a row
            return
        backend.half_open_successes += 1
        if backend.half_open_successes >= self.breaker.successes_to_close:
            backend.tripped, backend.request_failures, backend.half_open_successes = False, 0, 0
            backend.answers.clear()  # closed again: judged on what it answers from now on

    def _answering(self, backend: Backend) -> None:
        """A healthy backend answers: if it refused connections since it last did, nothing listened there, so this
        is a new process with an empty cache (`on_restart`)."""
        if backend.refused:
            backend.refused = False
            backend.new_process()
            for listener in self.on_restart:
                listener(backend.id)

    def mark_unreachable(self, backend: Backend, error: str, refused: bool = False) -> None:
        """A request could not reach the backend: take it out now, the probes will bring it back. `refused`: the
        connection was refused (see `Backend.refused`)."""
        if backend.healthy:
            log.warning("backend %s out: %s", backend.url, error)
        backend.refused = backend.refused or refused
        backend.healthy = False
        backend.failures += 1
        backend.last_error = error
        self._signal()

    async def probe(self, backend: Backend) -> None:
        before = backend.in_flight  # ours when the report may have been made: sent, answered, or in between
        silent = False  # no answer at all (timeout, refused, cut), not an unhealthy answer
        try:
            # no credentials: /health needs none, and whatever answers the port is not known to be ours yet; a
            # fresh challenge, which only the process started with the backend's secret answers (engine/instance.py)
            challenge = new_challenge() if backend.instance else None
            status, body = await self.client.get(
                backend.url + self.health_path, timeout=self.timeout, credentials=False,
                headers=[(CHALLENGE_HEADER.encode(), challenge.encode())] if challenge else ())
            ok = status == 200
            error = "" if ok else f"health check returned {status}"
            if ok:
                try:
                    data = json.loads(body)
                except ValueError:
                    data = None
                if not answered_by(data, backend.instance, challenge):
                    ok, error = False, IMPOSTOR
                elif isinstance(data, dict):
                    try:
                        backend.running = int(data.get("running", 0))
                        backend.waiting = int(data.get("waiting", 0))
                        # ours as the report may have counted them: those that finished during the round trip
                        # are in it, so the larger count (a report read as others' load is never ours
                        # over-counted)
                        backend.reported_in_flight = max(before, backend.in_flight)
                    except (ValueError, AttributeError, TypeError):
                        pass
        except Impostor:
            ok, error = False, IMPOSTOR
        except UpstreamError as exc:
            ok, error = False, f"health check failed: {exc.kind}"
            refused = getattr(exc, "refused", False)
            # a refused connection is an answer: nothing listens. A replica stopping gracefully closed its listener
            # first and finishes what it serves on the connections it has (a crashed one resets them itself), so
            # its requests were cut and retried elsewhere, and a stopping router could not retry them at all. Past
            # any drain (a process wedged after it closed its listener), it is silence again
            if refused and backend.refusing_since is None:
                backend.refusing_since = self.clock()
            draining = refused and self.clock() - backend.refusing_since < REFUSED_DRAIN_S
            silent = exc.kind in SILENT and not draining
            backend.refused = backend.refused or refused
        if ok and self.queue_metrics:
            self._start_queue_read(backend)  # beside the probes: a slow /metrics must not slow health detection
        elif not ok:
            backend.engine_waiting = backend.engine_running = None  # a replica that does not answer has no queue
        if silent:
            if backend.silent_since is None:
                backend.silent_since = self.clock()
        else:  # an answer (healthy or not), or a refusal
            backend.silent_since = None
        if ok:
            backend.successes += 1
            if not backend.healthy and backend.successes >= self.healthy_after:
                log.info("backend %s healthy", backend.url)
                backend.healthy = True
            if backend.healthy:
                backend.last_error = ""  # one failed probe short of taking it out had stayed on /health for good
                self._answering(backend)  # also between probes too few to take it out
            backend.failures = 0
            backend.refusing_since = None
            self._signal()
            return
        backend.successes = 0
        backend.failures += 1
        backend.last_error = error
        if backend.failures >= self.unhealthy_after and silent:
            # what a replica that answers nothing (SIGSTOP, a hung GPU) was sent and has not begun to answer goes
            # elsewhere: they waited out the read timeout, long after it was out. Every such round, not only the
            # one that took it out (a failed request may have done that first). A replica that answers its checks
            # unhealthy (an HTTP error) is answering: what it serves is left to finish
            abandon = getattr(self.client, "abandon", None)
            cut = abandon(backend.url, f"the replica stopped answering its health checks ({error})") if abandon \
                else 0
            if cut:
                log.warning("backend %s: %d request(s) it had not begun to answer go to another replica", backend.url,
                            cut)
        if backend.healthy and backend.failures >= self.unhealthy_after:
            log.warning("backend %s out: %s", backend.url, error)
            backend.healthy = False
            self._signal()

    def _start_queue_read(self, backend: Backend) -> None:
        """Read the engine's queue gauges in a task of their own, unless a read is still under way (a /metrics
        page that takes seconds is then read less often, and the probe round keeps its pace)."""
        task = self._queue_reads.get(backend.id)
        if task is None or task.done():
            self._queue_reads[backend.id] = asyncio.get_running_loop().create_task(self._read_engine_queue(backend))

    async def queue_reads_done(self) -> None:
        """Wait for the /metrics reads under way (tests; closing)."""
        pending = [t for t in self._queue_reads.values() if not t.done()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _read_engine_queue(self, backend: Backend) -> None:
        """The engine's own queue gauges (vLLM, SGLang); a failed or unreadable read leaves them unknown, not
        stale. The last value stands while the read is under way (/admin/load read 0 in between)."""
        queue = None
        try:
            status, body = await self.client.get(backend.url + "/metrics", timeout=self.timeout)
            if status == 200:
                queue = read_queue(body.decode("utf-8", "replace"), self.queue_metrics)
        except UpstreamError as exc:
            log.debug("backend %s: /metrics unreadable: %s", backend.url, exc.kind)
        except Exception:  # a page no parser expected must not end the probing (watcher.py's loop awaits it)
            log.exception("backend %s: /metrics not read", backend.url)
        backend.engine_waiting, backend.engine_running = queue if queue is not None else (None, None)

    async def probe_all(self) -> None:
        """Probe every backend; one whose probe fails unexpectedly is logged, and the others' results stand."""
        backends = list(self.backends.values())
        results = await asyncio.gather(*(self.probe(b) for b in backends), return_exceptions=True)
        for backend, result in zip(backends, results, strict=True):
            if isinstance(result, Exception):
                log.error("health check of %s failed: %r", backend.url, result)

    async def aclose(self) -> None:
        for task in self._queue_reads.values():
            task.cancel()
        await self.queue_reads_done()
        await self.client.aclose()
