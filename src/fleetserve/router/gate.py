"""The live admission gate: router/admission.py's verdicts (the simulator's too), with the waiting done here.

Order, as in the simulator: hold the request while no replica is ready (scale from zero, bounded buffer),
wait in the bounded queue while every replica is at its concurrency limit, or refuse with Retry-After.
Once the router stops (`close`), what waits here and what arrives is refused at once with 503 `router_stopping`:
only requests already sent to a replica run on, within the drain timeout. While the fleet says its replicas
cannot start (`set_failing`: a crash loop, no capacity), what the buffer holds and what would join it are
refused at once with 503 `replicas_failing` and the reason.
"""

from __future__ import annotations

import asyncio

from fleetserve.router.admission import (
    BUFFER,
    GO,
    AdmissionSettings,
    Rejection,
    admit,
    buffer_timeout,
    limit_views,
    overflow,
    replicas_failing,
    stopping,
)
from fleetserve.router.pool import BackendPool


class Refused(Exception):
    """Admission said no: `rejection` carries the status, message, code and Retry-After."""

    def __init__(self, rejection: Rejection):
        super().__init__(rejection.message)
        self.rejection = rejection


class AdmissionGate:
    def __init__(self, settings: AdmissionSettings, pool: BackendPool, metrics):
        self.settings = settings
        self.pool = pool
        self.metrics = metrics
        self.pending = 0  # held in the buffer at zero replicas
        self.queued = 0  # waiting for a free slot
        self._slot_free = asyncio.Event()
        self._closed = asyncio.Event()
        self.failing: str | None = None  # why no replica can start, as the fleet said (PUT /admin/backends)
        self._failed = asyncio.Event()
        # a replica that joins (scale-up) or comes back healthy has free slots: queued requests look again then,
        # not only when a request ends (the simulator drains its queue when a replica becomes ready)
        pool.on_change.append(self.slot_freed)

    def views(self, excluded: frozenset[str] = frozenset()):
        """Replica views with the per-replica concurrency limit applied (a full replica is not eligible), but
        those of the `excluded` replicas (a retry's: they failed this request)."""
        views = limit_views(self.pool.snapshot().replicas, self.settings.max_concurrent_per_replica)
        return [v for v in views if v.id not in excluded] if excluded else views

    def ready(self, excluded: frozenset[str] = frozenset()) -> bool:
        """Some replica other than the `excluded` ones is ready (at its limit or not)."""
        return any(b.id not in excluded for b in self.pool.healthy())

    def fast_go(self) -> bool:
        """The common case, decided without building views: no limits and some replica ready."""
        return (self.settings.max_concurrent_per_replica is None and not self.pending
                and not self._closed.is_set() and self.pool.any_eligible())

    def close(self) -> None:
        """The router is stopping: refuse what waits here and what comes next (503 router_stopping)."""
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def set_failing(self, reason: str | None) -> None:
        """The fleet's word that no replica can start now (None: it can again); held requests hear it at once."""
        self.failing = reason or None
        if self.failing:
            self._failed.set()
        elif self._failed.is_set():  # a fresh event only once the last was used: every backend push says None,
            self._failed = asyncio.Event()  # and swapping an unset one left held requests waiting on an orphan

    async def admit(self, excluded: frozenset[str] = frozenset()) -> float:
        """Wait until the request may go; returns the seconds it was held in the scale-from-zero buffer (a cold
        start, which the ttft_p95 scaling signal leaves out), 0.0 when it was not. `excluded`: a retry's replicas
        that failed it, whose free slots are not the request's."""
        held = 0.0
        while True:
            if self._closed.is_set():
                raise Refused(stopping())
            if excluded and not self.ready(excluded):
                return held  # none left for this retry: the dispatcher decides (no hold here: the excluded replica
                # may be ready, and the hold would return at once, again and again)
            views = self.views(excluded)
            verdict = admit(self.settings, self.ready(excluded), any(v.healthy for v in views),
                            self.pending, self.queued)
            if verdict == GO:
                return held
            if isinstance(verdict, Rejection):
                raise Refused(verdict)
            if verdict == BUFFER:
                if self.failing:
                    raise Refused(replicas_failing(self.failing))
                held += await self._hold_until_ready()
            else:
                await self._queue_for_slot(excluded)

    def slot_freed(self) -> None:
        """A request ended (or failed), or the backends changed: queued requests look again."""
        if self.queued:
            self._slot_free.set()
            self._slot_free = asyncio.Event()

    async def _queue_for_slot(self, excluded: frozenset[str] = frozenset()) -> None:
        loop = asyncio.get_running_loop()
        self.queued += 1
        self.metrics.queued.set(self.queued)
        deadline = loop.time() + self.settings.buffer_timeout
        try:
            while not any(v.healthy for v in self.views(excluded)) and self.ready(excluded):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise Refused(overflow(self.settings, "no slot became free in time"))
                if not await self._first_of(self._slot_free.wait(), remaining):
                    continue
                if self._closed.is_set():
                    raise Refused(stopping())
        finally:
            self.queued -= 1
            self.metrics.queued.set(self.queued)

    async def _hold_until_ready(self) -> float:
        """Hold the request while no replica can take it (scale from zero), bounded in count and time; returns the
        seconds it was held."""
        self.pending += 1
        self.metrics.pending.set(self.pending)
        started = self.pool.clock()  # the gateway's clock: its TTFB is measured on it too
        try:
            ready = await self._first_of(self.pool.wait_eligible(self.settings.buffer_timeout),
                                         self.settings.buffer_timeout)
        finally:
            self.pending -= 1
            self.metrics.pending.set(self.pending)
            held = self.pool.clock() - started
            self.metrics.buffer_wait_s.observe(held)
        if self._closed.is_set():
            raise Refused(stopping())
        if self.failing and not self.pool.any_eligible():
            raise Refused(replicas_failing(self.failing))
        if not ready:
            raise Refused(buffer_timeout(self.settings))
        return held

    async def _first_of(self, waiting, timeout: float) -> bool:
        """Await `waiting` until it ends, the gate closes or `timeout` passes; True unless it timed out (or
        `waiting` itself answered False)."""
        task = asyncio.ensure_future(waiting)
        closed = asyncio.ensure_future(self._closed.wait())
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            done, _ = await asyncio.wait({task, closed, failed}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, closed, failed):
                if not t.done():
                    t.cancel()
        if closed in done or failed in done:
            return True
        return bool(task in done and task.result() is not False)
