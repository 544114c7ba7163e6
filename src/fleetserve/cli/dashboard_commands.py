"""CLI: `dashboard grafana` (the Grafana JSON) and `dashboard open` (the router's live /dashboard).
Registered on the main app by `register(app)`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer

from fleetserve.cli.console import err, fail, out

GRAFANA_UID = re.compile(r"[A-Za-z0-9_-]{1,40}")  # what Grafana accepts as a dashboard uid

dashboard_app = typer.Typer(help="Dashboards: Grafana JSON, and the fleet's built-in live dashboard.",
                            no_args_is_help=True)


@dashboard_app.command("grafana")
def grafana(
    output: Annotated[str, typer.Option("--output", "-o", help="Where to write the dashboard JSON ('-': stdout)")
                      ] = "-",
    title: Annotated[str, typer.Option(help="Dashboard title")] = "fleetserve",
    uid: Annotated[str, typer.Option(help="Dashboard uid (stable across imports)")] = "fleetserve",
) -> None:
    """Build an importable Grafana dashboard (datasource variable; filters namespace, model_name, model_version,
    instance_type; latency/TTFB percentiles, concurrency, errors, cache tiers, replicas, nodes, cost)."""
    from fleetserve.cli.checks import output_failed, writable, write_output
    from fleetserve.observe.grafana import build_dashboard, structure_errors

    if not title.strip():  # Grafana refuses the import ("Dashboard title cannot be empty")
        raise typer.BadParameter("empty; allowed values: any non-empty title", param_hint="--title")
    if not GRAFANA_UID.fullmatch(uid):
        raise typer.BadParameter(f"{uid!r}; allowed values: 1 to 40 letters, digits, '-' or '_' (Grafana's uid)",
                                 param_hint="--uid")
    writable(None if output == "-" else output, "--output")
    board = build_dashboard(title=title, uid=uid)
    problems = structure_errors(board)
    if problems:  # a builder bug, never the user's input
        raise fail("; ".join(problems), 1)
    text = json.dumps(board, indent=2)
    if output == "-":
        print(text)
        return
    unwritten = write_output(output, text + "\n", "--output")
    if unwritten:
        raise output_failed(unwritten)
    panels = sum(1 for p in board["panels"] if p.get("type") != "row")
    out.print(f"wrote {output}: {panels} panels, import it in Grafana (Dashboards > New > Import)", markup=False)


@dashboard_app.command("open")
def open_dashboard(
    name: Annotated[str | None, typer.Argument(help="Fleet name (default: the only running one)")] = None,
    browser: Annotated[bool, typer.Option("--browser/--no-browser", help="Also open it in a web browser")] = False,
) -> None:
    """Print the URL of a running fleet's live dashboard (the router's /dashboard). It carries a login code signed
    with the fleet's internal token that works once, within 5 minutes (the page trades it for a session cookie)."""
    from fleetserve.fleet.control import FleetError, pick_fleet
    from fleetserve.fleet.state import fleet_dir

    try:
        state = pick_fleet(name)
    except FleetError as exc:
        raise fail(str(exc), exc.exit_code) from None
    url = dashboard_url(state.url, fleet_dir(state.name) / "internal.token")
    out.print(url, markup=False)
    if browser:
        import webbrowser

        try:
            opened = webbrowser.open(url)
        except webbrowser.Error:
            opened = False
        if not opened:  # it exited 0 without a word, the page never opened
            err.print("warning: no web browser could be opened here (no display, or none found; BROWSER names one): "
                      "open the URL above yourself", markup=False)


def dashboard_url(endpoint: str, token_file: Path, now: float | None = None) -> str:
    """The router's /dashboard with a login code signed by the fleet's token (0600 file, same user), so a browser
    can log in; never the token itself (it had been in the URL, and so in terminals and shell histories)."""
    from fleetserve.observe.dashboard import LOGIN_TTL_S, signed

    base = endpoint.removesuffix("/").removesuffix("/v1")
    try:
        token = token_file.read_text().strip()
    except OSError:
        return f"{base}/dashboard"
    return f"{base}/dashboard?login={signed(token, 'login', LOGIN_TTL_S, now)}"


def register(app: typer.Typer) -> None:
    app.add_typer(dashboard_app, name="dashboard")
