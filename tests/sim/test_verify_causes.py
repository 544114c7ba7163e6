"""verify's verdicts and reasons on fleets whose scaling lags or tops out: the money a burst costs is spent after
it, and a failure is blamed on what the fleet really did."""

from fleetserve.sim.setup import SimOptions
from fleetserve.sim.verify import verify
from fleetserve.spec.load import load_spec_data
from fleetserve.traces.model import TraceRequest
from tests.helpers import endpoint_of


def gpu_endpoint(maximum: int = 4, minimum: int = 0):
    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "routing": {"strategy": "prefixaware"}, "placement": {"instanceTypes": ["g6e.xlarge"]},
            "autoscaling": {"minReplicaCount": minimum, "maxReplicaCount": maximum, "pollingInterval": 30,
                            "cooldownPeriod": 300, "triggers": [{"metric": "concurrency", "target": 4}]}}
    return endpoint_of("lag", spec)


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

def test_requests_all_at_one_instant_get_a_verdict_not_a_crash():
    """Every request at t=0: the windows are one instant and the fleet records no state inside them (an
    IndexError exited 1, which reads as "fail")."""
    from tests.sim.test_golden import spec

    trace = [TraceRequest(0.0, 100, 20, (i,)) for i in range(5)]
    verdict = verify(spec("autoscaling.yaml"), trace, SimOptions(), {"ttft_p95_ms": 10})
    assert not verdict.passed
    idle = next(c for c in verdict.checks if c.window == "idle" and c.metric == "ttft_p95_ms")
    peak = next(c for c in verdict.checks if c.window == "peak" and c.metric == "ttft_p95_ms")
    # one window: the idle verdict tells the peak's story, and says why
    assert idle.reason.split("target: ", 1)[1].startswith(peak.reason.split("target: ", 1)[1])
    assert "single window" in idle.reason


def test_a_trace_of_one_instant_is_judged_on_the_run_with_its_money_not_on_a_window_of_zero_hours():
    """500 requests at t=0 on a GPU fleet: the only window was [0, 0] (peak and idle $0 over 0 hours, at a cost
    per hour the run never had); it now covers the run (shorter than a window), its cost and GPU-hours."""
    trace = [TraceRequest(0.0, 500, 100, (i,)) for i in range(500)]
    report = verify(gpu_endpoint(minimum=1), trace, SimOptions(), {"ttft_p95_ms": 60000}).result.report
    end = report["duration_s"]
    assert 0 < end < 300
    for key in ("peak", "idle"):
        section = report[key]
        assert section["windows"] == [[0.0, end]] and section["requests"] == 500
        assert section["cost_usd"] == report["cost_usd"] > 0 and section["gpu_hours"] == report["gpu_hours"] > 0
        assert abs(section["cost_per_hour_usd"] - report["cost_usd"] / (end / 3600)) < 0.01


def test_a_one_window_trace_is_judged_alike_on_either_side_of_half_a_window():
    """149 s of arrivals were judged with their drain (window [0, 235.6], $8.55/h) and 151 s without it
    ([0, 151], $7.85/h): one rule on both sides of half a window now."""
    ends = {}
    for span in (149, 151):
        trace = [TraceRequest(float(i), 3000, 300, (i,)) for i in range(span + 1)]
        report = verify(gpu_endpoint(minimum=1), trace, SimOptions(), {"ttft_p95_ms": 600000}).result.report
        (window,) = report["peak"]["windows"]
        ends[span] = (window[1], report["duration_s"], report["peak"]["cost_per_hour_usd"])
        assert window[1] == min(report["duration_s"], 300.0) > span, (span, window, report["duration_s"])
    assert abs(ends[149][2] - ends[151][2]) < 0.05 * ends[149][2], ends


def test_a_trace_of_one_request_is_judged_on_the_time_until_its_answer():
    report = verify(gpu_endpoint(minimum=1), [TraceRequest(0.0, 500, 100, (1,))], SimOptions(),
                    {"ttft_p95_ms": 600000}).result.report
    end = report["duration_s"]
    assert report["peak"]["windows"] == [[0.0, end]] and report["peak"]["hours"] > 0
    assert report["peak"]["cost_usd"] == report["cost_usd"] > 0


def test_an_e2e_target_that_the_answers_alone_miss_is_not_blamed_on_capacity():
    """2,000-token answers at one request a minute on 4 static replicas: each request alone decodes for longer
    than the target, so more replicas cannot help and verify says so (it said the static fleet was too small)."""
    from fleetserve.sim.verify import decode_floor_ms

    static = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "long"},
                             "spec": {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"},
                                      "replicas": 4, "placement": {"instanceTypes": ["g6e.xlarge"]}}}).endpoint
    trace = [TraceRequest(i * 60.0, 200, 2000, (i,)) for i in range(20)]
    verdict = verify(static, trace, SimOptions(), {"e2e_p95_ms": 10_000})
    e2e = next(c for c in verdict.checks if c.window == "peak" and c.metric == "e2e_p95_ms")
    assert not e2e.passed
    floor = decode_floor_ms(verdict.result, "peak")
    assert floor > 10_000 and floor <= e2e.value + 1e-3  # alone: the floor of what was measured
    assert "more replicas cannot meet it" in e2e.reason and "static fleet" not in e2e.reason


def test_a_budget_spent_on_a_schedule_floor_is_blamed_on_the_floor():
    """Two replicas held up by a business-hours floor while one request a minute arrives: the overspend is the
    floor's, not "the peak needs more GPUs"."""
    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 0,
            "placement": {"instanceTypes": ["g6e.xlarge"]},
            "autoscaling": {"minReplicaCount": 0, "maxReplicaCount": 3, "cooldownPeriod": 60,
                            "initialCooldownPeriod": 0, "triggers": [{"metric": "concurrency", "target": 4}],
                            "schedules": [{"name": "biz", "timezone": "UTC", "start": "0 0 * * *",
                                           "end": "0 23 * * *", "minReplicas": 2}]}}
    endpoint = endpoint_of("cron", spec)
    trace = [TraceRequest(i * 60.0, 200, 50, (i,)) for i in range(30)]
    verdict = verify(endpoint, trace, SimOptions(start="2026-01-05T01:00:00+00:00"), {"cost_per_hour_usd": 1})
    for window in ("peak", "idle"):
        cost = next(c for c in verdict.checks if c.window == window and c.metric == "cost_per_hour_usd")
        assert not cost.passed and "a schedule floor holds 2 replica(s)" in cost.reason, cost.reason


def test_an_overspend_on_empty_nodes_is_not_blamed_on_a_floor_of_zero():
    """Scaled to zero, with nodes kept two hours before consolidation: "minReplicaCount holds 0 replica(s) up"
    was the reason; the money went to the empty nodes."""
    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 0,
            "placement": {"instanceTypes": ["g6e.xlarge"]},
            "capacity": {"consolidation": {"policy": "WhenEmpty", "consolidateAfter": 7200}},
            "autoscaling": {"minReplicaCount": 0, "maxReplicaCount": 3, "cooldownPeriod": 60,
                            "initialCooldownPeriod": 0, "triggers": [{"metric": "concurrency", "target": 4}]}}
    endpoint = endpoint_of("idle", spec)
    trace = [TraceRequest(i * 2.0, 200, 50, (i,)) for i in range(100)]  # 200 s of load, then quiet
    trace += [TraceRequest(1800.0 + i * 600, 200, 50, (1000 + i,)) for i in range(3)]
    verdict = verify(endpoint, trace, SimOptions(), {"cost_per_hour_usd": 0.5})
    reasons = [c.reason for c in verdict.checks if c.metric == "cost_per_hour_usd" and not c.passed]
    assert reasons and all("nodes stay up with no replica on them" in r for r in reasons), reasons


def cold_bursts_between_a_warm_peak() -> list[TraceRequest]:
    """A warm peak (0.5 requests/s for 600 s), then five bursts of 40 requests, 20 minutes apart: each finds the
    fleet scaled to zero. Their windows are neither peak (quieter) nor idle (the empty windows are quieter)."""
    peak = [TraceRequest(i * 2.0, 500, 100, (10_000 + i,)) for i in range(300)]
    bursts = [TraceRequest(1800 + k * 1200 + i * 0.5, 500, 100, (20_000 + 100 * k + i,))
              for k in range(5) for i in range(40)]
    return sorted(peak + bursts, key=lambda r: r.arrival_s)


def test_cold_starts_at_idle_fail_idle_not_only_the_whole_trace():
    """A fifth of the requests waited ~160 s for a cold start and verify passed: peak and idle both met the SLO,
    idle's windows being the empty ones. Idle is now the quietest windows with requests: the bursts."""
    verdict = verify(gpu_endpoint(), cold_bursts_between_a_warm_peak(), SimOptions(),
                     {"ttft_p95_ms": 20000, "e2e_p95_ms": 120000})
    report = verdict.result.report
    by = {(c.window, c.metric): c for c in verdict.checks}
    assert by["peak", "ttft_p95_ms"].passed and not by["idle", "ttft_p95_ms"].passed and not verdict.passed
    assert "scale from zero: requests wait for a cold start" in by["idle", "ttft_p95_ms"].reason
    assert report["idle"]["requests"] == 200 and all(report["windows"]["arrivals"][int(a // 300)]
                                                     for a, _ in report["idle"]["windows"])
    assert report["worst"]["misses"] == 40 and report["worst"]["windows_with_misses"] == 5


def test_cold_starts_in_windows_neither_peak_nor_idle_fail_the_whole_trace():
    """The same cold bursts with a trickle after the peak, quieter than a burst: the bursts are neither peak nor
    idle, and the whole trace's row names where its misses fall."""
    trickle = [TraceRequest(600 + i * 60.0, 500, 100, (30_000 + i,)) for i in range(20)]
    trace = sorted(cold_bursts_between_a_warm_peak() + trickle, key=lambda r: r.arrival_s)
    verdict = verify(gpu_endpoint(), trace, SimOptions(), {"ttft_p95_ms": 20000, "e2e_p95_ms": 120000})
    report = verdict.result.report
    by = {(c.window, c.metric): c for c in verdict.checks}
    worst = report["worst"]
    assert worst["kind"] == "other" and worst["misses"] == 40 and report["slo_attainment"] < 0.9
    ttft = by["all", "ttft_p95_ms"]
    assert not ttft.passed and not verdict.passed
    a, b = worst["windows"][0]
    assert f"{a:.0f}-{b:.0f} s, neither a peak nor an idle window" in ttft.reason and "scale from zero" in ttft.reason
    assert ("all", "cost_per_hour_usd") not in by  # never above the costliest window's, which peak checks


def test_a_budget_spent_after_the_peak_is_not_blamed_on_the_peak():
    """The costliest window is the one after the burst: the reason said "the peak needs more GPUs"."""
    verdict = verify(gpu_endpoint(), late_burst(), SimOptions(),
                     {"ttft_p95_ms": 20000, "e2e_p95_ms": 120000, "cost_per_hour_usd": 5})
    cost = next(c for c in verdict.checks if c.window == "peak" and c.metric == "cost_per_hour_usd")
    assert "the costliest window is not a peak window" in cost.reason, cost.reason
    assert "scaleDownStabilizationTime" in cost.reason and "peak needs more GPUs" not in cost.reason


def test_the_state_entering_every_window_counts_not_only_the_first():
    """A multi-window peak read only the state entering its first window: a window the fleet entered at 4
    replicas and that recorded nothing of its own was taken for one at 1."""
    from types import SimpleNamespace

    from fleetserve.sim.verify import _window_points

    series = [(0.0, 1, 1, 1, 1.0, 1), (100.0, 1, 1, 1, 1.0, 1), (400.0, 4, 4, 4, 4.0, 4)]
    points = _window_points(SimpleNamespace(series=series), [(0.0, 300.0), (600.0, 900.0)])
    assert (600.0, 4, 4, 4, 4.0, 4) in points  # entering the second window, stamped at its start
    assert max(p[2] for p in points) == 4 and series[0] in points and series[1] in points
    # a state recorded at the very start of a window is the one entering it, not the one before
    series = [(0.0, 0, 0, 0, 0.0, 0), (300.0, 3, 3, 3, 3.0, 3)]
    assert _window_points(SimpleNamespace(series=series), [(300.0, 600.0)]) == [(300.0, 3, 3, 3, 3.0, 3)]


def test_a_window_length_that_is_not_a_round_number_takes_each_windows_own_requests():
    """--window 3.3: window 3 starts at 9.9 s and 9.9 / 3.3 = 2.999..., so the peak took window 2's requests (none)
    and passed on requests it never looked at."""
    from fleetserve.sim.report import window_requests

    trace = [TraceRequest(0.0, 200, 20, (1,))] + [TraceRequest(10 + i * 0.075, 200, 20, (100 + i,)) for i in range(40)]
    trace += [TraceRequest(30.0, 200, 20, (2,))]
    verdict = verify(gpu_endpoint(), trace, SimOptions(window_s=3.3), {"ttft_p95_ms": 150})
    report = verdict.result.report
    assert report["windows"]["arrivals"][3] == 40 and report["peak"]["windows"] == [[9.9, 13.2]]
    assert report["peak"]["requests"] == 40
    assert len(window_requests(verdict.result.fleet, [(3 * 3.3, 4 * 3.3)], 10)) == 40


def test_money_spent_after_the_last_arrival_counts_against_the_budget():
    """A burst in the trace's last seconds woke 8 nodes that ran for 90 s after it, outside every window: peak and
    costliest were $1.86/h and a $4/h budget passed."""
    trace = [TraceRequest(i * 10.0, 500, 600, (10_000 + i,)) for i in range(120)]
    trace += [TraceRequest(1190 + i * 0.05, 500, 600, (20_000 + i,)) for i in range(300)]
    trace.sort(key=lambda r: r.arrival_s)
    # 2-minute windows: the 90 s drain is more than half of one, so it is a window of its own
    verdict = verify(gpu_endpoint(maximum=8, minimum=1), trace, SimOptions(window_s=120),
                     {"ttft_p95_ms": 600_000, "e2e_p95_ms": 900_000, "cost_per_hour_usd": 4})
    report = verdict.result.report
    assert report["costliest_window"][0] >= max(r.arrival_s for r in trace) and report["cost_per_hour_max_usd"] > 4
    assert report["cost_per_hour_usd"] <= report["cost_per_hour_max_usd"]  # the whole run is within its windows
    cost = next(c for c in verdict.checks if c.window == "peak" and c.metric == "cost_per_hour_usd")
    assert not cost.passed and "after the last arrival" in cost.reason and "from 1 to 8 replica(s)" in cost.reason


def test_the_whole_traces_reason_names_the_window_that_missed_that_metric():
    """Long answers miss E2E in the first window; a burst at zero misses TTFT at 1500 s. The TTFT reason named the
    first window (most misses of any kind), where TTFT p95 was 158 ms."""
    trace = [TraceRequest(i * 3.0, 300, 3000, (10_000 + i,)) for i in range(100)]
    trace += [TraceRequest(1500 + i * 0.2, 300, 50, (20_000 + i,)) for i in range(30)]
    trace += [TraceRequest(2100, 300, 50, (30_000,))]
    trace.sort(key=lambda r: r.arrival_s)
    verdict = verify(gpu_endpoint(), trace, SimOptions(), {"ttft_p95_ms": 5000, "e2e_p95_ms": 60000})
    by = {(c.window, c.metric): c for c in verdict.checks}
    assert by["peak", "ttft_p95_ms"].passed and not by["all", "ttft_p95_ms"].passed
    assert "1500-1800 s, neither a peak nor an idle window" in by["all", "ttft_p95_ms"].reason
    assert "scale from zero" in by["all", "ttft_p95_ms"].reason
    assert "0-300 s, a peak window" in by["all", "e2e_p95_ms"].reason


def test_one_window_gets_one_account_of_its_cost():
    """A single-window trace: peak said "the peak needs more GPUs", idle "replicas stay up while idle"."""
    trace = [TraceRequest(0.0, 500, 100, (i,)) for i in range(200)]
    verdict = verify(gpu_endpoint(), trace, SimOptions(), {"ttft_p95_ms": 600_000, "e2e_p95_ms": 900_000,
                                                            "cost_per_hour_usd": 1})
    costs = [c for c in verdict.checks if c.metric == "cost_per_hour_usd"]
    assert not any(c.passed for c in costs)
    assert all("stay up while idle" not in c.reason for c in costs), [c.reason for c in costs]


def test_each_miss_counts_once_when_plan_ranks_trials():
    from fleetserve.sim.verify import Check, failed

    peak = Check("peak", "ttft_p95_ms", 9.0, 5.0, False, "")
    whole = Check("all", "ttft_p95_ms", 7.0, 5.0, False, "")
    between = Check("all", "e2e_p95_ms", 70.0, 60.0, False, "")
    assert failed([peak, whole]) == [peak]  # the whole trace's TTFT miss is the peak's
    assert failed([peak, whole, between]) == [peak, between]  # an E2E miss between peak and idle is its own


def test_sagemaker_instance_types_are_said_to_be_priced_at_ec2_rates():
    """HyperPod's ml.* types were billed at EC2's on-demand price with no word about it."""
    from fleetserve.capacity.prices import sagemaker_pricing

    def placement(section: dict):
        return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "sm"},
                               "spec": {"model": {"source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
                                        "placement": section}}).endpoint.spec

    (note,) = sagemaker_pricing(placement({"instanceTypes": ["ml.g5.8xlarge", "g6e.xlarge"]}))
    assert "ml.g5.8xlarge at g5.8xlarge's $2.45/h" in note and "lower bound" in note and "g6e" not in note
    term = {"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                  "values": ["ml.p4d.24xlarge", "ml.g5.24xlarge"]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    (note,) = sagemaker_pricing(placement(affinity))
    assert "ml.g5.24xlarge at g5.24xlarge's" in note and "ml.p4d.24xlarge at p4d.24xlarge's" in note
    assert sagemaker_pricing(placement({"instanceTypes": ["g6e.xlarge"]})) == []


def test_held_at_max_means_most_of_the_window_not_a_moment():
    """An autoscaled 3-7 that touched 7 for a moment at the end of a peak it spent at ~3.8 replicas was "held at
    maxReplicaCount=7: not enough capacity", while a static 7 passed: its cause was the lag."""
    from fleetserve.sim.verify import _share

    series = [(0.0, 3, 3, 3, 3.0, 3), (250.0, 3, 7, 7, 7.0, 7), (290.0, 7, 7, 7, 7.0, 7)]  # ready at 7 from 290 s
    assert _share(series, [(0.0, 300.0)], lambda p: p[1] >= 7) == 10 / 300
    assert _share(series, [(0.0, 300.0), (300.0, 600.0)], lambda p: p[1] >= 7) == 310 / 600
    assert _share(series, [(295.0, 295.0)], lambda p: p[1] >= 7) == 1.0  # a window of no length: its state


def test_held_at_max_after_a_scale_from_zero_counts_the_time_the_fleet_served():
    """0 ready until 200 s, then 3 (max) for the rest of a 0-300 s window, p95 900 s: blamed on the cold start
    again once "held at max" asked for half the window, of which two thirds were the cold start."""
    from types import SimpleNamespace

    from fleetserve.sim.verify import _capacity_cause

    series = [(0.0, 0, 3, 3, 3.0, 3), (200.0, 3, 3, 3, 3.0, 3)]
    scaling = SimpleNamespace(max_replicas=3, min_replicas=0)
    fleet = SimpleNamespace(series=series, policy_scaling=scaling, static=0, replicas=[], unplaced={},
                            capacity=SimpleNamespace(provider=None), disruptions={})
    section = {"windows": [[0.0, 300.0]], "failed_by_reason": {}, "ttft_ms": {"p95": 900_000.0}}
    result = SimpleNamespace(fleet=fleet, report={"peak": section})
    cause = _capacity_cause(result, "peak")
    assert "held at maxReplicaCount=3" in cause and "after a scale from zero" in cause, cause


def test_a_fleet_capacity_could_not_place_is_not_blamed_on_its_size():
    """A static 4 on a machine of one slot ran 1 replica: "a static fleet of 4 replica(s) cannot carry the peak
    load", no warning, and plan doubled to 64 replicas that all ran as one."""
    from fleetserve.sim.plan import Planner

    spec = {"model": {"source": "builtin:smollm2-135m"}, "replicas": 4, "routing": {"strategy": "leastload"},
            "capacity": {"localSlots": 1}}
    endpoint = endpoint_of("slots", spec)
    trace = [TraceRequest(i * 0.05, 300, 40) for i in range(300)]
    verdict = verify(endpoint, trace, SimOptions(), {"ttft_p95_ms": 100})
    report = verdict.result.report
    assert report["replicas_max"] == 1 and not verdict.passed
    said = "only 1 of the static fleet's 4 replicas could be placed"
    assert any(said in c.reason and "capacity.localSlots = 1" in c.reason for c in verdict.checks), verdict.checks
    assert any("at most 1 replica(s) ran" in w for w in report["warnings"]), report["warnings"]
    planner = Planner(endpoint, trace, SimOptions(), {"ttft_p95_ms": 100}, None, 20, ())
    planner.plan()
    statics = [t.data["spec"]["replicas"] for t in planner.history if t.step == "static"]
    assert statics == [1, 2] and "local" in planner.placement_bound  # x2 placed 1: no x4 ... x64


def test_instance_type_local_is_this_machine_not_a_gpu_type():
    """`instanceTypes: [local]` (what `models list` gives the CPU model) asked the local type for a GPU: every
    request was refused, "no available offering fits a replica of 1 GPU(s)"."""
    from fleetserve.sim.run import simulate

    def endpoint(placement: dict):
        spec = {"model": {"source": "builtin:smollm2-135m"}, "replicas": 2, "placement": placement}
        return endpoint_of("cpu", spec)

    trace = [TraceRequest(i * 0.5, 100, 10) for i in range(40)]
    named = simulate(endpoint({"instanceTypes": ["local"]}), trace, SimOptions()).report
    unnamed = simulate(endpoint({}), trace, SimOptions()).report
    assert named["failed"] == 0 and named["placement_failures"] == {}
    assert (named["ttft_ms"], named["cost_usd"]) == (unnamed["ttft_ms"], unnamed["cost_usd"])


def test_spec_choices_the_run_could_not_act_on_are_said():
    """Session routing on a trace without session keys was leastload's run under session's name, and autoscaling
    without triggers scaled on a default trigger, both without a word."""
    from fleetserve.sim.run import simulate

    spec = {"model": {"source": "builtin:smollm2-135m"}, "replicas": 1, "routing": {"strategy": "session"},
            "autoscaling": {"minReplicaCount": 1, "maxReplicaCount": 2}}
    endpoint = endpoint_of("s", spec)
    warnings = simulate(endpoint, [TraceRequest(i, 50, 5) for i in range(5)], SimOptions()).report["warnings"]
    assert any("no session keys" in w and "leastload's figures" in w for w in warnings), warnings
    assert any("no triggers" in w and "4 requests in flight per replica" in w for w in warnings), warnings
    keyed = [TraceRequest(i, 50, 5, session=f"s{i % 2}") for i in range(5)]
    assert not any("session keys" in w for w in simulate(endpoint, keyed, SimOptions()).report["warnings"])
    kv = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "k"},
                         "spec": {**spec, "routing": {"strategy": "kvaware"}}}).endpoint
    hashed = [TraceRequest(i, 600, 5, (1, 2)) for i in range(5)]
    blind = simulate(kv, hashed, SimOptions()).report["warnings"]
    assert any("kvaware in blind mode" in w and "prefixaware's figures" in w for w in blind), blind
    informed = simulate(kv, hashed, SimOptions(knowledge="informed")).report["warnings"]
    assert not any("kvaware" in w for w in informed), informed
    text = [TraceRequest(i, 0, 5, prompt="shared words " * 300) for i in range(5)]
    on_text = simulate(kv, text, SimOptions(knowledge="informed")).report["warnings"]
    assert any("kvaware on text prompts" in w for w in on_text), on_text
    assert not any("--knowledge informed" in w for w in informed)  # the built-in engine publishes its events
    vllm = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "v"},
                           "spec": {**spec, "routing": {"strategy": "kvaware"},
                                    "model": {"source": "catalog:llama-3.1-8b-instruct"}, "engine": {"kind": "vllm"},
                                    "placement": {"instanceTypes": ["g6e.xlarge"]}}}).endpoint
    informed = simulate(vllm, hashed, SimOptions(knowledge="informed")).report["warnings"]
    assert any("--knowledge informed" in w and "engine.kind vllm does not publish" in w for w in informed), informed


def test_an_autoscaled_overspend_names_what_the_autoscaler_ran_and_its_target():
    """"The peak needs more GPUs than the budget pays for" and "replicas stay up while idle (minReplicaCount ...)"
    were said of a 1-4 fleet whose target of 4 scaled it past the budget, where one replica passed every check."""
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "placement": {"instanceTypes": ["g6e.xlarge"]},
            "autoscaling": {"minReplicaCount": 1, "maxReplicaCount": 4,
                            "triggers": [{"metric": "concurrency", "target": 1}]}}
    endpoint = endpoint_of("t", spec)
    trace = [TraceRequest(i * 0.25, 400, 200, (i,)) for i in range(2400)]
    verdict = verify(endpoint, trace, SimOptions(window_s=60), {"ttft_p95_ms": 60000, "cost_per_hour_usd": 2.0})
    cost = {c.window: c for c in verdict.checks if c.metric == "cost_per_hour_usd"}
    assert not cost["peak"].passed and "a higher target per replica" in cost["peak"].reason, cost["peak"].reason
    assert "peak needs more GPUs" not in cost["peak"].reason.split("; otherwise")[0]
    idle = cost["idle"]
    assert not idle.passed and "(minReplicaCount 1, concurrency target 1/replica)" in idle.reason, idle.reason
    from fleetserve.sim.verify import _target

    assert _target(verdict.result.fleet) == "concurrency target 1/replica"


def test_a_drain_shorter_than_half_a_window_joins_the_last_window_as_a_short_tail_does():
    """A 23 s drain after the last arrival, priced alone, failed a budget at the full fleet's rate that the trace's
    only window met ($2.98/h against $1.61/h)."""
    from types import SimpleNamespace

    from fleetserve.sim.report import cost_bounds
    fleet = SimpleNamespace(options=SimpleNamespace(window_s=300.0))
    assert cost_bounds(fleet, [(0.0, 261.6)], 285.0) == [(0.0, 285.0)]
    assert cost_bounds(fleet, [(0.0, 300.0), (300.0, 600.0)], 601.5) == [(0.0, 300.0), (300.0, 601.5)]
    assert cost_bounds(fleet, [(0.0, 300.0)], 460.0) == [(0.0, 300.0), (300.0, 460.0)]  # half a window or more
    assert cost_bounds(fleet, [(0.0, 300.0)], 300.0) == [(0.0, 300.0)]


def spot_fleet_with_long_streams():
    """3 spot replicas, and 60 requests of 7,000 output tokens (~4.5 minutes each): spot notices cut streams."""
    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct", "contextLength": 16384},
            "replicas": 3, "routing": {"strategy": "leastload"}, "placement": {"instanceTypes": ["g6e.xlarge"]},
            "capacity": {"provider": "simulated", "capacityTypes": ["spot"]}}
    endpoint = endpoint_of("spot", spec)
    return endpoint, [TraceRequest(i * 20.0, 500, 7000) for i in range(60)]


def test_streams_cut_by_spot_interruptions_are_named_not_blamed_on_the_fleets_size():
    """verify said "a static fleet of 3 replica(s) cannot carry the peak load" for streams that spot notices cut,
    and plan doubled the fleet to 64 replicas, which cannot keep them."""
    endpoint, trace = spot_fleet_with_long_streams()
    verdict = verify(endpoint, trace, SimOptions(spot_interruption_rate=6.0), {"e2e_p95_ms": 400_000})
    errors = [c for c in verdict.checks if c.metric == "error_rate" and not c.passed]
    assert errors and verdict.result.fleet.disruptions["lost_mid_stream"] > 0
    assert all("stream(s) were cut when their replica stopped" in c.reason and "spot interruption" in c.reason
               and "cannot carry" not in c.reason and "at most 120 s (the 120 s notice)" in c.reason for c in errors)
    # a drain timeout under the notice is the limit then, and said to be
    data = endpoint.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spec"]["engine"] = {**data["spec"].get("engine", {}), "drainTimeoutSeconds": 30}
    short = verify(load_spec_data(data).endpoint, trace, SimOptions(spot_interruption_rate=6.0),
                   {"e2e_p95_ms": 400_000})
    cut = [c.reason for c in short.checks if c.metric == "error_rate" and not c.passed]
    assert cut and all("at most 30 s (engine.drainTimeoutSeconds (30 s" in r for r in cut), cut


def test_plan_answers_spot_cut_streams_with_on_demand_capacity_not_more_replicas():
    """plan doubled a spot fleet whose streams spot notices cut up to 64 replicas and picked $53.80 of p5, where the
    same spec on on-demand capacity passes at a fraction of it."""
    from fleetserve.sim.plan import plan

    endpoint, trace = spot_fleet_with_long_streams()
    result = plan(endpoint, trace, SimOptions(spot_interruption_rate=6.0), {"e2e_p95_ms": 400_000}, max_trials=12)
    assert result.winner is not None and result.winner.verdict.passed
    assert result.winner.data["spec"]["capacity"]["capacityTypes"] == ["on-demand"]
    assert result.winner.cost < result.baseline.cost
    change = next(c for c in result.changes if c["path"] == "spec.capacity.capacityTypes")
    assert "spot interruptions" in change["why"] and "more replicas do not keep" in change["why"]


def scaled_down_fleet_with_long_streams(drain: float | None = None):
    """4 on-demand replicas that scale down to 1 while 7,000-token answers (~4.5 minutes) still stream."""
    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct", "contextLength": 16384},
            "engine": {"kind": "vllm", **({"drainTimeoutSeconds": drain} if drain else {})},
            "replicas": 4, "routing": {"strategy": "leastload"}, "placement": {"instanceTypes": ["g6e.xlarge"]},
            "capacity": {"provider": "simulated", "simulated": {"provisioningDelaySeconds": 60},
                         "consolidation": {"policy": "WhenEmpty", "consolidateAfter": 60}},
            "autoscaling": {"minReplicaCount": 1, "maxReplicaCount": 4, "scaleDownStabilizationTime": 60,
                            "triggers": [{"metric": "concurrency", "target": 4}]}}
    endpoint = endpoint_of("down", spec)
    burst = [TraceRequest(i * 0.5, 500, 7000) for i in range(16)]
    return endpoint, burst + [TraceRequest(45.0 + i * 45.0, 500, 7000) for i in range(24)]


def test_streams_a_drain_cut_name_the_drain_timeout_and_a_longer_one_keeps_them():
    """The drain timeout was a constant (120 s) in the supervisor, the simulator and the rendered grace period;
    `engine.drainTimeoutSeconds` sets it in all three, and verify names it when drains cut streams."""
    endpoint, trace = scaled_down_fleet_with_long_streams()
    slo = {"e2e_p95_ms": 600_000}
    verdict = verify(endpoint, trace, SimOptions(), slo)
    errors = [c for c in verdict.checks if c.metric == "error_rate" and not c.passed]
    assert errors and verdict.result.fleet.disruptions["lost_mid_stream"] > 0
    assert all("drains, which stop a replica 120 s later" in c.reason
               and "a longer engine.drainTimeoutSeconds" in c.reason and "spot" not in c.reason for c in errors)
    endpoint, trace = scaled_down_fleet_with_long_streams(drain=600)
    kept = verify(endpoint, trace, SimOptions(), slo)
    assert kept.passed and kept.result.fleet.disruptions["lost_mid_stream"] == 0


def test_plan_gives_a_drained_replica_time_to_finish_the_traces_longest_answers():
    from fleetserve.sim.plan import plan

    endpoint, trace = scaled_down_fleet_with_long_streams()
    result = plan(endpoint, trace, SimOptions(), {"e2e_p95_ms": 600_000}, max_trials=12)
    assert result.winner is not None and result.winner.verdict.passed
    raised = result.winner.data["spec"]["engine"]["drainTimeoutSeconds"]
    assert raised > 120 and raised % 60 == 0
    change = next(c for c in result.changes if c["path"] == "spec.engine.drainTimeoutSeconds")
    assert "longest answer streamed for" in change["why"] and f"for {raised} s" in change["why"]
    endpoint, _ = spot_fleet_with_long_streams()  # short answers: the input's timeout stays
    short = [TraceRequest(i * 20.0, 500, 50) for i in range(30)]
    unchanged = plan(endpoint, short, SimOptions(), {"e2e_p95_ms": 600_000}, max_trials=6)
    assert not [c for c in unchanged.changes if c["path"] == "spec.engine.drainTimeoutSeconds"]


def test_the_planned_drain_is_the_winners_need_not_the_overloaded_inputs():
    """A one-replica input streams its answers for minutes under the trace (1,325 s on 1,500 of the Azure code
    trace's requests): the drain sized on it (34 minutes) was written for a winner of several replicas whose
    longest answer takes seconds, and it went into every pod's termination grace."""
    from pathlib import Path

    import yaml

    from fleetserve.sim.plan import plan
    from tests.sim.conftest import azure_slice

    doc = yaml.safe_load((Path(__file__).parents[2] / "examples" / "hyperpod.yaml").read_text())
    doc["spec"]["replicas"] = 1
    doc["spec"]["autoScalingSpec"].update(minReplicaCount=1, maxReplicaCount=1)
    endpoint = load_spec_data(doc).endpoint
    result = plan(endpoint, azure_slice(0, 500), SimOptions(), {"ttft_p95_ms": 10000, "e2e_p95_ms": 60000},
                  max_trials=8)
    assert result.winner is not None and result.winner.verdict.passed
    assert result.winner.label.endswith(", drain fitted") and result.trials == 9  # one past the budget: the check
    assert result.winner.data["spec"]["engine"]["drainTimeoutSeconds"] == 120  # the input's own is enough
    assert not [c for c in result.changes if c["path"] == "spec.engine.drainTimeoutSeconds"]
    # a static winner's autoscaler, off, holds its count: turned back on, it had started over its maximum of 1
    spec = result.winner.data["spec"]
    assert spec["autoscaling"]["enabled"] is False and spec["autoscaling"]["maxReplicaCount"] == spec["replicas"] > 1


def test_spot_cuts_of_requests_the_input_refused_for_their_length_still_move_plan_to_on_demand():
    """The switch read the input at its largest size before plan raised its context: the long requests were
    refused there, no stream was cut, and the search stayed on spot."""
    from fleetserve.sim.plan import plan

    endpoint, trace = spot_fleet_with_long_streams()
    data = endpoint.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spec"]["model"]["contextLength"] = 4096  # every 7,500-token request is refused as written
    short = load_spec_data(data).endpoint
    result = plan(short, trace, SimOptions(spot_interruption_rate=6.0), {"e2e_p95_ms": 400_000}, max_trials=14)
    assert result.context["to"] >= 7500
    assert result.winner is not None and result.winner.data["spec"]["capacity"]["capacityTypes"] == ["on-demand"]


def test_spot_churn_that_shows_as_latency_gets_each_type_searched_on_demand_too():
    """Interruptions every few minutes and a 200 s provisioning delay cut no stream of short answers but leave the
    fleet short: plan had won with 8 spot replicas at 4x the cost of one on-demand node that passes."""
    from fleetserve.sim.plan import Planner

    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct", "contextLength": 16384},
            "engine": {"kind": "vllm"}, "replicas": 2, "routing": {"strategy": "leastload"},
            "placement": {"instanceTypes": ["g6e.xlarge"]},
            "capacity": {"provider": "simulated", "capacityTypes": ["spot", "on-demand"]}}
    endpoint = endpoint_of("churn", spec)
    trace = [TraceRequest(i * 1.0, 1500, 100) for i in range(900)]
    options = SimOptions(spot_interruption_rate=20.0, provisioning_delay_s=200.0)
    search = Planner(endpoint, trace, options, {"ttft_p95_ms": 2000}, max_trials=40, instance_types=("g6.xlarge",))
    result = search.plan()
    assert result.baseline.verdict.result.fleet.disruptions["lost_mid_stream"] == 0  # not the cut-stream switch
    # verify blamed the fleet's size alone; the notices are named with what keeps the fleet whole
    assert all("spot interruption notice(s) took replicas away" in c.reason and "on-demand capacity" in c.reason
               for c in result.baseline.verdict.checks if not c.passed and c.metric == "ttft_p95_ms")
    assert result.winner is not None and result.winner.data["spec"]["capacity"]["capacityTypes"] == ["on-demand"]
    spot = [t for t in search.history if t.step == "static" and t.verdict.passed and "on-demand" not in t.instance_type]
    assert all(result.winner.cost < t.cost for t in spot)
    assert any("searched on on-demand capacity too" in n for n in result.notes)
    change = next(c for c in result.changes if c["path"] == "spec.capacity.capacityTypes")
    assert "on-demand x" in change["why"]


def test_a_type_short_for_most_of_the_trace_is_named_and_not_doubled():
    """A shortage of the only type until just before the trace ends: its replicas are placed late, so the all-time
    replica count reached the fleet's size, and plan doubled the type to x64 ("all 265 requests failed") without
    naming the shortage."""
    from fleetserve.sim.plan import Planner

    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct", "contextLength": 16384},
            "engine": {"kind": "vllm"}, "replicas": 2, "routing": {"strategy": "leastload"},
            "placement": {"instanceTypes": ["g5.xlarge"]},
            "capacity": {"provider": "simulated", "simulated": {"provisioningDelaySeconds": 3, "shortages": [
                {"instanceType": "g5.xlarge", "startSeconds": 0, "endSeconds": 550}]}}}
    endpoint = endpoint_of("short", spec)
    # long enough for the replicas to be placed within it: while none can be (no capacity, none on its way) the
    # requests are refused at once, as the live router does, so nothing held keeps the run going past the trace
    trace = [TraceRequest(i * 2.0, 500, 50) for i in range(400)]
    verdict = verify(endpoint, trace, SimOptions(), {"ttft_p95_ms": 5000})
    assert max(p[2] for p in verdict.result.fleet.series) == 2  # placed, once the shortage ended
    missed = [c for c in verdict.checks if not c.passed and c.window == "peak"]
    assert missed and all("were not all placed for" in c.reason and "placed no sooner" in c.reason for c in missed)
    search = Planner(endpoint, trace, SimOptions(), {"ttft_p95_ms": 5000}, max_trials=20, instance_types=())
    search.plan()
    statics = [t.data["spec"]["replicas"] for t in search.history if t.step == "static"]
    assert statics == [1] and "g5.xlarge" in search.placement_bound


def test_an_idle_overspend_of_a_fleet_up_to_its_max_is_not_blamed_on_the_cooldown():
    """A scale-to-zero fleet that ran several replicas through its quietest windows read 'the idle requests wake
    replicas that run on for cooldownPeriod; a shorter cooldown fits the budget': no cooldown brought it down."""
    from fleetserve.sim.verify import _overspend

    busy = [TraceRequest(i * 0.25, 500, 600, (30_000 + i,)) for i in range(4 * 1200)]  # 4/s for 20 min
    calm = [TraceRequest(1200 + i * 1.0, 500, 600, (40_000 + i,)) for i in range(1200)]  # then 1/s
    verdict = verify(gpu_endpoint(maximum=6), busy + calm, SimOptions(), {"cost_per_hour_usd": 1})
    reason = _overspend(verdict.result, "idle")
    assert "cooldownPeriod" not in reason and "6 replica(s) up while idle" in reason, reason
    assert "scaleDownStabilizationTime" in reason
    # one replica that requests every 4 s never let go: scaling to zero cannot save there either
    steady = [TraceRequest(i * 4.0, 200, 50, (50_000 + i,)) for i in range(900)]
    verdict = verify(gpu_endpoint(maximum=2), steady, SimOptions(), {"cost_per_hour_usd": 0.1})
    reason = _overspend(verdict.result, "idle")
    assert "a shorter cooldown" not in reason, reason


def test_a_winner_whose_replicas_ran_on_its_fallback_type_says_so():
    """Its first type was short for the whole trace: plan named the winner 'ml.g5.xlarge static x7' and its why
    'the cheapest static fleet of ml.g5.xlarge', while every replica ran (and was priced) on g6e.xlarge."""
    from fleetserve.sim.plan import Planner

    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct", "contextLength": 16384},
            "engine": {"kind": "vllm"}, "replicas": 2, "routing": {"strategy": "leastload"},
            "placement": {"instanceTypes": ["g5.xlarge", "g6e.xlarge"]},
            "capacity": {"provider": "simulated", "simulated": {"provisioningDelaySeconds": 3, "shortages": [
                {"instanceType": "g5.xlarge", "startSeconds": 0, "endSeconds": 100_000}]}}}
    endpoint = endpoint_of("fb", spec)
    trace = [TraceRequest(i * 2.0, 500, 50) for i in range(300)]
    verdict = verify(endpoint, trace, SimOptions(), {"ttft_p95_ms": 5000})
    assert set(verdict.result.report["node_hours_by_type"]) == {"g6e.xlarge"}
    planner = Planner(endpoint, trace, SimOptions(), {"ttft_p95_ms": 5000}, max_trials=12, instance_types=())
    out = planner.plan().to_json()
    assert out["verified"]
    assert any("ran mostly on g6e.xlarge" in w and "g5.xlarge was short of capacity" in w
               for w in out["warnings"]), out["warnings"]


def test_a_replica_count_above_the_max_is_said_as_validate_says_it():
    """`replicas: 5` with maxReplicaCount 3 ran at 3, and simulate (unlike validate) said nothing."""
    from fleetserve.sim.run import simulate

    endpoint = gpu_endpoint(maximum=3, minimum=1)
    over = endpoint.model_copy(update={"spec": endpoint.spec.model_copy(update={"replicas": 5})})
    report = simulate(over, late_burst()[:20], SimOptions()).report
    assert "spec.replicas: 5 is above autoscaling.maxReplicaCount (3): the fleet runs at most 3" in report["warnings"]
    assert not any(w.startswith("spec.replicas") for w in simulate(endpoint, late_burst()[:20],
                                                                   SimOptions()).report["warnings"])


def test_cost_and_gpu_hours_agree_with_the_node_ledger_when_spot_nodes_are_interrupted():
    """A spot node whose replica had drained away at the notice kept costing in the series (cost, GPU-hours, the
    plots) until the next change, 11 s past its termination in the ledger (node_hours_by_type)."""
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.sim.run import simulate

    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "placement": {"instanceTypes": ["g5.xlarge"]},
            "capacity": {"provider": "simulated", "capacityTypes": ["spot"],
                         "simulated": {"provisioningDelaySeconds": 30, "spotInterruptionRatePerHour": 6}},
            "autoscaling": {"minReplicaCount": 2, "maxReplicaCount": 4, "pollingInterval": 15,
                            "triggers": [{"metric": "concurrency", "target": 4}]}}
    endpoint = endpoint_of("spot", spec)
    trace = [TraceRequest(i * 2.0, 800, 200, (30_000 + i,)) for i in range(900)]
    report = simulate(endpoint, trace, SimOptions(seed=3)).report
    assert report["disruptions"]["spot_notices"] >= 1  # what the check is about happened
    hours = sum(report["node_hours_by_type"].values())
    price = Catalog.builtin().get("g5.xlarge")
    assert abs(report["gpu_hours"] - hours * price.gpus) < 1e-5, (report["gpu_hours"], hours)
    assert abs(report["cost_usd"] - hours * price.spot) < 1e-5


def test_an_l2_price_is_part_of_the_fleets_cost_and_a_free_l2_is_said():
    """L2 (a Redis server) cost nothing in the simulator, so plan could turn it on for free."""
    from fleetserve.sim.run import simulate

    def endpoint(l2: dict):
        base = gpu_endpoint(maximum=2, minimum=1)
        kv = base.spec.kv_cache.model_copy(update={"l2": base.spec.kv_cache.l2.model_copy(update=l2)})
        return base.model_copy(update={"spec": base.spec.model_copy(update={"kv_cache": kv})})

    trace = late_burst()[:40]
    free = simulate(endpoint({"enabled": True}), trace, SimOptions()).report
    paid = simulate(endpoint({"enabled": True, "price_per_hour": 0.5}), trace, SimOptions()).report
    off = simulate(endpoint({"enabled": False, "price_per_hour": 0.5}), trace, SimOptions()).report
    hours = paid["duration_s"] / 3600
    assert abs(paid["cost_usd"] - free["cost_usd"] - 0.5 * hours) < 1e-4, (paid["cost_usd"], free["cost_usd"], hours)
    assert any("kvCache.l2 is enabled without pricePerHour" in w for w in free["warnings"])
    assert not any("pricePerHour" in w for w in paid["warnings"] + off["warnings"])
    assert off["cost_usd"] == free["cost_usd"]  # disabled: its price is not paid


def test_the_prefill_floor_of_the_built_in_engine_takes_a_lone_prompt_whole_as_its_replica_does():
    """cpu-135m prefills a prompt with nothing else running in one step; the floor charged a step's base per
    256-token chunk (5,058 ms against a measured 4,478), and plan gave up on fleets that pass."""
    from fleetserve.sim.verify import prefill_floor_ms
    from tests.sim.test_golden import spec

    trace = [TraceRequest(i * 60.0, 4000 + 100 * i, 20, (i,)) for i in range(20)]  # a minute apart: no queueing
    verdict = verify(spec("quickstart.yaml"), trace, SimOptions(), {"ttft_p95_ms": 1})
    ttft = next(c for c in verdict.checks if c.window == "peak" and c.metric == "ttft_p95_ms")
    floor = prefill_floor_ms(verdict.result, "peak")
    assert floor <= ttft.value + 1e-3 and floor >= 0.95 * ttft.value, (floor, ttft.value)


def test_a_costliest_first_window_names_the_replicas_the_fleet_started_with():
    """The first window was read as entered with 0 replicas: a fleet started warm at 2 that only ever scaled down
    was said to have "scaled from 0 to 2" for a burst, and the reason never named spec.replicas."""
    from types import SimpleNamespace

    from fleetserve.sim.verify import _ran_on

    series = [(0.0, 2, 2, 2, 2.0, 2), (400.0, 1, 1, 1, 1.0, 1)]
    policy = SimpleNamespace(max_replicas=4, min_replicas=1, cooldown=300.0, down_window=300.0)
    report = {"peak": {"windows": [[600.0, 900.0]]}, "windows": {"window_s": 300.0, "arrivals": [30, 10, 90, 5]}}
    result = SimpleNamespace(report=report, fleet=SimpleNamespace(series=series, policy_scaling=policy))
    reason = _ran_on(result, (0.0, 300.0), [series[0]])
    assert "started with 2 replica(s) (spec.replicas" in reason and "scaled from 0" not in reason, reason


def test_idle_misses_after_a_scale_down_are_not_blamed_on_max_replicas():
    """At idle the fleet was at max (4) for most of the window, but dropped to 1 in a lull and took a cold start to
    come back, and its misses came then: verify said "replicas held at maxReplicaCount=4", and raising it would
    not have helped. Misses arriving mostly below max say so instead; misses at max still blame max."""
    from types import SimpleNamespace

    from fleetserve.sim.verify import _capacity_cause

    series = [(0.0, 4, 4, 4, 4.0, 4), (240.0, 1, 1, 1, 1.0, 1), (300.0, 4, 4, 4, 4.0, 4)]  # 1 from 240 to 300 s
    slo = {"ttft_p95_ms": 2000.0, "e2e_p95_ms": 30000.0}

    def request(at: float, ttft: float):
        return SimpleNamespace(arrival=at, first=at + ttft, done=at + ttft + 1, error=None)

    def cause(slow_at: list[float]) -> str:
        requests = [request(t, 0.5) for t in range(0, 600, 10)] + [request(t, 40.0) for t in slow_at]
        fleet = SimpleNamespace(series=series, policy_scaling=SimpleNamespace(max_replicas=4, min_replicas=1),
                                static=0, replicas=[], unplaced={}, capacity=SimpleNamespace(provider=None),
                                disruptions={}, requests=requests, t0=0.0)
        section = {"windows": [[0.0, 600.0]], "failed_by_reason": {}, "ttft_ms": {"p95": 40_000.0}}
        return _capacity_cause(SimpleNamespace(fleet=fleet, report={"idle": section, "slo": slo}), "idle")

    lull = cause([245.0, 255.0, 265.0, 275.0, 285.0, 320.0])
    assert "replicas went down to 1 during the idle" in lull and "5 of its 6 misses" in lull, lull
    assert "maxReplicaCount" not in lull
    at_max = cause([100.0, 150.0, 400.0, 450.0, 500.0, 250.0])
    assert "held at maxReplicaCount=4" in at_max, at_max


def test_prompts_the_router_timed_out_count_in_the_engine_floor():
    """An overloaded fleet's long prompts time out (upstream_timeout) and only its short ones are answered: the
    floor was computed over the answered alone, so at peak (1,699 of 1,739 timed out) verify blamed capacity only,
    while each prompt alone took 26 s on the engine, and plan read the engine-bound cause as none."""
    from fleetserve.traces.load import load_trace
    from tests.sim.conftest import MOONCAKE

    spec = {"model": {"name": "Llama-3.1-8B-Instruct", "source": "s3://bucket/models/Llama-3.1-8B-Instruct"},
            "engine": {"kind": "vllm", "args": ["--max-model-len", "131072"]}, "replicas": 2,
            "placement": {"instanceTypes": ["ml.g5.8xlarge"]}, "routing": {"strategy": "prefixaware"}}
    verdict = verify(endpoint_of("floor", spec), load_trace(str(MOONCAKE)), SimOptions(), {"ttft_p95_ms": 2000})
    peak = next(c for c in verdict.checks if c.window == "peak" and c.metric == "ttft_p95_ms")
    assert verdict.result.fleet.rejected["upstream_timeout"] > 1000
    assert not peak.passed and peak.floor is not None and peak.floor > 20_000, peak
    assert "more replicas cannot meet it" in peak.reason and "queueing on top" in peak.reason, peak.reason


def test_a_latency_row_says_its_misses_are_among_the_answered_when_requests_failed():
    """The whole trace's TTFT row named "most misses" in one window and the error-rate row in another: latency is
    judged on the answered requests, and the row now says so where requests failed."""
    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "routing": {"strategy": "leastload"}, "placement": {"instanceTypes": ["g6e.xlarge"]},
            "router": {"upstreamTimeoutSeconds": 30}}
    long = [TraceRequest(i * 0.4, 8000, 10, tuple(range(100_000 * i, 100_000 * i + 31))) for i in range(300)]
    short = [TraceRequest(i * 0.4 + 0.2, 200, 10, (10**9 + i,)) for i in range(300)]
    trace = sorted(long + short, key=lambda r: r.arrival_s)
    verdict = verify(endpoint_of("answered", spec), trace, SimOptions(), {"ttft_p95_ms": 5000, "e2e_p95_ms": 120000})
    rows = {c.metric: c.reason for c in verdict.checks if c.window == "all"}
    assert "most answered requests over the target" in rows["ttft_p95_ms"], rows["ttft_p95_ms"]
    assert "most misses" in rows["error_rate"], rows["error_rate"]


def test_one_request_over_the_context_is_said_in_the_singular():
    """"1 requests of the idle window need more than ..." read in verify's table."""
    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "placement": {"instanceTypes": ["g6e.xlarge"]}}
    trace = [TraceRequest(float(i), 300, 10, (i,)) for i in range(20)] + [TraceRequest(20.0, 9000, 10, (99,))]
    verdict = verify(endpoint_of("one", spec), trace, SimOptions())
    reasons = [c.reason for c in verdict.checks if c.metric == "error_rate" and not c.passed]
    assert reasons and all("1 request of" in r and " needs more than " in r for r in reasons), reasons


def test_a_ttft_the_prefix_loads_from_l2_alone_miss_is_not_blamed_on_the_fleets_size():
    """Roundrobin with L1 and L2: most turns of a conversation find their prefix in L2 and load it at 1.2 GB/s, which
    no queue causes. Verify blamed capacity ("a static fleet of 64 replica(s) cannot carry the peak load" at TTFT
    p95 719 ms). The loads are named, but are no engine floor (`Check.floor`, where plan stops doubling): under a
    cache-aware strategy more replicas keep more prefixes in engine memory, and the loads shrink."""
    from fleetserve.traces.generate import WorkloadSpec, generate

    trace = generate(WorkloadSpec(content="chat", duration_s=300, rate=2, seed=3), with_text=False)
    endpoint = endpoint_of("rr", {
        "model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 16,
        "routing": {"strategy": "roundrobin"}, "placement": {"instanceTypes": ["g6e.xlarge"]},
        "kvCache": {"l1": {"enabled": True, "maxBytes": "8Gi"}, "l2": {"enabled": True, "maxBytes": "512Gi"}}})
    verdict = verify(endpoint, trace, SimOptions(), {"ttft_p95_ms": 400})
    reasons = [c.reason for c in verdict.checks if not c.passed and c.metric == "ttft_p95_ms"]
    assert reasons and all("with the load of the prefixes they found in L1 or L2" in r and "roundrobin" in r
                           for r in reasons), reasons
    assert not any("cannot carry" in r for r in reasons), reasons
    assert all(c.floor is None for c in verdict.checks)  # not the engine's: plan keeps searching


def test_a_fleet_that_only_scaled_down_from_its_start_is_not_blamed_on_the_autoscaler():
    """Found by a black-box pass: on a one-window trace the peak row compared the window with itself (the
    costliest window's end takes in the drain, the peak window's does not) and the idle row said "the
    autoscaler ran up to 4 replica(s) at the peak" for the 4 replicas of spec.replicas, never scaled up; a
    three-request trace whose first window is its peak got the same blame."""
    spec = {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 4,
            "routing": {"strategy": "prefixaware"}, "placement": {"instanceTypes": ["g6e.xlarge"]},
            "autoscaling": {"minReplicaCount": 0, "maxReplicaCount": 4, "pollingInterval": 15,
                            "cooldownPeriod": 60, "triggers": [{"metric": "concurrency", "target": 4}]}}
    slo = {"ttft_p95_ms": 600_000, "e2e_p95_ms": 900_000, "cost_per_hour_usd": 1}
    one_window = [TraceRequest(i * 0.2, 500, 100, (i,)) for i in range(1000)]
    sparse = [TraceRequest(t, 500, 50, (i,)) for i, t in enumerate((0.0, 1800.0, 3600.0))]
    for trace in (one_window, sparse):
        verdict = verify(endpoint_of("warm", spec), trace, SimOptions(), slo)
        assert verdict.result.report["scaling"]["changes"] == 0 or trace is sparse
        reasons = [c.reason for c in verdict.checks if c.metric == "cost_per_hour_usd" and not c.passed]
        assert reasons and any(r.startswith("peak:") for r in reasons), reasons
        for reason in reasons:
            if reason.startswith("peak:") or trace is one_window:
                # the sparse trace's first request is activity: KEDA's cooldown from it takes the replicas to zero
                # in a minute, and what is left of the peak's cost is the emptied nodes before consolidation
                assert "the fleet started with 4 replica(s) (spec.replicas" in reason or (
                    trace is sparse and "nodes stay up with no replica on them" in reason), reason
            assert "autoscaler ran up to" not in reason and "is not a peak window" not in reason, reason
            assert "ran no more in these windows" in reason or not reason.startswith("peak:") or \
                "nodes stay up with no replica on them" in reason, reason
