"""A floor's end in the simulator, which reads the fleet's load one scrape late (`metric_lag_s`): a request served
in the window's last seconds must not wake the fleet from zero after the window closes."""

from fleetserve.sim.run import simulate
from fleetserve.sim.setup import SimOptions
from fleetserve.spec.load import load_spec_data
from fleetserve.traces.model import TraceRequest


def endpoint():
    spec = {"model": {"name": "llama", "source": "catalog:llama-3.1-8b-instruct"}, "replicas": 1,
            "routing": {"strategy": "roundrobin"}, "placement": {"instanceTypes": ["g5.xlarge"]},
            "autoscaling": {"minReplicaCount": 0, "maxReplicaCount": 2, "pollingInterval": 30, "cooldownPeriod": 300,
                            "schedules": [{"name": "morning", "timezone": "UTC", "start": "0 10 * * 1-5",
                                           "end": "30 10 * * 1-5", "minReplicas": 1}],
                            "triggers": [{"metric": "concurrency", "target": 4, "activationTarget": 0},
                                         {"metric": "ttft_p95", "target": 2000}]}}
    return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "floor-end"},
                           "spec": spec}).endpoint


def test_a_request_at_the_floors_end_does_not_wake_the_fleet_after_it():
    # the window opens at the trace's start (Monday 10:00 UTC) and closes at 10:30; a request 5 s before the close,
    # nothing for hours after it, then one more request that ends the run
    trace = [TraceRequest(t, 500, 20) for t in (0.0, 600.0, 1795.0, 4 * 3600.0)]
    fleet = simulate(endpoint(), trace, SimOptions()).fleet
    closes = 1800.0  # decisions are timed from the trace's start
    after = [(t - closes, desired, why) for t, desired, why in fleet.decisions if closes <= t < 4 * 3600]
    woken = [d for d in after if "activated from zero" in d[2]]
    assert not woken, after
    zero = [d for d in after if d[1] == 0]
    assert zero and zero[0][0] >= 300 - 30, after  # the cooldown counts from the window's close
