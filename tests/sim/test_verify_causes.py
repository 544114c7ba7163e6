"""verify's verdicts and reasons on fleets whose scaling lags or tops out: the money a burst costs is spent after
it, and a failure is blamed on what the fleet really did."""

from fleetserve.sim.setup import SimOptions
from fleetserve.sim.verify import verify
from fleetserve.spec.load import load_spec_data
from fleetserve.traces.model import TraceRequest


def gpu_endpoint(maximum: int = 4, minimum: int = 0):
    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "routing": {"strategy": "prefixaware"}, "placement": {"instanceTypes": ["g6e.xlarge"]},
            "autoscaling": {"minReplicaCount": minimum, "maxReplicaCount": maximum, "pollingInterval": 30,
                            "cooldownPeriod": 300, "triggers": [{"metric": "concurrency", "target": 4}]}}
    return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "lag"},
                           "spec": spec}).endpoint


def late_burst() -> list[TraceRequest]:
    """0.2 requests/s for half an hour, and 150 requests in the last 15 s of the first window."""
    quiet = [TraceRequest(i * 5.0, 500, 600, (10_000 + i,)) for i in range(360)]
    burst = [TraceRequest(285 + i * 0.1, 500, 600, (20_000 + i,)) for i in range(150)]
    return sorted(quiet + burst, key=lambda r: r.arrival_s)


def test_the_budget_at_peak_is_the_costliest_windows_where_scaling_runs_on_after_the_burst():
    verdict = verify(gpu_endpoint(), late_burst(), SimOptions(),
                     {"ttft_p95_ms": 20000, "e2e_p95_ms": 120000, "cost_per_hour_usd": 5})
    report = verdict.result.report
    assert report["peak"]["windows"] == [[0.0, 300.0]] and report["peak"]["cost_per_hour_usd"] < 5  # the burst's own
    assert report["cost_per_hour_max_usd"] > 5 and report["costliest_window"][0] >= 300  # the replicas it woke
    cost = next(c for c in verdict.checks if c.window == "peak" and c.metric == "cost_per_hour_usd")
    assert not cost.passed and cost.value == report["cost_per_hour_max_usd"] and "costliest window" in cost.reason
    assert not verdict.passed
