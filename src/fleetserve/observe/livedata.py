"""What the built-in dashboard draws: the fleet's own /metrics, sampled and turned into the Grafana panels' series.

Each sample reads the router's registry (in process), every backend's /metrics (with the internal token the
router already sends upstream) and the supervisor's /metrics (its URL comes in FLEETSERVE_SUPERVISOR_METRICS).
Samples are kept for `history_s`; a panel point compares a sample with the one `window_s` before it, the way
`rate(x[window])` and `histogram_quantile` would in Prometheus:

    rate           = (v_now - v_then) / (t_now - t_then), per series; a series that appeared since counts from 0
    quantile(q)    = the bucket where the cumulative count reaches q * count(+Inf), linearly interpolated
    error rate     = d(model_errors_total) / d(model_invocations_total)
    tier hit rate  = d(hits{tier}) / sum_tiers d(hits) * d(vllm prefix hits) / d(vllm prefix queries)

Filters (namespace, model_name, model_version, instance_type) select model series by exact label value.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from fleetserve.observe.grafana import ERROR_SERIES, FILTER_LABELS, PANELS
from fleetserve.observe.rules import is_server_error
from fleetserve.observe.vocabulary import MARKED_REASONS

SUPERVISOR_ENV = "FLEETSERVE_SUPERVISOR_METRICS"
QUANTILES = (0.5, 0.95, 0.99)
COUNTS = frozenset({"concurrency", "throughput", "nodes", "cached_tokens"})  # a series gone away reads 0
NEED_TWO_SAMPLES = frozenset({"latency", "ttfb", "latency_by_instance", "errors", "throughput", "cache_tiers",
                              "cached_tokens"})  # rates and quantiles over a window
Key = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)


def parse(text: str, source: str) -> dict[Key, float]:
    """Prometheus text -> {(name, labels): value}; `source` keeps equal series of two replicas apart."""
    samples: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            labels = dict(s.labels)
            labels.setdefault("__source", source)
            samples[(s.name, tuple(sorted(labels.items())))] = float(s.value)
    return samples


GAP_WINDOWS = 3  # samples further apart than this many windows: a gap in the lines, no rate across it


@dataclass
class Sample:
    t: float
    values: dict[Key, float]
    points: dict[tuple, dict] = field(default_factory=dict, repr=False)  # per filter set, computed once
    decisions: dict[str, float] | None = field(default=None, repr=False)
    sources: frozenset[str] | None = None  # the sources that answered (None: all of its values' sources)
    known: frozenset[str] = frozenset()  # the sources seen in this sample or any before it


def _source(key: Key) -> str:
    return dict(key[1]).get("__source", "")


def comparable(now: Sample, then: Sample) -> tuple[dict[Key, float], dict[Key, float]]:
    """(now, then) values to take rates from, source by source, as rate() would:
    - a source known before `then` that did not answer at `then` (its /metrics over 2 s on a busy machine) is left
      out: its whole lifetime's counters had read as that window's traffic;
    - a source new since `then` (a replica that just started) counts from 0;
    - a source any of whose counters went down restarted: all of it counts from 0 (series by series, a histogram's
      buckets across a restart were no longer cumulative); a gauge that went down says nothing."""
    if then.sources is None:
        return now.values, then.values
    before, kept, restarted = then.values, {}, set()
    for key, v in now.values.items():
        source = _source(key)
        if source in then.sources or source not in then.known:
            kept[key] = v
        if v < before.get(key, 0.0) and key[0].endswith(COUNTER_SUFFIXES):  # a gauge goes down as it likes: one
            restarted.add(source)  # that did (in flight 1 -> 0) had counted the source's lifetime as one window's
    return kept, {key: v for key, v in before.items() if _source(key) not in restarted}


COUNTER_SUFFIXES = ("_total", "_bucket", "_count", "_sum")  # series that only grow while their process lives


def _match(labels: tuple[tuple[str, str], ...], filters: dict[str, str]) -> bool:
    d = dict(labels)
    return all(d.get(k) == v for k, v in filters.items() if k in d or k in FILTER_LABELS)


def _sum(values: dict[Key, float], name: str, filters: dict[str, str] | None = None, by: str | None = None
         ) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    for (n, labels), v in values.items():
        if n == name and (not filters or _match(labels, filters)):
            out[dict(labels).get(by, "") if by else ""] += v
    return out


def _delta(now: dict[Key, float], then: dict[Key, float], name: str, filters: dict[str, str] | None = None,
           by: str | None = None) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    for key, v in now.items():
        n, labels = key
        if n == name and (not filters or _match(labels, filters)):
            out[dict(labels).get(by, "") if by else ""] += max(0.0, v - then.get(key, 0.0))
    return out


def quantile(q: float, buckets: dict[str, float]) -> float | None:
    """histogram_quantile over cumulative bucket counts {le: count}; None without observations."""
    ordered = sorted(((math.inf if le == "+Inf" else float(le)), c) for le, c in buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank, prev_le, prev_count = q * ordered[-1][1], 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_count) / (count - prev_count) if count > prev_count
                                                else 1.0)
        prev_le, prev_count = le, count
    return prev_le


WATCHED_FILE = "dashboard-watched"  # in the router workers' bus folder: touched when a page asks for data
WATCH_S = 120.0  # every worker samples while a page asked within this long


class LiveData:
    """The samples behind the page. With several router workers each keeps its own history, and the page's polls
    reach them in turn: so every worker samples while anyone watches (the bus folder's WATCHED_FILE, touched at
    each poll), and each one samples the router's merged metrics (every worker's counters), not its own. A page
    had read requests totals alternating between two workers' counts, and "in flight 0" beside a panel of 4."""

    def __init__(self, history_s: float = 600.0, window_s: float = 15.0, min_interval_s: float = 1.5,
                 clock=time.time):
        self.history_s, self.window_s, self.min_interval_s = history_s, window_s, min_interval_s
        self.clock = clock
        self.samples: collections.deque[Sample] = collections.deque()
        self.supervisor_url = os.environ.get(SUPERVISOR_ENV, "")
        self._lock = asyncio.Lock()
        self._watched_at = -math.inf

    # --- sampling ---------------------------------------------------------------------------------------

    def watched(self, folder: str | None) -> None:
        """A page asked for data now."""
        self._watched_at = self.clock()
        if folder:
            try:
                Path(folder, WATCHED_FILE).touch()
            except OSError:
                pass  # the router is stopping: this worker's own history still serves the page

    def watching(self, folder: str | None) -> bool:
        last = self._watched_at
        if folder:
            try:
                last = max(last, Path(folder, WATCHED_FILE).stat().st_mtime)
            except OSError:
                pass
        return self.clock() - last < WATCH_S

    async def keep_sampling(self, gateway) -> None:
        """Every health round: a sample while a page watches (any worker's), so each worker's history is whole."""
        if self.watching(gateway.peers.folder if gateway.peers is not None else None):
            await self.sample(gateway)

    async def sample(self, gateway) -> None:
        """Take a sample unless the last one is fresher than `min_interval_s`."""
        async with self._lock:
            now = self.clock()
            if self.samples and now - self.samples[-1].t < self.min_interval_s:
                return
            from prometheus_client import generate_latest

            values = parse(generate_latest(gateway.metrics_registry()).decode(), "router")
            urls = [(b.id, b.url.rstrip("/") + "/metrics") for b in gateway.pool.backends.values() if b.healthy]
            if self.supervisor_url:
                urls.append(("supervisor", self.supervisor_url))
            texts = await asyncio.gather(*(self._get(gateway.upstream, url) for _id, url in urls))
            answered = {"router"}
            for (source, _url), text in zip(urls, texts, strict=True):
                if text:
                    values.update(parse(text, source))
                    answered.add(source)
            self.add(Sample(now, values, sources=frozenset(answered)))

    @staticmethod
    async def _get(client, url: str) -> str:
        try:
            status, body = await client.get(url, timeout=2.0)
            return body.decode("utf-8", "replace") if status == 200 else ""
        except Exception:  # noqa: BLE001 - a replica going away must not break the page
            return ""

    def add(self, sample: Sample) -> None:
        if sample.sources is not None:
            sample.known = sample.sources | (self.samples[-1].known if self.samples else frozenset())
        self.samples.append(sample)
        while self.samples and sample.t - self.samples[0].t > self.history_s:
            self.samples.popleft()

    # --- series -----------------------------------------------------------------------------------------

    def options(self) -> dict[str, list[str]]:
        """Label values seen in the latest sample, per filter."""
        found: dict[str, set[str]] = {k: set() for k in FILTER_LABELS}
        if self.samples:
            for (_n, labels), _v in self.samples[-1].values.items():
                d = dict(labels)
                if "model_name" in d and "replica" in d:
                    for k in FILTER_LABELS:
                        if k in d:
                            found[k].add(d[k])
        return {k: sorted(v) for k, v in found.items()}

    def _then(self, i: int) -> Sample | None:
        """The sample a rate at sample i is taken from: `window_s` before it, or None when the nearest such one
        is more than GAP_WINDOWS windows old (nobody watched: a rate over 100 s was drawn as the last 15 s')."""
        s = self.samples[i]
        for j in range(i - 1, -1, -1):
            age = s.t - self.samples[j].t
            if age >= self.window_s:
                return self.samples[j] if age <= GAP_WINDOWS * self.window_s else None
        return self.samples[0] if i > 0 else None

    def _points(self, i: int, filters: dict[str, str]) -> dict[str, dict[str, float | None]]:
        """panel key -> series name -> value at sample i."""
        now, then_s = self.samples[i], self._then(i)
        v, out = now.values, {}
        out["concurrency"] = dict(_sum(v, "model_concurrent_requests", filters, by="instance_type"))
        out["replicas"] = {"desired": _sum(v, "fleetserve_autoscaler_desired_replicas").get(""),
                           "ready": _sum(v, "fleetserve_autoscaler_ready_replicas").get("")}
        nodes = {}
        for (n, labels), val in v.items():
            if n == "fleetserve_nodes" and _match(labels, {k: x for k, x in filters.items() if k == "instance_type"}):
                d = dict(labels)
                name = f"{d.get('instance_type', '')} {d.get('capacity_type', '')}".strip()
                nodes[name] = nodes.get(name, 0.0) + val
        out["nodes"] = nodes
        out["cost"] = {"$/h": _sum(v, "fleetserve_cost_per_hour_dollars").get("")}
        if then_s is None:
            return out
        dt = max(now.t - then_s.t, 1e-9)
        v, w = comparable(now, then_s)  # the gauges above read every source as it is now
        for key, metric in (("latency", "model_latency_milliseconds"), ("ttfb", "model_ttfb_milliseconds")):
            buckets = _delta(v, w, metric + "_bucket", filters, by="le")
            out[key] = {f"p{int(q * 100)}": quantile(q, buckets) for q in QUANTILES}
        by_instance = {}
        for it in sorted(set(_sum(v, "model_latency_milliseconds_count", filters, by="instance_type"))):
            buckets = _delta(v, w, "model_latency_milliseconds_bucket", {**filters, "instance_type": it}, by="le")
            by_instance[it] = quantile(0.95, buckets)
        out["latency_by_instance"] = by_instance
        calls = sum(_delta(v, w, "model_invocations_total", filters).values())
        by_status = _delta(v, w, "model_errors_total", filters, by="status")
        server = sum(n for status, n in by_status.items() if is_server_error(status))
        client = sum(n for status, n in by_status.items() if status.startswith("4") and not is_server_error(status))
        out["errors"] = {ERROR_SERIES[0]: server / calls if calls else None,
                         ERROR_SERIES[1]: client / calls if calls else None}
        out["throughput"] = {k: x / dt for k, x in _delta(v, w, "model_invocations_total", filters,
                                                          by="model_version").items()}
        tier_hits = _delta(v, w, "fleetserve_kv_tier_hits_total", by="tier")
        name_filter = {k: x for k, x in filters.items() if k == "model_name"}
        hits = sum(_delta(v, w, "vllm:prefix_cache_hits_total", name_filter).values())
        queries = sum(_delta(v, w, "vllm:prefix_cache_queries_total", name_filter).values())
        all_hits = sum(tier_hits.values())
        out["cache_tiers"] = {tier: (n / all_hits * hits / queries if all_hits and queries else None)
                              for tier, n in tier_hits.items()} if queries else {}
        out["cached_tokens"] = {k: x / dt for k, x in
                                _delta(v, w, "fleetserve_router_cached_tokens_total", by="source").items()}
        held = _delta(v, w, "fleetserve_router_buffer_wait_seconds_bucket", by="le")
        out["held"] = {f"p{int(q * 100)}": (s * 1000 if (s := quantile(q, held)) is not None else None)
                       for q in (0.5, 0.95)}
        return out

    def payload(self, filters: dict[str, str] | None = None) -> dict:
        """The JSON the page draws: one entry per panel of observe/grafana.PANELS, plus decisions."""
        filters = {k: v for k, v in (filters or {}).items() if k in FILTER_LABELS and v}
        cache_key = tuple(sorted(filters.items()))
        for i, s in enumerate(self.samples):
            if cache_key not in s.points:  # a sample and the one before it never change: compute once
                if len(s.points) > 8:
                    s.points.clear()
                s.points[cache_key] = self._points(i, filters)
        names: dict[str, set[str]] = {p.key: set() for p in PANELS}
        for s in self.samples:
            for key, values in s.points[cache_key].items():
                names.setdefault(key, set()).update(values)
        # every series gets a point at every sample: one whose source went away (the replicas of an instance type
        # after a scale to zero) reads 0 where it counts things, and a gap (None) where it is a ratio or a
        # latency; without it the line and the panel's headline kept the last value the source reported
        series: dict[str, dict[str, list]] = {p.key: {} for p in PANELS}
        previous = None
        for s in self.samples:
            points, t = s.points[cache_key], round(s.t, 3)
            if previous is not None and s.t - previous > GAP_WINDOWS * self.window_s:
                for lines in series.values():  # a break in every line: a straight one across the time nobody
                    for line in lines.values():  # watched looked like data
                        line.append([round((previous + s.t) / 2, 3), None])
            previous = s.t
            for key, known in names.items():
                values, absent = points.get(key), (0.0 if key in COUNTS else None)
                if values is None and key in NEED_TWO_SAMPLES:
                    continue  # the first sample has nothing to compare with: no point, not a zero
                for name in known:
                    series[key].setdefault(name or "all", []).append([t, (values or {}).get(name, absent)])
        panels = []
        for p in PANELS:
            lines = [{"name": n, "points": pts} for n, pts in sorted(series[p.key].items())]
            panels.append({"key": p.key, "title": p.title, "unit": p.unit, "description": p.description,
                           "series": lines})
        return {"now": self.clock(), "window_s": self.window_s, "filters": filters, "options": self.options(),
                "panels": panels, "annotations": self.annotations()}

    def annotations(self) -> list[dict]:
        """Scaling decisions that change the fleet (`vocabulary.MARKED_REASONS`): where
        fleetserve_autoscaler_decisions_total{reason} went up between samples. Not across a gap in the samples
        (nobody watched): the decision came somewhere in it, and a mark at the gap's end was drawn a minute or more
        after it; the lines show the gap."""
        marks, previous, then = [], None, None
        for s in self.samples:
            if s.sources is not None and "supervisor" not in s.sources:
                continue  # its /metrics did not answer then: every decision ever made read as new at the next one
            if s.decisions is None:
                s.decisions = dict(_sum(s.values, "fleetserve_autoscaler_decisions_total", by="reason"))
            now = s.decisions
            if previous is not None and s.t - then <= GAP_WINDOWS * self.window_s:
                for reason, n in now.items():
                    if reason in MARKED_REASONS and n > previous.get(reason, 0.0):
                        marks.append({"t": round(s.t, 3), "text": f"scaling: {reason}"})
            previous, then = now, s.t
        return marks
