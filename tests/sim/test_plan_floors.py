"""`plan` searches time-of-day floors: peaks found in the trace's day, floors that beat the autoscaler's cold
start, and a winner whose changes say why its floors differ from the input's."""

import numpy as np

from fleetserve.sim.floors import DAY, PeakWindow, peak_windows, reached, slot_seconds
from fleetserve.sim.plan import plan
from fleetserve.sim.setup import SimOptions
from fleetserve.sim.verify import verify
from fleetserve.spec.load import load_spec_data
from fleetserve.traces.model import TraceRequest
from tests.helpers import endpoint_of

SLO = {"ttft_p95_ms": 5000, "e2e_p95_ms": 60000}
START = SimOptions().start_epoch  # 10:00 UTC


def daily_peak(seed: int = 0) -> list[TraceRequest]:
    """Half an hour from 10:00 UTC: 0.3 requests/s, and 3/s from 10:10 to 10:15 (one replica carries the rest)."""
    rng = np.random.default_rng(seed)
    out, t = [], 0.0
    while t < 1800:
        t += rng.exponential(1 / (3.0 if 600 <= t < 900 else 0.3))
        out.append(TraceRequest(t, int(rng.integers(1000, 4000)), int(rng.integers(100, 400))))
    return out


def endpoint(schedules: list[dict] | None = None):
    auto = {"minReplicaCount": 1, "maxReplicaCount": 4, "triggers": [{"metric": "concurrency", "target": 4}],
            "schedules": schedules or []}
    return load_spec_data({
        "apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "daily"},
        "spec": {"model": {"source": "hf:meta-llama/Llama-3.1-8B-Instruct"}, "replicas": 1,
                 "placement": {"instanceTypes": ["g6e.xlarge"]}, "autoscaling": auto}}).endpoint


def test_slots_and_peak_windows_of_the_day():
    assert slot_seconds(1800) == 300 and slot_seconds(3 * 3600) == 1800 and slot_seconds(5 * DAY) == 3600
    windows, slot = peak_windows([r.arrival_s for r in daily_peak()], START)
    assert slot == 300 and [w.label for w in windows] == ["10:10-10:15 UTC"]
    assert windows[0].cron(windows[0].start_s) == "10 10 * * *" and windows[0].cron(windows[0].end_s) == "15 10 * * *"
    assert peak_windows([float(s) for s in range(0, 1800, 2)], START)[0] == []  # flat load: no floors to derive
    # a peak across midnight on two days is one window that wraps: 23:00-01:00
    night = [h * 3600 + m * 60 + d * DAY for d in (0, 1) for h in range(24) for m in range(0, 60, 10)
             for _ in range(10 if h in (23, 0) else 1)]
    windows, slot = peak_windows([float(t) for t in night], 0.0)
    assert slot == 3600 and [w.label for w in windows] == ["23:00-01:00 UTC"]
    assert reached([(0.0, 1, 1), (82800.0, 3, 3), (90000.0, 1, 1)], 0.0, windows[0]) == 3


def test_a_daily_peak_gets_a_planned_floor_that_passes_verify_and_is_explained():
    """The input's floor (10:20-10:28, after the peak) only costs; the plan replaces it with a floor on the peak
    (or with none, when no floor is cheaper), says why, and the winner passes verify on its own."""
    trace = daily_peak()
    late = [{"name": "late", "start": "20 10 * * *", "end": "28 10 * * *", "minReplicas": 3}]
    result = plan(endpoint(late), trace, SimOptions(), slo=SLO, max_trials=12, instance_types=())
    out = result.to_json()
    floors = out["floors"]
    assert floors["peak_windows"][0]["window"] == "10:10-10:15 UTC", floors
    assert [c["label"] for c in floors["candidates"]][:1] == ["no floors"] and len(floors["candidates"]) > 1
    assert out["verified"] and out["cost_usd"] < out["static_peak_cost_usd"], out["winner"]
    auto = result.winner.data["spec"]["autoscaling"]
    change = next(c for c in out["changes"] if c["path"] == "spec.autoscaling.schedules")
    assert change["from"][0]["name"] == "late"
    if auto["schedules"]:  # floors won: a window on the peak, raised one cold start early
        assert floors["chosen"] == "derived"
        assert [(s["start"], s["end"]) for s in auto["schedules"]] == [("10 10 * * *", "15 10 * * *")]
        assert auto["scheduleLeadTime"] >= floors["cold_start_s"] > 0
        assert "10:10-10:15 UTC" in change["why"] and "cold start" in change["why"]
        days = (trace[-1].arrival_s - trace[0].arrival_s) / 86400  # a rule from one sighting is said to be one
        assert any("repeat every day what a trace of" in w for w in out["warnings"]) == (days < 2), out["warnings"]
    else:  # no floor was cheaper: the search says so
        assert floors["chosen"] == "none" and change["why"].startswith("no floors")
    planned = load_spec_data(result.winner.data).endpoint  # the written spec loads and passes on its own
    assert verify(planned, trace, SimOptions(), slo=SLO).passed


def test_a_peak_window_label_and_cron_wrap_midnight():
    w = PeakWindow(23 * 3600, 25 * 3600, 10, 1.0)
    assert w.label == "23:00-01:00 UTC" and w.cron(w.end_s) == "0 1 * * *"


def test_a_plan_without_floors_leaves_no_lead_behind():
    """A winner that dropped every floor kept the input's scheduleLeadTime (180 s of lead for no floor)."""
    from fleetserve.sim.plan import _with_floors

    data = {"spec": {"replicas": 1, "autoscaling": {"maxReplicaCount": 3, "scheduleLeadTime": 180, "schedules": [
        {"name": "day", "timezone": "UTC", "start": "0 9 * * *", "end": "0 17 * * *", "minReplicas": 2}]}}}
    assert _with_floors(data, [], 0)["spec"]["autoscaling"]["scheduleLeadTime"] == 0
    kept = _with_floors(data, data["spec"]["autoscaling"]["schedules"], 120)["spec"]["autoscaling"]
    assert kept["scheduleLeadTime"] == 120 and len(kept["schedules"]) == 1


def test_floors_are_tried_on_every_types_peak_only_miss():
    """Five 2-minute bursts half an hour apart (Azure format, from 08:00 UTC): only the cheapest failing trial of
    all types got floors (g6e.xlarge 0-1, $2.86 with floors), while g6.xlarge 0-2 with floors passes at $2.50."""
    from pathlib import Path

    from fleetserve.traces.load import load_timed_trace

    trace, start = load_timed_trace(Path(__file__).parents[1] / "data" / "bursts_half_hour_apart.csv")
    spec = {"model": {"name": "llama", "source": "hf:meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"kind": "vllm", "gpus": 1}, "replicas": 2, "routing": {"strategy": "leastload"},
            "placement": {"instanceTypes": ["g6e.xlarge"]},
            "capacity": {"provider": "simulated", "simulated": {"provisioningDelaySeconds": 60}},
            "autoscaling": {"minReplicaCount": 1, "maxReplicaCount": 4,
                            "triggers": [{"metric": "concurrency", "target": 4}]}}
    endpoint = endpoint_of("gaps", spec)
    result = plan(endpoint, trace, SimOptions(start=start.isoformat()), max_trials=40)
    out = result.to_json()
    bases = {c["label"].split(" on ")[-1].split(" auto ")[0] for c in out["floors"]["candidates"]}
    assert {"g6e.xlarge", "g6.xlarge"} <= bases, out["floors"]["candidates"]
    cheapest = min(c["cost_usd"] for c in out["floors"]["candidates"] if c["verified"])
    assert out["verified"] and out["cost_usd"] <= cheapest + 1e-6 and out["cost_usd"] < 2.6, out["winner"]


def test_a_type_that_wins_through_floors_is_not_called_the_cheapest_static():
    """Floors on each type let a type win whose static fleet is not the cheapest; the why said it was."""
    from types import SimpleNamespace

    from fleetserve.sim.plan import Trial
    from fleetserve.sim.plan_why import _instance_type

    def trial(kind: str, cost: float, step: str, parent=None) -> Trial:
        report = {"cost_usd": cost, "gpu_hours": cost, "replica_hours": cost}
        verdict = SimpleNamespace(passed=True, checks=[], result=SimpleNamespace(report=report))
        return Trial({"spec": {"replicas": 2}}, verdict, f"{kind} {step}", step, kind, parent)

    g5, g6 = trial("g5.xlarge", 2.0, "static"), trial("g6.xlarge", 2.4, "static")
    auto = trial("g6.xlarge", 1.2, "auto", g6)
    won = trial("g6.xlarge", 1.5, "floors", auto)
    search = SimpleNamespace(history=[g5, g6, auto, won], types=["g5.xlarge", "g6.xlarge"], unfit={},
                             engine_bound={}, trials=4, max_trials=80, exhausted=False)
    why = _instance_type(search, won)
    assert why.startswith("g6.xlarge with time-of-day floors costs least") and "g5.xlarge's static fleet" in why
    assert _instance_type(search, trial("g5.xlarge", 1.0, "auto", g5)).startswith("the instance type whose")


def test_a_passing_input_is_a_candidate_and_never_beaten_by_a_dearer_spec():
    """An input whose target and bounds lie off the search's grid passed at $3.39 and plan wrote a $3.87 spec it
    called the cheapest: the input as written is a candidate."""
    from fleetserve.sim.plan import Planner

    trace = [TraceRequest(i * 0.5, 400, 40, (i,)) for i in range(600)]
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "placement": {"instanceTypes": ["g6e.xlarge"]},
            "autoscaling": {"minReplicaCount": 1, "maxReplicaCount": 3,
                            "triggers": [{"metric": "concurrency", "target": 3}]}}
    endpoint = endpoint_of("in", spec)
    planner = Planner(endpoint, trace, SimOptions(), {"ttft_p95_ms": 5000}, None, 30, ("g6e.xlarge",))
    result = planner.plan()
    (as_input,) = [t for t in planner.history if t.step == "input"]
    assert as_input.verdict.passed and as_input.data["spec"]["autoscaling"] == planner.base["spec"]["autoscaling"]
    out = result.to_json()
    assert out["verified"] and out["cost_usd"] <= as_input.cost
    if result.winner is as_input:
        assert [c["path"] for c in out["changes"]] == ["spec.slo.ttftP95Ms"]


def test_a_profile_plans_the_input_type_only_and_says_so():
    """--profile's one engine speed stood for every candidate type: an L4 planned at an L40S's speed won and the
    written spec failed verify at 19 s."""
    trace = [TraceRequest(i * 2.0, 400, 40, (i,)) for i in range(60)]
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "placement": {"instanceTypes": ["g6e.xlarge"]}}
    endpoint = endpoint_of("p", spec)
    result = plan(endpoint, trace, SimOptions(profile="l40s-llama-8b"), {"ttft_p95_ms": 5000}, max_trials=12)
    out = result.to_json()
    assert out["verified"] and result.winner.data["spec"]["placement"]["instanceTypes"] == ["g6e.xlarge"]
    assert "spec.placement.instanceTypes" not in {c["path"] for c in out["changes"]}
    assert any("--profile l40s-llama-8b gives one engine's speed" in w for w in out["warnings"]), out["warnings"]


def test_a_planned_type_keeps_the_inputs_other_affinity_terms_and_its_naming():
    """plan replaced the whole placement: a HyperPod spec pinned to us-west-2a came out free to land in any zone,
    and an ml.-named affinity came out in EC2 names."""
    from fleetserve.sim.plan import _pinned

    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}
    types = {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["ml.g5.8xlarge"]}
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [zone, types]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "preference": {"matchExpressions": [types]}}]}
    pinned = _pinned(affinity, "ml.g6e.xlarge")
    (term,) = pinned["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [zone, {**types, "values": ["ml.g6e.xlarge"]}]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in pinned  # it only ranked instance types
    trace = [TraceRequest(i * 2.0, 400, 40, (i,)) for i in range(60)]
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "placement": {"nodeAffinity": affinity}}
    endpoint = endpoint_of("z", spec)
    result = plan(endpoint, trace, SimOptions(), {"ttft_p95_ms": 5000}, max_trials=8, instance_types=("g6e.xlarge",))
    placed = result.winner.data["spec"]["placement"]
    expressions = placed["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert zone in expressions["matchExpressions"]
    assert all(v.startswith("ml.") for e in expressions["matchExpressions"] if e["key"] == types["key"]
               for v in e["values"])
    load_spec_data(result.winner.data)  # a valid spec


def test_a_type_over_the_budget_is_not_doubled_further():
    """A static fleet twice the size costs no less: p4d and p5 ran x1 to x64 over a $16/h budget that one node
    of them exceeds, 14 of 25 trials spent on fleets that could not pass."""
    from fleetserve.sim.plan import Planner

    trace = [TraceRequest(i * 0.5, 400, 40, (i,)) for i in range(400)]
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "placement": {"instanceTypes": ["g6e.xlarge"]}}
    endpoint = endpoint_of("b", spec)
    planner = Planner(endpoint, trace, SimOptions(), {"ttft_p95_ms": 50, "cost_per_hour_usd": 1.0}, None, 20,
                      ("p5.48xlarge",))
    planner.plan()
    statics = [(t.instance_type, t.data["spec"]["replicas"]) for t in planner.history if t.step == "static"]
    assert statics == [("g6e.xlarge", 1), ("p5.48xlarge", 1)], statics  # each over $1/h at one node
    assert set(planner.budget_bound) == {"g6e.xlarge", "p5.48xlarge"}


def test_a_planned_type_keeps_only_the_affinity_terms_that_let_it_in():
    """Terms are ORed: (g5.xlarge or g6.xlarge in us-west-2a) or (g6e.xlarge anywhere). Pinning every term to
    g5.xlarge let it land in any zone through the g6e term; and one shared expression wrote YAML anchors."""
    import yaml

    from fleetserve.sim.plan import _pinned

    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}
    key = "node.kubernetes.io/instance-type"
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": key, "operator": "In", "values": ["g5.xlarge", "g6.xlarge"]}, zone]},
        {"matchExpressions": [{"key": key, "operator": "In", "values": ["g6e.xlarge"]}]},
        {"matchExpressions": [{"key": key, "operator": "NotIn", "values": ["g5.xlarge"]}, {**zone, "values": ["b"]}]}]}}

    def terms(pinned):
        return pinned["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]

    assert terms(_pinned(affinity, "g5.xlarge")) == [
        {"matchExpressions": [zone, {"key": key, "operator": "In", "values": ["g5.xlarge"]}]}]
    assert len(terms(_pinned(affinity, "g6e.xlarge"))) == 2  # its own term, and the NotIn g5 one
    assert [t["matchExpressions"][0] for t in terms(_pinned(affinity, "p5.48xlarge"))] == [{**zone, "values": ["b"]}]
    # a type no term lets in (one of plan's own candidates) takes the terms of the input's first type
    two = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms(affinity)[:2]}}
    assert [t["matchExpressions"][0] for t in terms(_pinned(two, "p5.48xlarge", first="g5.xlarge"))] == [zone]
    several = _pinned(affinity, "g6e.xlarge")
    assert "&id" not in yaml.safe_dump(several)


def test_an_instance_type_list_keeps_the_inputs_other_types_as_fallbacks():
    """plan collapsed [g5.xlarge, g6e.xlarge, g5.2xlarge] to one type, dropping the fallbacks that keep a fleet
    placeable through a capacity shortage."""
    trace = [TraceRequest(i * 2.0, 400, 40) for i in range(60)]
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "engine": {"kind": "vllm"}, "capacity": {"provider": "simulated"},
            "placement": {"instanceTypes": ["g6e.xlarge", "g5.2xlarge", "g6.xlarge"]}}
    endpoint = endpoint_of("f", spec)
    result = plan(endpoint, trace, SimOptions(), {"ttft_p95_ms": 5000}, max_trials=10,
                  instance_types=("g5.xlarge",))
    listed = result.winner.data["spec"]["placement"]["instanceTypes"]
    assert sorted(listed[1:]) == sorted(set(spec["placement"]["instanceTypes"]) - {listed[0]})
    assert listed[1:] == [t for t in spec["placement"]["instanceTypes"] if t != listed[0]]  # in the input's order
    if listed != spec["placement"]["instanceTypes"]:
        why = next(c["why"] for c in result.changes if c["path"].startswith("spec.placement.instanceTypes"))
        assert "as fallbacks through a capacity shortage" in why


def test_a_candidates_fallbacks_are_cloud_types_the_input_could_place_each_once():
    """The input's list was copied as it was: `local` ($0, this machine) followed a cloud type, `ml.g6e.xlarge` and
    `g6e.xlarge` were listed as two types, and a type the replica does not fit on was kept as a fallback."""
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.capacity.placement import replica_request
    from fleetserve.sim.plan import _on_demand, _with_type

    catalog = Catalog.builtin()
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "engine": {"kind": "vllm", "resources": {"requests": {"cpu": "6", "memory": "30Gi"}}},
            "placement": {"instanceTypes": ["ml.g5.xlarge", "local", "g6e.xlarge", "ml.g5.2xlarge"]}}
    data = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "f"}, "spec": spec}
    endpoint = load_spec_data(data).endpoint
    asked = replica_request(endpoint.spec.engine, endpoint.spec.model, endpoint.spec.kv_cache)
    placed = _with_type(data, "ml.g5.4xlarge", catalog, asked=asked)["spec"]["placement"]["instanceTypes"]
    # g5.xlarge has 4 vCPU (the pod asks 6); g6e.xlarge is 4 too; local is no fallback
    assert placed == ["ml.g5.4xlarge", "ml.g5.2xlarge"], placed
    again = _with_type(data, "g5.2xlarge", catalog, asked=asked)["spec"]["placement"]["instanceTypes"]
    assert again == ["g5.2xlarge"]  # ml.g5.2xlarge is the same type
    spot = {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    pinned = {**data, "spec": {**spec, "placement": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [spot, zone]}]}}}}}
    terms = _on_demand(pinned)["spec"]["placement"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [zone]}]  # a term requiring spot placed nothing on demand


def test_the_autoscaled_search_tries_the_inputs_own_target_first_so_a_tie_keeps_it():
    """The search started at target 4, and a tie keeps the first found: an input's target 8 became 4 for nothing
    ("against ... t8 a tie on cost, GPU-hours and replica-hours (the one found first is kept)")."""
    from fleetserve.sim.plan import Planner

    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "placement": {"instanceTypes": ["g6e.xlarge"]},
            "autoscaling": {"minReplicaCount": 2, "maxReplicaCount": 6,
                            "triggers": [{"metric": "concurrency", "target": 8}]}}
    endpoint = endpoint_of("tie", spec)
    planner = Planner(endpoint, daily_peak(), SimOptions(), SLO, None, 40, ("g6e.xlarge",))
    planner.plan()
    auto = [t.label for t in planner.history if t.step == "auto"]
    assert auto[0].endswith(" t8"), auto
    assert {a.rsplit(" t", 1)[1] for a in auto} == {"2", "4", "8", "16"} and len(auto) == len(set(auto)), auto


def test_an_input_with_a_fallback_is_planned_with_its_fallback_within_each_candidates_max():
    """A fallback of 4 and a candidate of at most 1 replica: the plan stopped on the spec error "fallback.replicas
    (4) is above maxReplicaCount (1)"."""
    trace = [TraceRequest(i * 4.0, 400, 40, (i,)) for i in range(120)]
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "placement": {"instanceTypes": ["g6e.xlarge"]},
            "autoscaling": {"minReplicaCount": 1, "maxReplicaCount": 6, "fallback": {"replicas": 4},
                            "triggers": [{"metric": "concurrency", "target": 4}]}}
    endpoint = endpoint_of("fb", spec)
    out = plan(endpoint, trace, SimOptions(), {"ttft_p95_ms": 5000}, max_trials=16).to_json()
    assert out["verified"]
