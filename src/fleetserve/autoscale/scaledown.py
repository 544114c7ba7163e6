"""Which replicas go when the desired count drops, pure: the cheapest ones to lose first (and which come back
when it rises again while they drain).

Not yet useful replicas go before useful ones (pending, then restarting, then starting, then ready); among
equals, an idle one before a busy one (an idle replica stops at once; a busy one drains, and a stream longer than
the drain timeout is cut: the newest replica, busy, was drained while an idle one stayed), then the one on the
emptiest node (its node is the likeliest to become empty and be removed), then the fewest requests in flight,
then the newest.
Shared by the local fleet supervisor and the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

STATE_RANK = {"pending": 0, "restarting": 1, "starting": 2, "moving": 3, "ready": 4}


@dataclass(frozen=True)
class Candidate:
    id: str
    state: str  # pending | restarting | starting | ready
    node_id: str
    ordinal: int  # creation order (higher: newer)
    in_flight: int = 0  # requests it serves (the router's count)


def victims(candidates: Sequence[Candidate], node_used: Mapping[str, int], count: int,
            node_price: Mapping[str, float] | None = None) -> list[Candidate]:
    """The `count` replicas to drain, in order. With `node_price` ($/h per node), after the not yet useful ones, the
    replicas of whole nodes come first, the dearest node that the count can empty first: its price stops. By the
    emptiest node alone, a fleet of a $0.81/h 1-GPU node and a $5.67/h 4-GPU node holding two replicas kept the
    dear node and dropped the cheap one at a scale-down from 3 to 1."""
    count = max(0, count)
    ranked = sorted(candidates, key=lambda c: (STATE_RANK.get(c.state, 0), c.in_flight > 0,
                                               node_used.get(c.node_id, 0), c.in_flight, -c.ordinal))
    if not node_price or count == 0:
        return ranked[:count]
    chosen = [c for c in ranked if STATE_RANK.get(c.state, 0) < STATE_RANK["ready"]][:count]
    rest = [c for c in ranked if c not in chosen]
    on: dict[str, list[Candidate]] = {}
    for c in rest:
        on.setdefault(c.node_id, []).append(c)
    for node in sorted(on, key=lambda n: (-node_price.get(n, 0.0), node_used.get(n, 0))):
        members = on[node]
        whole = len(members) >= node_used.get(node, len(members))  # nothing else of the fleet's runs there
        if whole and node_price.get(node, 0.0) > 0 and len(chosen) + len(members) <= count:
            chosen += members
    chosen += [c for c in rest if c not in chosen][:count - len(chosen)]
    return chosen


def spot_drain_due(interrupt_at: float, now: float, drain_timeout: float) -> bool:
    """A replica on a spot node with an interruption notice serves on while its replacement starts (make-before-
    break, as consolidation moves replicas) and drains once the replacement is ready, or at the latest
    `drain_timeout` before the node goes, so that what it serves has the time a scale-in gives it. A drain
    timeout as long as the notice (120 s, the default) drains it at the notice; a shorter one keeps it serving
    the rest, where draining at the notice left a fleet of one without a ready replica for the whole cold start."""
    return now >= interrupt_at - drain_timeout


def moves_to_finish(moving: Sequence[T], node_of: Callable[[T], str], going: Collection[str], ready: int,
                    desired: int) -> list[T]:
    """The moving replicas whose replacements are ready (make-before-break), those on a node with a spot notice
    first: a consolidation can wait, the notice cannot (in list order, a consolidated one left while a noticed one
    served on until its deadline)."""
    first = sorted(moving, key=lambda r: node_of(r) not in going)
    return first[:max(0, ready + len(moving) - desired)]


def revivals(draining: Sequence[T], node_of: Callable[[T], str], deadline_of: Callable[[T], float | None],
             unusable: Collection[str], shortfall: int) -> list[T]:
    """The draining replicas to put back in service when the fleet wants `shortfall` more, before any new one is
    launched: a replica still draining is warm (its model loaded, its cache full) and holds its slot, where a new
    one waits a cold start, and on one machine also the end of the drain for that slot (a request that woke a
    fleet draining its last replica found the machine full: 503 for three minutes). The nearest deadline first
    (its streams are the next to be cut); none on a node that goes (`unusable`: a spot notice, a consolidation)."""
    usable = [r for r in draining if node_of(r) not in unusable]
    usable.sort(key=lambda r: deadline_of(r) or 0.0)
    return usable[:max(0, shortfall)]
