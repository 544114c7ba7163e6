"""Retry before the first byte, pure: which answers move a request elsewhere, how long to wait, where not to go.

Until a replica has produced the first body bytes, a refused connection or a 502/503/504 sends the request to
another replica: the failed one joins `excluded` (the policy's RouteRequest.excluded), at most `max_attempts`
tries, with exponential backoff and jitter between them.

A 503 that carries Retry-After is the replica saying it is busy (its waiting queue is full: the built-in engine,
the simulated one), not that it is broken: the request tries another replica, but the replica's circuit breaker
does not count it. Counted, ten of them in a burst opened the breaker of an idle, healthy replica for 60 s.
"""

from __future__ import annotations

RETRYABLE_STATUS = frozenset({502, 503, 504})


def retryable(status: int) -> bool:
    return status in RETRYABLE_STATUS


def busy(status: int, retry_after: bytes | None) -> bool:
    """The replica's own "queue full" answer: try elsewhere, do not hold it against the replica."""
    return status == 503 and retry_after is not None


def retry_after_seconds(value: bytes | None, default: int = 1) -> int:
    """A Retry-After header's delay in whole seconds (1..60); an HTTP date or garbage gives `default`."""
    try:
        return max(1, min(60, int(value.strip()))) if value is not None else default
    except ValueError:
        return default


def backoff(attempt: int, jitter: float) -> float:
    """Seconds to wait before attempt number `attempt` (1, 2, ...); `jitter` is uniform in [0, 1)."""
    return min(2.0, 0.05 * 2 ** attempt) * (0.5 + jitter)


def exclude(excluded: frozenset[str], replica: str) -> frozenset[str]:
    return excluded | {replica}
