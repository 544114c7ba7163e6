"""Candidate time-of-day floors for `fleetserve plan`, derived from the trace's load over the day.

Why: an autoscaler reacts one cold start late, so a daily peak either waits for new replicas or forces a
higher `minReplicaCount` all day. A floor that rises one cold start before the peak (`scheduleLeadTime`) and
falls after it can be cheaper than either. The arrivals are folded onto the UTC day (the simulator's wall
clock, `SimOptions.start`) and counted per slot (5 min to 1 h: a short trace still gets several slots; slot
edges fall on whole minutes, so each window is a daily cron). Slots with at least `PEAK_SHARE` of the
busiest slot's arrivals are peak; each run of them becomes one window.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

DAY = 86400
SLOTS = (300, 600, 900, 1800, 3600)
PEAK_SHARE = 0.5


@dataclass(frozen=True)
class PeakWindow:
    start_s: int  # seconds after UTC midnight, a whole minute
    end_s: int  # exclusive; may be past midnight (end_s > DAY) for a window that wraps
    arrivals: int  # the busiest slot's arrivals inside the window
    typical: float  # mean arrivals of the trace's other (off-peak) slots

    def cron(self, at: int) -> str:
        at %= DAY
        return f"{at % 3600 // 60} {at // 3600} * * *"

    @property
    def label(self) -> str:
        def hm(s: int) -> str:
            s %= DAY
            return f"{s // 3600:02d}:{s % 3600 // 60:02d}"

        return f"{hm(self.start_s)}-{hm(self.end_s)} UTC"


def slot_seconds(span_s: float) -> int:
    """The largest slot that still cuts the trace's day into at least six."""
    day = min(max(span_s, 1.0), DAY)
    return max((s for s in SLOTS if day / s >= 6), default=SLOTS[0])


def peak_windows(arrivals: list[float], start_epoch: float) -> tuple[list[PeakWindow], int]:
    """Peak windows of the day (empty when the load has no time-of-day shape) and the slot length."""
    if not arrivals:
        return [], SLOTS[0]
    span = max(arrivals) - min(arrivals)
    slot = slot_seconds(span)
    per_day = DAY // slot
    seen: Counter[tuple[int, int]] = Counter()  # (day, slot of the day) -> arrivals
    for a in arrivals:
        t = int(start_epoch + a)
        seen[(t // DAY, t % DAY // slot)] += 1
    folded = [0] * per_day  # the busiest day's count of each slot
    covered = set()
    first, last = int(start_epoch + min(arrivals)), int(start_epoch + max(arrivals))
    for t in range(first - first % slot, last + 1, slot):
        covered.add(t % DAY // slot)
    for (_, i), n in seen.items():
        folded[i] = max(folded[i], n)
    busiest = max(folded)
    peak = [i for i in range(per_day) if folded[i] >= PEAK_SHARE * busiest]
    rest = [folded[i] for i in covered if i not in peak]
    if not rest:
        return [], slot  # every slot the trace covers is busy: no off-peak to save on
    typical = sum(rest) / len(rest)
    runs: list[list[int]] = []
    for i in peak:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    if len(runs) > 1 and runs[0][0] == 0 and runs[-1][-1] == per_day - 1:
        runs[0] = runs.pop() + [i + per_day for i in runs[0]]  # wraps past midnight: one window
    windows = [PeakWindow(r[0] * slot, (r[-1] + 1) * slot, max(folded[i % per_day] for i in r), typical)
               for r in runs]
    return sorted(windows, key=lambda w: w.start_s), slot


def reached(series: list[tuple], start_epoch: float, window: PeakWindow) -> int:
    """The most replicas (total, column 2 of the fleet's series) a run had inside the window, any day."""
    most = 0
    for i, point in enumerate(series):
        end = series[i + 1][0] if i + 1 < len(series) else point[0]
        a, b = start_epoch + point[0], start_epoch + max(end, point[0] + 1e-9)
        for day in range(int(a // DAY) - 1, int(b // DAY) + 1):  # does [a, b) meet this day's window?
            lo, hi = day * DAY + window.start_s, day * DAY + window.end_s
            if a < hi and b > lo:
                most = max(most, point[2])
                break
    return most


def cold_start_s(fleet) -> float:
    """Node provisioning + model load, as the simulated fleet had them (0 without replicas)."""
    if not fleet.replicas:
        return 0.0
    return getattr(fleet.capacity.provider, "provisioning_delay", 0.0) + fleet.replicas[0].profile.load_s


def schedules(windows: list[PeakWindow], levels: list[int]) -> list[dict]:
    """The spec's `autoscaling.schedules` for the windows at the given floors (camelCase, as in YAML)."""
    return [{"name": f"peak-{w.label[:5].replace(':', '')}", "timezone": "UTC", "start": w.cron(w.start_s),
             "end": w.cron(w.end_s), "minReplicas": n} for w, n in zip(windows, levels, strict=True)]


def lead_time(cold_s: float) -> int:
    """Floors rise this early: one cold start, rounded up to a whole minute."""
    return int(math.ceil(cold_s / 60.0) * 60) if cold_s > 0 else 0
