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
