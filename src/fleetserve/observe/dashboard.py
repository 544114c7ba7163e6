"""The router's built-in live dashboard: `/dashboard` (one self-contained HTML page) and `/dashboard/data` (JSON).

No Grafana and no external assets: the CSS and the JavaScript are inline and the charts are SVG drawn by the
page itself. Both routes need the router's admin check. A browser cannot send the admin header, so
`fleetserve dashboard open` prints `/dashboard?login=CODE`: a code signed with the fleet's internal token (read
from its 0600 file) that expires in LOGIN_TTL_S; the page trades it for an HttpOnly, SameSite=Strict session
cookie (signed likewise, SESSION_TTL_S) and redirects to the bare URL. The printed URL had carried the internal
token itself, the fleet's strongest secret, into terminals, shell histories and proxy logs, and the cookie had
held it too. `?token=T` (the admin token or the internal token, typed by hand) still logs in the same way.
Signed, not stored: every router worker checks a code or a cookie alone. A login code is also used once
(`UsedLogins`): a URL seen in a terminal, a shell history or a proxy log after its owner opened it is dead, not a
session for anyone for the rest of its five minutes. The workers of one router share what was used through
their bus folder; separate router replicas (Kubernetes) each accept a code once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets as secrets_module
import time
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from fleetserve.api.errors import APIError
from fleetserve.api.internal import same_secret
from fleetserve.observe.grafana import FILTER_LABELS, PANELS
from fleetserve.observe.livedata import LiveData
from fleetserve.router.admin import admin_allowed

COOKIE = "fleetserve_dashboard"
LOGIN_TTL_S = 300  # a printed login URL works this long
SESSION_TTL_S = 12 * 3600  # a browser's login lasts this long


def signed(secret: str, purpose: str, ttl_s: float, now: float | None = None) -> str:
    """`EXPIRY.NONCE.SIGNATURE`: what `valid` accepts for `purpose` until EXPIRY (seconds since the epoch); the
    nonce makes each code its own, so that using one (`UsedLogins`) spends no other."""
    expiry = int((time.time() if now is None else now) + ttl_s)
    nonce = secrets_module.token_hex(8)
    return f"{expiry}.{nonce}.{_signature(secret, purpose, expiry, nonce)}"


def _signature(secret: str, purpose: str, expiry: int, nonce: str) -> str:
    message = f"fleetserve-dashboard:{purpose}:{expiry}:{nonce}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def valid(value: str, purpose: str, secrets: tuple[str | None, ...], now: float | None = None) -> bool:
    expiry, _, rest = value.partition(".")
    nonce, _, signature = rest.partition(".")
    # ASCII digits of a plausible length: "²" passes isdigit() and int() refused it (a 500 for anyone)
    if not (expiry.isascii() and expiry.isdigit() and len(expiry) <= 12) or not signature or \
            not _is_nonce(nonce) or int(expiry) < (time.time() if now is None else now):
        return False
    return any(secret and same_secret(signature, _signature(secret, purpose, int(expiry), nonce))
               for secret in secrets)


def _is_nonce(nonce: str) -> bool:
    return len(nonce) == 16 and all(c in "0123456789abcdef" for c in nonce)


class UsedLogins:
    """The login codes already traded for a session, until they expire. Given a folder (the router workers' bus),
    a code is spent by creating a file named after its nonce (O_EXCL: one worker wins), so it is spent for every
    worker; without one, in this process's memory."""

    def __init__(self) -> None:
        self._used: dict[str, int] = {}

    def first_use(self, code: str, folder: str | None = None, now: float | None = None) -> bool:
        """True once per code (which `valid` accepted), False on any later use."""
        expiry_text, nonce, _ = code.split(".", 2)
        expiry, now = int(expiry_text), time.time() if now is None else now
        if folder is None:
            self._used = {n: e for n, e in self._used.items() if e >= now}
            if nonce in self._used:
                return False
            self._used[nonce] = expiry
            return True
        spent = Path(folder) / "used-logins"
        try:
            spent.mkdir(exist_ok=True)
            for entry in spent.iterdir():
                if int(entry.name.partition(".")[0]) < now:
                    entry.unlink(missing_ok=True)
            os.close(os.open(spent / f"{expiry}.{nonce}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            return False
        except (OSError, ValueError):  # the folder is gone (the router stops): no session from a code not spent
            return False


def _secrets(gateway) -> tuple[str | None, ...]:
    return gateway.settings.admin_token, gateway.internal.token


def _token_ok(gateway, token: str) -> bool:
    return bool(token) and any(secret and same_secret(token, secret) for secret in _secrets(gateway))


def allowed(gateway, request: Request) -> bool:
    return admin_allowed(gateway, request) or valid(request.cookies.get(COOKIE, ""), "session", _secrets(gateway))


def dashboard_routes(gateway) -> list[Route]:
    live = LiveData()
    gateway.dashboard = live
    used = UsedLogins()

    async def page(request: Request) -> Response:
        token, login = request.query_params.get("token", ""), request.query_params.get("login", "")
        if token or login:
            if not (_token_ok(gateway, token) if token else valid(login, "login", _secrets(gateway))):
                return APIError(403, "dashboard: wrong or expired login (`fleetserve dashboard open` prints a new "
                                     f"URL; it works {LOGIN_TTL_S // 60} minutes)").response()
            folder = gateway.peers.folder if gateway.peers is not None else None  # attached after this app is built
            if login and not token and not used.first_use(login, folder):
                return APIError(403, "dashboard: this login URL was used already; each works once (`fleetserve "
                                     "dashboard open` prints a new one)").response()
            secret = next(s for s in (gateway.internal.token, gateway.settings.admin_token) if s)
            redirect = RedirectResponse("/dashboard", status_code=303)
            redirect.set_cookie(COOKIE, signed(secret, "session", SESSION_TTL_S), max_age=SESSION_TTL_S,
                                httponly=True, samesite="strict", path="/dashboard",
                                secure=request.url.scheme == "https")
            return redirect
        if not allowed(gateway, request):
            return APIError(403, "dashboard: open the URL `fleetserve dashboard open` prints "
                                 "(or send x-fleetserve-admin)").response()
        return HTMLResponse(render_page(), headers={"cache-control": "no-store"})

    async def data(request: Request) -> Response:
        if not allowed(gateway, request):
            return APIError(403, "dashboard data: admin only").response()
        live.watched(gateway.peers.folder if gateway.peers is not None else None)
        await live.sample(gateway)
        body = live.payload({k: request.query_params.get(k, "") for k in FILTER_LABELS})
        load = gateway.load_report()  # every router worker's, as /admin/load: one worker's alone had alternated
        ids = {b.url: b.id for b in gateway.pool.backends.values()}
        body["fleet"] = {"strategy": gateway.policy.name, "model": ", ".join(gateway.settings.served_models),
                         "requests_total": load["requests_total"],
                         "pending": load["pending"], "in_flight": load["in_flight"],
                         "backends": [{"id": ids.get(b["url"], b["url"]), "healthy": b["healthy"],
                                       "draining": b["draining"], "in_flight": b["in_flight"]}
                                      for b in load["backends"]]}
        return JSONResponse(body, headers={"cache-control": "no-store"})

    return [Route("/dashboard", page, methods=["GET"]), Route("/dashboard/data", data, methods=["GET"])]


def render_page() -> str:
    layout = json.dumps([{"key": p.key, "title": p.title, "unit": p.unit} for p in PANELS])
    return PAGE.replace("__PANELS__", layout).replace("__FILTERS__", json.dumps(list(FILTER_LABELS)))


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>fleetserve dashboard</title><link rel="icon" href="data:,">
<style>
:root{--bg:#0f1419;--card:#182028;--fg:#e6e9ec;--dim:#8b98a5;--grid:#2a3541;--warn:#f0a03c}
*{box-sizing:border-box}body{margin:0;background:var(--bg);color:var(--fg);font:13px/1.4 system-ui,sans-serif}
header{display:flex;flex-wrap:wrap;gap:12px 24px;align-items:center;padding:10px 16px;
  border-bottom:1px solid var(--grid)}
header h1{font-size:16px;margin:0}header .stat b{font-size:15px}header .dim,.dim{color:var(--dim)}
select{background:var(--card);color:var(--fg);border:1px solid var(--grid);border-radius:4px;padding:2px 4px}
main{display:grid;grid-template-columns:repeat(auto-fill,minmax(400px,1fr));gap:10px;padding:10px 16px}
.panel{background:var(--card);border-radius:6px;padding:8px 10px;min-width:0}
.panel h2{font-size:13px;margin:0 0 2px;font-weight:600;display:flex;justify-content:space-between;gap:8px}
.panel h2 .value{font-variant-numeric:tabular-nums;color:#9fd3ff}
.panel svg{width:100%;height:150px;display:block}.legend{display:flex;flex-wrap:wrap;gap:4px 12px;color:var(--dim)}
.legend i{display:inline-block;width:10px;height:3px;margin-right:4px;vertical-align:middle}
.empty{fill:var(--dim);font-size:12px}
#stale{display:none;background:#4a2b12;color:#ffd7a8;padding:8px 16px;border-bottom:1px solid var(--warn)}
body.stale #stale{display:block}body.stale main{opacity:.45;filter:grayscale(.6)}
</style></head><body>
<div id="stale" role="alert"></div>
<header><h1 id="title">fleetserve</h1><span class="stat">strategy <b id="strategy">-</b></span>
<span class="stat">requests <b id="requests">-</b></span><span class="stat">in flight <b id="inflight">-</b></span>
<span class="stat">replicas <b id="backends">-</b></span><span id="filters"></span>
<span class="dim" id="updated">connecting ...</span></header>
<main id="panels"></main>
<script>
"use strict";
const PANELS = __PANELS__, FILTERS = __FILTERS__;
const COLORS = ["#5fb3f9","#f2c14e","#7bd88f","#f47c7c","#c39bf5","#4fd1c5","#f59e6b","#a3b1bf"];
const chosen = {};
const $ = (id) => document.getElementById(id);
const NS = "http://www.w3.org/2000/svg";
function fmt(v, unit) {
  if (v === null || v === undefined || Number.isNaN(v)) return "-";
  if (unit === "percentunit") return (v * 100).toFixed(1) + "%";
  if (unit === "ms") return v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(v < 10 ? 1 : 0) + " ms";
  if (unit === "currencyUSD") return "$" + v.toFixed(3);
  if (unit === "reqps") return v.toFixed(2) + "/s";
  if (unit.startsWith("suffix:")) return (Math.abs(v) >= 100 ? v.toFixed(0) : +v.toFixed(2) + "") + unit.slice(7);
  return Math.abs(v) >= 100 ? v.toFixed(0) : +v.toFixed(2) + "";
}
function tick(v, unit) {  // axis labels fit the 44 px margin: a suffix unit is in the panel's value, not here
  if (!unit.startsWith("suffix:")) return fmt(v, unit);
  const a = Math.abs(v);
  return a >= 1e6 ? +(v / 1e6).toFixed(1) + "M" : a >= 1e3 ? +(v / 1e3).toFixed(1) + "k" : fmt(v, "");
}
function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}
for (const p of PANELS) {
  const div = document.createElement("section");
  div.className = "panel"; div.id = "panel-" + p.key; div.dataset.points = "0";
  div.innerHTML = `<h2><span>${p.title}</span><span class="value">-</span></h2>` +
                  `<svg viewBox="0 0 400 150" preserveAspectRatio="none"></svg><div class="legend"></div>`;
  $("panels").appendChild(div);
}
function draw(panel, data, marks, t0, t1) {
  const div = $("panel-" + panel.key), svg = div.querySelector("svg"), legend = div.querySelector(".legend");
  svg.replaceChildren(); legend.replaceChildren();
  const W = 400, H = 150, L = 44, B = 16, T = 6, R = 6;
  // a null point is a gap: the line breaks there, and a series whose latest point is null reads "-"
  const series = data.series.map(s => ({name: s.name, pts: s.points.filter(p => p[1] !== null),
                                        last: s.points.length ? s.points[s.points.length - 1][1] : null,
                                        all: s.points}));
  const values = series.flatMap(s => s.pts.map(p => p[1]));
  div.dataset.points = String(values.length);
  const pct = panel.unit === "percentunit", top = Math.max(0, ...values);
  let max = top > 0 ? top * 1.1 : (pct ? 0.01 : 1);
  if (pct) max = Math.min(Math.max(max, 0.01), Math.max(1, top));  // ratios: at most 100 %, at least 1 %
  const x = t => L + (W - L - R) * (t - t0) / Math.max(t1 - t0, 1), y = v => H - B - (H - B - T) * v / max;
  for (let i = 0; i <= 3; i++) {
    const v = max * i / 3;
    el("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#2a3541", "stroke-width": 1}, svg);
    el("text", {x: L - 4, y: y(v) + 4, "text-anchor": "end", fill: "#8b98a5", "font-size": 10}, svg)
      .textContent = tick(v, panel.unit);
  }
  const minutes = Math.round((t1 - t0) / 60);
  el("text", {x: L, y: H - 3, fill: "#8b98a5", "font-size": 10}, svg).textContent =
    minutes >= 1 ? "-" + minutes + " min" : "-" + Math.round(t1 - t0) + " s";
  el("text", {x: W - R, y: H - 3, fill: "#8b98a5", "font-size": 10, "text-anchor": "end"}, svg).textContent = "now";
  for (const m of marks) {
    if (m.t < t0) continue;
    const line = el("line", {x1: x(m.t), x2: x(m.t), y1: T, y2: H - B, stroke: "#f0a03c",
                             "stroke-dasharray": "3 3", "stroke-width": 1, class: "annotation"}, svg);
    el("title", {}, line).textContent = m.text;
  }
  if (!values.length) {
    el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"}, svg).textContent = "no data yet";
  }
  const latest = [];
  series.forEach((s, i) => {
    const c = COLORS[i % COLORS.length];
    if (s.pts.length) {
      let d = "", pen = "M";
      s.all.forEach((p, j) => {
        if (p[1] === null) { pen = "M"; return; }
        d += pen + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1); pen = "L";
        const alone = (j === 0 || s.all[j - 1][1] === null) && (j === s.all.length - 1 || s.all[j + 1][1] === null);
        if (alone) el("circle", {cx: x(p[0]), cy: y(p[1]), r: 2, fill: c}, svg);  // a point between gaps
      });
      el("path", {d, fill: "none", stroke: c, "stroke-width": 1.6, "vector-effect": "non-scaling-stroke"}, svg);
      latest.push([s.name, s.last]);
    }
    const item = document.createElement("span");
    item.innerHTML = `<i style="background:${c}"></i>`;
    item.append(`${s.name} ${fmt(s.last, panel.unit)}`);
    legend.appendChild(item);
  });
  div.querySelector(".value").textContent = latest.length === 1 ? fmt(latest[0][1], panel.unit) :
    (latest.length ? latest.length + " series" : "-");
}
function filterBar(options) {
  const bar = $("filters");
  for (const f of FILTERS) {
    let sel = document.getElementById("filter-" + f);
    if (!sel) {
      const label = document.createElement("label"); label.append(f + " ");
      sel = document.createElement("select"); sel.id = "filter-" + f;
      sel.onchange = () => { chosen[f] = sel.value; refresh(); };
      label.appendChild(sel); bar.appendChild(label); bar.append(" ");
    }
    const want = ["", ...(options[f] || [])];
    if (sel.options.length !== want.length) {
      sel.replaceChildren(...want.map(v => { const o = document.createElement("option");
        o.value = v; o.textContent = v || "all"; return o; }));
      sel.value = chosen[f] || "";
    }
  }
}
async function refresh() {
  try {
    const q = new URLSearchParams(Object.entries(chosen).filter(([, v]) => v));
    const r = await fetch("/dashboard/data?" + q, {credentials: "same-origin", cache: "no-store"});
    if (!r.ok) throw Object.assign(new Error("HTTP " + r.status), {status: r.status});
    const data = await r.json();
    const t1 = data.now, t0 = Math.min(t1 - 60, ...data.panels.flatMap(p => p.series.map(s =>
      s.points.length ? s.points[0][0] : t1)));
    for (const p of data.panels) draw(p, p, data.annotations, t0, t1);
    const f = data.fleet;
    if (f.model) {
      $("title").textContent = "fleetserve \u00b7 " + f.model; document.title = f.model + " \u00b7 fleetserve";
    }
    $("strategy").textContent = f.strategy; $("requests").textContent = f.requests_total;
    $("inflight").textContent = f.in_flight + (f.pending ? " (+" + f.pending + " held)" : "");
    $("backends").textContent = f.backends.length ? f.backends.filter(b => b.healthy).length + "/" +
      f.backends.length + " healthy" : "none (scaled to zero, or starting)";
    filterBar(data.options);
    lastData = t1;
    $("updated").textContent = "updated " + new Date(t1 * 1000).toLocaleTimeString();
    document.body.classList.remove("stale");
    document.body.dataset.loaded = "1";
  } catch (e) {
    // what the page shows is old: said at the top, the panels greyed (the last values had stayed, as if live)
    const since = lastData ? "No data since " + new Date(lastData * 1000).toLocaleTimeString() + ": "
                           : "No data yet: ";
    $("stale").textContent = since + (e.status === 403
      ? "this browser's login ended (sessions last 12 hours) or the fleet was restarted; run `fleetserve dashboard " +
        "open` for a new URL"
      : e.status ? "the router answered HTTP " + e.status
      : "the router does not answer (is the fleet running? `fleetserve status`)");
    document.body.classList.add("stale");
    $("updated").textContent = lastData ? "last data " + new Date(lastData * 1000).toLocaleTimeString() : "";
  }
}
let lastData = 0;
refresh(); setInterval(refresh, 2000);
</script></body></html>
"""
