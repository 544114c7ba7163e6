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
