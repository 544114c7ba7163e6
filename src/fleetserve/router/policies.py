"""Routing policies: one narrow method over a frozen snapshot, registered by name.

    choose(request, snapshot) -> ReplicaView | None

The same objects run in the live router and in the simulator; they hold no I/O and read no clock. A policy
returns None only when no replica is eligible.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ReplicaView:
    """What a policy may know about one replica at decision time."""

    id: str
    url: str
    healthy: bool = True
    in_flight: int = 0  # requests this router has outstanding on it
    waiting: int = 0  # the replica's own reported queue (vllm:num_requests_waiting)
    running: int = 0  # the replica's own reported running count

    @property
    def load(self) -> int:
        """Outstanding work: ours in flight, or what the replica reports if other routers also feed it."""
        return max(self.in_flight, self.running + self.waiting)


@dataclass(frozen=True)
class FleetSnapshot:
    replicas: tuple[ReplicaView, ...]

    def eligible(self, excluded: frozenset[str] = frozenset()) -> list[ReplicaView]:
        return [r for r in self.replicas if r.healthy and r.id not in excluded]


@dataclass(frozen=True)
class RouteRequest:
    """The parts of a request a policy may use."""

    path: str
    body: dict = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    tenant: str | None = None
    excluded: frozenset[str] = frozenset()  # replicas already tried for this request


class RoutingPolicy(Protocol):
    name: str

    def choose(self, request: RouteRequest, snapshot: FleetSnapshot) -> ReplicaView | None: ...


_REGISTRY: dict[str, Callable[..., RoutingPolicy]] = {}


def register(name: str):
    def wrap(cls):
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def registered_policies() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def create_policy(name: str, **options) -> RoutingPolicy:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown routing strategy {name!r}; allowed: {', '.join(_REGISTRY)}") from None
    return factory(**options)


@register("roundrobin")
class RoundRobin:
    """Each eligible replica in turn; the rotation skips replicas that are out."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, request: RouteRequest, snapshot: FleetSnapshot) -> ReplicaView | None:
        eligible = snapshot.eligible(request.excluded)
        if not eligible:
            return None
        return eligible[next(self._counter) % len(eligible)]


@register("leastload")
class LeastLoad:
    """The replica with the least outstanding work; ties rotate so equal replicas share evenly."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, request: RouteRequest, snapshot: FleetSnapshot) -> ReplicaView | None:
        eligible = snapshot.eligible(request.excluded)
        if not eligible:
            return None
        low = min(r.load for r in eligible)
        tied = [r for r in eligible if r.load == low]
        return tied[next(self._counter) % len(tied)]
