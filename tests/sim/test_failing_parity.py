"""No replica can start: the simulator refuses as the live router does (`autoscale/failing.py`, one rule for both),
instead of holding every request for the buffer timeout."""

import pytest

from fleetserve.autoscale.failing import CRASH_LOOP, STATIC_ZERO, unplaced, why_failing
from fleetserve.sim.run import simulate
from fleetserve.sim.setup import SimOptions
from fleetserve.sim.verify import verify
from fleetserve.traces.model import TraceRequest
from tests.helpers import endpoint_of


def trace(n: int = 20, gap: float = 2.0) -> list[TraceRequest]:
    return [TraceRequest(i * gap, 200, 20, (i,)) for i in range(n)]


def fleet_spec(**spec) -> dict:
    return {"model": {"name": "llama-8b", "source": "catalog:llama-3.1-8b-instruct"},
            "placement": {"instanceTypes": ["g6e.xlarge"]}, **spec}


@pytest.mark.parametrize("args, reason", [
    ((0, False, False, False, False, ""), STATIC_ZERO),  # nothing can wake it
    ((0, True, False, False, False, ""), None),  # at zero, autoscaled: the next request wakes it
    ((0, False, True, False, False, ""), None),  # an external engine is not ours to start
    ((1, True, False, True, False, unplaced("no offering fits")), None),  # one serves
    ((1, True, False, False, True, unplaced("no offering fits")), None),  # one is on its way
    ((1, True, False, False, False, unplaced("no offering fits")), unplaced("no offering fits")),
    ((1, True, False, False, False, "engine exited"), None),  # not a placement error, no crash loop
])
def test_why_failing(args, reason):
    assert why_failing(*args) == reason


def test_a_crash_loop_is_failing_without_the_replicas_own_error():
    """The replica's last log line (a model path, a traceback's words) had reached every client in the 503: it is
    the operator's (status, logs); clients hear that no replica can start."""
    error = "replica r0 exited with code 1 and is restarting; its last error: --model: /srv/models/acme does not exist"
    assert why_failing(1, True, False, False, True, error, crash_looping=True) == CRASH_LOOP
    assert "/srv" not in CRASH_LOOP


def test_a_static_fleet_of_zero_refuses_every_request_at_once_and_verify_names_why():
    """Each request had waited the 600 s buffer timeout (a 636 s run for 37 s of trace) for a cold_start_timeout,
    where `up` answers 503 replicas_failing at once; verify blamed the load on "a static fleet of 0"."""
    endpoint = endpoint_of("zero", fleet_spec(replicas=0))
    result = simulate(endpoint, trace(), SimOptions())
    assert result.report["failed_by_reason"] == {"replicas_failing": 20}
    assert all(r.done == r.arrival for r in result.fleet.requests)  # at arrival, not after a hold
    assert result.report["duration_s"] < 60
    verdict = verify(endpoint, trace(), SimOptions())
    assert not verdict.passed
    assert any(STATIC_ZERO in c.reason for c in verdict.checks if not c.passed), verdict.checks


def test_a_fleet_that_cannot_place_its_replica_refuses_what_it_holds_at_the_next_round():
    """Autoscaled from zero onto nodes no replica fits on: the held request waited out the buffer timeout (a day of
    it walked for minutes of wall time); the supervisor tells the router at its next round, and so does this."""
    endpoint = endpoint_of("unplaceable", fleet_spec(
        replicas=0, router={"bufferTimeoutSeconds": 86400},
        engine={"resources": {"requests": {"cpu": "500"}}},
        autoscaling={"minReplicaCount": 0, "maxReplicaCount": 2, "triggers": [{"metric": "concurrency", "target": 4}]}))
    options = SimOptions()
    result = simulate(endpoint, trace(5), options)
    assert result.report["failed_by_reason"] == {"replicas_failing": 5}
    first = result.fleet.requests[0]
    assert first.done - first.arrival <= options.reconcile_s + 1e-9  # one control round, not the buffer timeout
    assert result.fleet.failing.startswith("cannot place a replica")
