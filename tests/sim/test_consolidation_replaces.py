"""Consolidation replaces a node with a cheaper one in the simulator as in the live fleet (`capacity/manager.py`):
a fleet that fell back to a dearer type during a shortage moves back once the cheaper type has capacity again,
without losing a request."""

from fleetserve.sim.run import simulate
from fleetserve.sim.setup import SimOptions
from fleetserve.traces.model import TraceRequest
from tests.helpers import endpoint_of


def fell_back(shortage_end_s: float = 600.0, policy: str = "WhenEmptyOrUnderutilized", budget: str | None = "100%"):
    return endpoint_of("fallback", {
        "model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 2,
        "routing": {"strategy": "leastload"}, "placement": {"instanceTypes": ["g5.xlarge", "g6e.xlarge"]},
        "capacity": {"provider": "simulated", "capacityTypes": ["on-demand"],
                     "simulated": {"provisioningDelaySeconds": 90,
                                   "shortages": [{"instanceType": "g5.xlarge", "startSeconds": 0,
                                                  "endSeconds": shortage_end_s}]},
                     "consolidation": {"policy": policy, "consolidateAfter": 60,
                                       **({"budgets": [{"nodes": budget}]} if budget else {})}}})


def steady(seconds: float = 3600.0) -> list[TraceRequest]:
    return [TraceRequest(i * 2.0, 400, 50) for i in range(int(seconds / 2))]


def test_a_fleet_on_its_fallback_type_moves_to_the_cheaper_one_when_the_shortage_ends():
    trace = steady()
    replaced = simulate(fell_back(), trace, SimOptions())
    kept = simulate(fell_back(policy="WhenEmpty"), trace, SimOptions())  # deletes only empty nodes
    hours, kept_hours = replaced.report["node_hours_by_type"], kept.report["node_hours_by_type"]
    assert set(kept_hours) == {"g6e.xlarge"}, kept_hours  # stayed on the fallback for the whole hour
    assert hours["g5.xlarge"] > 2 * hours["g6e.xlarge"], hours  # moved once the shortage and its mark ended
    assert replaced.report["cost_usd"] < 0.8 * kept.report["cost_usd"]
    assert sum("replacing node" in line for line in replaced.fleet.capacity.log) == 2
    assert replaced.report["requests"] == len(trace) and replaced.report["error_rate"] == 0  # nothing lost
    assert [n.offering.instance_type for n in replaced.fleet.capacity.nodes()] == ["g5.xlarge"] * 2
