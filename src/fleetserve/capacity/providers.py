"""Node providers behind one interface.

    create(offering, slots, now) -> Node        raises InsufficientCapacityError, ProviderError
    delete(node_id, now) -> None                raises NodeNotFoundError
    poll(now) -> list[NodeEvent]                nodes that became ready, interruption notices, terminations
    nodes() -> list[Node]

Errors are part of the contract: InsufficientCapacityError means "this offering, now": the caller marks
the offering unavailable and tries the next one at once. ProviderError is anything else (retry later).
Time is always passed in, never read, so the same providers run in the live fleet and in virtual time.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.placement import Offering

SPOT_NOTICE_SECONDS = 120.0


class ProviderError(Exception):
    """The provider failed for a reason other than capacity; retry later."""


class InsufficientCapacityError(ProviderError):
    """No capacity for this offering right now (EC2's InsufficientInstanceCapacity)."""

    def __init__(self, offering: Offering, message: str = ""):
        super().__init__(message or f"insufficient capacity for {offering.instance_type} ({offering.capacity_type})")
        self.offering = offering


class MachineFullError(ProviderError):
    """Every slot of the one node a provider has is taken by this fleet's own replicas: a wait for one of them to
    go, not a capacity shortage of the offering (marked unavailable for the ICE TTL, this machine could place
    nothing for three minutes after the drain that freed it)."""

    def __init__(self, node: Node):
        super().__init__(f"every replica slot of this machine is taken ({node.used} of capacity.localSlots = "
                         f"{node.slots}); a replica starts when one is free")


class NodeNotFoundError(ProviderError):
    """The node does not exist (already deleted or never created)."""


@dataclass
class Node:
    id: str
    offering: Offering
    price_per_hour: float
    slots: int
    created_at: float
    ready_at: float
    used: int = 0
    interrupt_at: float | None = None  # set by a spot interruption notice
    last_change: float = 0.0  # when a replica was last added or removed (consolidateAfter timer)

    def ready(self, now: float) -> bool:
        return now >= self.ready_at

    @property
    def free(self) -> int:
        return self.slots - self.used


@dataclass(frozen=True)
class NodeEvent:
    kind: str  # "ready" | "interruption-notice" | "terminated"
    node_id: str
    at: float


class Provider(Protocol):
    name: str

    def create(self, offering: Offering, slots: int, now: float) -> Node: ...

    def delete(self, node_id: str, now: float) -> None: ...

    def poll(self, now: float) -> list[NodeEvent]: ...

    def nodes(self) -> list[Node]: ...


class LocalProvider:
    """This machine as one node with a fixed number of replica slots; it exists from the start."""

    name = "local"

    def __init__(self, slots: int, price_per_hour: float = 0.0, now: float = 0.0):
        self._node = Node("local", Offering("local", "on-demand"), price_per_hour, slots, now, now, last_change=now)
        self._live = False

    def create(self, offering: Offering, slots: int, now: float) -> Node:
        if self._live:
            raise MachineFullError(self._node)
        self._live = True
        return self._node

    def delete(self, node_id: str, now: float) -> None:
        if node_id != "local" or not self._live:
            raise NodeNotFoundError(node_id)
        self._live = False

    def poll(self, now: float) -> list[NodeEvent]:
        return []

    def nodes(self) -> list[Node]:
        return [self._node] if self._live else []


@dataclass(frozen=True)
class Shortage:
    """No capacity for `instance_type` (all capacity types unless given) between `start` and `end`."""

    instance_type: str
    start: float
    end: float
    capacity_type: str | None = None


@dataclass
class SimulatedCloud:
    """A cloud in virtual time: capacity limits, shortages on a schedule, provisioning delays, spot interruptions.

    `spot_interruption_rate` is per node-hour; interruptions come with SPOT_NOTICE_SECONDS of notice and a
    seeded RNG, so a run is reproducible.
    """

    catalog: Catalog
    limits: dict[str, int] = field(default_factory=dict)  # instance type -> max nodes at once
    shortages: list[Shortage] = field(default_factory=list)
    provisioning_delay: float = 90.0
    spot_interruption_rate: float = 0.0
    seed: int = 0
    name: str = "simulated"

    def __post_init__(self) -> None:
        self._nodes: dict[str, Node] = {}
        self._ids = itertools.count(1)
        self._rng = random.Random(self.seed)
        self._announced: set[str] = set()
        self._noticed: list[tuple[str, float]] = []  # scripted notices, announced by the next poll
        self._last_poll: float | None = None

    def _short(self, offering: Offering, now: float) -> bool:
        return any(s.instance_type == offering.instance_type and s.start <= now < s.end
                   and s.capacity_type in (None, offering.capacity_type) for s in self.shortages)

    def create(self, offering: Offering, slots: int, now: float) -> Node:
        if offering.instance_type not in self.catalog:
            raise ProviderError(f"unknown instance type {offering.instance_type}")
        if self._short(offering, now):
            raise InsufficientCapacityError(offering)
        limit = self.limits.get(offering.instance_type)
        in_use = sum(1 for n in self._nodes.values() if n.offering.instance_type == offering.instance_type)
        if limit is not None and in_use >= limit:
            raise InsufficientCapacityError(offering, f"capacity limit of {limit} {offering.instance_type} reached")
        price = self.catalog.get(offering.instance_type).price(offering.capacity_type)
        node = Node(f"node-{next(self._ids)}", offering, price, slots, now, now + self.provisioning_delay,
                    last_change=now)
        self._nodes[node.id] = node
        return node

    def delete(self, node_id: str, now: float) -> None:
        if self._nodes.pop(node_id, None) is None:
            raise NodeNotFoundError(node_id)

    def poll(self, now: float) -> list[NodeEvent]:
        events = []
        since = self._last_poll if self._last_poll is not None else now
        self._last_poll = now
        for node_id, at in self._noticed:
            if node_id in self._nodes:
                events.append(NodeEvent("interruption-notice", node_id, at))
        self._noticed.clear()
        for node in list(self._nodes.values()):
            if node.ready(now) and node.id not in self._announced:
                self._announced.add(node.id)
                events.append(NodeEvent("ready", node.id, node.ready_at))
            if node.offering.capacity_type == "spot" and node.interrupt_at is None and self.spot_interruption_rate:
                hours = max(0.0, now - since) / 3600
                if self._rng.random() < 1 - math.exp(-self.spot_interruption_rate * hours):
                    node.interrupt_at = now + SPOT_NOTICE_SECONDS
                    events.append(NodeEvent("interruption-notice", node.id, now))
            if node.interrupt_at is not None and now >= node.interrupt_at:
                del self._nodes[node.id]
                events.append(NodeEvent("terminated", node.id, node.interrupt_at))
        return events

    def interrupt(self, node_id: str, now: float) -> None:
        """Schedule a spot interruption (tests, scripted scenarios); the next poll announces it, as a drawn one."""
        self._nodes[node_id].interrupt_at = now + SPOT_NOTICE_SECONDS
        self._noticed.append((node_id, now))

    def nodes(self) -> list[Node]:
        return list(self._nodes.values())


@dataclass
class RecordingProvider:
    """A fake for tests: records every call, fails the offerings it is told to, provisions instantly."""

    catalog: Catalog
    fail: set[Offering] = field(default_factory=set)
    name: str = "recording"

    def __post_init__(self) -> None:
        self.calls: list[tuple] = []
        self._nodes: dict[str, Node] = {}
        self._ids = itertools.count(1)

    def create(self, offering: Offering, slots: int, now: float) -> Node:
        self.calls.append(("create", offering, slots, now))
        if offering in self.fail:
            raise InsufficientCapacityError(offering)
        price = self.catalog.get(offering.instance_type).price(offering.capacity_type)
        node = Node(f"fake-{next(self._ids)}", offering, price, slots, now, now, last_change=now)
        self._nodes[node.id] = node
        return node

    def delete(self, node_id: str, now: float) -> None:
        self.calls.append(("delete", node_id, now))
        if self._nodes.pop(node_id, None) is None:
            raise NodeNotFoundError(node_id)

    def poll(self, now: float) -> list[NodeEvent]:
        return []

    def nodes(self) -> list[Node]:
        return list(self._nodes.values())
