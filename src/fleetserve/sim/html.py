"""`--report report.html`: one self-contained page (no network fetches), plots as inline SVG via matplotlib.

Plots: TTFT over time against the SLO (per-minute p95 of the requests that arrived in that minute and were
answered; a minute without answers is a gap in the line, not a line drawn across it), requests per minute
answered and refused or failed, replicas and nodes, cost per hour, and the share of prompt tokens found in a
cache per minute (tokens, not a mean of per-request ratios); peak, idle and the worst window shaded. The table
shows failures and error rates per window, and the cost per hour `verify` checks at peak (the costliest window's).
"""

from __future__ import annotations

import html
import io
import json

import numpy as np

from fleetserve.sim.fleet import SimFleet
from fleetserve.sim.report import table_sections

BUCKET_S = 60.0
# the buckets of the per-period series, the shortest that leaves at most MOST_BUCKETS bars over the run: a week
# drawn in minutes was 10,080 bars a pixel too narrow to show, and a 3.9 MB page for two requests
BUCKETS = ((60.0, "minute"), (300.0, "5 minutes"), (900.0, "15 minutes"), (3600.0, "hour"), (4 * 3600.0, "4 hours"),
           (86400.0, "day"))
MOST_BUCKETS = 720
LEAST_SHADE = 1 / 300  # a shaded window is drawn at least this share of the time axis wide (5 minutes of a week)


def bucket_for(duration_s: float) -> tuple[float, str]:
    """(seconds, name) of the series' bucket for a run of `duration_s`."""
    for seconds, name in BUCKETS:
        if duration_s / seconds <= MOST_BUCKETS:
            return seconds, name
    return BUCKETS[-1]


def _svg(fig, prefix: str) -> str:
    """The figure as SVG, the same bytes for the same figure: no date in its metadata and element ids from a
    fixed salt (matplotlib's random ids and timestamp made two reports of one seed differ), each id and reference
    to one prefixed with `prefix` (every figure of a page had figure_1, axes_1 and the same clip paths)."""
    import re

    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "fleetserve"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m[1]}"', text)
    return re.sub(r'(url\(#|href="#)([^")]+)', lambda m: f"{m[1]}{prefix}{m[2]}", text)


SHADED_SPANS = 400  # at most this many shaded spans per kind: a plot's width shows no more


def shaded_spans(windows: list, most: int = SHADED_SPANS) -> list[tuple[float, float]]:
    """The windows as few spans as the plot can show: touching ones joined, then the narrowest gaps closed until at
    most `most` remain. A day in 1 s windows shaded 30,000 spans: 103 s and a 20 MB report."""
    spans: list[list[float]] = []
    for a, b in sorted(windows):
        if spans and a <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], b)
        else:
            spans.append([a, b])
    if len(spans) > most:
        gaps = sorted(spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1))
        close = gaps[len(spans) - most - 1]  # closing every gap up to this one leaves at most `most`
        joined = [spans[0]]
        for a, b in spans[1:]:
            if a - joined[-1][1] <= close:
                joined[-1][1] = b
            else:
                joined.append([a, b])
        spans = joined
    return [(a, b) for a, b in spans]


def time_unit(duration_s: float) -> tuple[float, str]:
    """Seconds per unit of the time axis, and its name: minutes, or hours past six of them (a day read 0-1440)."""
    return (3600.0, "hours") if duration_s > 6 * 3600 else (60.0, "minutes")


# every chart's axes at the same place on the page, so the shaded windows line up from chart to chart (each was
# cropped to its own labels: a wider y-tick label moved its axes)
MARGINS = {"left": 0.085, "right": 0.985, "bottom": 0.19, "top": 0.87}


def _shade(ax, report: dict, unit: float) -> None:
    least = (report.get("duration_s") or 0.0) * LEAST_SHADE

    def span(a: float, b: float, **style) -> None:
        if b - a < least:  # widened about its middle, to be seen
            a, b = (a + b - least) / 2, (a + b + least) / 2
        ax.axvspan(a / unit, b / unit, lw=0, **style)

    for a, b in shaded_spans(report["peak"]["windows"]):
        span(a, b, color="tab:red", alpha=0.08)
    for a, b in shaded_spans(report["idle"]["windows"]):
        span(a, b, color="tab:blue", alpha=0.08)
    for a, b in (report.get("worst") or {}).get("windows", []):
        span(a, b, color="tab:orange", alpha=0.15)


def _per_minute(fleet: SimFleet, bucket_s: float = BUCKET_S) -> dict[str, np.ndarray]:
    """Per-bucket series over the whole run (minutes unless the run is long: `bucket_for`): minutes (x), TTFT p95
    and the cached share of prompt tokens of the answered requests (NaN where a bucket has none), arrivals answered,
    and arrivals refused or failed. One sort, not a pass over every request per bucket (a day of 5 million
    requests is 1,440 minutes)."""
    if not fleet.requests:
        return {}
    reqs = fleet.requests
    bins = (np.array([r.arrival - fleet.t0 for r in reqs]) // bucket_s).astype(int)
    n = int(bins.max()) + 1
    ok = np.array([r.first is not None and r.done is not None and r.error is None for r in reqs])
    answered = [r for r, good in zip(reqs, ok, strict=True) if good]
    ttft = np.array([(r.first - r.arrival) * 1000 for r in answered])
    prompt = np.bincount(bins[ok], weights=[r.spec.prompt for r in answered], minlength=n)
    cached = np.bincount(bins[ok], weights=[r.cached for r in answered], minlength=n)
    count = np.bincount(bins[ok], minlength=n)
    p95 = np.full(n, np.nan)
    order = np.lexsort((ttft, bins[ok]))
    starts = np.concatenate(([0], np.cumsum(count)))
    for b in np.flatnonzero(count):
        p95[b] = np.percentile(ttft[order[starts[b]:starts[b + 1]]], 95)
    with np.errstate(invalid="ignore", divide="ignore"):
        hits = np.where(count > 0, cached / np.maximum(prompt, 1.0), np.nan)
    return {"x": np.arange(n) * bucket_s / 60, "ttft_p95": p95, "hit": hits,
            "answered": count, "failed": np.bincount(bins[~ok], minlength=n)}


def _ms(value) -> str:
    return "-" if value is None else f"{value:.0f}"


FAILED_ROW = ' style="color:#b00"'
REASON_CELL = '<td style="text-align:left">'


def _verdict(checks: list) -> str:
    """verify's checks as a table, failures first in red with their reasons."""
    rows = []
    for c in sorted(checks, key=lambda c: c.passed):
        value = "-" if c.value is None else f"{c.value:.4g}"
        limit = "-" if c.limit is None else f"{c.limit:.4g}"
        rows.append(f"<tr{'' if c.passed else FAILED_ROW}><th>{html.escape(c.window)}</th>"
                    f"<td>{html.escape(c.metric)}</td><td>{value}</td><td>{limit}</td>"
                    f"<td>{'pass' if c.passed else 'fail'}</td>{REASON_CELL}{html.escape(c.reason)}</td></tr>")
    verdict = "PASS" if all(c.passed for c in checks) else "FAIL"
    return (f"<h2>verify: {verdict}</h2><table><tr><th>window</th><th>check</th><th>value</th><th>limit</th>"
            f"<th>result</th><th>reason</th></tr>{''.join(rows)}</table>")


def render_html(fleet: SimFleet, report: dict, title: str, checks: list | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"
    bucket, per = bucket_for(report.get("duration_s") or 0.0)
    minute = _per_minute(fleet, bucket)
    series = np.array(fleet.series) if fleet.series else np.zeros((1, 6))
    unit, unit_name = time_unit(report.get("duration_s") or 0.0)
    if minute:
        minute = {**minute, "x": minute["x"] * 60 / unit}
    figs = []
    fig, ax = plt.subplots(figsize=(9, 3))
    _shade(ax, report, unit)
    if minute and np.isfinite(minute["ttft_p95"]).any():
        ax.plot(minute["x"], minute["ttft_p95"], lw=1.2, marker="o", ms=3, label=f"TTFT p95 per {per}")
        ax.set_yscale("log")
    ax.axhline(report["slo"]["ttft_p95_ms"], color="tab:red", ls="--", lw=1, label="SLO")
    ax.set(xlabel=unit_name, ylabel="ms",
           title="Latency against the SLO (red: peak windows, blue: idle, orange: most misses)")
    ax.legend(loc="best", fontsize=8, framealpha=0.6)
    figs.append(fig)
    if minute:
        fig, ax = plt.subplots(figsize=(9, 2.6))
        _shade(ax, report, unit)
        ax.bar(minute["x"], minute["answered"], width=bucket / unit, align="edge", color="tab:gray", label="answered")
        ax.bar(minute["x"], minute["failed"], width=bucket / unit, align="edge", bottom=minute["answered"],
               color="tab:red", label="refused or failed")
        ax.set(xlabel=unit_name, ylabel="requests",
               title=f"Requests per {per} ({report['failed']} refused or failed, {report['error_rate']:.2%})")
        ax.set_ylim(0, max(1.0, float((minute["answered"] + minute["failed"]).max())) * 1.15)  # room for the legend
        ax.legend(loc="best", fontsize=8, framealpha=0.6)
        figs.append(fig)
    fig, ax = plt.subplots(figsize=(9, 2.6))
    _shade(ax, report, unit)
    ax.step(series[:, 0] / unit, series[:, 2], where="post", label="replicas (all)")
    ax.step(series[:, 0] / unit, series[:, 1], where="post", label="replicas serving")
    ax.step(series[:, 0] / unit, series[:, 3], where="post", label="nodes", ls=":")
    ax.set(xlabel=unit_name, ylabel="count", title="Replicas and nodes")
    ax.set_ylim(0, max(1.0, float(series[:, 1:4].max())) * 1.15)  # a run that never started one: 0 to 1, not +-0.04
    ax.legend(loc="best", fontsize=8, framealpha=0.6)
    figs.append(fig)
    fig, ax = plt.subplots(figsize=(9, 2.6))
    _shade(ax, report, unit)
    ax.step(series[:, 0] / unit, series[:, 4], where="post", color="tab:green")
    ax.set(xlabel=unit_name, ylabel="$/hour", title=f"Cost (total ${report['cost_usd']:.2f})")
    top = float(series[:, 4].max())
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    figs.append(fig)
    if minute and np.isfinite(minute["hit"]).any():
        fig, ax = plt.subplots(figsize=(9, 2.6))
        _shade(ax, report, unit)
        ax.plot(minute["x"], minute["hit"], lw=1.2, marker=".", ms=3, color="tab:purple")
        ax.set(xlabel=unit_name, ylabel="fraction", ylim=(0, 1), title="Prompt tokens found in a cache")
        figs.append(fig)
    span = (report.get("duration_s") or 0.0) / unit  # the run's own span, as the report's figures
    for f in figs:  # one time axis for every chart: the run's, from its start to its last answer
        f.subplots_adjust(**MARGINS)
        for ax in f.axes:
            ax.set_xlim(0, max(span, BUCKET_S / unit))
    svgs = [_svg(f, f"f{i}-") for i, f in enumerate(figs)]
    for f in figs:
        plt.close(f)
    rows = "".join(
        f"<tr><th>{html.escape(name)}</th><td>{sec['requests']}</td><td>{sec['failed']}</td>"
        f"<td>{sec['error_rate']:.2%}</td><td>{_ms(sec['ttft_ms']['p50'])}</td><td>{_ms(sec['ttft_ms']['p95'])}</td>"
        f"<td>{_ms(sec['e2e_ms']['p95'])}</td><td>{sec['slo_attainment']:.3f}</td><td>{sec['cost_usd']:.2f}</td>"
        f"<td>{sec['cost_per_hour_usd']:.2f}</td></tr>"
        for name, sec in table_sections(report))
    costliest = ""
    if report.get("costliest_window") and report["cost_per_hour_max_usd"] > 0:
        a, b = report["costliest_window"]
        costliest = (f"<p>Costliest window {a:.0f}-{b:.0f} s: ${report['cost_per_hour_max_usd']:.2f}/hour "
                     "(what <code>verify</code> holds to the budget at peak).</p>")
    body = "\n".join(f"<div>{s}</div>" for s in svgs)
    warned = "".join(f"<li>{html.escape(w)}</li>" for w in report.get("warnings") or [])
    warned = f"<h2>Warnings</h2><ul>{warned}</ul>" if warned else ""
    data = html.escape(json.dumps(report, indent=1))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}pre{{font-size:11px;background:#f6f6f6}}</style>
</head><body><h1>{html.escape(title)}</h1>
<p>Routing {report['routing']['strategy']} ({report['routing']['knowledge']}); SLO TTFT p95
{report['slo']['ttft_p95_ms']:.0f} ms, E2E p95 {report['slo']['e2e_p95_ms']:.0f} ms ({report['slo']['source']});
replicas up to {report['replicas_max']}; hit rate {report['hit_rate']['total']:.3f}.</p>
{_verdict(checks) if checks else ""}
<table><tr><th></th><th>requests</th><th>refused or failed</th><th>error rate</th><th>TTFT p50 ms</th>
<th>TTFT p95 ms</th><th>E2E p95 ms</th><th>SLO attained</th><th>cost $</th><th>$/hour</th></tr>{rows}</table>
{costliest}
{warned}
{body}
<details><summary>report JSON</summary><pre>{data}</pre></details></body></html>
"""
