"""The control loop skips its rounds through idle stretches (`SimFleet._next_tick`): a long trace
with quiet hours must give exactly the report, decisions, node history and cost of a run that looks every
second, with far fewer rounds."""

import json
import random

import pytest

from fleetserve.sim.run import simulate
from fleetserve.sim.setup import SimOptions
from fleetserve.traces.model import TraceRequest
from tests.sim.test_golden import spec


def bursts_with_quiet_hours(seed: int, bursts: int = 4, gap_s: float = 6 * 3600) -> list[TraceRequest]:
    """Bursts of 60 requests (2 per second, shared prefixes) separated by hours of silence."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(bursts):
        for _ in range(60):
            t += rng.expovariate(2.0)
            out.append(TraceRequest(t, rng.randint(50, 800), rng.randint(5, 60),
                                    tuple(rng.randint(0, 20) for _ in range(2))))
        t += gap_s * rng.uniform(0.5, 1.5)
    return out


def run(endpoint, trace, fast: bool, **options):
    result = simulate(endpoint, trace, SimOptions(fast_forward=fast, **options))
    result.report["sim"].pop("events")  # the one figure that must differ: skipped rounds are events not run
    fleet = result.fleet
    return (json.dumps(result.report, sort_keys=True, default=str), fleet.decisions, fleet.series,
            fleet.capacity.log), fleet.ticks


@pytest.mark.parametrize("example, options", [
    ("autoscaling.yaml", {}),  # scale to zero at night, a cron floor in Seoul business hours
    ("autoscaling.yaml", {"knowledge": "informed"}),  # health rounds keep every second (their order matters)
    ("simulated-cloud.yaml", {}),  # nodes, consolidateAfter, an ICE shortage, spot preferred
    ("hyperpod.yaml", {}),
    ("quickstart.yaml", {}),  # no autoscaler: nothing to poll
])
def test_skipping_idle_rounds_changes_no_figure(example, options):
    endpoint, trace = spec(example), bursts_with_quiet_hours(3)
    slow, slow_ticks = run(endpoint, trace, False, **options)
    fast, fast_ticks = run(endpoint, trace, True, **options)
    assert fast == slow
    assert slow_ticks > 40_000  # about 18 hours of simulated time, looked at every second
    assert fast_ticks * 10 < slow_ticks


def test_spot_nodes_keep_every_round():
    """Spot interruptions are drawn per round from the seeded RNG: skipping would change the draws."""
    endpoint, trace = spec("simulated-cloud.yaml"), bursts_with_quiet_hours(4, bursts=2, gap_s=3600)
    slow, slow_ticks = run(endpoint, trace, False, spot_interruption_rate=0.5)
    fast, fast_ticks = run(endpoint, trace, True, spot_interruption_rate=0.5)
    assert fast == slow
    assert fast_ticks == slow_ticks


@pytest.mark.parametrize("budget", ["100%", None])  # None: Karpenter's default 10 %, one node at a time
def test_an_out_of_capacity_mark_expiring_in_a_quiet_stretch_is_a_round(budget):
    """An on-demand node on its fallback type is replaced once the cheaper offering's mark expires: that round runs
    however quiet a fleet without an autoscaler is (g5.xlarge is short for the first hour, and every retry marks it
    again), and the run-up to the next burst found the fleet still on its fallback. Under a budget of one node at a
    time the second replacement waits for the first deleted node to stop counting (60 s): that is a round too."""
    from tests.sim.test_consolidation_replaces import fell_back

    endpoint = fell_back(shortage_end_s=3600.0, budget=budget)
    trace = bursts_with_quiet_hours(5, bursts=2, gap_s=3 * 3600)
    slow, slow_ticks = run(endpoint, trace, False)
    fast, fast_ticks = run(endpoint, trace, True)
    assert fast == slow
    assert any("replacing node" in line for line in fast[3]), fast[3]
    assert fast_ticks * 5 < slow_ticks
