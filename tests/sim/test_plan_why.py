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
