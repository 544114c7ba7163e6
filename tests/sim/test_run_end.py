"""A run ends when its last request is answered: timers that find nothing left to do (the buffer timeout of a
request answered long before, a queue timeout) must not bill the fleet beyond it."""

import pytest

from fleetserve.sim.run import simulate
from fleetserve.sim.setup import SimOptions
from fleetserve.spec.load import load_spec_data
from fleetserve.traces.model import TraceRequest


def endpoint(buffer_timeout: float, limits: dict | None = None, replicas: int = 0, minimum: int = 0):
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": replicas,
            "routing": {"strategy": "roundrobin"}, "placement": {"instanceTypes": ["g5.xlarge"]},
            "router": {"bufferTimeoutSeconds": buffer_timeout},
            "autoscaling": {"minReplicaCount": minimum, "maxReplicaCount": 2, "pollingInterval": 30,
                            "cooldownPeriod": 300, "triggers": [{"metric": "concurrency", "target": 4,
                                                                  "activationTarget": 0}]}}
    if limits:
        spec["requestLimits"] = limits
    return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "end"},
                           "spec": spec}).endpoint


THREE = [TraceRequest(t, 500, 50) for t in (0.0, 1800.0, 3600.0)]


def test_cost_and_duration_do_not_depend_on_the_buffer_timeout():
    reports = [simulate(endpoint(t), THREE, SimOptions()).report for t in (200, 600, 1200)]
    assert len({r["cost_usd"] for r in reports}) == 1 and len({r["duration_s"] for r in reports}) == 1
    last = max(r["e2e_ms"]["p99"] for r in reports) / 1000
    assert reports[0]["duration_s"] < 3600 + last + 1  # it ends with the last answer (cold start included)


@pytest.mark.parametrize("limits", [None, {"maxConcurrentRequests": 1}])
def test_a_warm_static_fleet_is_billed_for_the_trace_only(limits):
    burst = [TraceRequest(i * 0.5, 500, 50) for i in range(4)]
    report = simulate(endpoint(600, limits, replicas=2, minimum=2), burst, SimOptions(static_replicas=2)).report
    assert report["duration_s"] < 30  # four small requests on two warm replicas: seconds, not a 600 s timer
    assert report["cost_usd"] < 2 * 1.5 * 30 / 3600


def test_a_cold_start_is_no_reason_for_more_replicas():
    """Three requests half an hour apart on a fleet at zero with a ttft_p95 trigger: each waits ~161 s for a node
    and the model, and counting that wait as its TTFT scaled the fleet 1 -> 4 for one request ($1.107 against $0.469
    without the trigger). The router's scaling signal leaves the buffer's cold start out."""
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 0,
            "routing": {"strategy": "roundrobin"}, "placement": {"instanceTypes": ["g5.xlarge"]},
            "autoscaling": {"minReplicaCount": 0, "maxReplicaCount": 4, "pollingInterval": 30,
                            "cooldownPeriod": 300, "triggers": [
                                {"metric": "concurrency", "target": 4, "activationTarget": 0},
                                {"metric": "ttft_p95", "target": 2000}]}}
    endpoint = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "t"},
                               "spec": spec}).endpoint
    trace = [TraceRequest(t, 1000, 100, (2 * i, 2 * i + 1)) for i, t in enumerate((0.0, 1800.0, 3600.0))]
    report = simulate(endpoint, trace, SimOptions()).report
    assert report["ttft_ms"]["p50"] > 100_000  # each client did wait for a cold start
    assert report["replicas_max"] == 1


def test_scaling_changes_count_the_first_one_from_the_starting_count():
    """0 -> 1 at the first request, 1 -> 0 after the cooldown, twice more up and once more down: five changes
    (the count started at the first decision and said four)."""
    report = simulate(endpoint(600), THREE, SimOptions()).report
    assert report["scaling"]["changes"] == 5
