"""Routing policies behind `choose(request, snapshot) -> Choice | None`, registered by name."""

from fleetserve.router.policies import prefix, session, simple  # noqa: F401  (registration)
from fleetserve.router.policies.base import (
    Choice,
    FleetSnapshot,
    Needs,
    ReplicaView,
    RouteRequest,
    RoutingPolicy,
    create_policy,
    needs_of,
    register,
    registered_policies,
)

__all__ = ["Choice", "FleetSnapshot", "Needs", "ReplicaView", "RouteRequest", "RoutingPolicy", "create_policy",
           "needs_of", "register", "registered_policies"]
