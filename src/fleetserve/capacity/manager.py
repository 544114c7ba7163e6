"""Capacity for one endpoint: slots on nodes, placement with immediate fall-through, consolidation, cost.

Shared by the local fleet (with the local or the simulated-cloud provider) and the simulator.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.consolidation import (
    NODE_TERMINATION_S,
    ConsolidationPolicy,
    Removal,
    Replacement,
    consolidate,
)
from fleetserve.capacity.cost import CostLedger
from fleetserve.capacity.placement import (
    Availability,
    InsufficientCapacity,
    Placement,
    ReplicaRequest,
    Tier,
    place,
    replicas_per_node,
)
from fleetserve.capacity.providers import (
    InsufficientCapacityError,
    MachineFullError,
    Node,
    NodeEvent,
    Provider,
    ProviderError,
)


@dataclass(frozen=True)
class Slot:
    node: Node
    placement: Placement | None  # None when an existing node had room


class CapacityManager:
    def __init__(self, provider: Provider, catalog: Catalog, tiers: list[Tier], request: ReplicaRequest,
                 *, availability: Availability | None = None, allow_larger: bool = False,
                 local_slots: int = 1, consolidation: ConsolidationPolicy | None = None,
                 namespace: str = "default", model_version: str = "1"):
        self.provider = provider
        self.catalog = catalog
        self.tiers = tiers
        self.request = request
        self.availability = availability or Availability()
        self.allow_larger = allow_larger
        self.local_slots = local_slots
        self.consolidation = consolidation or ConsolidationPolicy()
        self.ledger = CostLedger()
        self.labels = (namespace, model_version)
        self.log: collections.deque[str] = collections.deque(maxlen=100)  # placement notes, newest last
        self.cordoned: set[str] = set()  # underutilized nodes being emptied: no new replicas land there
        self.terminating: collections.deque[float] = collections.deque()  # when consolidation deleted a node
        self._replacements: dict[frozenset, Replacement | None] = {}  # offerings out of capacity -> what to place

    def _note(self, line: str) -> None:
        if not self.log or self.log[-1] != line:
            self.log.append(line)

    def _slots_for(self, instance_type: str) -> int:
        if instance_type == "local":
            return self.local_slots
        return replicas_per_node(self.catalog.get(instance_type), self.request)

    def acquire(self, replica_id: str, now: float) -> Slot | InsufficientCapacity:
        """A slot for a new replica: an existing node with room (fullest first), else a new node."""
        roomy = [n for n in self.provider.nodes()
                 if n.free > 0 and n.interrupt_at is None and n.id not in self.cordoned]
        if roomy:
            node = max(roomy, key=lambda n: (n.used, -n.price_per_hour))
            return self._take(node, replica_id, None, now)
        while True:
            choice = place(self.request, self.tiers, self.catalog, self.availability, now, self.allow_larger)
            if isinstance(choice, InsufficientCapacity):
                self._note(f"insufficient capacity: {choice.reason}")
                return choice
            try:
                node = self.provider.create(choice.offering, self._slots_for(choice.offering.instance_type), now)
            except MachineFullError as exc:
                self._note(f"insufficient capacity: {exc}")
                return InsufficientCapacity(str(exc))
            except InsufficientCapacityError as exc:
                self.availability.mark_unavailable(exc.offering, now)
                self.log.append(f"{exc}; offering unavailable for {self.availability.ttl:.0f}s, trying the next")
                continue
            for note in choice.notes:
                self.log.append(note)
            self.log.append(f"new node {node.id}: {node.offering.instance_type} {node.offering.capacity_type} "
                            f"${node.price_per_hour:.3f}/h (tier {choice.tier})")
            self.ledger.node_started(node.id, node.price_per_hour, node.slots, node.offering.instance_type,
                                     node.offering.capacity_type, now)
            return self._take(node, replica_id, choice, now)

    def _take(self, node: Node, replica_id: str, placement: Placement | None, now: float) -> Slot:
        node.used += 1
        node.last_change = now
        self.ledger.replica_started(replica_id, node.id, *self.labels, now)
        return Slot(node, placement)

    def release(self, replica_id: str, node_id: str, now: float) -> None:
        for node in self.provider.nodes():
            if node.id == node_id:
                node.used = max(0, node.used - 1)
                node.last_change = now
        self.ledger.replica_stopped(replica_id, now)

    def poll(self, now: float) -> list[NodeEvent]:
        events = self.provider.poll(now)
        for e in events:
            if e.kind == "terminated":
                self.ledger.node_stopped(e.node_id, e.at)
                self.log.append(f"spot node {e.node_id} terminated")
            elif e.kind == "interruption-notice":
                node = next((n for n in self.provider.nodes() if n.id == e.node_id), None)
                left = f" in {node.interrupt_at - now:.0f}s" if node is not None and node.interrupt_at else ""
                self.log.append(f"spot interruption notice: node {e.node_id} terminates{left}; its replicas move")
        return events

    def leaving(self) -> set[str]:
        """Nodes that go: a spot notice, or cordoned by consolidation. No replica is placed or kept there."""
        return set(self.interrupting()) | self.cordoned

    def interrupting(self) -> dict[str, float]:
        """Node id -> when it goes, for the spot nodes with an interruption notice (their replicas move)."""
        return {n.id: n.interrupt_at for n in self.provider.nodes() if n.interrupt_at is not None}

    def release_interrupted(self, now: float) -> None:
        """A noticed spot node whose replicas all moved away is given back at once, as Karpenter deletes it: it
        stayed, empty and billed, until the notice ran out."""
        for node in list(self.provider.nodes()):
            if node.interrupt_at is not None and node.used == 0:
                self._delete(node.id, now, "interrupted node emptied: released")

    def consolidate(self, now: float, load_ratio: float) -> list[Removal]:
        """Apply what consolidation allows: empty nodes are deleted; underutilized ones are cordoned and returned,
        and the caller moves their replicas (replacements first, then drains); once empty, they are deleted.

        Nodes already being emptied count against the disruption budgets, like Karpenter's deleting nodes."""
        live = {n.id for n in self.provider.nodes()}
        self.cordoned &= live
        # the very expression the simulator's fast-forward wakes on (`now - t >= N` could differ from it in the
        # last bit, and a skipped run then missed the round that frees the budget)
        while self.terminating and now >= self.terminating[0] + NODE_TERMINATION_S:
            self.terminating.popleft()
        removals = consolidate(self.provider.nodes(), self.consolidation, now, load_ratio,
                               deleting=len(self.cordoned), terminating=len(self.terminating),
                               replacement=self._replacement_now(now), cordoned=self.cordoned)
        emptied = [n.id for n in self.provider.nodes() if n.id in self.cordoned and n.used == 0]
        for node_id in emptied:
            self._delete(node_id, now, "consolidation removed emptied node")
            self.terminating.append(now)
        for r in removals:
            if r.reason == "Empty" and r.node_id not in emptied:  # this machine too: a fleet at zero holds no
                # node, as before its first replica (it read $0/h at the start and the local price after a wake)
                self._delete(r.node_id, now, "consolidation removed empty node")
                self.terminating.append(now)
            elif r.reason == "Underutilized" and r.node_id not in self.cordoned and self.provider.name != "local":
                if r.replacement is not None and not self._make_replacement(r, now):
                    continue
                self.cordoned.add(r.node_id)
                if r.replacement is None:
                    self.log.append(f"consolidation: node {r.node_id} is underutilized; moving its replicas")
        return [r for r in removals if r.reason == "Empty" or r.node_id in self.cordoned]

    def _replacement_now(self, now: float):
        """What consolidation may replace a node with this round: the node placement would make now (consolidation
        keeps it only where it costs less). Asked for every on-demand node every round, and placement depends only
        on which offerings are out of capacity now, so it is made once per such set (placed afresh for each node,
        it took a fifth of a simulation's time)."""
        if self.provider.name == "local":
            return None
        known: list[Replacement | None] = []

        def replacement(node: Node) -> Replacement | None:
            if node.id in self.cordoned:
                return None
            if not known:
                known.append(self._placement_for(now))
            return known[0]
        return replacement

    def _placement_for(self, now: float) -> Replacement | None:
        out = frozenset(o for o, until in self.availability.until.items() if until > now)
        if out not in self._replacements:
            choice = place(self.request, self.tiers, self.catalog, self.availability, now, self.allow_larger)
            if len(self._replacements) > 64:
                self._replacements.clear()
            self._replacements[out] = None if isinstance(choice, InsufficientCapacity) else \
                Replacement(choice, self._slots_for(choice.offering.instance_type))
        return self._replacements[out]

    def _make_replacement(self, removal: Removal, now: float) -> bool:
        """Create the cheaper node first (Karpenter pre-spins replacements); an offering out of capacity is marked
        unavailable and the node stays, as Karpenter untaints a node whose replacement failed."""
        choice = removal.replacement.placement
        old = next(n for n in self.provider.nodes() if n.id == removal.node_id)
        try:
            node = self.provider.create(choice.offering, removal.replacement.slots, now)
        except InsufficientCapacityError as exc:
            self.availability.mark_unavailable(exc.offering, now)
            self._note(f"consolidation: no cheaper node to replace one with yet: {exc}")  # one line per
            return False  # shortage, not one per node and retry
        except ProviderError as exc:
            self._note(f"consolidation: no cheaper node to replace one with yet: {exc}")
            return False
        self.ledger.node_started(node.id, node.price_per_hour, node.slots, node.offering.instance_type,
                                 node.offering.capacity_type, now)
        self.log.append(f"consolidation: replacing node {old.id} ({old.offering.instance_type} "
                        f"{old.offering.capacity_type} ${old.price_per_hour:.3f}/h) with new node {node.id} "
                        f"({node.offering.instance_type} {node.offering.capacity_type} "
                        f"${node.price_per_hour:.3f}/h); moving its replicas")
        return True

    def uncordon_all(self, why: str) -> None:
        if self.cordoned:
            self.log.append(f"consolidation of {', '.join(sorted(self.cordoned))} cancelled: {why}")
            self.cordoned.clear()

    def _delete(self, node_id: str, now: float, note: str) -> None:
        self.provider.delete(node_id, now)
        self.ledger.node_stopped(node_id, now)
        self.cordoned.discard(node_id)
        self.log.append(f"{note} {node_id}")

    def release_all(self, now: float) -> None:
        """The fleet stopped: every node it held is given back, so its cost stops (a stopped fleet showed its last
        node and $/h in `status`)."""
        for node in list(self.provider.nodes()):
            self._delete(node.id, now, "fleet stopped: released node")
        for name in self.ledger.services:
            self.ledger.service_stopped(name, now)

    def nodes(self) -> list[Node]:
        return self.provider.nodes()

    def cost_per_hour(self) -> float:
        return self.ledger.per_hour()
