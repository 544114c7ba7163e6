"""Consolidation, pure: which nodes to remove now, Karpenter's words and budgets.

- `WhenEmpty`: nodes without replicas, idle for `consolidateAfter` (the timer restarts on any replica
  change on the node);
- `WhenEmptyOrUnderutilized`: also nodes whose replicas fit in the free slots of the other occupied nodes (the
  emptiest first, the dearest among equals), but only when
  the remaining replicas can absorb the load: load_ratio x N / (N - k) <= 1 (the consolidation-aware
  scale-down check), where load_ratio is the fleet's load over its target; and, as Karpenter's single-node
  consolidation replaces, an on-demand node whose replicas fit in the others' free slots plus one node that
  placement would take now and that costs less (a spot offering back after a shortage, or the cheaper type a
  fallback had passed over): the new node is made first and the replicas move onto it, so no load check.
  Spot nodes are not replaced (Karpenter needs its SpotToSpotConsolidation gate and 15 types for that);
- budgets: `nodes: "10%"` or `"2"`: allowed = ceil(total x pct) - deleting - notready; the most restrictive
  active budget wins; a budget may be limited to a cron window in a time zone. A node consolidation deleted
  counts as deleting (and in the total) for `NODE_TERMINATION_S`, as Karpenter counts a node as disrupting until
  it is gone: the simulated cloud deletes at once, and a budget of 10 % of 4 nodes let the local fleet's
  0.2-second loop delete three of them within a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from fleetserve.autoscale.schedule import Cron
from fleetserve.capacity.placement import Placement
from fleetserve.capacity.providers import Node

NODE_TERMINATION_S = 60.0  # a node's drain and instance termination, for the budgets


@dataclass(frozen=True)
class Budget:
    nodes: str = "10%"
    schedule: Cron | None = None
    duration: float = 0.0  # seconds the budget holds after each schedule firing
    timezone: str = "UTC"

    def active(self, now: float) -> bool:
        if self.schedule is None:
            return True
        from zoneinfo import ZoneInfo

        moment = datetime.fromtimestamp(now, UTC)
        fired = self.schedule.previous(moment, ZoneInfo(self.timezone))
        return fired is not None and moment - fired.astimezone(UTC) < timedelta(seconds=self.duration)

    def allowed(self, total: int, deleting: int, not_ready: int) -> int:
        if self.nodes.endswith("%"):
            cap = math.ceil(total * float(self.nodes[:-1]) / 100)
        else:
            cap = int(self.nodes)
        return max(0, cap - deleting - not_ready)


@dataclass(frozen=True)
class ConsolidationPolicy:
    policy: str = "WhenEmptyOrUnderutilized"  # or "WhenEmpty"
    consolidate_after: float = 0.0
    budgets: tuple[Budget, ...] = (Budget(),)


@dataclass(frozen=True)
class Replacement:
    """The cheaper node a replaced one's replicas move to: what placement takes now, and the replicas it holds."""

    placement: Placement
    slots: int


@dataclass(frozen=True)
class Removal:
    node_id: str
    reason: str  # "Empty" or "Underutilized"
    replacement: Replacement | None = None  # set when the node is replaced rather than deleted


def consolidate(nodes: list[Node], policy: ConsolidationPolicy, now: float, load_ratio: float = 0.0,
                deleting: int = 0, terminating: int = 0,
                replacement: Callable[[Node], Replacement | None] | None = None,
                cordoned: frozenset[str] | set[str] = frozenset()) -> list[Removal]:
    """`deleting`: nodes being emptied; `terminating`: nodes deleted within NODE_TERMINATION_S (gone from `nodes`);
    `replacement`: the node placement would make now for a node's replicas (None: none, or replacing is off);
    `cordoned`: nodes being emptied, whose free slots take no replica (a replacement had counted on them, and its
    replicas needed a second new node)."""
    ready = [n for n in nodes if n.ready(now) and n.interrupt_at is None and n.id not in cordoned]
    not_ready = sum(1 for n in nodes if not n.ready(now) or n.interrupt_at is not None)
    budgets = [b for b in policy.budgets if b.active(now)] or [Budget("100%")]
    allowed = min(b.allowed(len(nodes) + terminating, deleting + terminating, not_ready) for b in budgets)
    settled = [n for n in ready if now - n.last_change >= policy.consolidate_after]
    out = [Removal(n.id, "Empty") for n in settled if n.used == 0]
    if policy.policy == "WhenEmptyOrUnderutilized":
        replicas = sum(n.used for n in nodes)
        moved = 0
        # free slots on nodes that hold replicas: moving onto an empty node only swaps one node for another (a full
        # node was moved to an identical empty one, restarting its replica for nothing). Summed once, less what
        # each removal takes: summed per candidate, it was the simulator's hottest loop with many nodes
        free_held = sum(m.free for m in ready if m.used > 0)
        # the emptiest first and, among equals, the dearest: the cheapest went first, and g5 nodes at $0.40/h
        # moved their replicas onto g6e nodes at $0.74/h that stayed
        for n in sorted((n for n in settled if n.used > 0), key=lambda n: (n.used / n.slots, -n.price_per_hour)):
            free_elsewhere = free_held - n.free  # `n` is ready (settled), and holds replicas
            if free_elsewhere < n.used:
                continue
            # its replicas move to the free slots; while they restart the others carry the load
            survivors = replicas - moved - n.used
            if survivors <= 0 or load_ratio * replicas / survivors > 1.0:
                continue
            moved += n.used
            free_held -= n.free + n.used  # its own free slots go with it, and its replicas fill others'
            out.append(Removal(n.id, "Underutilized"))
        if replacement is not None:
            out += _replacement(settled, {r.node_id for r in out}, free_held, replacement)
    return out[:allowed]


def _replacement(settled: list[Node], removed: set[str], free_held: int,
                 replacement: Callable[[Node], Replacement | None]) -> list[Removal]:
    """The dearest on-demand node that one cheaper new node (with the others' free slots) can stand in for: one per
    round, as Karpenter's single-node consolidation replaces one node at a time (two in a round had counted on
    the same free slots)."""
    for n in sorted((n for n in settled if n.used > 0 and n.id not in removed
                     and n.offering.capacity_type == "on-demand"), key=lambda n: -n.price_per_hour):
        new = replacement(n)
        if new is None or new.placement.price_per_hour >= n.price_per_hour:
            continue
        free_elsewhere = max(0, free_held - n.free)
        # replicas that all fit elsewhere are the deletion's to move (it declined: the load); the new node would
        # stay empty, as replacements take the fullest node with room first
        if n.used <= free_elsewhere or new.slots + free_elsewhere < n.used:
            continue
        return [Removal(n.id, "Underutilized", new)]
    return []
