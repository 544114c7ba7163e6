"""The series of replicas that left the fleet, forgotten a while after they left.

A replica's counters (the cached-token feedback, its ejections, HyperPod's `model_*` series the router counts
for engines without their own) outlived it: every replica brought back from zero on a new port, and on Kubernetes
every pod that ever came and went, kept a set of series in the router's /metrics for good, an unbounded number
of label values. A replica's series now stay `RETAIN_S` after it left, so the scrapes in between read its last
increments, and then go. Prometheus keeps what it scraped: a `rate()` over a window that holds the replica
still counts it. A replica that comes back within the time keeps its series; later, it starts at 0 (a counter
reset, which `rate()` reads as one).
"""

from __future__ import annotations

RETAIN_S = 300.0  # 20 scrapes at Prometheus's default 15 s interval


class Departures:
    """Which replicas left when, by (backend id, `replica` label) pair: the model_* series are labelled by the
    label, the router's own by the id, and a port a departed replica had can come back under another label (a
    new replica given a freed port: r0's label had stayed for good)."""

    def __init__(self, retain_s: float = RETAIN_S) -> None:
        self.retain_s = retain_s
        self.known: set[tuple[str, str]] = set()  # live, or left within the time
        self.gone_at: dict[tuple[str, str], float] = {}

    def update(self, live: dict[str, str], now: float) -> tuple[list[str], list[str]]:
        """`live`: backend id -> replica label. The backend ids whose time is up, and the replica labels that go
        with them; an id or a label still held by another pair (a restarted `r0` on a new port) is kept."""
        pairs = set(live.items())
        for pair in pairs:
            self.known.add(pair)
            self.gone_at.pop(pair, None)
        for pair in self.known - pairs:
            self.gone_at.setdefault(pair, now)
        expired = [pair for pair, at in self.gone_at.items() if now - at >= self.retain_s]
        for pair in expired:
            del self.gone_at[pair]
            self.known.discard(pair)
        ids, labels = self.kept()
        return sorted({b for b, _ in expired} - ids), sorted({lbl for _, lbl in expired} - labels)

    def kept(self) -> tuple[frozenset[str], frozenset[str]]:
        """The backend ids and replica labels whose series are still shown: live, or left within the time."""
        return frozenset(b for b, _ in self.known), frozenset(lbl for _, lbl in self.known)
