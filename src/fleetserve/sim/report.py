"""The simulation report: latency percentiles, SLO attainment, GPU-hours and cost, hit rates, split into
peak and idle windows.

Windows: the trace's span is cut into `window_s` windows (default 300 s; a tail shorter than half a window
joins the one before) ranked by arrival rate; `peak` is the busiest `peak_fraction` of them (default 10 %,
at least one), `idle` the quietest `idle_fraction` (default 25 %, at least one) of the others; neither is
ever a window without arrivals (the empty stretches have no latency to judge).
Each of `peak` and `idle` carries the same latency and cost keys as the whole run, computed over its own
windows: requests that arrived in them, and the money and GPU-hours spent during them. Scaling lags the load,
so the money of a burst is often spent in the window after it: `cost_per_hour_max_usd` is the highest cost per
hour of any window, and `costliest_window` says which (the budget `verify` checks at peak); after the last
arrival, the fleet's drain (answering the queue, replicas running on until they scale down) is cut into windows
of the same length for this, so money spent after the trace's last request is counted; a drain shorter than
half a window joins the trace's last window, as a short tail of the trace does (a 23 s drain priced alone
failed a budget at the full fleet's rate that the trace's only window, at $1.61/h, met). A request meets the
SLO when its TTFT and E2E are within the targets; a refused or failed request never does. `worst` is the window
with the most requests that missed the SLO (null when none did), wherever it falls: a scale from zero in a
middling window is neither peak nor idle, yet its misses count in the whole trace's percentiles.
"""

from __future__ import annotations

import math

import numpy as np

from fleetserve.sim.fleet import SimFleet, span_hours

DEFAULT_SLO = {"ttft_p95_ms": 2000.0, "e2e_p95_ms": 30000.0, "cost_per_hour_usd": None, "max_error_rate": 0.01}


def slo_of(endpoint, overrides: dict | None = None) -> tuple[dict, str]:
    """The SLO to judge against and where it came from ("spec", "defaults", "flags")."""
    section = endpoint.spec.slo
    slo = dict(DEFAULT_SLO) if section is None else {
        "ttft_p95_ms": section.ttft_p95_ms, "e2e_p95_ms": section.e2e_p95_ms,
        "cost_per_hour_usd": section.cost_per_hour_usd, "max_error_rate": section.max_error_rate}
    source = "defaults" if section is None else "spec"
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if given:
        slo.update(given)
        source += "+flags"
    return slo, source


def _pcts(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50": round(float(p50), 3), "p95": round(float(p95), 3), "p99": round(float(p99), 3)}


def window_count(fleet: SimFleet) -> int:
    """How many windows the trace's span is cut into: a tail shorter than half a window joins the one before."""
    w = fleet.options.window_s
    span = max(fleet.end - fleet.t0, 1e-9)
    full = int(span // w)
    return max(1, full + (span - full * w >= w / 2))


def request_windows(fleet: SimFleet, count: int) -> list[int]:
    """The window each request arrived in, of `count` (the last one takes the trace's tail), in the order of
    `fleet.requests` (one pass: a call per request was a twentieth of a 64-replica run)."""
    t0, w, last = fleet.t0, fleet.options.window_s, count - 1
    return [min(last, int((r.arrival - t0) / w)) for r in fleet.requests]


def window_bounds(fleet: SimFleet, n: int) -> list[tuple[float, float]]:
    """(start, end) seconds after the trace start of each of the `n` windows; the last takes the tail. A trace of
    one window whose arrivals span less than a window (all its requests at once, one request, or a short burst)
    is judged on one window's length, or on the whole run when that ended sooner, not on its arrivals' span alone
    (before, a trace of one instant had the window [0, 0]: peak and idle cost $0 over 0 hours at $9.79/h while
    the run cost $0.28 over 104 s; and only spans under half a window were, so 149 s of arrivals were judged
    with their drain at $8.55/h and 151 s without it at $7.85/h). Past that the drain is priced with
    `cost_bounds`."""
    w = fleet.options.window_s
    span = max(fleet.end - fleet.t0, 1e-9)
    if n == 1:
        run = max(fleet.end, fleet.finished_at) - fleet.t0
        span = max(span, min(run, w))
    return [(i * w, span if i == n - 1 else (i + 1) * w) for i in range(n)]


def drain_bounds(fleet: SimFleet, bounds: list[tuple[float, float]], end: float) -> list[tuple[float, float]]:
    """Windows of `window_s` from the last window's end to the run's `end` (its drain after the last arrival), the
    last one taking a tail shorter than half a window: the money a burst at the end woke is spent there."""
    w = fleet.options.window_s
    start = bounds[-1][1] if bounds else 0.0
    out: list[tuple[float, float]] = []
    while end - start > 1e-9:
        stop = end if end - start < 1.5 * w else start + w
        out.append((start, stop))
        start = stop
    return out


def cost_bounds(fleet: SimFleet, bounds: list[tuple[float, float]], end: float) -> list[tuple[float, float]]:
    """The windows whose cost per hour the budget is checked on: the trace's and its drain's, a drain shorter
    than half a window joined to the trace's last window (as a short tail of the trace is)."""
    drain = drain_bounds(fleet, bounds, end)
    if bounds and len(drain) == 1 and drain[0][1] - drain[0][0] < fleet.options.window_s / 2:
        return [*bounds[:-1], (bounds[-1][0], drain[0][1])]
    return bounds + drain


def windows(fleet: SimFleet) -> tuple[list[tuple[float, float]], list[tuple[float, float]], list[int]]:
    """(peak windows, idle windows, arrivals per window) as (start, end) seconds after the trace start."""
    opts = fleet.options
    n = window_count(fleet)
    counts = [0] * n
    for i in request_windows(fleet, n):
        counts[i] += 1
    bounds = window_bounds(fleet, n)
    rate = [counts[i] / max(b - a, 1e-9) for i, (a, b) in enumerate(bounds)]  # the last may be shorter or longer
    order = sorted(range(n), key=lambda i: (-rate[i], i))
    # a window without arrivals is never peak: padding a short burst with empty windows diluted its cost per
    # hour (two bursts a day apart: $2.75/h at "peak" where the burst ran at $9.30/h, and verify passed a $5/h
    # budget)
    busy = [i for i in order if counts[i]] or order[:1]
    k_peak = min(max(1, math.floor(n * opts.peak_fraction)), len(busy))
    # nor idle: a window without requests has no latency to judge, and idle windows that were all empty passed a
    # scale-to-zero fleet whose every off-peak request (one each 7 minutes) waited 161 s for a cold start; the
    # budget is checked at the costliest window, so the empty windows' cost is never what passes or fails
    # nor a peak window, while a quieter one with requests is left (a miss there would weigh twice); a trace of
    # one busy window, or of peaks only, shares it (`_single`)
    rest = busy[k_peak:] or busy[k_peak - 1:k_peak]
    k_idle = min(max(1, math.floor(n * opts.idle_fraction)), len(rest))
    peak = sorted(busy[:k_peak])
    idle = sorted(rest[::-1][:k_idle])
    return [bounds[i] for i in peak], [bounds[i] for i in idle], counts


def _section(fleet: SimFleet, reqs: list, spans: list[tuple[float, float]], slo: dict) -> dict:
    ok = [r for r in reqs if r.error is None and r.first is not None and r.done is not None]
    ttft = np.array([(r.first - r.arrival) * 1000 for r in ok])
    e2e = np.array([(r.done - r.arrival) * 1000 for r in ok])
    met = int(np.sum((ttft <= slo["ttft_p95_ms"]) & (e2e <= slo["e2e_p95_ms"]))) if ok else 0
    cost = sum(span_hours(fleet.series, a, b, 4) for a, b in spans)
    gpu_hours = sum(span_hours(fleet.series, a, b, 5) for a, b in spans)
    replica_hours = sum(span_hours(fleet.series, a, b, 2) for a, b in spans)
    hours = sum(b - a for a, b in spans) / 3600
    failed = len(reqs) - len(ok)
    reasons: dict[str, int] = {}
    for r in reqs:
        if r.error is not None:
            reasons[r.error] = reasons.get(r.error, 0) + 1
    return {
        "requests": len(reqs),
        "failed": failed,
        "failed_by_reason": dict(sorted(reasons.items())),
        "error_rate": round(failed / len(reqs), 6) if reqs else 0.0,
        "ttft_ms": _pcts(ttft),
        "e2e_ms": _pcts(e2e),
        "slo_attainment": round(met / len(reqs), 6) if reqs else 1.0,
        "gpu_hours": round(gpu_hours, 6),
        "replica_hours": round(replica_hours, 6),  # what ranks equal costs (a local fleet costs $0 at any size)
        "cost_usd": round(cost, 6),
        "cost_per_hour_usd": round(cost / hours, 6) if hours > 0 else 0.0,
        "hours": round(hours, 6),
    }


def window_costs(series: list[tuple], bounds: list[tuple[float, float]]) -> list[float]:
    """Dollars spent in each of the sorted, disjoint `bounds`, in one pass over the fleet's $/h step series."""
    costs = [0.0] * len(bounds)
    j = 0
    for (t, *vals), nxt in zip(series, [*series[1:], None], strict=False):
        end = nxt[0] if nxt is not None else math.inf
        while j < len(bounds) and bounds[j][1] <= t:
            j += 1
        k = j
        while k < len(bounds) and bounds[k][0] < end:
            lo, hi = max(t, bounds[k][0]), min(end, bounds[k][1])
            if hi > lo:
                costs[k] += vals[3] * (hi - lo) / 3600
            k += 1
    return costs


def costliest(fleet: SimFleet, bounds: list[tuple[float, float]]) -> tuple[float, tuple[float, float] | None]:
    """The highest cost per hour of any window, and that window."""
    best, where = 0.0, None
    for (a, b), cost in zip(bounds, window_costs(fleet.series, bounds), strict=True):
        per_hour = cost / ((b - a) / 3600) if b > a else 0.0
        if where is None or per_hour > best + 1e-12:
            best, where = per_hour, (a, b)
    return best, where


def window_requests(fleet: SimFleet, spans, count: int) -> list:
    """The requests that arrived in the given windows (of `count`; the last one takes the trace's tail)."""
    w = fleet.options.window_s
    chosen = {round(a / w) for a, _ in spans}  # a start is i x w: int() took 3 x 3.3 / 3.3 = 2.999... for window 2
    return [r for r, i in zip(fleet.requests, request_windows(fleet, count), strict=True) if i in chosen]


def missed(r, slo: dict, metric: str = "slo") -> bool:
    """Whether a request missed: the SLO (refused, failed, or over either target), or one check's metric (a
    latency target among the answered requests; `error_rate`: refused or failed)."""
    answered = r.error is None and r.first is not None and r.done is not None
    if not answered:
        return metric in ("slo", "error_rate")
    ttft = (r.first - r.arrival) * 1000 > slo["ttft_p95_ms"]
    e2e = (r.done - r.arrival) * 1000 > slo["e2e_p95_ms"]
    return {"ttft_p95_ms": ttft, "e2e_p95_ms": e2e, "error_rate": False}.get(metric, ttft or e2e)


def worst_section(fleet: SimFleet, slo: dict, bounds: list[tuple[float, float]], peak: list, idle: list,
                  metric: str = "slo") -> dict | None:
    """The window with the most misses (`missed`, of the SLO or of one metric; the earliest of equals) as a
    section, with `misses`, `kind` (peak, idle, or other) and `windows_with_misses` (how many windows had any);
    None when no request missed."""
    misses = [0] * len(bounds)
    for r, i in zip(fleet.requests, request_windows(fleet, len(bounds)), strict=True):
        if missed(r, slo, metric):
            misses[i] += 1
    most = max(misses, default=0)
    if most == 0:
        return None
    i = misses.index(most)
    span = bounds[i]
    section = _section(fleet, window_requests(fleet, [span], len(bounds)), [span], slo)
    kind = "peak" if span in peak else "idle" if span in idle else "other"
    return {**section, "windows": [[round(span[0], 3), round(span[1], 3)]], "misses": most, "kind": kind,
            "windows_with_misses": sum(1 for m in misses if m)}


def table_sections(report: dict) -> list[tuple[str, dict]]:
    """The rows a table of the report shows: the whole run, peak, idle, and the window with the most misses."""
    rows = [("all", report), ("peak", report["peak"]), ("idle", report["idle"])]
    if report.get("worst"):
        a, b = report["worst"]["windows"][0]
        rows.append((f"most misses {a:.0f}-{b:.0f} s ({report['worst']['kind']})", report["worst"]))
    return rows


def build_report(fleet: SimFleet, slo: dict, slo_source: str) -> dict:
    t0 = fleet.t0
    end = max(fleet.end, fleet.finished_at) - t0
    whole = _section(fleet, fleet.requests, [(0.0, end)], slo)
    peak_spans, idle_spans, counts = windows(fleet)
    bounds = window_bounds(fleet, len(counts))
    top, top_window = costliest(fleet, cost_bounds(fleet, bounds, end))

    peak = _section(fleet, window_requests(fleet, peak_spans, len(counts)), peak_spans, slo)
    idle = _section(fleet, window_requests(fleet, idle_spans, len(counts)), idle_spans, slo)
    worst = worst_section(fleet, slo, bounds, peak_spans, idle_spans)
    peak["windows"] = [[round(a, 3), round(b, 3)] for a, b in peak_spans]
    idle["windows"] = [[round(a, 3), round(b, 3)] for a, b in idle_spans]
    h = fleet.hits
    queried = max(h["queried"], 1)
    hit = h["engine"] + h["l1"] + h["l2"]
    desired = [fleet.static] + [d for _, d, _ in fleet.decisions]  # from the starting count: the first counts
    series = [p for p in fleet.series if p[0] <= end + 1e-9] or fleet.series[:1]  # the run's own span
    return {
        **whole,
        "hit_rate": {"total": round(hit / queried, 6), "engine": round(h["engine"] / queried, 6),
                     "l1": round(h["l1"] / queried, 6), "l2": round(h["l2"] / queried, 6)},
        "replicas_max": max((p[2] for p in series), default=0),
        "replicas_ready_max": max((p[1] for p in series), default=0),
        "nodes_max": max((p[3] for p in series), default=0),
        "node_hours_by_type": fleet.capacity.ledger.hours_by_instance_type(t0 + end),
        "duration_s": round(end, 3),
        "failed_by_reason": dict(sorted(fleet.rejected.items())),
        "peak": peak,
        "idle": idle,
        "worst": worst,
        "cost_per_hour_max_usd": round(top, 6),
        "costliest_window": [round(top_window[0], 3), round(top_window[1], 3)] if top_window else None,
        "slo": {**slo, "source": slo_source},
        "routing": {"strategy": fleet.strategy, "knowledge": fleet.options.knowledge},
        "scaling": {"autoscaling": fleet.controller is not None, "decisions": len(fleet.decisions),
                    "changes": sum(1 for a, b in zip(desired, desired[1:], strict=False) if a != b)},
        "windows": {"window_s": fleet.options.window_s, "peak_fraction": fleet.options.peak_fraction,
                    "idle_fraction": fleet.options.idle_fraction, "arrivals": counts},
        "disruptions": {k: fleet.disruptions[k] for k in ("spot_notices", "retried", "lost_mid_stream")},
        "sim": {"seed": fleet.options.seed, "events": fleet.sim.events, "oversized_requests": h["oversized"]},
    }
