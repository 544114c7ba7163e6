"""Which replica's server errors are its own: failure ratios compared across the fleet.

A 500 may be the request's doing (a poison prompt, an input that crashes the model's code) or the replica's (a
bad GPU, a corrupted process). Counting 500s in a row could not tell them apart: one client sending poison
requests opened breaker after breaker, and a replica failing every other request never had ten in a row. As
Envoy's success-rate outlier detection does, a replica is an outlier when it fails a large share of its recent
answers (`min_ratio`, over at least `min_answers` of the last `window`) *and* the healthiest other replica with
enough answers of its own fails at most `relative` of that share: poison that every replica fails alike ejects
none, a replica failing alone goes out. The pool still caps server-error ejections at half of its replicas.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class OutlierSettings:
    window: int = 20  # the last answers per replica that are compared
    min_answers: int = 10  # fewer than this: no verdict on the replica (and no weight as a comparison)
    min_ratio: float = 0.5  # a replica failing less than this share is never an outlier
    relative: float = 0.5  # ... nor while another replica fails at least this fraction of its share


class AnswerWindow:
    """A replica's last answers: server error or not (answers at the first byte; other failures are the
    consecutive breaker's business)."""

    __slots__ = ("_outcomes", "errors")

    def __init__(self, size: int):
        self._outcomes: deque[bool] = deque(maxlen=size)
        self.errors = 0

    def record(self, server_error: bool) -> None:
        if len(self._outcomes) == self._outcomes.maxlen and self._outcomes[0]:
            self.errors -= 1
        self._outcomes.append(server_error)
        self.errors += server_error

    def clear(self) -> None:
        self._outcomes.clear()
        self.errors = 0

    def __len__(self) -> int:
        return len(self._outcomes)

    @property
    def ratio(self) -> float:
        return self.errors / len(self._outcomes) if self._outcomes else 0.0


def is_outlier(own: AnswerWindow, others: Iterable[AnswerWindow], s: OutlierSettings) -> bool:
    """True when `own` fails enough of its answers and clearly more than the healthiest comparable replica (none
    comparable: the others are taken as healthy, so a lone failing replica of a quiet fleet still goes out)."""
    if len(own) < s.min_answers or own.ratio < s.min_ratio:
        return False
    compared = [w.ratio for w in others if len(w) >= s.min_answers // 2]
    best = min(compared, default=0.0)
    return best <= s.relative * own.ratio
