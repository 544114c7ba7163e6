"""Session affinity: a consistent hash ring on a header or body key, with load fallback.

The key (e.g. `x-session-id`, or `user` in the body) picks a point on a ring of virtual nodes; the first
eligible replica clockwise serves it, so adding or removing a replica moves only its own sessions. A sticky
replica that is gone or overloaded (load at least `overload_abs` and above `overload_rel` x the others' mean) passes the
session to the next one on the ring. Requests without a key go to the least loaded replica.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools

from fleetserve.router.policies.base import Choice, FleetSnapshot, ReplicaView, RouteRequest, register


def _point(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


@register("session")
class SessionAffinity:
    def __init__(self, session_key: str | None = None, vnodes: int = 64, overload_abs: int = 8,
                 overload_rel: float = 2.0, **_options):
        self.keys = [k for k in (session_key, "x-session-id", "x-user-id", "user") if k]
        self.vnodes = vnodes
        self.overload_abs = overload_abs
        self.overload_rel = overload_rel
        self._ring: list[tuple[int, str]] = []
        self._ring_ids: frozenset[str] = frozenset()
        self._counter = itertools.count()

    def session_of(self, request: RouteRequest) -> str | None:
        for key in self.keys:
            value = request.headers.get(key.lower()) or request.body.get(key)
            if isinstance(value, str | int) and str(value):
                return str(value)
        return None

    def _rebuild(self, replicas: tuple[ReplicaView, ...]) -> None:
        ids = frozenset(r.id for r in replicas)
        if ids == self._ring_ids:
            return
        self._ring = sorted((_point(f"{rid}#{v}"), rid) for rid in ids for v in range(self.vnodes))
        self._ring_ids = ids

    def choose(self, request: RouteRequest, snapshot: FleetSnapshot) -> Choice | None:
        eligible = {r.id: r for r in snapshot.eligible(request.excluded)}
        if not eligible:
            return None
        session = self.session_of(request)
        if session is None:
            low = min(r.load for r in eligible.values())
            tied = [r for r in eligible.values() if r.load == low]
            return Choice(tied[next(self._counter) % len(tied)], "no_key", request.prompt_tokens)
        self._rebuild(snapshot.replicas)
        total = sum(r.load for r in eligible.values())

        def overloaded(r: ReplicaView) -> bool:
            others = (total - r.load) / max(len(eligible) - 1, 1)
            return r.load >= self.overload_abs and r.load > self.overload_rel * max(others, 1.0)

        start = bisect.bisect(self._ring, (_point(session), ""))
        seen: set[str] = set()
        skipped_overloaded = False
        for i in range(len(self._ring)):
            rid = self._ring[(start + i) % len(self._ring)][1]
            if rid in seen:
                continue
            seen.add(rid)
            replica = eligible.get(rid)
            if replica is None:
                continue  # gone or excluded: the session moves to the next replica on the ring
            if overloaded(replica):
                skipped_overloaded = True
                continue
            if len(seen) == 1:
                branch = "sticky"
            else:
                branch = "overload_fallback" if skipped_overloaded else "reassigned"
            return Choice(replica, branch, request.prompt_tokens)
        low = min(eligible.values(), key=lambda r: r.load)  # everyone is overloaded: the least loaded
        return Choice(low, "all_overloaded", request.prompt_tokens)
