"""The supervisor's own metrics (autoscaler and capacity), served on a loopback port for Prometheus."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from fleetserve.fleet.process import free_port


class SupervisorMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.desired = Gauge("fleetserve_autoscaler_desired_replicas", "Replicas the policy wants", registry=r)
        self.ready = Gauge("fleetserve_autoscaler_ready_replicas", "Replicas answering /health", registry=r)
        self.decisions = Counter("fleetserve_autoscaler_decisions", "Scaling decisions by kind", ["reason"],
                                 registry=r)
        self.cold_start = Histogram("fleetserve_replica_cold_start_seconds",
                                    "From the request for a replica to its first healthy answer",
                                    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600), registry=r)
        self.cost_per_hour = Gauge("fleetserve_cost_per_hour_dollars", "What the fleet's nodes cost per hour",
                                   registry=r)
        self.cost_total = Gauge("fleetserve_cost_dollars", "Dollars spent since the fleet started", registry=r)
        self.nodes = Gauge("fleetserve_nodes", "Nodes by instance and capacity type",
                           ["instance_type", "capacity_type"], registry=r)
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
        self.nodes.clear()
        for n in state.nodes:
            self.nodes.labels(n.instance_type, n.capacity_type).inc()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
