"""plan's explanations: what it says about the input and the winner."""


def test_a_zero_dollar_baseline_says_why():
    """`$0.75 against $0.00 for the input` read as a bargain the input had, where it had placed no replica."""
    from types import SimpleNamespace

    from fleetserve.sim.plan import PlanResult

    def baseline(cost, requests, failed):
        checks = [SimpleNamespace(passed=False, reason="error_rate: no replica could be placed")]
        verdict = SimpleNamespace(result=SimpleNamespace(report={"requests": requests, "failed": failed}),
                                  checks=checks)
        result = PlanResult.__new__(PlanResult)
        result.baseline = SimpleNamespace(cost=cost, verdict=verdict)
        return result.baseline_note()

    assert baseline(0.0, 300, 300) == "it served none of the 300 requests: error_rate: no replica could be placed"
    assert "localPricePerHour" in baseline(0.0, 300, 12)
    assert baseline(1.5, 300, 300) is None


def test_a_type_of_as_many_gpus_as_a_replica_asks_is_not_larger_than_it():
    """A 4-GPU replica on g6e.12xlarge (4 GPUs) had allowLargerInstances turned on ("more GPUs than one replica
    asks"): rendered for Kubernetes, Karpenter could then pick 8-GPU nodes."""
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.capacity.placement import ReplicaRequest
    from fleetserve.sim.plan import _with_type

    data = {"spec": {"placement": {"instanceTypes": ["g5.xlarge"]}, "capacity": {}}}
    catalog = Catalog.builtin()
    assert catalog.get("g6e.12xlarge").gpus == 4
    four = _with_type(data, "g6e.12xlarge", catalog, asked=ReplicaRequest(gpus=4))
    one = _with_type(data, "g6e.12xlarge", catalog, asked=ReplicaRequest(gpus=1))
    assert four["spec"]["capacity"]["allowLargerInstances"] is False
    assert one["spec"]["capacity"]["allowLargerInstances"] is True


def test_a_winner_with_the_context_raised_is_not_called_the_baseline_it_does_not_cost():
    """The input at its max replicas with its context raised won, and its `why` called it "the baseline, $1.0142"
    beside a baseline_cost_usd of $0.9748 (the input as written, which refused the long requests)."""
    from types import SimpleNamespace

    from fleetserve.sim.plan_why import _static_replicas

    report = {"gpu_hours": 0.414, "replica_hours": 0.414}
    trial = SimpleNamespace(step="baseline", parent=None, cost=1.0142, verdict=SimpleNamespace(
        result=SimpleNamespace(report=report), passed=True))
    search = SimpleNamespace(types=[], history=[], unfit={}, exhausted=False, max_trials=8,
                             context={"from": 4096, "to": 22528, "requests_over": 85})
    raised = _static_replicas(search, SimpleNamespace(**vars(trial), label="input static at max replicas, "
                                                                                  "context raised"))
    assert "the baseline," not in raised and "context raised to 22528 ($1.0142" in raised, raised
    assert "baseline_cost_usd is the input as written (context 4096: 85 requests refused)" in raised
    as_written = _static_replicas(search, SimpleNamespace(**vars(trial), label="input static at max replicas"))
    assert as_written.startswith("the input at its max replicas (the baseline, $1.0142")


def test_a_cache_blind_input_is_planned_routed_by_prefix_where_no_fleet_of_it_passes():
    """Roundrobin over a conversation trace: every turn reloads its prefix from L2 on another replica, which no
    number of replicas helps. Only the winner's routing was varied, so plan bought a p5.48xlarge at $8.20 where two
    g6e.xlarge routed by prefix pass at $0.34; each type is now searched routed by prefix too."""
    from fleetserve.sim.plan import plan
    from fleetserve.sim.setup import SimOptions
    from fleetserve.traces.generate import WorkloadSpec, generate
    from tests.helpers import endpoint_of

    trace = generate(WorkloadSpec(content="chat", duration_s=300, rate=2, seed=3), with_text=False)
    endpoint = endpoint_of("rr", {
        "model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct", "contextLength": 131072},
        "replicas": 4, "routing": {"strategy": "roundrobin"}, "placement": {"instanceTypes": ["g6e.xlarge"]},
        "kvCache": {"l1": {"enabled": True, "maxBytes": "8Gi"}, "l2": {"enabled": True, "maxBytes": "512Gi"}},
        "capacity": {"provider": "simulated"}})
    out = plan(endpoint, trace, SimOptions(), {"ttft_p95_ms": 400}, max_trials=40).to_json()
    assert out["verified"] and out["cost_usd"] < 1.0, out["winner"]
    (routing,) = [c for c in out["changes"] if c["path"] == "spec.routing.strategy"]
    assert routing["to"] == "prefixaware" and "ignores the prompts' shared prefixes" in routing["why"], routing


def test_the_baseline_of_a_static_input_at_zero_is_no_fleet():
    """`replicas: 0` without autoscaling serves nothing: its baseline ran one replica ($0.02 "for the input")."""
    from fleetserve.sim.plan import _max_replicas

    assert _max_replicas({"replicas": 0}) == 0 and _max_replicas({"replicas": 3}) == 3
    assert _max_replicas({"replicas": 0, "autoscaling": {"maxReplicaCount": 4}}) == 4
