"""The supervisor's own metrics (autoscaler and capacity), served on a loopback port for Prometheus."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, start_http_server

from fleetserve.fleet.process import free_port
from fleetserve.observe import vocabulary as v

SERVICES = ("router", "redis", "prometheus")  # the fleet's own services the supervisor restarts


class SupervisorMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()  # built from the vocabulary (fleetserve.observe.vocabulary)
        self.desired = v.AUTOSCALER_DESIRED.make(r)
        self.ready = v.AUTOSCALER_READY.make(r)
        self.decisions = v.AUTOSCALER_DECISIONS.make(r)
        for reason in {label for _, label in v.DECISION_REASONS} | {"other"}:
            # every reason's series from 0: a counter that appears at 1 shows no increase(), so the dashboard's
            # annotations missed the first decision of each reason in a supervisor's life
            self.decisions.labels(reason)
        self.cold_start = v.REPLICA_COLD_START.make(r)
        self.service_restarts = v.SERVICE_RESTARTS.make(r)
        for service in SERVICES:  # at 0 from the start: increase() sees the first restart
            self.service_restarts.labels(service)
        self.cost_per_hour = v.COST_PER_HOUR.make(r)
        self.cost_total = v.COST_TOTAL.make(r)
        self.nodes = v.NODES.make(r)
        self._node_kinds: set[tuple[str, str]] = set()
        self._server = None

    def serve(self, host: str = "127.0.0.1") -> str:
        port = free_port(host)
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return f"http://{host}:{port}/metrics"

    def update(self, state) -> None:
        self.desired.set(state.desired)
        self.ready.set(state.ready)
        self.cost_per_hour.set(state.cost_per_hour)
        self.cost_total.set(state.cost_total)
        counts = Counter((n.instance_type, n.capacity_type) for n in state.nodes)
        self._node_kinds |= set(counts)  # a kind once seen stays, at 0: at zero nodes the series had vanished (a
        for kind in self._node_kinds:  # gap in the panel, "no data" to an alert, where the answer was 0)
            self.nodes.labels(*kind).set(counts.get(kind, 0))

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
