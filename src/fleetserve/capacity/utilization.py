"""The load ratio consolidation reads: the fleet's demand over what its ready replicas are meant to carry.

    load_ratio = (in_flight + pending) / (max(1, target_per_replica) x ready_replicas)   (0 with none ready)

`consolidate()` removes an underutilized node only when load_ratio x N / (N - k) <= 1 afterwards. Shared by
the local fleet supervisor and the simulator.
"""

from __future__ import annotations


def load_ratio(in_flight: int, pending: int, target_per_replica: float, ready_replicas: int) -> float:
    if ready_replicas <= 0:
        return 0.0
    return (in_flight + pending) / (max(1.0, target_per_replica) * ready_replicas)


def target_per_replica(policy) -> float:
    """The first trigger's target (the supervisor's convention), 4 without autoscaling."""
    return policy.triggers[0].target if policy is not None and policy.triggers else 4.0
