"""Admission, pure: may a request go to a replica now, wait, or be refused? Shared by the gateway and the simulator.

The gateway's order (router/server.py): first the scale-from-zero buffer (no replica ready: hold the request,
at most `buffer_size` of them, each at most `buffer_timeout`; beyond: 503 `buffer_full`), then the per-replica
limit (HyperPod `maxConcurrentRequests`: a replica at its limit is not eligible; when none has a free slot the
request waits in a queue of at most `max_queue`; beyond it, or after `buffer_timeout` in it: the overflow status).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fleetserve.router.policies.base import ReplicaView


@dataclass(frozen=True)
class AdmissionSettings:
    buffer_size: int = 256
    buffer_timeout: float = 600.0
    max_concurrent_per_replica: int | None = None
    max_queue: int | None = None
    overflow_status: int = 429

    @classmethod
    def from_spec(cls, spec) -> AdmissionSettings:
        """From an EndpointSpec's `router` and `requestLimits` sections."""
        limits = spec.request_limits
        return cls(spec.router.buffer_size, spec.router.buffer_timeout_seconds, limits.max_concurrent_requests,
                   limits.max_queue_size, limits.overflow_status_code)


@dataclass(frozen=True)
class Rejection:
    status: int
    code: str
    message: str
    retry_after: str


GO, BUFFER, QUEUE = "go", "buffer", "queue"


def limit_views(views: tuple[ReplicaView, ...], limit: int | None) -> tuple[ReplicaView, ...]:
    """A replica at its concurrency limit is not eligible (the snapshot the policy sees)."""
    if not limit:
        return views
    return tuple(dataclasses.replace(v, healthy=v.healthy and v.in_flight < limit) for v in views)


def admit(settings: AdmissionSettings, any_ready: bool, any_slot: bool, pending: int, queued: int
          ) -> str | Rejection:
    """GO, BUFFER (no replica ready: hold until one is), QUEUE (all at their limit: wait for a slot), or a
    Rejection. `pending`/`queued` count the requests already held/queued."""
    if not any_ready:
        if pending >= settings.buffer_size:
            return Rejection(503, "buffer_full", f"no replica is ready and the wait buffer is full "
                                                 f"({settings.buffer_size} requests); retry later", "5")
        return BUFFER
    if settings.max_concurrent_per_replica and not any_slot:
        if settings.max_queue is not None and queued >= settings.max_queue:
            return overflow(settings, "the queue is full")
        return QUEUE
    return GO


def overflow(settings: AdmissionSettings, why: str) -> Rejection:
    return Rejection(settings.overflow_status, "overloaded",
                     f"all replicas are at their limit of {settings.max_concurrent_per_replica} concurrent "
                     f"requests and {why}; retry later", "1")


def stopping() -> Rejection:
    """A stopping router sends nothing new to a replica: what waits at its door (held at zero replicas or queued
    for a slot) is answered now, for the client to retry elsewhere, instead of being cut at the drain timeout."""
    return Rejection(503, "router_stopping", "the router is stopping and starts no new request; retry (another "
                                             "router, or this endpoint once it is back)", "1")


def replicas_failing(reason: str) -> Rejection:
    """The fleet says no replica can start now (one crash-loops, or no capacity is left): a request held for one
    would wait out the buffer timeout (10 minutes by default) for a 503 that names nothing; it is told now."""
    return Rejection(503, "replicas_failing", f"no model replica can start: {reason}; retry later", "30")


def buffer_timeout(settings: AdmissionSettings) -> Rejection:
    return Rejection(503, "cold_start_timeout", f"no replica became ready within {settings.buffer_timeout:.0f}s",
                     "10")
