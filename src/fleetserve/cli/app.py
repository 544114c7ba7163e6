"""The `fleetserve` command line. Bad input exits 2 with a message naming the field or option."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from fleetserve import __version__
from fleetserve.api.limits import SEND_S
from fleetserve.cli.bench_commands import bench_app
from fleetserve.cli.checks import MAX_THREADS, float_option, output_failed, write_output
from fleetserve.cli.console import (
    EXIT_USAGE,
    Terminated,
    err,
    fail,
    out,
    print_spec_errors,
    render_refusal,
    say,
    usage_error_json,
)

app = typer.Typer(
    name="fleetserve",
    help="Open, portable inference operations for LLMs: one spec, a local fleet, a cache-aware gateway.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="Prepare models: import the demo model, make tiny test models.", no_args_is_help=True)
app.add_typer(model_app, name="model")
models_app = typer.Typer(help="The model catalog: presets usable as model.source: catalog:NAME.",
                         no_args_is_help=True)
app.add_typer(models_app, name="models")

app.add_typer(bench_app, name="bench")


def _print_version(value: bool) -> None:
    if value:
        out.print(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[bool | None, typer.Option("--version", callback=_print_version, is_eager=True,
                                                  help="Print the fleetserve version and exit.")] = None,
) -> None:
    """Open, portable inference operations for LLMs: one spec, a local fleet, a cache-aware gateway."""


def _load(path: str):
    from fleetserve.spec import SpecError, load_spec

    try:
        return load_spec(path)
    except SpecError as exc:
        raise fail(str(exc), EXIT_USAGE) from None


def _print_warnings(loaded) -> None:
    for w in loaded.warnings:
        err.print("[yellow]warning:[/yellow] ", end="")
        err.print(str(w), markup=False)


@app.command()
def version() -> None:
    """Print the fleetserve version."""
    out.print(__version__)


@app.command()
def validate(
    spec: Annotated[str, typer.Argument(help="Endpoint spec (fleetserve.io/v1 or HyperPod InferenceEndpointConfig)")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the normalised spec as JSON")] = False,
    kubernetes: Annotated[bool, typer.Option("--kubernetes", help="Check it as `render k8s` would (exit 2 where "
                                                                  "it refuses) and list the warnings that hold "
                                                                  "there, not the local fleet's")] = False,
) -> None:
    """Check a spec: field errors exit 2; settings without local effect are listed as warnings."""
    from fleetserve.spec import SpecError, load_spec

    try:
        loaded = load_spec(spec)
    except SpecError as exc:
        if as_json:
            print_spec_errors(exc)
        raise fail(str(exc), EXIT_USAGE) from None
    if kubernetes:  # a CI that gated on validate passed specs render k8s then refused (no node type fits)
        from fleetserve.k8s.render import render, rendered_warnings
        from fleetserve.spec.errors import SpecProblem

        try:
            rendered = render(loaded.endpoint)
        except ValueError as exc:
            if as_json:
                print_spec_errors(render_refusal(exc, "render k8s refuses it: "))
            raise fail(f"render k8s refuses it: {exc}", EXIT_USAGE) from None
        loaded.warnings[:] = [SpecProblem("", text) for text in rendered_warnings(loaded, rendered)]
    else:
        from fleetserve.spec.effects import (
            local_auth_problem,
            local_memory_problem,
            local_model_problem,
            local_tls_problem,
        )

        for problem in (local_model_problem(loaded.endpoint), local_tls_problem(loaded.endpoint),
                        local_auth_problem(loaded.endpoint), local_memory_problem(loaded.endpoint)):
            if problem is not None:
                loaded.warnings.append(problem)
        if loaded.endpoint.spec.engine.kind == "builtin":
            from fleetserve.fleet.engine_args import builtin_args_problem
            from fleetserve.spec.errors import SpecProblem

            if (args := builtin_args_problem(loaded.endpoint.spec.engine.args)) is not None:
                path, message = args.split(": ", 1)
                loaded.warnings.append(SpecProblem(path, f"{message}: `fleetserve up` refuses to start"))
    _print_warnings(loaded)
    if as_json:
        print(json.dumps({"valid": True, "format": loaded.source_format,
                          "endpoint": loaded.endpoint.model_dump(mode="json", by_alias=True),
                          "warnings": [str(w) for w in loaded.warnings]}, indent=2))
        return
    e = loaded.endpoint
    out.print("[green]valid[/green] ", end="")
    out.print(f"{loaded.source_format} spec: endpoint {e.metadata.namespace}/{e.metadata.name}, "
              f"model {e.served_model_name} ({e.spec.model.source}), engine {e.spec.engine.kind}, "
              f"{len(e.spec.engine.urls) if e.spec.engine.kind == 'external' else e.spec.replicas} replica(s), "
              f"routing {e.spec.routing.strategy}", markup=False)


@app.command()
def up(
    spec: Annotated[str, typer.Argument(help="Endpoint spec file")],
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return once the fleet is ready")] = False,
    quiet_warnings: Annotated[bool, typer.Option("--quiet-warnings", hidden=True)] = False,
    log_format: Annotated[str | None, typer.Option(help="Router and engine logs: text or json (JSON lines); "
                                                        "default: spec.observability.logFormat")] = None,
    log_prompts: Annotated[bool, typer.Option("--log-prompts", help="Put prompt text in the request lines "
                                              "(default: spec.observability.logPrompts, off)")] = False,
    stop_with: Annotated[int | None, typer.Option("--stop-with", min=1, max=2**31 - 1, metavar="PID",
                                                  help="Stop the fleet when process PID exits (a benchmark or "
                                                       "CI job that owns the fleet, killed or not)")] = None,
) -> None:
    """Start the spec's engine replicas and router on this machine; Ctrl-C stops everything."""
    from fleetserve.fleet.control import FleetError, ensure_not_running, start_detached
    from fleetserve.fleet.supervisor import Supervisor

    loaded = _with_log_options(_load(spec), _check_log_format(log_format), log_prompts)
    log_args = (("--log-format", log_format) if log_format else ()) + (("--log-prompts",) if log_prompts else ())
    if stop_with is not None:
        from fleetserve.fleet.state import pid_alive

        if not pid_alive(stop_with):
            raise typer.BadParameter(f"no running process {stop_with}", param_hint="--stop-with")
        log_args += ("--stop-with", str(stop_with))
    if not quiet_warnings:
        from fleetserve.spec.effects import local_memory_problem

        if (short := local_memory_problem(loaded.endpoint)) is not None:  # as validate warns of it
            loaded.warnings.append(short)
        _print_warnings(loaded)
    name = loaded.endpoint.metadata.name
    from fleetserve.fleet.supervisor import local_start_problem

    if problem := local_start_problem(loaded):  # before a fleet is recorded: it had left a failed one behind
        raise fail(problem, EXIT_USAGE)
    try:
        if detach:
            try:
                with err.status(f"starting fleet {name} ..."), _stopped_by_sigterm_and_sighup():
                    state = start_detached(spec, name, loaded.endpoint.spec.engine.startup_timeout_seconds + 120,
                                           log_args)
            except KeyboardInterrupt:
                err.print(f"start of fleet {name} interrupted: it was stopped", markup=False)
                raise
            _announce(state)
            _startup_warnings(state)
            out.print(f"stop it with: fleetserve down {name}")
            return
        ensure_not_running(name)
        from fleetserve.fleet.control import inherited_fleet_lock, take_fleet_lock

        # held until this process ends (the descriptor stays open): one supervisor per name
        fleet_lock = inherited_fleet_lock() or take_fleet_lock(name)  # noqa: F841
    except FleetError as exc:
        raise fail(str(exc), exc.exit_code) from None
    from fleetserve.fleet.control import DETACHED_ENV, set_aside_last_run
    from fleetserve.fleet.state import fleet_dir

    if not os.environ.get(DETACHED_ENV):  # `up --detach` set them aside before it started this supervisor
        set_aside_last_run(fleet_dir(name))  # in the foreground too: the last run's lines came first in its files

    detached = bool(os.environ.get(DETACHED_ENV))
    lines = _logged_say(loaded.endpoint.spec.observability.log_format) if detached else say

    def ready(state) -> None:
        if detached:  # `up --detach` announces it; its log gets one line in the log's format (plain lines, with no
            # time or level and a "press Ctrl-C" nobody could, had broken a JSON log's readers)
            lines(f"fleet {state.name} ready: {len(state.replicas)} replica(s), routing {state.strategy}, endpoint "
                  f"{state.url}")
            return
        _announce(state)
        out.print("press Ctrl-C to stop")

    code = Supervisor(loaded, spec, say=lines, owner_pid=stop_with).run(on_ready=ready)
    raise typer.Exit(code)


def _logged_say(log_format: str):
    """A detached supervisor's lines (its supervisor.log) with their time, as the router's and engines' lines have
    it, in the fleet's log format: scaling, crash and restart lines had no time, and could not be lined up with
    what the other logs said. Its own warnings (logging) go the same way."""
    import logging

    from fleetserve.observe.logs import configure_logging

    configure_logging(log_format, "supervisor")
    logger = logging.getLogger("fleetserve.supervisor")

    def logged(message: str) -> None:
        level = logging.ERROR if message.startswith("error:") else \
            logging.WARNING if message.startswith("warning:") else logging.INFO
        if level != logging.INFO:  # the level says it: "supervisor WARNING warning: ..." said it twice
            message = message.split(": ", 1)[1]
        logger.log(level, message)

    return logged


@contextlib.contextmanager
def _stopped_by_sigterm_and_sighup():
    """SIGTERM and SIGHUP (a closed terminal) while a detached fleet starts end the wait as Ctrl-C does, so the
    starting fleet is stopped (`start_detached`); Python's default exit had left it starting, unseen. SIGTERM exits
    143 (`Terminated`), SIGHUP 130."""
    def stop(signum, _frame):
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second one does not cut the stop under way
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _check_log_format(value: str | None) -> str | None:
    from fleetserve.observe.logs import LOG_FORMATS

    if value is not None and value not in LOG_FORMATS:
        raise typer.BadParameter(f"{value!r}; allowed values: {', '.join(LOG_FORMATS)}", param_hint="--log-format")
    return value


def _with_log_options(loaded, log_format: str | None, log_prompts: bool):
    """The spec with --log-format / --log-prompts applied to spec.observability (the options win)."""
    from dataclasses import replace

    if log_format is None and not log_prompts:
        return loaded
    e = loaded.endpoint
    update = {"log_format": log_format} if log_format else {}
    if log_prompts:
        update["log_prompts"] = True
    obs = e.spec.observability.model_copy(update=update)
    return replace(loaded, endpoint=e.model_copy(update={"spec": e.spec.model_copy(update={"observability": obs})}))


def _announce(state) -> None:
    out.print(f"fleet [bold]{escape(state.name)}[/bold] ready: {len(state.replicas)} replica(s), "
              f"routing {state.strategy}")
    out.print(f"endpoint: {state.url}", markup=False)
    out.print(f"model: {state.model}", markup=False)
    if state.tls_cert:
        out.print(f"TLS certificate (trust it in clients): {state.tls_cert}", markup=False)
    if state.prometheus_url:
        out.print(f"prometheus: {state.prometheus_url} ({_prometheus_login(state)})", markup=False)


def _startup_warnings(state) -> None:
    """What the detached supervisor said only in its log (a foreground `up` prints its lines as they come)."""
    if state.l2_url and state.l2_status not in ("", "up"):
        err.print(f"[yellow]warning:[/yellow] L2 Redis at {escape(state.l2_url)} is {escape(state.l2_status)}: "
                  "engines serve from L1 and recompute until it answers")
    for tenant, l2 in sorted(state.l2_tenants.items()):
        if l2.get("status") not in ("", "up"):
            err.print(f"[yellow]warning:[/yellow] L2 Redis of tenant {escape(tenant)} at {escape(l2['url'])} is "
                      f"{escape(l2['status'])}: that tenant's requests are served from L1 and recompute until it "
                      "answers")


@app.command()
def status(
    name: Annotated[str | None, typer.Argument(help="Fleet name (default: all)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="A live table, redrawn from the state files")] = False,
    interval: Annotated[float | None, float_option(min=0.1, help="Seconds between redraws (--watch; default 2)")
                        ] = None,
    iterations: Annotated[int | None, typer.Option(min=1, help="Stop after N redraws (--watch; default: Ctrl-C)")
                          ] = None,
    show_all: Annotated[bool, typer.Option("--all", "-a", help="Also the fleets that were stopped (hidden "
                                                                "unless NAME is given)")] = False,
    prune: Annotated[bool, typer.Option("--prune", help="Remove what is kept of fleets whose processes are all "
                                                         "gone (stopped, failed, dead): state and logs")] = False,
) -> None:
    """Show fleets, their replicas and states."""
    from fleetserve.fleet.state import list_fleets, mark_stale, serving_note

    if not watch and (interval is not None or iterations is not None):
        raise typer.BadParameter("redraws only with --watch", param_hint="--interval/--iterations")
    if watch and prune:  # it removed state and logs without a word and watched nothing
        raise typer.BadParameter("one: --prune removes what is kept of stopped fleets, --watch redraws the table",
                                 param_hint="--watch/--prune")
    if watch and as_json:  # the table was drawn and --json dropped without a word
        raise typer.BadParameter("a live table; for JSON run `status --json` again (or poll it)",
                                 param_hint="--watch/--json")
    if prune:
        _prune_fleets(name, as_json)
        return
    if name and not any(f.name == name for f in list_fleets()):  # as `down` and `dashboard open`: exit 2
        known = ", ".join(f.name for f in list_fleets()) or "none"
        raise fail(f"no fleet named {name!r} (known: {known})", 2, path="NAME")
    if watch:
        from fleetserve.cli.status_view import load
        from fleetserve.cli.status_view import watch as watch_fleets

        # the fleets stopped before the watch began stay hidden; one that stops while it runs is shown stopped
        hidden = set() if show_all or name else {f.name for f in load(None) if f.status == "stopped"}
        watch_fleets(name, interval or 2.0, iterations, out,
                     loader=lambda n: [f for f in load(n) if f.name not in hidden])
        return

    # a supervisor that vanished without writing its end: its rows are stale, not ready
    fleets = [mark_stale(f) for f in list_fleets() if name is None or f.name == name]
    # fleets stopped on purpose pile up under ~/.fleetserve/run: listed only when asked for (failed and dead
    # ones stay: they want a look)
    shown = fleets if show_all or name else [f for f in fleets if f.status != "stopped"]
    hidden = len(fleets) - len(shown)
    if as_json:
        print(json.dumps([{**f.to_json(), "serving": serving_note(f)} for f in shown], indent=2))
        return
    if not shown:
        out.print("no fleets running" + _hidden_note(hidden), markup=False)
        return
    for f in shown:
        _print_fleet(f)
    if hidden:
        out.print(_hidden_note(hidden).strip(), markup=False)




def _hidden_note(hidden: int) -> str:
    if not hidden:
        return ""
    return f" ({hidden} stopped fleet(s) not shown: --all lists them, --prune removes them)"


def _prune_fleets(name: str | None, as_json: bool = False) -> None:
    """Remove the run folders of fleets that stopped, failed or died; a dead supervisor's live leftovers are
    `down`'s to stop first (a recorded pid of a cleanly stopped fleet may belong to another process by now)."""
    import shutil

    from fleetserve.fleet.control import is_ours
    from fleetserve.fleet.state import fleet_dir, list_fleets, mark_stale, pid_alive, supervisor_alive

    fleets = [mark_stale(f) for f in list_fleets() if name is None or f.name == name]
    if name and not fleets:
        raise fail(f"no fleet named {name!r} (known: {', '.join(f.name for f in list_fleets()) or 'none'})", 2)
    removed, kept = [], []
    for f in fleets:
        children = [f.router_pid, f.redis_pid, f.prometheus_pid, *(r.pid for r in f.replicas)]
        # ours only: a recorded pid may belong to another process by now
        alive = supervisor_alive(f) or any(p and pid_alive(p) and is_ours(p, f) for p in children)
        if f.status not in ("stopped", "failed", "dead"):
            kept.append({"name": f.name, "status": f.status, "why": "running"})
        elif f.status == "dead" and alive:  # a clean stop ended them all
            kept.append({"name": f.name, "status": f.status,
                         "why": f"processes still alive: `fleetserve down {f.name}` stops them"})
        else:
            shutil.rmtree(fleet_dir(f.name), ignore_errors=True)
            removed.append(f.name)
    if as_json:  # --json had printed the sentence
        print(json.dumps({"removed": removed, "kept": kept}, indent=2))
        return
    out.print(f"removed {len(removed)} fleet(s)" + (": " + ", ".join(removed) if removed else ""), markup=False)
    if kept:
        out.print("kept: " + "; ".join(f"{k['name']} ({k['status']}"
                                       + (f", {k['why']})" if k["why"] != "running" else ")") for k in kept),
                  markup=False)


def _prometheus_login(state) -> str:
    """How to sign in to the fleet's Prometheus (basic auth: its series name the tenants)."""
    from fleetserve.fleet.prometheus import PASSWORD_FILE, USER
    from fleetserve.fleet.state import fleet_dir

    return f"user {USER}, password in {fleet_dir(state.name) / PASSWORD_FILE}"


def _print_fleet(f) -> None:
    from fleetserve.fleet.state import serving_note

    note = serving_note(f)
    out.print(f"[bold]{escape(f.name)}[/bold] ({f.namespace}) {f.status}{escape(f' ({note})' if note else '')} "
              f"{escape(f.url)} "
              f"model {escape(f.model)} routing {f.strategy}")
    gone = f.status in ("stopped", "failed", "dead")  # its processes are gone: nothing below is listening
    cost = f"it cost ${f.cost_total:.4f} in all" if gone else \
        f"cost ${f.cost_per_hour:.3f}/h, ${f.cost_total:.4f} so far"  # a stopped fleet bills nothing more
    out.print(f"  replicas: desired {f.desired}, ready {f.ready}; {cost}", markup=False)
    if f.prometheus_url:
        out.print(f"  prometheus: {f.prometheus_url}" + (f" (was; the fleet is {f.status})" if gone else
                                                          f" ({_prometheus_login(f)})"), markup=False)
    if f.l2_url:
        out.print(f"  l2: {f.l2_url} {f.l2_status or 'unknown'}" + (f" (was; the fleet is {f.status})" if gone else ""),
                  markup=False)
    if f.service_restarts:
        out.print("  restarted: " + ", ".join(f"{service} {count} time(s)" for service, count
                                              in sorted(f.service_restarts.items())), markup=False)
    for tenant, l2 in sorted(f.l2_tenants.items()):
        out.print(f"  l2 of tenant {tenant}: {l2['url']} {l2.get('status') or 'unknown'}"
                  + (f" (was; the fleet is {f.status})" if gone else ""), markup=False)
    if f.alerts and not gone:
        out.print(f"  alerts firing: {', '.join(f.alerts)} (its Prometheus: /api/v1/alerts)", markup=False)
    if f.last_decision:
        out.print(f"  last decision{' (before it stopped)' if gone else ''}: {f.last_decision['desired']} "
                  f"replica(s): {f.last_decision['reason']}", markup=False)
    if f.error:
        out.print(f"  error: {f.error}", markup=False)
    from fleetserve.fleet.state import fleet_dir

    out.print(f"  logs: {fleet_dir(f.name) / 'logs'}" + (f" (supervisor: {fleet_dir(f.name) / 'supervisor.log'})"
              if (fleet_dir(f.name) / "supervisor.log").exists() else ""), markup=False)
    if f.status == "dead":  # it read "dead" with no word of what to do
        out.print(f"  the supervisor is gone (killed, or the machine restarted): `fleetserve down {f.name}` stops "
                  "what it left running; `fleetserve up SPEC` starts the fleet again", markup=False)
    table = Table("replica", Column("url", overflow="fold"), "state", "node", "pid", "restarts", "cold start")
    for r in f.replicas:
        cold = f"{r.cold_start_s:.1f}s" if r.cold_start_s is not None else "-"
        state = f"{r.state} (router: {r.router_why or 'failing health checks'})" if r.router_healthy is False \
            else r.state
        table.add_row(r.id, r.url, state, f"{r.node} {r.instance_type}".strip(), str(r.pid or "-"),
                      str(r.restarts), cold)
    out.print(table)  # piped: as wide as it needs (cli/console.py); on a terminal a URL folds, never cut to "…"
    if f.nodes:
        nodes = Table("node", "instance type", "capacity", "$/h", "replicas", "ready")
        for n in f.nodes:
            ready = "gone" if gone else \
                ("yes" if n.ready else "provisioning") + (" (interrupting)" if n.interrupting else "")
            nodes.add_row(n.id, n.instance_type, n.capacity_type, f"{n.price_per_hour:.3f}", f"{n.used}/{n.slots}",
                          ready)
        out.print(nodes)


@app.command()
def down(
    name: Annotated[str | None, typer.Argument(help="Fleet name (default: the only running one)")] = None,
) -> None:
    """Stop a detached fleet and all its processes."""
    from fleetserve.fleet.control import FleetError, pick_fleet, stop_fleet, stop_wait_s

    try:
        state = pick_fleet(name)
    except FleetError as exc:
        if exc.stopped is not None:  # `down` twice is done, not a failure (it exited 1, as `docker stop` does not)
            out.print(f"fleet {exc.stopped.name} is not running ({exc.stopped.status} already)" if name else str(exc),
                      markup=False)
            return
        raise fail(str(exc), exc.exit_code) from None
    with err.status(f"stopping fleet {state.name}: requests under way may finish (up to {stop_wait_s(state):.0f} s)"):
        stop_fleet(state)
    out.print(f"fleet {state.name} stopped" + (" (its supervisor had died; leftovers cleaned)"
                                               if state.status == "dead" else ""))


#: `fleetserve engine` options of the model engine that the simulated one has no use for, and the reverse
MODEL_ENGINE_ONLY = ("engine_cache_bytes", "l1_bytes", "l2_url", "l2_password_file", "l2_tenant", "max_batch",
                     "prefill_chunk", "threads", "dtype", "max_tokens_default", "max_waiting", "revision",
                     "orphan_drain", "kv_cache", "stream_keepalive")
SIMULATED_ONLY = ("cache_blocks", "speedup")


def _given(ctx: typer.Context, names: tuple[str, ...]) -> list[str]:
    """The options among `names` the user gave on the command line, as flags."""
    def set_by_user(name: str) -> bool:  # by its name: typer's click is not always the `click` package; on the
        # command line only (an exported $FLEETSERVE_L2_URL had stopped every simulated engine of that shell)
        source = ctx.get_parameter_source(name)
        return source is not None and source.name == "COMMANDLINE"

    given = [n for n in names if set_by_user(n)]
    return ["--" + n.replace("_", "-") if n != "kv_cache" else "--no-kv-cache" for n in given]


@app.command()
def engine(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Model directory or source (builtin:NAME, hf:org/name, path)")
                     ] = None,
    simulate: Annotated[str | None, typer.Option(help="Run a simulated engine with this performance profile "
                                                      "(fast, a10g-8b, h100-8b) instead of a model")] = None,
    cache_blocks: Annotated[int | None, typer.Option(min=1, help="Simulated KV capacity in blocks")] = None,
    block_size: Annotated[int | None, typer.Option(min=1, help="KV block size in tokens (default 256)")] = None,
    kv_cache: Annotated[bool, typer.Option(help="Prefix KV cache (reuse computed prefixes)")] = True,
    engine_cache_bytes: Annotated[int, typer.Option(min=1, help="Bytes of KV blocks kept ready in the engine")
                                  ] = 512 << 20,
    l1_bytes: Annotated[int, typer.Option(min=0, help="L1 tier: CPU bytes for offloaded blocks (0: off)")] = 0,
    l2_url: Annotated[str | None, typer.Option(envvar="FLEETSERVE_L2_URL", show_envvar=False,
                                               help="L2 tier: redis://host:port/db (none: off; a URL with a password "
                                                    "may come in $FLEETSERVE_L2_URL, off the command line)")] = None,
    l2_password_file: Annotated[str | None, typer.Option(help="File with the L2 Redis password (AUTH)")] = None,
    l2_tenant: Annotated[list[str] | None, typer.Option(envvar="FLEETSERVE_L2_TENANTS", show_envvar=False,
                                                        help="TENANT=redis://... : a tenant's own L2 (repeat; or "
                                                             "$FLEETSERVE_L2_TENANTS, space-separated)")] = None,
    max_batch: Annotated[int, typer.Option(min=1, max=256, help="Sequences decoded together (1: serial)")] = 8,
    prefill_chunk: Annotated[int, typer.Option(min=16, help="Prompt tokens per prefill step")] = 256,
    speedup: Annotated[float, float_option(min=0.001, help="Simulated engine runs this many times faster")] = 1.0,
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    served_model_name: Annotated[str | None, typer.Option(help="Name clients use (default: directory name)")] = None,
    model_version: Annotated[str, typer.Option()] = "1",
    namespace: Annotated[str, typer.Option()] = "default",
    instance_type: Annotated[str, typer.Option()] = "local",
    replica: Annotated[str, typer.Option(help="Replica id for metric labels")] = "r0",
    threads: Annotated[int | None, typer.Option(min=1, max=MAX_THREADS, help="torch threads")] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16")] = "auto",
    context_length: Annotated[int | None, typer.Option(min=1)] = None,
    max_tokens_default: Annotated[int, typer.Option(
        min=1, help="max_tokens when a chat request gives none (a completion: 16, as OpenAI and vLLM)")] = 512,
    max_waiting: Annotated[int, typer.Option(min=1, help="Queue bound; beyond it requests get 503")] = 256,
    revision: Annotated[str | None, typer.Option()] = None,
    internal_token_file: Annotated[str | None, typer.Option(
        help="File with the fleet's internal token: only callers that send it may name a tenant or use "
             "the admin API (without it: no tenants, no admin API)")] = None,
    max_body_bytes: Annotated[int, typer.Option(min=1024, help="Larger request bodies get 413")] = 4 << 20,
    max_header_bytes: Annotated[int, typer.Option(min=1024, help="Larger request headers get 431")] = 64 << 10,
    log_format: Annotated[str, typer.Option(help="text, or json (JSON lines: one per request)")] = "text",
    log_prompts: Annotated[bool, typer.Option("--log-prompts", help="Put prompt text in the request lines")
                           ] = False,
    drain_timeout: Annotated[float, float_option(min=0, help="Seconds in-flight requests may run on after SIGTERM "
                                                        "(Kubernetes passes engine.drainTimeoutSeconds)")] = 5.0,
    orphan_drain: Annotated[float | None, float_option(
        min=0, max=86400, help="Seconds in-flight requests may run on after SIGUSR1, which `fleetserve up` has the "
                               "kernel send when the fleet's supervisor dies (default: SIGUSR1 is not handled)")
                            ] = None,
    stream_keepalive: Annotated[float, float_option(
        min=0, max=3600, help="Seconds a stream whose text is held back (incomplete UTF-8, a possible stop string) "
                              "may go without a chunk before an SSE comment goes out (0: at every such token): "
                              "under the router's stream idle timeout (`up` passes a third of the shorter of "
                              "router.streamIdleTimeoutSeconds and upstreamTimeoutSeconds, at most 15)")
                            ] = 15.0,
) -> None:
    """Run the built-in engine: an OpenAI-compatible server for one model replica (or a simulated one)."""
    _check_log_format(log_format)
    from dataclasses import replace

    from fleetserve.api.internal import read_secret_file
    from fleetserve.engine.demo import ModelSourceError
    from fleetserve.engine.main import run_engine

    _token(internal_token_file, "--internal-token-file")  # before the model loads; a traceback before
    if l2_password_file:
        try:
            read_secret_file(l2_password_file)
        except (OSError, ValueError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--l2-password-file") from None
    unused = _given(ctx, MODEL_ENGINE_ONLY if simulate is not None else SIMULATED_ONLY)
    if unused:  # they had been ignored without a word: a queue-full test against a simulated engine tested nothing
        which = "the simulated engine (--simulate)" if simulate is not None else "a model engine (--model)"
        raise typer.BadParameter(f"{', '.join(unused)}: not used by {which}", param_hint=unused[0])
    if simulate is not None:
        from fleetserve.engine.simulated import run_simulated_engine
        from fleetserve.sim.perf import profile

        try:
            perf = profile(simulate)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--simulate") from None
        perf = replace(perf.scaled(speedup), cache_blocks=cache_blocks or perf.cache_blocks,
                       block_size=block_size or perf.block_size)
        from fleetserve.api.internal import read_token_file
        from fleetserve.api.limits import SizeLimits
        from fleetserve.observe.metrics import ModelIdentity

        token = read_token_file(internal_token_file) if internal_token_file else None
        run_simulated_engine(perf, host, port, served_model_name or f"sim-{simulate}", token,
                             SizeLimits(max_body_bytes, max_header_bytes), log_format=log_format,
                             identity=ModelIdentity(namespace, served_model_name or f"sim-{simulate}", model_version,
                                                    instance_type, replica), log_prompts=log_prompts,
                             drain_timeout=drain_timeout, **({"context_length": context_length} if context_length
                                                             else {}))
        return
    if model is None:
        raise typer.BadParameter("give --model (a model source) or --simulate (a performance profile)",
                                 param_hint="--model")
    from fleetserve.spec.endpoint import redis_url_problem, tenant_name_problem

    try:
        if l2_url is not None:
            redis_url_problem(l2_url)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--l2-url") from None
    tenant_l2 = {}
    for item in l2_tenant or []:
        tenant, sep, url = item.partition("=")
        try:
            if not tenant or not sep:
                raise ValueError("expected TENANT=URL")
            tenant_name_problem(tenant)
            redis_url_problem(url)
        except ValueError as exc:
            raise typer.BadParameter(f"{item!r}: {exc}", param_hint="--l2-tenant") from None
        if tenant in tenant_l2 and tenant_l2[tenant] != url:  # the last one had won without a word
            raise typer.BadParameter(f"tenant {tenant!r} is given twice ({tenant_l2[tenant]} and {url})",
                                     param_hint="--l2-tenant")
        tenant_l2[tenant] = url
    if not kv_cache and (l1_bytes or l2_url or tenant_l2):  # the tiers were ignored without a word; not refused:
        # a fleet's engine.args may add --no-kv-cache to the tiers its kvCache section gives
        err.print("[yellow]warning:[/yellow] --no-kv-cache turns the prefix cache off: --l1-bytes, --l2-url and "
                  "--l2-tenant do nothing")
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise typer.BadParameter(f"{dtype!r}; allowed values: auto, float32, bfloat16, float16", param_hint="--dtype")
    try:
        run_engine(model=model, host=host, port=port, served_model_name=served_model_name,
                   model_version=model_version, namespace=namespace, instance_type=instance_type, replica=replica,
                   threads=threads, dtype=dtype, context_length=context_length,
                   max_tokens_default=max_tokens_default, max_waiting=max_waiting, revision=revision,
                   block_size=block_size or 256, kv_cache=kv_cache, engine_cache_bytes=engine_cache_bytes,
                   l1_bytes=l1_bytes, l2_url=l2_url, max_batch=max_batch, prefill_chunk=prefill_chunk,
                   tenant_l2=tenant_l2, internal_token_file=internal_token_file, max_body_bytes=max_body_bytes,
                   max_header_bytes=max_header_bytes, l2_password_file=l2_password_file, log_format=log_format,
                   log_prompts=log_prompts, drain_timeout=drain_timeout, orphan_drain=orphan_drain,
                   stream_keepalive=stream_keepalive)
    except ModelSourceError as exc:
        raise fail(f"--model: {exc}", EXIT_USAGE) from None


def _token(path: str | None, flag: str) -> str | None:
    """A token file's secret, or exit 2 naming the flag."""
    if not path:
        return None
    from fleetserve.api.internal import read_token_file

    try:
        return read_token_file(path)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None


@app.command()
def router(
    backend: Annotated[list[str], typer.Option(help="Backend base URL (repeat for each replica)")] = None,
    backend_dns: Annotated[list[str] | None, typer.Option(
        help="HOST:PORT whose addresses are the replicas, resolved every few seconds (a Kubernetes headless "
             "Service); repeatable")] = None,
    failing_file: Annotated[str | None, typer.Option(
        help="A file holding why no replica can start (empty: nothing stops them), re-read every health round: "
             "while it names a reason, requests that would wait for a replica are refused 503 replicas_failing "
             "(on Kubernetes the operator writes it)")] = None,
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8080,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    strategy: Annotated[str, typer.Option(help="Routing strategy")] = "leastload",
    health_path: Annotated[str, typer.Option()] = "/health",
    max_attempts: Annotated[int, typer.Option(min=1, help="Replicas tried before the first byte")] = 3,
    health_interval: Annotated[float, float_option(min=0.05, help="Seconds between health probes")] = 1.0,
    buffer_size: Annotated[int, typer.Option(min=0, help="Requests held while no replica is ready")] = 256,
    buffer_timeout: Annotated[float, float_option(min=0.1, help="Seconds a held request waits")] = 600.0,
    upstream_timeout: Annotated[float, float_option(
        min=0.1, max=86400, help="Seconds a replica may stay silent (a non-streamed answer: its whole generation) "
                                 "before the request is answered 504")] = 1800.0,
    stream_idle_timeout: Annotated[float, float_option(
        min=0.1, max=86400, help="Seconds a replica may stay silent once its answer began (between two chunks of "
                                 "a stream) before the router ends it with an error (at most --upstream-timeout)")
                                   ] = 60.0,
    client_send_timeout: Annotated[float, float_option(
        min=0.1, max=86400, help="Seconds a client may take no byte of its answer (its socket full) before the "
                                 "router cuts the connection and ends the request as the client's (499)")] = SEND_S,
    max_connections: Annotated[int | None, typer.Option(
        min=16, help="Client connections each router process holds; past it a new one gets 503 and a close "
                     "[default: 10000, at most the process's file descriptors less 1024]")] = None,
    session_key: Annotated[str | None, typer.Option(help="Header or body key for session routing")] = None,
    max_concurrent_per_replica: Annotated[int | None, typer.Option(min=1, help="Requests in flight per replica")
                                          ] = None,
    max_queue: Annotated[int | None, typer.Option(min=0, help="Requests waiting for a slot; beyond: overflow")
                         ] = None,
    overflow_status: Annotated[int, typer.Option(min=400, max=599, help="Status when the queue is full")] = 429,
    unhealthy_after: Annotated[int, typer.Option(min=1, help="Failed probes before a backend is out")] = 2,
    healthy_after: Annotated[int, typer.Option(min=1, help="Good probes before it is back")] = 1,
    auth_file: Annotated[str | None, typer.Option(help="JSON {keys: {sha256-of-key: tenant}}; enables auth")
                         ] = None,
    tls_cert: Annotated[str | None, typer.Option(help="PEM certificate (with --tls-key)")] = None,
    tls_key: Annotated[str | None, typer.Option(help="PEM private key")] = None,
    tls_self_signed: Annotated[str | None, typer.Option(help="Folder for a self-signed certificate, made once")
                               ] = None,
    internal_token_file: Annotated[str | None, typer.Option(
        help="File with the token the engines trust (the same file as theirs); needed with --auth-file")] = None,
    send_internal_token: Annotated[bool, typer.Option(
        "--send-internal-token/--no-send-internal-token",
        help="Send the internal token to the backends (off for engines outside the fleet: the token also opens "
             "this router's admin API)")] = True,
    engine_token_file: Annotated[str | None, typer.Option(
        help="File with the API key the engines require (vLLM, SGLang --api-key): sent instead of the internal "
             "token")] = None,
    tenant_cache_salt: Annotated[bool, typer.Option(
        "--tenant-cache-salt", help="Write each tenant's cache_salt into its requests, keyed with the internal "
                                    "token (vLLM and SGLang backends, which ignore the tenant header)")] = False,
    max_body_bytes: Annotated[int, typer.Option(min=1024, help="Larger request bodies get 413")] = 4 << 20,
    max_header_bytes: Annotated[int, typer.Option(min=1024, help="Larger request headers get 431")] = 64 << 10,
    log_format: Annotated[str, typer.Option(help="text, or json (JSON lines: one per request)")] = "text",
    log_prompts: Annotated[bool, typer.Option("--log-prompts", help="Put prompt text in the request lines")
                           ] = False,
    access_log: Annotated[bool, typer.Option("--access-log/--no-access-log",
                                             help="One log line per request")] = True,
    workers: Annotated[int, typer.Option(min=1, max=256, help="Processes serving the port (SO_REUSEPORT); one per "
                                                              "core the router may use")] = 1,
    model_metrics: Annotated[bool, typer.Option(
        "--model-metrics", help="Export HyperPod's model_* invocation metrics per replica (engines that do not "
                                "export them: vLLM, SGLang), labelled with the four options below")] = False,
    model_metrics_scope: Annotated[str, typer.Option(
        help="--model-metrics: all (per replica, for engines that export none) or router (only the errors the "
             "router produces itself, beside engines that count the rest: the built-in one)")] = "all",
    namespace: Annotated[str, typer.Option(help="--model-metrics: the namespace label")] = "default",
    served_model_name: Annotated[str | None, typer.Option(help="--model-metrics: the model_name label")] = None,
    model_version: Annotated[str, typer.Option(help="--model-metrics: the model_version label")] = "1",
    instance_type: Annotated[str, typer.Option(help="--model-metrics: the instance_type label")] = "local",
    queue_metrics: Annotated[str | None, typer.Option(
        help="Read the engines' queue from their /metrics gauges for /admin/load (the autoscaler's signal): vllm "
             "or sglang, engines that put none in their health body")] = None,
    model: Annotated[list[str] | None, typer.Option(
        "--model", help="A model name the replicas serve (repeat): while none is ready the router answers "
                        "/v1/models itself and refuses other names (404), instead of holding them (which wakes a "
                        "fleet at zero)")] = None,
    invocation_path: Annotated[str | None, typer.Option(
        help="The path the replicas serve chat and completions on, when not OpenAI's (a SageMaker-style "
             "container's /invocations, which reads the body's shape)")] = None,
    check_bodies: Annotated[bool, typer.Option(
        "--check-bodies", help="The replicas are fleetserve's built-in engines: while none is ready, answer a body "
                               "they would refuse 400 at once (it had waited for a cold start, or got a 503)")] = False,
    model_cards_file: Annotated[str | None, typer.Option(
        help="Keep the model cards a replica gave in this file (read at start, written when learnt): a router "
             "restarted at zero answers with them (max_model_len) and refuses what no context holds")] = None,
    drain_timeout: Annotated[float, float_option(min=0, help="Seconds requests under way may run on after SIGTERM "
                                                        "(Kubernetes passes the smaller of router.bufferTimeoutSeconds"
                                                        " and engine.drainTimeoutSeconds)")] = 5.0,
) -> None:
    """Run the OpenAI-compatible gateway in front of engine replicas."""
    _check_log_format(log_format)
    from fleetserve.api.limits import SizeLimits
    from fleetserve.router.engine_queue import QUEUE_GAUGES
    from fleetserve.router.policies import registered_policies
    from fleetserve.router.server import RouterSettings, run_router

    if strategy not in registered_policies():
        raise typer.BadParameter(f"{strategy!r}; allowed values: {', '.join(registered_policies())}",
                                 param_hint="--strategy")
    if queue_metrics is not None and queue_metrics not in QUEUE_GAUGES:
        raise typer.BadParameter(f"{queue_metrics!r}; allowed values: {', '.join(QUEUE_GAUGES)}",
                                 param_hint="--queue-metrics")
    from fleetserve.router.upstream import backend_url_problem

    for url in backend or []:
        if (problem := backend_url_problem(url)) is not None:
            raise typer.BadParameter(problem, param_hint="--backend")
    if not health_path.startswith("/"):  # it was glued to the port: http://h:8000health
        raise typer.BadParameter(f"{health_path!r}: a path, starting with /", param_hint="--health-path")
    if invocation_path is not None:
        from fleetserve.spec.endpoint import invocation_path_problem

        problem = invocation_path_problem(invocation_path)
        if problem:
            raise typer.BadParameter(problem, param_hint="--invocation-path")
    from fleetserve.router.discovery import DnsBackends

    try:
        dns = tuple(DnsBackends.parse(value) for value in backend_dns or [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--backend-dns") from None
    from fleetserve.router.auth import KeyRing

    keyring = None
    if auth_file:
        try:
            keyring = KeyRing.from_file(auth_file)
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
            raise typer.BadParameter(f"cannot read API keys from {auth_file}: {exc}",
                                     param_hint="--auth-file") from None
    internal_token = _token(internal_token_file, "--internal-token-file")
    if internal_token is None and keyring is not None:
        raise typer.BadParameter("API keys make tenants, and engines accept a tenant only from a router that sends "
                                 "their internal token: give the same --internal-token-file to the router and the "
                                 "engines", param_hint="--internal-token-file")
    engine_token = _token(engine_token_file, "--engine-token-file")
    if tenant_cache_salt and not internal_token:
        raise typer.BadParameter("tenant cache salts are keyed with the fleet's internal token: give "
                                 "--internal-token-file", param_hint="--tenant-cache-salt")
    if bool(tls_cert) != bool(tls_key):
        raise typer.BadParameter("give both --tls-cert and --tls-key", param_hint="--tls-cert/--tls-key")
    if tls_self_signed and tls_cert:  # the self-signed folder was ignored without a word
        raise typer.BadParameter("give either --tls-self-signed or --tls-cert/--tls-key, not both",
                                 param_hint="--tls-self-signed")
    from fleetserve.router.tls import TLSFileError, certificate_hosts, check_tls_files, ensure_self_signed

    tls = (tls_cert, tls_key) if tls_cert else None
    try:
        if tls_self_signed and not tls:
            from pathlib import Path

            cert, key = ensure_self_signed(Path(tls_self_signed), certificate_hosts(host))
            tls = (str(cert), str(key))
        # before the backends are probed and the workers forked: a bad pair was found at the first handshake
        # setup, as a traceback, and each worker failed on it again for ever
        expiring = check_tls_files(*tls) if tls else None
    except (TLSFileError, OSError) as exc:
        flag = "--tls-self-signed" if tls_self_signed and not tls_cert else "--tls-cert/--tls-key"
        raise typer.BadParameter(str(exc), param_hint=flag) from None
    if expiring:
        err.print(f"warning: {expiring}", markup=False)
    from fleetserve.fleet.process import bind_refusal

    # bound here without SO_REUSEPORT: a second router with --workers had shared the port with the first one
    field, problem = bind_refusal(host, port)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint=f"--{field}")
    identity = None
    from fleetserve.router.model_metrics import SCOPES

    if model_metrics_scope not in SCOPES:
        raise typer.BadParameter(f"{model_metrics_scope!r}; allowed values: {', '.join(SCOPES)}",
                                 param_hint="--model-metrics-scope")
    if model_metrics:
        if not served_model_name:
            raise typer.BadParameter("the model_name label of the model_* series: give the served model's name",
                                     param_hint="--served-model-name")
        from fleetserve.observe.metrics import ModelIdentity

        identity = ModelIdentity(namespace, served_model_name, model_version, instance_type, "")
    settings = RouterSettings(strategy=strategy, max_attempts=max_attempts, health_interval=health_interval,
                              keyring=keyring,
                              buffer_size=buffer_size, buffer_timeout=buffer_timeout, session_key=session_key,
                              upstream_read_timeout=upstream_timeout, stream_idle_timeout=stream_idle_timeout,
                              client_send_timeout=client_send_timeout, max_connections=max_connections,
                              max_concurrent_per_replica=max_concurrent_per_replica, max_queue=max_queue,
                              overflow_status=overflow_status,
                              admin_token=os.environ.get("FLEETSERVE_ADMIN_TOKEN") or None,
                              internal_token=internal_token, send_internal_token=send_internal_token,
                              engine_token=engine_token,
                              tenant_cache_salt=tenant_cache_salt, backend_dns=dns, failing_file=failing_file,
                              size_limits=SizeLimits(max_body_bytes, max_header_bytes), log_prompts=log_prompts,
                              access_log=access_log, model_identity=identity, queue_metrics=queue_metrics,
                              model_metrics_scope=model_metrics_scope,
                              served_models=tuple(dict.fromkeys(model or ())), invocation_path=invocation_path,
                              check_bodies=check_bodies, model_cards_file=model_cards_file)
    if workers > 1 and (max_concurrent_per_replica or max_queue is not None):
        from fleetserve.spec.effects import limits_split

        err.print(f"warning: --max-concurrent-per-replica / --max-queue with --workers {workers}: "
                  f"{limits_split(workers)}", markup=False)
    run_router(list(backend or []), host, port, settings, health_path, unhealthy_after, healthy_after, tls,
               log_format=log_format, workers=workers, grace_s=drain_timeout)


@models_app.command("list")
def models_list(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False) -> None:
    """List the catalog's presets: source, engine, context length, instance types."""
    from dataclasses import asdict

    from fleetserve.engine.catalog import CATALOG

    if as_json:  # max_context: the model's own maximum (the field's 0, "same as the context", read as that)
        print(json.dumps([{**asdict(p), "max_context": p.model_maximum} for p in CATALOG.values()], indent=2))
        return
    # nothing is cut with an ellipsis (at 80 columns, or in a pipe, the 8B and 70B names read the same): long
    # cells fold, and the name, what catalog:NAME needs, keeps one line
    table = Table(Column("name", no_wrap=True, min_width=max(len(n) for n in CATALOG)),
                  *(Column(h, overflow="fold") for h in ("source", "engine", "context", "gpus", "instance types",
                                                         "license")))
    for p in CATALOG.values():
        table.add_row(p.name, p.source, p.engine, str(p.context_length), str(p.gpus), ", ".join(p.instance_types),
                      p.license)
    from rich.measure import Measurement

    if out.is_terminal:
        out.print(table)
        return
    wide = Measurement.get(out, out.options.update(max_width=1000), table).maximum  # in a pipe: whole lines
    Console(highlight=False, width=max(out.width, wide)).print(table)


@model_app.command("prepare")
def model_prepare(
    source: Annotated[str, typer.Argument(help="builtin:NAME, hf:org/name, s3://bucket/prefix, catalog:NAME "
                                                "or a local path")],
    revision: Annotated[str | None, typer.Option()] = None,
    region: Annotated[str | None, typer.Option(help="S3 region")] = None,
    download: Annotated[bool, typer.Option("--download", help="hf: sources missing from the local cache are "
                                                              "downloaded from the Hub (HF_TOKEN)")] = False,
) -> None:
    """Resolve a model source to a local directory (importing or fetching it once); prints the path."""
    from fleetserve.engine.demo import ModelSourceError
    from fleetserve.engine.sources import resolve_source

    given = source.removeprefix("catalog:")
    for flag, value, applies in (("--revision", revision, "hf:"), ("--region", region, "s3://")):
        if value is not None and not given.startswith(applies) and not source.startswith("catalog:"):
            err.print(f"warning: {flag} applies to {applies} sources; ignored for {source}", markup=False)
    try:
        print(resolve_source(source, revision, region, progress=sys.stderr.isatty(), download=download))
    except ModelSourceError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    except OSError as exc:  # FLEETSERVE_HOME a file, a path too long for the file system, a disk full
        raise fail(f"{source}: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else ""),
                    EXIT_USAGE) from None
    except Exception as exc:  # the S3 client's own errors: no credentials, an endpoint it cannot reach
        if type(exc).__module__.split(".")[0] not in ("botocore", "boto3"):
            raise
        raise fail(f"{source}: {exc}", EXIT_USAGE) from None


@model_app.command("tiny")
def model_tiny(
    path: Annotated[str, typer.Argument(help="Directory to write the model to")],
    # bounded: a test model (65,536 hidden or 100,000 layers had tried to allocate ~100 GB, a traceback)
    hidden_size: Annotated[int, typer.Option(min=8, max=8192)] = 64,
    layers: Annotated[int, typer.Option(min=1, max=128)] = 2,
    heads: Annotated[int, typer.Option(min=1, max=256)] = 4,
    kv_heads: Annotated[int, typer.Option(min=1, max=256)] = 2,
    context_length: Annotated[int, typer.Option(min=16, max=1 << 20)] = 2048,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    force: Annotated[bool, typer.Option("--force", help="Write into a folder that is not empty (its config, "
                                        "weights and tokenizer files are replaced)")] = False,
) -> None:
    """Create a tiny random-initialised Llama with a byte-level tokenizer (for tests)."""
    from fleetserve.engine.tiny import create_tiny_model

    if hidden_size % heads or heads % kv_heads:
        raise typer.BadParameter("hidden-size must be a multiple of heads, heads a multiple of kv-heads",
                                 param_hint="--hidden-size/--heads/--kv-heads")
    if (hidden_size // heads) % 2:  # rotary embeddings rotate pairs: an odd head size made a model that crashed
        raise typer.BadParameter(f"hidden-size / heads is {hidden_size // heads}, an odd head size (rotary "
                                 "embeddings need an even one)", param_hint="--hidden-size/--heads")
    from pathlib import Path

    from fleetserve.cli.checks import writable_folder

    writable_folder(path, "PATH")
    if not force and any(Path(path).iterdir()):  # a real model's folder had its config.json replaced without a word
        raise typer.BadParameter(f"{path} is not empty; give a new folder, or --force to write over what it holds",
                                 param_hint="PATH")
    print(create_tiny_model(path, hidden_size=hidden_size, layers=layers, heads=heads, kv_heads=kv_heads,
                            context_length=context_length, seed=seed))


from fleetserve.cli import analyze_commands  # noqa: E402  (analyze, profile, trace)

analyze_commands.register(app)

from fleetserve.cli import render_commands  # noqa: E402  (render k8s)

render_commands.register(app)

from fleetserve.cli import sim_commands  # noqa: E402  (simulate, verify, plan, bench sim-speed)

sim_commands.register(app, bench_app)

from fleetserve.cli import dashboard_commands  # noqa: E402  (dashboard grafana, dashboard open)

dashboard_commands.register(app)


docs_app = typer.Typer(help="Generated documentation.", no_args_is_help=True)
app.add_typer(docs_app, name="docs")


@docs_app.command("metrics")
def docs_metrics(
    output: Annotated[str | None, typer.Option("--output", "-o", help="Write here (default: print)")] = None,
) -> None:
    """Every metric's name, type, unit, labels and help, from the one vocabulary (docs/metrics.md)."""
    from fleetserve.observe.docs import render_metrics_md

    if output is None:
        print(render_metrics_md(), end="")
        return
    unwritten = write_output(output, render_metrics_md(), "--output")
    if unwritten:
        raise output_failed(unwritten)
    say(f"wrote {output}")


def _show_click_error(exc) -> None:
    """A usage error as typer prints it (a usage line and a panel), or as click does without rich."""
    try:
        from typer.rich_utils import rich_format_error
    except ImportError:
        exc.show()
        return
    rich_format_error(exc)


def main() -> None:
    from fleetserve.engine.paths import pin_home

    # click's (typer vendors its own copy): the base of the usage errors it raises while parsing
    click_exception = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        pin_home()
        try:  # click's own handling, but for usage errors, which a command run with --json also prints as JSON
            code = app(standalone_mode=False)
        except click_exception as exc:
            usage_error_json(exc)
            _show_click_error(exc)
            sys.exit(exc.exit_code)
        except typer.Abort:
            err.print("Aborted!")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
    except KeyboardInterrupt:
        sys.exit(143 if Terminated.raised else 130)
    except OSError as exc:  # FLEETSERVE_HOME a file, missing, or not writable: a traceback had said it
        from pathlib import Path

        from fleetserve.engine.paths import home

        where = home()
        usable = where.is_dir() and os.access(where, os.W_OK | os.X_OK)
        if usable or exc.filename is None or not Path(str(exc.filename)).is_relative_to(where):
            raise  # the home itself is fine: another error (a full disk, a file of a cached model) says itself
        fail(f"FLEETSERVE_HOME ({where}) cannot be used: {exc.strerror or exc} ({exc.filename}); point it at a "
             "folder this user can write, or leave it unset (~/.cache/fleetserve)")
        sys.exit(EXIT_USAGE)
    except SystemExit as exc:
        if exc.code == 130 and Terminated.raised:  # typer's exit for a KeyboardInterrupt: this one was SIGTERM
            sys.exit(143)
        raise


if __name__ == "__main__":
    main()
