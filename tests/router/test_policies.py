from collections import Counter

import pytest

from fleetserve.router.policies import (
    FleetSnapshot,
    ReplicaView,
    RouteRequest,
    create_policy,
    registered_policies,
)


def snap(*replicas):
    return FleetSnapshot(tuple(replicas))


def test_registry_lists_names_and_rejects_unknown():
    assert {"roundrobin", "leastload"} <= set(registered_policies())
    with pytest.raises(ValueError, match="allowed: .*roundrobin"):
        create_policy("fastest")


def test_roundrobin_rotates_over_healthy_only():
    policy = create_policy("roundrobin")
    s = snap(ReplicaView("a", "u"), ReplicaView("b", "u", healthy=False), ReplicaView("c", "u"))
    picks = Counter(policy.choose(RouteRequest("/"), s).id for _ in range(10))
    assert picks == {"a": 5, "c": 5}


def test_leastload_prefers_idle_and_uses_reported_queue():
    policy = create_policy("leastload")
    s = snap(ReplicaView("a", "u", in_flight=3), ReplicaView("b", "u", in_flight=0, waiting=5),
             ReplicaView("c", "u", in_flight=1))
    assert policy.choose(RouteRequest("/"), s).id == "c"


def test_leastload_spreads_ties():
    policy = create_policy("leastload")
    s = snap(ReplicaView("a", "u"), ReplicaView("b", "u"))
    assert {policy.choose(RouteRequest("/"), s).id for _ in range(4)} == {"a", "b"}


@pytest.mark.parametrize("name", ["roundrobin", "leastload"])
def test_excluded_and_empty(name):
    policy = create_policy(name)
    s = snap(ReplicaView("a", "u"), ReplicaView("b", "u"))
    assert policy.choose(RouteRequest("/", excluded=frozenset({"a"})), s).id == "b"
    assert policy.choose(RouteRequest("/", excluded=frozenset({"a", "b"})), s) is None
    assert policy.choose(RouteRequest("/"), snap()) is None
