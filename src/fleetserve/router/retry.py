"""Retry before the first byte, pure: which answers move a request elsewhere, how long to wait, where not to go.

Until a replica has produced the first body bytes, a refused connection or a 502/503/504 sends the request to
another replica: the failed one joins `excluded` (the policy's RouteRequest.excluded), at most `max_attempts`
tries, with exponential backoff and jitter between them.
"""

from __future__ import annotations

RETRYABLE_STATUS = frozenset({502, 503, 504})


def retryable(status: int) -> bool:
    return status in RETRYABLE_STATUS


def backoff(attempt: int, jitter: float) -> float:
    """Seconds to wait before attempt number `attempt` (1, 2, ...); `jitter` is uniform in [0, 1)."""
    return min(2.0, 0.05 * 2 ** attempt) * (0.5 + jitter)


def exclude(excluded: frozenset[str], replica: str) -> frozenset[str]:
    return excluded | {replica}
