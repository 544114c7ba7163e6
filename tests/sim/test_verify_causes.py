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


def test_a_burst_at_zero_that_then_waits_at_max_is_blamed_on_max_not_on_the_cold_start():
    """300 requests in 3 s at zero on the local example (cold start ~8 s, at most 3 replicas): a TTFT p95 of a
    minute was blamed on the cold start; it is the fleet held at maxReplicaCount."""
    from tests.sim.test_golden import spec

    trace = [TraceRequest(i * 0.01, 100, 20, (i,)) for i in range(300)]
    trace += [TraceRequest(1200 + i * 20.0, 100, 20, (1000 + i,)) for i in range(50)]
    verdict = verify(spec("autoscaling.yaml"), trace, SimOptions())
    ttft = next(c for c in verdict.checks if c.window == "peak" and c.metric == "ttft_p95_ms")
    assert not ttft.passed and ttft.value > 30_000
    assert "held at maxReplicaCount=3" in ttft.reason and "after a scale from zero" in ttft.reason


def test_too_little_capacity_at_idle_names_the_replicas_the_fleet_had():
    """The idle cause printed minReplicaCount (0) as the replicas kept, while 2 to 3 were ready all along."""
    from fleetserve.sim.verify import _capacity_cause
    from fleetserve.traces.generate import WorkloadSpec, generate

    trace = generate(WorkloadSpec.for_kind("bursts", duration_s=3600, rate=2, seed=3, burst_factor=8,
                                           burst_every_s=900, burst_s=60), with_text=False)
    verdict = verify(gpu_endpoint(), trace, SimOptions(), {"ttft_p95_ms": 1})
    cause = _capacity_cause(verdict.result, "idle")
    fleet, spans = verdict.result.fleet, verdict.result.report["idle"]["windows"]
    ready = {p[1] for p in fleet.series if any(a <= p[0] < b for a, b in spans)}
    assert "minReplicaCount 0" in cause and "0 replica(s)" not in cause, cause
    assert f"{min(ready)}" in cause


def test_window_costs_in_one_pass_equal_each_windows_integral():
    from fleetserve.sim.fleet import span_hours
    from fleetserve.sim.report import window_bounds, window_costs, window_count
    from fleetserve.sim.run import simulate

    fleet = simulate(gpu_endpoint(), late_burst(), SimOptions()).fleet
    bounds = window_bounds(fleet, window_count(fleet))
    assert len(bounds) == 6
    for got, (a, b) in zip(window_costs(fleet.series, bounds), bounds, strict=True):
        assert abs(got - span_hours(fleet.series, a, b, 4)) < 1e-9
