"""The router gives up on a replica that sends no first byte within router.upstreamTimeoutSeconds of the send
(504 upstream_timeout, not retried: router/dispatch.py); the simulator does the same, or an overloaded fleet's
requests waited 40 minutes there and counted as answered."""

from fleetserve.sim.run import simulate
from fleetserve.sim.setup import SimOptions
from fleetserve.spec.load import load_spec_data
from fleetserve.traces.model import TraceRequest


def endpoint(upstream_timeout: float | None):
    router = {"upstreamTimeoutSeconds": upstream_timeout} if upstream_timeout else {}
    return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "slow"},
                           "spec": {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"},
                                    "replicas": 1, "routing": {"strategy": "leastload"}, "router": router,
                                    "placement": {"instanceTypes": ["g5.xlarge"]}}}).endpoint


# 60 distinct 4,000-token prompts at once on one replica (about 2 s of prefill each), then one more at 300 s
BURST = [TraceRequest(i * 0.01, 4000, 20) for i in range(60)] + [TraceRequest(300.0, 4000, 20)]
TIMEOUT = 10


def test_a_send_without_a_first_byte_in_time_fails_upstream_timeout_and_leaves_its_replica():
    result = simulate(endpoint(TIMEOUT), BURST, SimOptions(static_replicas=1))
    report, requests = result.report, result.fleet.requests
    timed_out = [r for r in requests if r.error == "upstream_timeout"]
    assert timed_out and report["failed_by_reason"] == {"upstream_timeout": len(timed_out)}
    for r in timed_out:  # at the deadline, as the router answers
        assert abs((r.done - r.arrival) - TIMEOUT) < 1e-6
    answered = [r for r in requests if r.error is None]
    assert answered and all(r.first - r.arrival <= TIMEOUT + 1 for r in answered)  # a first byte in time (+ overhead)
    late = requests[-1]  # the replica dropped the requests whose clients were gone: it is free again
    assert late.error is None and late.first - late.arrival < TIMEOUT
    assert result.fleet.outstanding == 0 and result.fleet.book.in_flight["r0"] == 0


def test_the_default_timeout_fails_nothing_here_and_the_run_ends_with_its_last_answer():
    report = simulate(endpoint(None), BURST, SimOptions(static_replicas=1)).report
    assert report["failed"] == 0
    assert report["duration_s"] < 600  # not 1,800 s after the last send, when its (idle) deadline timer fires
