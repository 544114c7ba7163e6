"""`fleetserve status --watch`: the fleets' state files as one live table (rich Live), redrawn every interval.

`render` is pure (fleets in, a renderable out) so it is tested without a terminal; `watch` only loops."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fleetserve.fleet.state import serving_note

STATE_STYLES = {"ready": "green", "starting": "yellow", "pending": "yellow", "restarting": "red",
                "draining": "magenta", "stopped": "dim", "dead": "red", "failed": "red"}


def _styled(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state.split()[0] if state else "", ""))


def render(fleets: list, now: float | None = None, interval: float | None = None) -> RenderableType:
    """One table row per replica, grouped by fleet, with the fleet's desired/ready, cost and last decision."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now if now is not None else time.time()))
    footer = f"updated {stamp}" + (f", every {interval:g}s; Ctrl-C to stop" if interval else "")
    if not fleets:
        return Group(Text("no fleets"), Text(footer, style="dim"))
    table = Table("fleet", "status", "desired/ready", "$/h", "replica", "state", "node", "restarts", "cold start",
                  title="fleetserve fleets", title_justify="left", expand=False)
    for f in fleets:
        note = serving_note(f)
        status = _styled(f.status) if not note else Text(f"{f.status}: {note}", style="yellow")
        head = [f.name, status, f"{f.desired}/{f.ready}", f"{f.cost_per_hour:.3f}"]
        if not f.replicas:
            table.add_row(*head, "-", "-", "-", "-", "-")
        for i, r in enumerate(f.replicas):
            cold = f"{r.cold_start_s:.1f}s" if r.cold_start_s is not None else "-"
            cells = head if i == 0 else ["", "", "", ""]
            state = _styled(r.state) if r.router_healthy is not False else Text(f"{r.state} (router: out)", "red")
            table.add_row(*cells, r.id, state, f"{r.node} {r.instance_type}".strip() or "-",
                          str(r.restarts), cold)
        table.add_section()
    notes = []
    for f in fleets:
        line = f"{f.name}: {f.url or '-'}  routing {f.strategy or '-'}  ${f.cost_total:.4f} so far"
        if f.last_decision:
            line += f"  last decision: {f.last_decision.get('desired')} ({f.last_decision.get('reason')})"
        notes.append(Text(line))
        if f.alerts and f.status not in ("stopped", "failed", "dead"):  # the watch had hidden a critical one
            notes.append(Text(f"{f.name}: alerts firing: {', '.join(f.alerts)}", style="red"))
        if f.error:
            notes.append(Text(f"{f.name}: error: {f.error}", style="red"))
    return Group(table, *notes, Text(footer, style="dim"))


def load(name: str | None) -> list:
    from fleetserve.fleet.state import list_fleets, mark_stale

    return [mark_stale(f) for f in list_fleets() if name is None or f.name == name]


def watch(name: str | None, interval: float, iterations: int | None, console: Console,
          loader: Callable[[str | None], list] = load, sleep: Callable[[float], None] = time.sleep) -> int:
    """Redraw until Ctrl-C, or `iterations` times (tests, scripts). Returns how many frames were drawn."""
    frames = 0
    with Live(render(loader(name), interval=interval), console=console, auto_refresh=False,
              transient=False) as live:
        try:
            while True:
                frames += 1
                live.update(render(loader(name), interval=interval), refresh=True)
                if iterations is not None and frames >= iterations:
                    break
                sleep(interval)
        except KeyboardInterrupt:
            pass
    return frames
