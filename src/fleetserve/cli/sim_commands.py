"""CLI: `simulate`, `verify`, `plan` (the fleet simulator) and `bench sim-speed`. Registered on the main app by
`register(app, bench_app)`. Bad input exits 2 naming the parameter and the allowed values; `verify` exits 1
when the spec fails its SLO, `plan` when no candidate passes."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fleetserve.cli.checks import float_option, output_failed, writable, write_output
from fleetserve.cli.console import err, fail, print_spec_errors
from fleetserve.input_file import not_a_file

# piped into a log, rich would fit the tables to 80 columns and cut the numbers ("reque…", "34785… ms")
_PIPED_WIDTH = None if sys.stdout.isatty() else 160
out = Console(soft_wrap=True, highlight=False, width=_PIPED_WIDTH)

Spec = Annotated[str, typer.Argument(help="Endpoint spec (fleetserve.io/v1 or HyperPod InferenceEndpointConfig)")]
TraceOpt = Annotated[str, typer.Option("--trace", help="Trace: Mooncake JSONL, Azure CSV, prompt log, ServeGen")]
PricesOpt = Annotated[str | None, typer.Option(
    "--prices", help="YAML or JSON of $/hour by instance type, over the catalog's list prices "
                     "(ml.g5.xlarge: 1.41, or {onDemand: 1.41, spot: 0.6})")]
TraceModelOpt = Annotated[str | None, typer.Option("--trace-model", help="ServeGen files of several models: the "
                                                                         "one whose arrivals to replay")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON")]
SeedOpt = Annotated[int, typer.Option(min=0, help="Random seed (the simulator's draws and the routing tie-breaks; "
                                                  "0: the live router's own): the same seed gives the same numbers")]
KnowOpt = Annotated[str, typer.Option("--knowledge", help="What the router knows: blind (no KV events, capacity or "
                                                          "queue) or informed")]
ProfileOpt = Annotated[str | None, typer.Option(help="Performance profile preset or profile.json (default: by "
                                                     "instance type)")]
RateOpt = Annotated[float, float_option(min=0.001, help="Multiply the trace's request rate (copies spread in gaps)")]
ReportOpt = Annotated[str | None, typer.Option("--report", help="Write a self-contained HTML report here")]
LimitOpt = Annotated[int | None, typer.Option(min=1, help="Only the first N requests of the trace file, in file "
                                                           "order (taken before the rate scale makes copies or thins "
                                                           "them; sort a file whose rows are out of time order; a "
                                                           "ServeGen file: the first N arrivals drawn at its scaled "
                                                           "rates)")]
WindowOpt = Annotated[float, float_option(min=1, help="Peak/idle window length in seconds")]
PeakOpt = Annotated[float, float_option(min=0.001, max=1, help="Busiest fraction of windows counted as peak")]
IdleOpt = Annotated[float, float_option(min=0.001, max=1, help="Quietest fraction of windows counted as idle")]
StartOpt = Annotated[str | None, typer.Option(
    help="Wall time of the trace start, ISO 8601 (cron floors and budgets read it); default: the trace's own "
         "first timestamp (Azure CSV, UTC), else Monday 2026-01-05T10:00:00+00:00")]
TtftOpt = Annotated[float | None, float_option(min=1, help="SLO: TTFT p95 in ms (overrides spec.slo)")]
E2eOpt = Annotated[float | None, float_option(min=1, help="SLO: E2E p95 in ms (overrides spec.slo)")]
CostOpt = Annotated[float | None, float_option(min=0.0001, help="SLO: cost limit in $/hour (overrides spec.slo)")]
SpotOpt = Annotated[float | None, float_option(min=0, help="Spot interruptions per node-hour (default: the spec's)")]
DelayOpt = Annotated[float | None, float_option(min=0, help="Node provisioning seconds (default: the spec's "
                                                           "simulated cloud, else 90)")]




def _simulatable(loaded) -> None:
    """Every instance type the fleet may place on must be in the simulator's catalog (prices, GPUs, profiles);
    a cluster spec may name others, which `render k8s` passes through."""
    from fleetserve.capacity.catalog import Catalog

    catalog = Catalog.builtin()
    unknown = catalog.first_unknown(loaded.endpoint.spec.placement.instance_types)
    if unknown:
        from fleetserve.spec.errors import SpecProblem

        problem = SpecProblem(f"spec.placement.instanceTypes[{unknown[0]}]",
                              f"{unknown[1]!r} is not in the simulator's catalog; known: {', '.join(catalog.names())}")
        if loaded.source_format == "hyperpod":  # named by the user's own field, ours kept in the message
            from fleetserve.spec.hyperpod import source_of

            problem = source_of(problem, loaded.document) or problem
        raise fail(f"{problem.path}: {problem.message}")


def _model_key(source: str) -> str:
    """A model source as the name its weights go by: `catalog:` read through the catalog, the scheme dropped,
    the last folder (builtin:smollm2-135m, catalog:smollm2-135m and a prepared .../smollm2-135m are one model)."""
    if source.startswith("catalog:"):
        from fleetserve.engine.catalog import CATALOG

        entry = CATALOG.get(source.removeprefix("catalog:"))
        source = entry.source if entry is not None else source.removeprefix("catalog:")
    for scheme in ("builtin:", "hf:", "s3://"):
        source = source.removeprefix(scheme)
    return Path(source.rstrip("/")).name.lower()


def _profile_of_another_model(profile: str | None, spec) -> str | None:
    """A measured profile file names the model it was measured on (`model`); one of another model simulates the
    spec's at that model's speed, which is said (a tiny CPU model's profile ran a HyperPod 8B spec in silence)."""
    if profile is None or not Path(profile).is_file():
        return None
    try:
        measured = json.loads(Path(profile).read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    source = spec.model.source if isinstance(spec.model.source, str) else ""
    if not isinstance(measured, str) or not measured or not source:
        return None
    if _model_key(measured) == _model_key(source):
        return None
    return (f"--profile {profile} was measured on {measured}; the spec serves {source}: its engines run at the "
            "measured model's speed")


def _inputs(spec: str, trace: str, knowledge: str, profile: str | None, rate_scale: float, limit: int | None,
            seed: int, window: float, peak_fraction: float, idle_fraction: float, start: str | None,
            spot_rate: float | None = None, provisioning_delay: float | None = None, trace_model: str | None = None,
            prices: str | None = None, as_json: bool = False):
    """The spec, the trace and the options, or exit 2 naming what is wrong (a spec's problems also as JSON on
    stdout with --json)."""
    from datetime import UTC, datetime

    from fleetserve.sim.profiles import ProfileError, resolve
    from fleetserve.sim.setup import DEFAULT_START, KNOWLEDGE_MODES, SimOptions
    from fleetserve.sim.workload import scale_rate
    from fleetserve.spec import SpecError, load_spec
    from fleetserve.traces.load import TraceError, detect_format, read_trace

    if knowledge not in KNOWLEDGE_MODES:
        raise typer.BadParameter(f"{knowledge!r}; allowed values: {', '.join(KNOWLEDGE_MODES)}",
                                 param_hint="--knowledge")
    if start is not None:
        try:
            moment = datetime.fromisoformat(start)
        except ValueError:
            raise typer.BadParameter(f"{start!r} is not an ISO 8601 time (e.g. 2026-01-05T10:00:00+00:00)",
                                     param_hint="--start") from None
        if not 1970 <= moment.year <= 9000:  # cron floors and budgets compute the days around the trace
            raise typer.BadParameter(f"{start!r}: the year must be within 1970..9000", param_hint="--start")
        # without an offset: UTC, as an Azure stamp, never the machine's own zone (the same command gave $3.62
        # under TZ=UTC and $2.66 under Asia/Seoul); every form is echoed in one (2026-01-05T10:00:00+00:00, not Z)
        start = (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).isoformat()
    if profile is not None:
        try:
            resolve(profile)
        except (ProfileError, ValueError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--profile") from None
    priced = None
    if prices is not None:
        from fleetserve.capacity.prices import PriceError, load_prices

        try:
            priced = load_prices(prices)
        except PriceError as exc:
            raise typer.BadParameter(str(exc), param_hint="--prices") from None
    try:
        loaded = load_spec(spec)
    except SpecError as exc:
        if as_json:
            print_spec_errors(exc)
        raise fail(str(exc)) from None
    _simulatable(loaded)
    # what the inputs carry, in every report's warnings: on stderr and in --json alike (a CI reading the JSON had
    # not learnt that its latencies came from another model's profile)
    # the spec's warnings that hold wherever it runs (a trigger replaced, a MIG slice costed as whole GPUs): what is
    # simulated is what they say, and simulate, verify and plan had said none of them
    from fleetserve.sim.run import said_by_the_run

    said = [str(w) for w in loaded.warnings if w.everywhere and not said_by_the_run(w, loaded.endpoint)]
    said += _inert_flags(loaded.endpoint.spec, spot_rate, provisioning_delay)
    if priced:
        said += _unused_prices(loaded.endpoint.spec, priced, prices)
    if (other := _profile_of_another_model(profile, loaded.endpoint.spec)) is not None:
        said.append(other)
    if not Path(trace).exists():
        raise typer.BadParameter(f"{trace} does not exist", param_hint="--trace")
    try:
        fmt = detect_format(Path(trace))
        if trace_model is not None and fmt != "servegen":
            raise typer.BadParameter(f"applies to ServeGen rate files only; {trace} is a {fmt} trace",
                                     param_hint="--trace-model")
        # a rate file's arrivals are drawn with --seed, at its rates scaled first (`rate_scale` below: done then)
        rated = ({"seed": seed, **({"rate_scale": rate_scale} if rate_scale != 1.0 else {})}
                 if fmt == "servegen" else {})
        requests, own, notes = read_trace(trace, limit=limit, **({"model": trace_model} if trace_model else {}),
                                          **rated)
    except TraceError as exc:
        hints = {"model": "--trace-model", "rate_scale": "--rate-scale"}
        raise typer.BadParameter(str(exc), param_hint=hints.get(exc.param, "--trace")) from None
    if "rate_scale" in rated:
        rate_scale = 1.0
    said += notes
    if fmt == "servegen":  # sizes the figures depend on, which the file does not carry
        from fleetserve.traces.servegen import size_warning

        said.append(f"{size_warning()}, so latency, cost and hit rate are those of that size (a Mooncake or Azure "
                    "trace carries real sizes)")
    if start is None:  # the trace's own clock where it has one: its cron floors are those of its day
        start = own.isoformat() if own is not None else DEFAULT_START
    if rate_scale != 1.0:
        try:
            requests = scale_rate(requests, rate_scale, seed)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--rate-scale") from None
        if not requests:
            raise typer.BadParameter(f"{rate_scale:g} leaves none of the trace's requests; use a larger factor",
                                     param_hint="--rate-scale")
    options = SimOptions(seed=seed, knowledge=knowledge, profile=profile, window_s=window, prices=priced,
                         peak_fraction=peak_fraction, idle_fraction=idle_fraction, start=start,
                         spot_interruption_rate=spot_rate, provisioning_delay_s=provisioning_delay,
                         input_warnings=tuple(said))
    return loaded, requests, options


def _unused_prices(spec, priced: dict, path: str) -> list[str]:
    """Say so when --prices prices none of the types the spec places on: the run's cost was the catalog's, and
    the file was echoed as if it had been used (plan's other candidate types may still read it)."""
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.sim.setup import gpu_types

    placed = {Catalog.canonical(t) for t in gpu_types(spec, Catalog.builtin())}
    if placed and not placed & {Catalog.canonical(t) for t in priced}:
        return [f"--prices {path} prices none of the spec's instance types ({', '.join(sorted(placed))}): its cost "
                "is the catalog's (plan's other candidate types may use the file)"]
    return []


def _inert_flags(spec, spot_rate: float | None, provisioning_delay: float | None) -> list[str]:
    """Say so when a cloud flag cannot change this spec's run (it changed nothing, silently)."""
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.sim.setup import uses_cloud

    cloud = uses_cloud(spec, Catalog.builtin())
    out = []
    if provisioning_delay is not None and not cloud:
        out.append("--provisioning-delay has no effect: the spec names no instance types, so it runs on the local "
                   "node, which provisions nothing")
    if spot_rate is not None and (not cloud or "spot" not in spec.capacity.capacity_types):
        where = "names no instance types (the local node)" if not cloud else \
            f"allows only {', '.join(spec.capacity.capacity_types)} capacity (capacity.capacityTypes)"
        out.append(f"--spot-interruption-rate has no effect: the spec {where}")
    return out


class _Progress:
    """A progress bar over virtual time (or plan's trials, each named on the bar) on a terminal. Elsewhere (CI, a
    pipe to tee) plan's trials are one line each on stderr: a long search had been minutes of silence."""

    def __init__(self, total: float, label: str):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.enabled = err.is_terminal
        self.total = max(total, 1.0)
        self.label, self.started = label, 0
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                            TimeElapsedColumn(), console=err, transient=True, disable=not self.enabled)
        self.task = self.bar.add_task(label, total=self.total)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if exc[0] is None and self.enabled:  # a search that stops early (plan: fewer trials than --max-trials)
            self.bar.update(self.task, completed=self.total)  # ends at 100 %, not at 29 %
        self.bar.__exit__(*exc)

    def __call__(self, done) -> None:
        if isinstance(done, str):  # a trial begins, named
            self.started += 1
            if self.enabled:
                self.bar.update(self.task, completed=min(self.started, self.total), description=f"{self.label} {done}")
            else:  # plan's check of its winner runs past --max-trials: no "trial 9 (at most 8)"
                most = f" (at most {self.total:.0f})" if self.started <= self.total else ""
                err.print(f"{self.label}: trial {self.started}{most}: {done}", markup=False, highlight=False)
        elif self.enabled:
            self.bar.update(self.task, completed=min(done, self.total))


def _slo(ttft_p95_ms, e2e_p95_ms, cost_per_hour) -> dict:
    return {"ttft_p95_ms": ttft_p95_ms, "e2e_p95_ms": e2e_p95_ms, "cost_per_hour_usd": cost_per_hour}


def simulate(
    spec: Spec, trace: TraceOpt, as_json: JsonOpt = False,
    report: ReportOpt = None,
    seed: SeedOpt = 0, knowledge: KnowOpt = "blind", profile: ProfileOpt = None, rate_scale: RateOpt = 1.0,
    limit: LimitOpt = None, window: WindowOpt = 300.0, peak_fraction: PeakOpt = 0.1, idle_fraction: IdleOpt = 0.25,
    start: StartOpt = None, ttft_p95_ms: TtftOpt = None, e2e_p95_ms: E2eOpt = None,
    cost_per_hour: CostOpt = None, spot_interruption_rate: SpotOpt = None, provisioning_delay: DelayOpt = None,
    trace_model: TraceModelOpt = None, prices: PricesOpt = None,
) -> None:
    """Run the spec's fleet (routing, autoscaling, capacity) against a trace in virtual time; report latency,
    SLO attainment, GPU-hours and cost, overall and for the peak and idle windows."""
    from fleetserve.sim.run import simulate as run

    writable(report, "--report", (spec, trace, profile, prices))
    loaded, requests, options = _inputs(spec, trace, knowledge, profile, rate_scale, limit, seed, window,
                                        peak_fraction, idle_fraction, start, spot_interruption_rate,
                                        provisioning_delay, trace_model, prices, as_json)
    with _Progress(requests[-1].arrival_s, "simulating") as progress:
        result = run(loaded.endpoint, requests, options, _slo(ttft_p95_ms, e2e_p95_ms, cost_per_hour), progress)
    unwritten = None
    if report:
        from fleetserve.sim.html import render_html

        unwritten = write_output(report, render_html(result.fleet, result.report,
                                                     f"fleetserve simulate {Path(spec).name}"), "--report")
    r = result.report
    _print_warnings(r)  # on stderr in every mode: --json keeps stdout to the JSON
    if as_json:
        print(json.dumps(r, indent=2))
        if unwritten:
            raise output_failed(unwritten)
        return
    table = Table(title=f"{loaded.endpoint.metadata.name}: {r['requests']} requests, {r['duration_s']:.0f} s "
                        f"simulated, routing {r['routing']['strategy']} ({r['routing']['knowledge']})")
    for col in ("", "requests", "TTFT p50", "TTFT p95", "E2E p95", "SLO attained", "failed", "cost $", "$/h"):
        table.add_column(col, justify="right")
    from fleetserve.sim.report import table_sections

    for name, sec in table_sections(r):
        table.add_row(name, str(sec["requests"]), _ms(sec["ttft_ms"]["p50"]), _ms(sec["ttft_ms"]["p95"]),
                      _ms(sec["e2e_ms"]["p95"]), f"{sec['slo_attainment']:.3f}", str(sec["failed"]),
                      f"{sec['cost_usd']:.2f}", f"{sec['cost_per_hour_usd']:.2f}")
    out.print(table)
    out.print(f"GPU-hours {r['gpu_hours']:.2f}, replicas up to {r['replicas_max']}, hit rate "
              f"{r['hit_rate']['total']:.3f} (engine {r['hit_rate']['engine']:.3f}, L1 {r['hit_rate']['l1']:.3f}, "
              f"L2 {r['hit_rate']['l2']:.3f})" + (f"; report: {report}" if report and not unwritten else ""))
    if r.get("costliest_window") and r["cost_per_hour_max_usd"] > 0:  # a free local fleet has no costliest
        a, b = r["costliest_window"]
        out.print(f"costliest window {a:.0f}-{b:.0f} s: ${r['cost_per_hour_max_usd']:.2f}/h")
    out.print(f"trace start (cron floors, budgets): {r['start']}", markup=False)
    if unwritten:
        raise output_failed(unwritten)


def _print_warnings(report: dict) -> None:
    for warning in report.get("warnings") or ():
        err.print(f"warning: {warning}", markup=False)


def _ms(value) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _figure(value: float) -> str:
    """A check's value or limit in the verify table: whole numbers from 1,000 up (ms, as the reasons write them;
    `.4g` had written 9.417e+04 beside a reason's 94175 ms), four significant digits below."""
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _slo_line(slo: dict) -> str:
    cost = "no limit" if slo["cost_per_hour_usd"] is None else f"${slo['cost_per_hour_usd']:.2f}/h"
    return (f"SLO ({slo['source']}): TTFT p95 <= {slo['ttft_p95_ms']:.0f} ms, E2E p95 <= {slo['e2e_p95_ms']:.0f} ms, "
            f"errors <= {slo['max_error_rate']:.1%}, cost {cost}")


def verify(
    spec: Spec, trace: TraceOpt, as_json: JsonOpt = False, seed: SeedOpt = 0, knowledge: KnowOpt = "blind",
    profile: ProfileOpt = None, rate_scale: RateOpt = 1.0, limit: LimitOpt = None, window: WindowOpt = 300.0,
    peak_fraction: PeakOpt = 0.1, idle_fraction: IdleOpt = 0.25, start: StartOpt = None,
    ttft_p95_ms: TtftOpt = None, e2e_p95_ms: E2eOpt = None, cost_per_hour: CostOpt = None,
    spot_interruption_rate: SpotOpt = None, provisioning_delay: DelayOpt = None, trace_model: TraceModelOpt = None,
    report: ReportOpt = None, prices: PricesOpt = None,
) -> None:
    """Pass or fail: does the spec meet its SLO (spec.slo, flags, or the defaults) at peak, at idle and over the
    whole trace? Exit 0 pass, 1 fail, 2 bad input."""
    from fleetserve.sim.verify import verify as run

    writable(report, "--report", (spec, trace, profile, prices))
    loaded, requests, options = _inputs(spec, trace, knowledge, profile, rate_scale, limit, seed, window,
                                        peak_fraction, idle_fraction, start, spot_interruption_rate,
                                        provisioning_delay, trace_model, prices, as_json)
    with _Progress(requests[-1].arrival_s, "verifying") as progress:
        verdict = run(loaded.endpoint, requests, options, _slo(ttft_p95_ms, e2e_p95_ms, cost_per_hour), progress)
    _print_warnings(verdict.result.report)
    unwritten = None
    if report:
        from fleetserve.sim.html import render_html

        unwritten = write_output(report, render_html(verdict.result.fleet, verdict.result.report,
                                                     f"fleetserve verify {Path(spec).name}", verdict.checks),
                                 "--report")
    if as_json:
        print(json.dumps(verdict.to_json(), indent=2))
    else:
        table = Table(title=f"verify {loaded.endpoint.metadata.name}: "
                            f"{'[green]PASS[/green]' if verdict.passed else '[red]FAIL[/red]'}")
        for col in ("window", "check", "value", "limit", "result"):
            table.add_column(col)
        for c in verdict.checks:
            value = "-" if c.value is None else _figure(c.value)
            limit_ = "-" if c.limit is None else _figure(c.limit)
            table.add_row(c.window, c.metric, value, limit_, "pass" if c.passed else "[red]fail[/red]")
        out.print(table)
        out.print(_slo_line(verdict.result.report["slo"]), markup=False)
        out.print(f"trace start (cron floors, budgets): {verdict.result.report['start']}", markup=False)
        for c in verdict.checks:
            if not c.passed:
                out.print(f"  - {c.reason}", markup=False)
    if unwritten:  # neither pass nor fail: the report asked for is not there
        raise output_failed(unwritten)
    raise typer.Exit(0 if verdict.passed else 1)


HYPERPOD_PLANNED = ("the planned spec is a fleetserve.io/v1 Endpoint, not an InferenceEndpointConfig (`up`, `render "
                    "k8s` and the operator take it): what the HyperPod document has that fleetserve does not act on "
                    "(validate's warnings: endpointName, an S3 certificate output, names of ports and volumes, ...) is "
                    "not in it")


def plan(
    spec: Spec, trace: TraceOpt,
    output: Annotated[str, typer.Option("-o", "--output", help="Write the winning spec (YAML) here")] = "planned.yaml",
    as_json: JsonOpt = False, seed: SeedOpt = 0, knowledge: KnowOpt = "blind", profile: ProfileOpt = None,
    rate_scale: RateOpt = 1.0, limit: LimitOpt = None, window: WindowOpt = 300.0, peak_fraction: PeakOpt = 0.1,
    idle_fraction: IdleOpt = 0.25, start: StartOpt = None, ttft_p95_ms: TtftOpt = None,
    e2e_p95_ms: E2eOpt = None, cost_per_hour: CostOpt = None,
    max_trials: Annotated[int, typer.Option(min=2, max=1000, help="Simulations the search may run")] = 80,
    spot_interruption_rate: SpotOpt = None, provisioning_delay: DelayOpt = None, trace_model: TraceModelOpt = None,
    prices: PricesOpt = None,
) -> None:
    """Search instance types, replica bounds, scaling target, routing and cache tiers for the cheapest spec that
    passes verify; write it to -o and explain the changes. Exit 0 when one passes, 1 when none does."""
    import yaml

    from fleetserve.sim.plan import plan as run

    writable(output, "--output", (spec, trace, profile, prices))
    loaded, requests, options = _inputs(spec, trace, knowledge, profile, rate_scale, limit, seed, window,
                                        peak_fraction, idle_fraction, start, spot_interruption_rate,
                                        provisioning_delay, trace_model, prices, as_json)
    with _stop_on_first_interrupt() as stop, _Progress(max_trials, "planning") as progress:
        result = run(loaded.endpoint, requests, options, _slo(ttft_p95_ms, e2e_p95_ms, cost_per_hour), progress,
                     max_trials, stop=stop.is_set)
    data = result.to_json()
    if loaded.source_format == "hyperpod" and result.winner is not None:  # the file is not what the user gave
        data["warnings"] = [*(data.get("warnings") or []), HYPERPOD_PLANNED]
    _print_warnings(data)  # the winner's, or the closest trial's
    # the conditions the winner was verified under that the written spec does not carry: verify of the file
    # without them checked another world (a floor lead sized for --provisioning-delay 0 failed at 90 s)
    from fleetserve.sim.setup import SimOptions

    default = SimOptions()  # the flags' defaults are its own

    def unless_default(value, field: str):
        return None if value == getattr(default, field) else value

    given = {"--limit": limit, "--rate-scale": None if rate_scale == 1.0 else rate_scale,
             "--seed": unless_default(seed, "seed"), "--knowledge": unless_default(knowledge, "knowledge"),
             "--profile": profile, "--window": unless_default(window, "window_s"),
             "--peak-fraction": unless_default(peak_fraction, "peak_fraction"),
             "--idle-fraction": unless_default(idle_fraction, "idle_fraction"), "--start": start,
             "--spot-interruption-rate": spot_interruption_rate, "--provisioning-delay": provisioning_delay,
             "--trace-model": trace_model, "--prices": prices}
    def command(where) -> str:
        """`verify` of the written spec under the winner's conditions; `where` maps each file path (as typed for
        the JSON and the terminal, absolute in the file itself, which is read from anywhere)."""
        files = {"--profile", "--prices"}
        flags = " ".join(f"{k} {shlex.quote(str(where(v) if k in files and Path(str(v)).is_file() else v))}"
                         for k, v in given.items() if v is not None)
        return " ".join(["fleetserve verify", shlex.quote(where(output)), "--trace", shlex.quote(where(trace)),
                         *([flags] if flags else [])])

    # a command naming a file no run wrote is no command: null when nothing passed
    data["verify_command"] = command(str) if result.winner is not None else None
    unwritten = None
    if result.winner is not None:
        planned = (f"# planned by fleetserve plan from {Path(spec).resolve()} against {Path(trace).resolve()}\n"
                   + f"# verified as: {command(lambda f: str(Path(f).resolve()))}\n"
                   + (f"# {HYPERPOD_PLANNED}\n" if loaded.source_format == "hyperpod" else "")
                   + yaml.safe_dump(result.winner.data, sort_keys=False))
        unwritten = write_output(output, planned, "--output")
        data["output"] = None if unwritten else output
        if unwritten:  # the search's result is still printed, and the spec with it: minutes of simulation
            data["verify_command"] = None  # name no file that is not there
            data["planned_spec"] = planned
    else:  # nothing is written; a file already there (an earlier run's, or the input) must not pass for this one's
        data["output"] = None
        stale = Path(output).exists()
    if as_json:
        data.pop("report", None)
        print(json.dumps(data, indent=2))
    elif result.winner is None:
        out.print(f"no candidate passed verify in {result.trials} simulations"
                  + (f" ({result.cut_short}: a larger --max-trials may find one)" if result.cut_short else "")
                  + f"; nothing written to {output}"
                  + (" (the file already there was left as it was: it is not this run's result)" if stale else ""),
                  markup=False)
        if result.closest is not None:
            out.print(f"closest: {result.closest.label}, which fails:", markup=False)
            for reason in data["failures"]:
                out.print(f"  - {reason}", markup=False)
    else:
        w = data
        base = "passes" if w["baseline_verified"] else "fails verify"
        static = w["static_peak_cost_usd"]
        static = (f"${static:.2f}" if static is not None else "not found before the search was cut short"
                  if result.cut_short else "none passed" if result.statics_tried else "not tried")
        zero = f" ($0: {w['baseline_note']})" if w["baseline_note"] else ""
        out.print(f"winner ({w['winner']}): ${w['cost_usd']:.2f} against ${w['baseline_cost_usd']:.2f} for the input "
                  f"at its max replicas{zero}, which {base} (static peak-sized fleet: {static}); "
                  f"{result.trials} simulations; "
                  + ("not written: its spec follows" if unwritten else f"written to {output}"), markup=False)
        if result.cut_short:  # the winner is the cheapest of what ran, not of what the search would have tried
            out.print(f"search cut short: {result.cut_short}; a larger --max-trials may find a cheaper spec",
                      markup=False)
        out.print(_slo_line(result.winner.verdict.result.report["slo"]), markup=False)
        if w["verify_command"]:
            out.print(f"verified as: {w['verify_command']}", markup=False)
        if not [c for c in w["changes"] if not c["path"].startswith("spec.slo.")]:  # the flags it was verified at
            flags = " (only the targets given as flags are written into its slo)" if w["changes"] else ""
            out.print(f"no change to the fleet: the input as written is the cheapest spec that passes of the "
                      f"{result.trials} simulated{flags}", markup=False)
        said = set()  # each change under its reason; a reason shared by several changes is said once
        for c in w["changes"]:
            out.print(f"  {c['path']}: {c['from']!r} -> {c['to']!r}", markup=False)
            if c.get("why") and c["why"] not in said:
                said.add(c["why"])
                out.print(f"      why: {c['why']}", markup=False)
    if not as_json and result.context and result.context["to"] == result.context["from"]:
        out.print(f"context length not raised: {result.context['why']}", markup=False)  # the model's own maximum
    if unwritten:
        if not as_json:
            print(data["planned_spec"], end="")
        raise output_failed(unwritten)
    if result.interrupted:  # what it had is said (and a spec that passed written); the exit says it was stopped
        raise typer.Exit(130)
    raise typer.Exit(0 if data["verified"] else 1)


@contextlib.contextmanager
def _stop_on_first_interrupt():
    """The first Ctrl-C asks the search to stop after the simulation under way and report what it found (it had
    exited 130 at once, saying nothing and throwing away every trial); a second one stops at once."""
    import signal
    import threading

    stop = threading.Event()

    def interrupted(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        err.print("interrupted: stopping after the simulation under way, then reporting what the search found "
                  "(Ctrl-C again to stop now)", markup=False)

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield stop
        return
    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def bench_sim_speed(
    as_json: JsonOpt = False,
    trace: Annotated[str | None, typer.Option(help="Azure-format trace (default: the Azure code trace)")] = None,
    rate: Annotated[float, float_option(min=0.001, help="Rate scale of the trace")] = 100.0,
    strategy: Annotated[str, typer.Option(help="Routing strategy of the benchmark fleet")] = "leastload",
    limit: LimitOpt = None,
) -> None:
    """Simulated requests per wall-clock second on a rate-scaled Azure trace, autoscaling 4-64 replicas."""
    from fleetserve.router.policies import registered_policies
    from fleetserve.sim.speed import AZURE_CODE, sim_speed

    if strategy not in registered_policies():
        raise typer.BadParameter(f"{strategy!r}; allowed values: {', '.join(registered_policies())}",
                                 param_hint="--strategy")
    path = Path(trace) if trace else AZURE_CODE
    if (why := not_a_file(path)) is not None:
        hint = "" if trace else " (the repository's copy of the Azure code trace; an installed package has none: " \
                                "give --trace)"
        raise typer.BadParameter(f"{path} {why}{hint}", param_hint="--trace")
    from fleetserve.sim.speed import RateError
    from fleetserve.traces.load import TraceError

    try:
        result = sim_speed(path, rate, limit, strategy)
    except RateError as exc:
        raise typer.BadParameter(str(exc), param_hint="--rate") from None
    except TraceError as exc:
        raise typer.BadParameter(str(exc), param_hint="--trace") from None
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        out.print(f"{result['requests_per_s']:.0f} simulated requests/s ({result['requests']} requests, "
                  f"{result['simulated_s']:.0f} s simulated in {result['wall_s']:.1f} s wall)", markup=False)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    app.command()(simulate)
    app.command()(verify)
    app.command()(plan)
    bench_app.command("sim-speed")(bench_sim_speed)
