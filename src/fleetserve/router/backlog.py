"""What the router books per replica between sending a request and its end: in-flight count and prefill backlog.

The cache-aware cost score (`policies/cost.py`) reads `prefill_backlog`: prompt tokens the policy expected
the replica to compute (`Choice.prefill_tokens`) for requests that have not produced a first byte yet. The
gateway books them when it sends, unbooks them at the first byte or on failure, and frees the in-flight slot
when the response ends (or fails). The simulator keeps the same book.
"""

from __future__ import annotations

from collections import defaultdict


class LoadBook:
    def __init__(self) -> None:
        self.in_flight: dict[str, int] = defaultdict(int)
        self.backlog: dict[str, int] = defaultdict(int)

    def sent(self, replica: str, prefill: int) -> None:
        self.in_flight[replica] += 1
        self.backlog[replica] += prefill

    def first_byte(self, replica: str, prefill: int) -> None:
        self.backlog[replica] -= prefill

    def finished(self, replica: str) -> None:
        self.in_flight[replica] -= 1

    def failed(self, replica: str, prefill: int, first_byte_seen: bool = False) -> None:
        """A send that failed (before its first byte unless said otherwise): both bookings go."""
        if not first_byte_seen:
            self.backlog[replica] -= prefill
        self.in_flight[replica] -= 1

    def forget(self, replica: str) -> None:
        self.in_flight.pop(replica, None)
        self.backlog.pop(replica, None)
