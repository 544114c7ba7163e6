"""The wall clock of traces that carry none (Mooncake rows, prompt logs, generated workloads).

The simulator starts such a trace at `CLOCKLESS_START`, a Monday 10:00 UTC, so that cron floors see a working
day. Generated workloads are made on the same clock: a diurnal day peaks at 14:00 of it, and an Azure CSV
written from them is stamped from it, so one workload reads the same to `simulate`, `verify` and `plan` in
every format (the Azure copy was stamped from midnight while the Mooncake copy ran from 10:00: the same seed
gave TTFT p95 1,057 ms in one format and 8,034 ms in the other under a business-hours floor).
"""

from __future__ import annotations

from datetime import UTC, datetime

CLOCKLESS_START = datetime(2026, 1, 5, 10, 0, 0, tzinfo=UTC)


def hour_of_day(start: datetime = CLOCKLESS_START) -> float:
    """The hour of the day (UTC, fractional) at which a trace on this clock begins."""
    start = start.astimezone(UTC) if start.tzinfo else start
    return start.hour + start.minute / 60 + start.second / 3600
