"""Cost accounting: dollars per node, replica, namespace and model version, from node prices over time.

A replica pays its node's price divided by the node's slots for as long as it runs there; slots nobody
uses are booked as the node's idle cost (that is the money scale-down and consolidation can save). Services
the fleet runs whatever its replicas do (the L2 Redis, `kvCache.l2.pricePerHour`) are booked apart, by name.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class _Span:
    start: float
    end: float | None = None

    def hours(self, now: float) -> float:
        return max(0.0, ((self.end if self.end is not None else now) - self.start) / 3600)


@dataclass
class _NodeRecord:
    price: float
    slots: int
    instance_type: str
    capacity_type: str
    span: _Span


@dataclass
class _ReplicaRecord:
    node_id: str
    namespace: str
    model_version: str
    span: _Span


@dataclass
class _ServiceRecord:
    price: float
    span: _Span


@dataclass
class CostLedger:
    nodes: dict[str, _NodeRecord] = field(default_factory=dict)
    replicas: dict[str, list[_ReplicaRecord]] = field(default_factory=lambda: defaultdict(list))
    services: dict[str, _ServiceRecord] = field(default_factory=dict)
    past_nodes: list[tuple[str, _NodeRecord]] = field(default_factory=list)  # earlier runs of a node id reused

    def service_started(self, name: str, price: float, now: float) -> None:
        self.services[name] = _ServiceRecord(price, _Span(now))

    def service_stopped(self, name: str, now: float) -> None:
        record = self.services.get(name)
        if record and record.span.end is None:
            record.span.end = now

    def node_started(self, node_id: str, price: float, slots: int, instance_type: str, capacity_type: str,
                     now: float) -> None:
        earlier = self.nodes.get(node_id)
        if earlier is not None:  # the local machine, taken again after a release at zero: its earlier hours count
            self.past_nodes.append((node_id, earlier))
        self.nodes[node_id] = _NodeRecord(price, slots, instance_type, capacity_type, _Span(now))

    def node_stopped(self, node_id: str, now: float) -> None:
        record = self.nodes.get(node_id)
        if record and record.span.end is None:
            record.span.end = now

    def replica_started(self, replica_id: str, node_id: str, namespace: str, model_version: str, now: float) -> None:
        self.replicas[replica_id].append(_ReplicaRecord(node_id, namespace, model_version, _Span(now)))

    def replica_stopped(self, replica_id: str, now: float) -> None:
        for record in self.replicas.get(replica_id, []):
            if record.span.end is None:
                record.span.end = now

    def hours_by_instance_type(self, now: float) -> dict[str, float]:
        """Node-hours per instance type: where the replicas really ran (a fallback, when the first was short)."""
        out: dict[str, float] = defaultdict(float)
        for _, n in self._all_nodes():
            out[n.instance_type] += n.span.hours(now)
        return {t: round(h, 6) for t, h in sorted(out.items())}

    def _all_nodes(self) -> list[tuple[str, _NodeRecord]]:
        return [*self.past_nodes, *self.nodes.items()]

    def per_hour(self) -> float:
        """What the running nodes and services cost per hour right now."""
        return sum(n.price for n in self.nodes.values() if n.span.end is None) + \
            sum(s.price for s in self.services.values() if s.span.end is None)

    def totals(self, now: float) -> dict:
        by_node: dict[str, float] = defaultdict(float)
        for nid, n in self._all_nodes():
            by_node[nid] += n.price * n.span.hours(now)
        by_node = {nid: round(dollars, 6) for nid, dollars in by_node.items()}
        by_replica: dict[str, float] = defaultdict(float)
        by_namespace: dict[str, float] = defaultdict(float)
        by_version: dict[str, float] = defaultdict(float)
        used: dict[str, float] = defaultdict(float)
        for rid, records in self.replicas.items():
            for r in records:
                node = self.nodes.get(r.node_id)
                if node is None:
                    continue
                dollars = node.price / max(node.slots, 1) * r.span.hours(now)
                by_replica[rid] += dollars
                by_namespace[r.namespace] += dollars
                by_version[r.model_version] += dollars
                used[r.node_id] += dollars
        idle = {nid: round(total - used.get(nid, 0.0), 6) for nid, total in by_node.items()}
        by_service = {name: round(s.price * s.span.hours(now), 6) for name, s in self.services.items()}
        return {
            "total": round(sum(by_node.values()) + sum(by_service.values()), 6),
            "per_hour": round(self.per_hour(), 6),
            "by_node": by_node,
            "by_service": by_service,
            "idle_by_node": idle,
            "by_replica": {k: round(v, 6) for k, v in by_replica.items()},
            "by_namespace": {k: round(v, 6) for k, v in by_namespace.items()},
            "by_model_version": {k: round(v, 6) for k, v in by_version.items()},
        }
