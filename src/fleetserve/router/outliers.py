"""Which replica's server errors are its own: its failure ratio tested against the rest of the fleet's.

A 500 may be the request's doing (a poison prompt, an input that crashes the model's code) or the replica's (a
bad GPU, a corrupted process). Counting 500s in a row could not tell them apart: one client sending poison
requests opened breaker after breaker, and a replica failing every other request never had ten in a row.

A replica is an outlier when, over its last `window` answers (at least `min_answers`), it fails at least
`min_ratio` of them *and* clearly more than the other replicas together: a two-proportion z-test of its ratio
against the pooled ratio of the others that take traffic and have `min_answers` of their own, at `min_z`
standard errors (Envoy's success-rate detection compares hosts by standard deviations too). Poison spread over
the fleet fails every replica alike and ejects none: with 30 % of requests poisoned at random, a 20-answer
window reaches 0.5 one time in twenty, which a comparison with the lowest other ratio took for an outlier in
every run; the z-test does not. With no other replica to compare with there is no verdict. The pool caps
server-error ejections at half of its replicas: a client whose poison prompt cache-aware routing sends to one
replica makes that replica an outlier, then the next.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class OutlierSettings:
    window: int = 50  # the last answers per replica that are compared
    min_answers: int = 10  # fewer than this: no verdict on the replica, and no weight as a comparison
    min_ratio: float = 0.5  # a replica failing less than this share is never an outlier
    min_z: float = 4.0  # standard errors by which its ratio must exceed the others' pooled one


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
    """True when `own` fails at least `min_ratio` of its answers and, by `min_z` standard errors, more than the
    comparable others pooled (`others`: the windows of the other replicas that take traffic)."""
    n = len(own)
    if n < s.min_answers or own.ratio < s.min_ratio:
        return False
    compared = [w for w in others if len(w) >= s.min_answers]
    m = sum(len(w) for w in compared)
    if not m:
        return False  # nothing to compare with: a 500 the whole fleet would answer looks the same
    theirs = sum(w.errors for w in compared) / m
    pooled = (own.errors + theirs * m) / (n + m)
    spread = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / m))
    return spread > 0 and (own.ratio - theirs) / spread >= s.min_z
