"""The scaling loop for a live fleet: when to poll, what to read, the decision; the supervisor applies it.

Polls every `pollingInterval`, and at once when requests are waiting at zero replicas (activation must not
wait a whole interval: that is the "loooong cold start" KEDA users complain about).
"""

from __future__ import annotations

from collections.abc import Callable

from fleetserve.autoscale.policy import ScaleDecision, ScalingPolicy, ScalingState, decide
from fleetserve.autoscale.signals import LoadReading, metrics_from_load, query_prometheus


class Controller:
    def __init__(self, policy: ScalingPolicy, state: ScalingState, read_load: Callable[[], dict | None],
                 queries: tuple[tuple[str, str] | None, ...] = (),
                 prometheus: Callable[[str, str], float | None] = query_prometheus):
        self.policy = policy
        self.state = state
        self.read_load = read_load
        self.queries = queries
        self.prometheus = prometheus
        self.last: ScaleDecision | None = None
        self._next_poll = 0.0
        self._previous: LoadReading | None = None

    @property
    def desired(self) -> int:
        return self.state.current

    @property
    def next_poll(self) -> float:
        """When the next regular poll is due (activation at zero may come earlier: `due`)."""
        return self._next_poll

    def due(self, now: float, pending: int) -> bool:
        return now >= self._next_poll or (self.state.current == 0 and pending > 0)

    def tick(self, now: float, load: dict | None = None) -> ScaleDecision:
        load = self.read_load() if load is None else load
        metrics, self._previous = metrics_from_load(self.policy, load, self._previous, now, self.prometheus,
                                                    self.queries)
        decision = decide(self.policy, self.state, metrics, now)
        self.state = decision.state
        self.last = decision
        self._next_poll = now + self.policy.polling_interval
        return decision
