import functools
from pathlib import Path

import pytest

from fleetserve.traces.load import load_trace
from fleetserve.traces.model import TraceRequest

AZURE = Path("/work/shared/traces/AzureLLMInferenceTrace_code.csv")
MOONCAKE = Path("/work/shared/traces/mooncake_synthetic_trace.jsonl")
DATA = Path(__file__).parent.parent / "data"


@functools.cache
def _azure() -> tuple[TraceRequest, ...]:
    path = AZURE if AZURE.is_file() else DATA / "azure_code_sample.csv"
    return tuple(load_trace(path))


def azure_slice(start: float, end: float) -> list[TraceRequest]:
    """A window of the Azure code trace, rebased to start at 0."""
    from dataclasses import replace

    return [replace(r, arrival_s=r.arrival_s - start) for r in _azure() if start <= r.arrival_s < end]


@pytest.fixture(scope="session")
def mooncake() -> list[TraceRequest]:
    path = MOONCAKE if MOONCAKE.is_file() else DATA / "mooncake_sample.jsonl"
    return load_trace(path, limit=600)
