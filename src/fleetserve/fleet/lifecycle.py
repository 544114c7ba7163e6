"""A replica's life in the local fleet: its phases and the only transitions allowed between them.

    pending ----> starting ----> ready ----> moving ----> draining ----> stopped
       |             |   ^         |  \\                     ^
       |             v   |         |   \\--------------------/
       |          restarting <-----/
       \\------------------------------------------------> stopped

- pending: has a slot on a node that is still being provisioned;
- starting: its process runs, /health does not answer yet (cold start);
- ready: takes traffic;
- moving: takes traffic, but its node is being consolidated: a replacement is started elsewhere, then it
  drains (Karpenter's make-before-break for underutilized nodes);
- restarting: crashed; waits for its back-off before the process starts again;
- draining: no new requests; stopped when idle (or after the drain timeout), or back to ready (or starting,
  where its drain began) when the fleet wants a replica again before it stopped (autoscale/scaledown.revivals);
- stopped: gone (its slot is released).

Every change goes through `advance`, so an impossible move (say, stopped -> ready) is a bug that fails loudly
instead of a state that silently lies in `fleetserve status`.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    READY = "ready"
    MOVING = "moving"
    RESTARTING = "restarting"
    DRAINING = "draining"
    STOPPED = "stopped"


ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.STARTING, Phase.STOPPED}),
    Phase.STARTING: frozenset({Phase.READY, Phase.RESTARTING, Phase.DRAINING, Phase.STOPPED}),
    Phase.READY: frozenset({Phase.MOVING, Phase.RESTARTING, Phase.DRAINING, Phase.STOPPED}),
    Phase.MOVING: frozenset({Phase.READY, Phase.RESTARTING, Phase.DRAINING, Phase.STOPPED}),
    Phase.RESTARTING: frozenset({Phase.STARTING, Phase.STOPPED}),
    Phase.DRAINING: frozenset({Phase.READY, Phase.STARTING, Phase.STOPPED}),  # back: wanted again while draining
    Phase.STOPPED: frozenset(),
}

#: phases whose process serves (or may serve) requests
SERVING = frozenset({Phase.READY, Phase.MOVING})
#: how the router sees each phase (absent: not a backend)
ROUTER_STATE = {Phase.STARTING: "starting", Phase.RESTARTING: "starting", Phase.READY: "ready",
                Phase.MOVING: "ready", Phase.DRAINING: "draining"}


class IllegalTransition(RuntimeError):
    pass


def advance(current: str, new: Phase) -> Phase:
    """The new phase, after checking that `current -> new` is allowed."""
    here = Phase(current)
    if new not in ALLOWED[here]:
        allowed = ", ".join(sorted(ALLOWED[here])) or "none"
        raise IllegalTransition(f"replica cannot go from {here} to {new} (allowed: {allowed})")
    return new
