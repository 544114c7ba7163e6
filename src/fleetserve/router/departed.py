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
    """Which replicas left when, and the `replica` label each had (the model_* series are labelled by it)."""

    def __init__(self, retain_s: float = RETAIN_S) -> None:
        self.retain_s = retain_s
        self.labels: dict[str, str] = {}  # backend id -> replica label, for the live and the recently departed
        self.gone_at: dict[str, float] = {}

    def update(self, live: dict[str, str], now: float) -> tuple[list[str], list[str]]:
        """`live`: backend id -> replica label. The backend ids whose time is up, and the replica labels that go
        with them (a label a live replica now carries, as a restarted `r0` on a new port, is kept)."""
        for backend, label in live.items():
            self.labels[backend] = label
            self.gone_at.pop(backend, None)
        for backend in self.labels.keys() - live.keys():
            self.gone_at.setdefault(backend, now)
        expired = [b for b, at in self.gone_at.items() if now - at >= self.retain_s]
        labels = {self.labels[b] for b in expired}
        for backend in expired:
            del self.gone_at[backend], self.labels[backend]
        return expired, sorted(labels - set(self.labels.values()))

    def kept(self) -> tuple[frozenset[str], frozenset[str]]:
        """The backend ids and replica labels whose series are still shown: live, or left within the time."""
        return frozenset(self.labels), frozenset(self.labels.values())
