import functools
from pathlib import Path

import pytest

from fleetserve.traces.load import load_trace
from fleetserve.traces.model import TraceRequest

DATA = Path(__file__).parent.parent / "data"
AZURE = DATA / "azure_code_trace.csv"  # the whole trace, in the repository: no test depends on ../shared
MOONCAKE = DATA / "mooncake_synthetic_trace.jsonl"


@functools.cache
def _azure() -> tuple[TraceRequest, ...]:
    return tuple(load_trace(AZURE))


def azure_slice(start: float, end: float) -> list[TraceRequest]:
    """A window of the Azure code trace, rebased to start at 0."""
    from dataclasses import replace

    return [replace(r, arrival_s=r.arrival_s - start) for r in _azure() if start <= r.arrival_s < end]


@pytest.fixture(scope="session")
def mooncake() -> list[TraceRequest]:
    return load_trace(MOONCAKE, limit=600)
