"""`--report report.html`: one self-contained page (no network fetches), plots as inline SVG via matplotlib.

Plots: TTFT over time against the SLO (per-minute p95 of the requests that arrived in that minute), replicas
and nodes, cost per hour, and the engine prefix-cache hit rate per minute; peak and idle windows shaded.
"""

from __future__ import annotations

import html
import io
import json

import numpy as np

from fleetserve.sim.fleet import SimFleet

BUCKET_S = 60.0


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]


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


def _shade(ax, report: dict) -> None:
    for a, b in shaded_spans(report["peak"]["windows"]):
        ax.axvspan(a / 60, b / 60, color="tab:red", alpha=0.08, lw=0)
    for a, b in shaded_spans(report["idle"]["windows"]):
        ax.axvspan(a / 60, b / 60, color="tab:blue", alpha=0.08, lw=0)


def _per_minute(fleet: SimFleet) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    reqs = [r for r in fleet.requests if r.first is not None and r.error is None]
    if not reqs:
        return np.array([]), np.array([]), np.array([])
    t = np.array([r.arrival - fleet.t0 for r in reqs])
    ttft = np.array([(r.first - r.arrival) * 1000 for r in reqs])
    hit = np.array([r.cached / max(r.spec.prompt, 1) for r in reqs])
    bins = (t // BUCKET_S).astype(int)
    xs, p95, hits = [], [], []
    for b in np.unique(bins):
        mask = bins == b
        xs.append(b * BUCKET_S / 60)
        p95.append(np.percentile(ttft[mask], 95))
        hits.append(hit[mask].mean())
    return np.array(xs), np.array(p95), np.array(hits)


def render_html(fleet: SimFleet, report: dict, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"
    xs, p95, hits = _per_minute(fleet)
    series = np.array(fleet.series) if fleet.series else np.zeros((1, 6))
    figs = []
    fig, ax = plt.subplots(figsize=(9, 3))
    _shade(ax, report)
    if xs.size:
        ax.plot(xs, p95, lw=1.2, label="TTFT p95 per minute")
    ax.axhline(report["slo"]["ttft_p95_ms"], color="tab:red", ls="--", lw=1, label="SLO")
    ax.set_yscale("log")
    ax.set(xlabel="minutes", ylabel="ms", title="Latency against the SLO (red: peak windows, blue: idle)")
    ax.legend(loc="upper right", fontsize=8)
    figs.append(fig)
    fig, ax = plt.subplots(figsize=(9, 2.6))
    _shade(ax, report)
    ax.step(series[:, 0] / 60, series[:, 2], where="post", label="replicas (all)")
    ax.step(series[:, 0] / 60, series[:, 1], where="post", label="replicas serving")
    ax.step(series[:, 0] / 60, series[:, 3], where="post", label="nodes", ls=":")
    ax.set(xlabel="minutes", ylabel="count", title="Replicas and nodes")
    ax.legend(loc="upper right", fontsize=8)
    figs.append(fig)
    fig, ax = plt.subplots(figsize=(9, 2.6))
    _shade(ax, report)
    ax.step(series[:, 0] / 60, series[:, 4], where="post", color="tab:green")
    ax.set(xlabel="minutes", ylabel="$/hour", title=f"Cost (total ${report['cost_usd']:.2f})")
    figs.append(fig)
    if xs.size:
        fig, ax = plt.subplots(figsize=(9, 2.6))
        _shade(ax, report)
        ax.plot(xs, hits, lw=1.2, color="tab:purple")
        ax.set(xlabel="minutes", ylabel="fraction", ylim=(0, 1), title="Prompt tokens found in the KV cache")
        figs.append(fig)
    svgs = [_svg(f) for f in figs]
    for f in figs:
        plt.close(f)
    rows = "".join(
        f"<tr><th>{name}</th><td>{sec['requests']}</td><td>{sec['ttft_ms']['p50']}</td><td>{sec['ttft_ms']['p95']}"
        f"</td><td>{sec['e2e_ms']['p95']}</td><td>{sec['slo_attainment']:.3f}</td><td>{sec['cost_usd']:.2f}</td>"
        f"<td>{sec['cost_per_hour_usd']:.2f}</td></tr>"
        for name, sec in (("all", report), ("peak", report["peak"]), ("idle", report["idle"])))
    body = "\n".join(f"<div>{s}</div>" for s in svgs)
    data = html.escape(json.dumps(report, indent=1))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}pre{{font-size:11px;background:#f6f6f6}}</style>
</head><body><h1>{html.escape(title)}</h1>
<p>Routing {report['routing']['strategy']} ({report['routing']['knowledge']}); SLO TTFT p95
{report['slo']['ttft_p95_ms']:.0f} ms, E2E p95 {report['slo']['e2e_p95_ms']:.0f} ms ({report['slo']['source']});
replicas up to {report['replicas_max']}; hit rate {report['hit_rate']['total']:.3f}.</p>
<table><tr><th></th><th>requests</th><th>TTFT p50 ms</th><th>TTFT p95 ms</th><th>E2E p95 ms</th>
<th>SLO attained</th><th>cost $</th><th>$/hour</th></tr>{rows}</table>
{body}
<details><summary>report JSON</summary><pre>{data}</pre></details></body></html>
"""
