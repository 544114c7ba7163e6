"""What every prototype shares: its command line and the least-loaded choice by in-flight count."""

from __future__ import annotations

import argparse

HEALTH = b'{"status":"ok"}'


class LeastLoaded:
    """In-flight counters per backend; `acquire` picks the least busy (first on ties)."""

    def __init__(self, backends: list[str]):
        self.backends = [b.rstrip("/") for b in backends]
        self.inflight = [0] * len(self.backends)

    def acquire(self) -> int:
        i = min(range(len(self.inflight)), key=self.inflight.__getitem__)
        self.inflight[i] += 1
        return i

    def release(self, i: int) -> None:
        self.inflight[i] -= 1


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--backend", action="append", required=True, help="Backend base URL (repeatable)")
    return parser.parse_args(argv)
