"""How plan ranks its trials: cost, then GPU-hours, then replica-hours, each equal within a tolerance.

A plain tuple comparison let noise decide: a static x8 beat x7 by $0.00003 of drain time, and a routing change was
made for $0.0004 of $2.50 (rounding to significant digits only moved the edge: 3.52650001 and 3.52649999 still
differ). Trials are compared figure by figure; equal trials keep the one found first.
"""

from __future__ import annotations

from functools import cmp_to_key

RANK_TOLERANCE = 1e-3  # relative: figures within 0.1 % of each other are equal
RANK_FLOOR = 1e-4  # and within this absolutely (a short trace's cents)
# a change of routing or cache tiers on the winner must save more than this: at 0.1 % plan switched a p5 fleet's
# routing for $0.014 of $3.95 that the run's drain made (0.5 s earlier), with a worse TTFT, and a free local
# fleet's routing and L2 for 0.5 % of replica-hours
SWITCH_TOLERANCE = 1e-2


def compare(a, b, tolerance: float = RANK_TOLERANCE) -> tuple[int, int]:
    """(-1: `a` ranks first, 1: `b` does, 0: equal; the figure that decided: 0 cost, 1 GPU-hours, 2 replica-hours,
    3 none). Each figure is equal within `tolerance` (or RANK_FLOOR); equal trials keep the one found first."""
    relative = tolerance
    for i, (x, y) in enumerate(zip(a.rank, b.rank, strict=True)):
        tolerance = max(relative * max(abs(x), abs(y)), RANK_FLOOR)
        if x < y - tolerance:
            return -1, i
        if x > y + tolerance:
            return 1, i
    return 0, 3


def better(a, b, tolerance: float = RANK_TOLERANCE) -> bool:
    return compare(a, b, tolerance)[0] < 0


BY_RANK = cmp_to_key(lambda a, b: compare(a, b)[0])  # sorts trials by rank, the tolerance included
