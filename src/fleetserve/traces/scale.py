"""Time and rate scaling of any trace, and windows of it.

- `scale_time(requests, factor)` stretches (factor > 1) or compresses (factor < 1) the time axis: the same
  requests, arrival times multiplied by `factor`; the rate changes by 1/factor, the shape of the load with it.
- `scale_rate(requests, factor, seed)` keeps the time axis and multiplies the number of requests: each
  request is copied `floor(factor)` times (plus one more with probability `factor - floor(factor)`), a copy
  placed at a uniform random point of the request's own stretch of the timeline (from halfway to the request
  before it to halfway to the next; the first and last requests' stretches end at theirs; a half beside a gap
  reaches at most twice as far as the other half, so an idle stretch stays idle), so the load curve keeps its
  shape at the trace's own resolution and the span stays the trace's.
  Copies are new users, not repeats: their hash ids move to a fresh id range,
  their session key gets a suffix and the first message a copy tag, so a copy shares no prefix with its
  original that the original did not share with itself (the prefix-reuse *structure* is kept, not inflated).
  factor < 1 thins the trace (each request kept with probability `factor`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from fleetserve.traces.model import TraceRequest, check_request_count, check_span


def _check(factor: float, what: str) -> None:
    if not (isinstance(factor, int | float) and math.isfinite(factor) and factor > 0):
        raise ValueError(f"{what} must be a positive number, got {factor!r}")


def scale_time(requests: list[TraceRequest], factor: float) -> list[TraceRequest]:
    """Arrival times multiplied by `factor` (2.0: half the rate over twice the span)."""
    _check(factor, "time scale factor")
    check_span(max((r.arrival_s for r in requests), default=0.0) * factor, f"the trace at a time scale of {factor:g}")
    return [replace(r, arrival_s=r.arrival_s * factor) for r in requests]


def compress(requests: list[TraceRequest], speedup: float) -> list[TraceRequest]:
    """The same trace `speedup` times faster (the inverse of `scale_time`)."""
    _check(speedup, "speedup")
    return scale_time(requests, 1.0 / speedup)


def scale_rate(requests: list[TraceRequest], factor: float, seed: int = 0) -> list[TraceRequest]:
    """About `factor` times as many requests over the same span (see the module docstring)."""
    _check(factor, "rate scale factor")
    check_request_count(len(requests) * factor, f"a rate scale of {factor:g} on {len(requests):,} requests")
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    if not ordered:
        return []
    rng = np.random.default_rng(seed)
    whole, frac = int(factor), factor - int(factor)
    id_span = 1 + max((h for r in ordered for h in r.hash_ids), default=-1)
    times = np.array([r.arrival_s for r in ordered])
    before, after = _stretch(times)
    width = before + after
    out: list[TraceRequest] = []
    copies_total = whole + (1 if frac > 0 else 0)
    for c in range(copies_total):
        keep = np.ones(len(ordered), dtype=bool) if c < whole else rng.random(len(ordered)) < frac
        offsets = np.zeros(len(ordered)) if c == 0 else rng.random(len(ordered)) * width - before
        for i in np.flatnonzero(keep):
            r = ordered[i]
            out.append(r if c == 0 else _copy(r, c, float(times[i] + offsets[i]), id_span))
    out.sort(key=lambda r: r.arrival_s)
    return out


SPREAD = 2.0  # a stretch's half reaches at most this many times its other half into a gap


def _stretch(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each request's stretch of the timeline, as (half before it, half after it): halfway to its neighbours (none
    before the first, none after the last: the span is kept), a half beside a gap cut to SPREAD times the other
    half (the first's and last's to SPREAD times their neighbour's inner half). Uncut, copies of the last request
    of a burst spread halfway into the idle half hour after it: the Azure code trace scaled 3.5x kept 2 of its 13
    empty minutes, and verify's idle windows became single stray requests that failed on a cold start."""
    before = np.diff(times, prepend=times[0]) / 2
    after = np.diff(times, append=times[-1]) / 2
    caps_after, caps_before = before.copy(), after.copy()
    if len(times) > 1:
        caps_after[0], caps_before[-1] = after[1], before[-2]
    return np.minimum(before, SPREAD * caps_before), np.minimum(after, SPREAD * caps_after)


def _copy(r: TraceRequest, c: int, arrival: float, id_span: int) -> TraceRequest:
    messages = r.messages
    if messages:
        first = dict(messages[0])
        tag, content = f"[copy {c}] ", first.get("content")
        if isinstance(content, list):  # the text parts' form: tag the first text part (or add one), not a repr
            parts = list(content)
            at = next((k for k, part in enumerate(parts) if isinstance(part, dict) and part.get("type") == "text"),
                      None)
            if at is None:
                parts.insert(0, {"type": "text", "text": tag.strip()})
            else:
                parts[at] = {**parts[at], "text": tag + str(parts[at].get("text", ""))}
            first["content"] = parts
        else:
            first["content"] = tag + (content or "")
        messages = (first, *messages[1:])
    return replace(r, arrival_s=arrival, hash_ids=tuple(h + c * id_span for h in r.hash_ids),
                   session=f"{r.session}#{c}" if r.session is not None else None, messages=messages,
                   prompt=f"[copy {c}] {r.prompt}" if r.prompt is not None else None)


def window(requests: list[TraceRequest], start_s: float = 0.0, end_s: float | None = None,
           rebase: bool = True) -> list[TraceRequest]:
    """Requests arriving in [start_s, end_s), with times rebased to start at 0 (unless `rebase` is False)."""
    picked = [r for r in requests if r.arrival_s >= start_s and (end_s is None or r.arrival_s < end_s)]
    return [replace(r, arrival_s=r.arrival_s - start_s) for r in picked] if rebase else picked
