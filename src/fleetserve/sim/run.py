"""One simulation from a spec and a trace: the entry point the CLI, verify, plan and the benchmarks share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetserve.sim.fleet import SimFleet
from fleetserve.sim.report import build_report, slo_of
from fleetserve.sim.setup import SimOptions, profile_for, uses_cloud
from fleetserve.sim.workload import SimRequestSpec, build_workload
from fleetserve.traces.model import TraceRequest


@dataclass
class SimResult:
    report: dict
    fleet: SimFleet


def engine_block(endpoint, options: SimOptions) -> int:
    """The engines' KV block size: the profile's (the first instance type's, or the chosen profile)."""
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.sim.setup import gpu_types

    catalog = Catalog.builtin()
    types = gpu_types(endpoint.spec, catalog) if uses_cloud(endpoint.spec, catalog) else ["local"]
    return profile_for(types[0], catalog, options, endpoint.spec).block_size


def simulate(endpoint, trace: list[TraceRequest] | list[SimRequestSpec], options: SimOptions | None = None,
             slo: dict | None = None, progress: Callable[[float], None] | None = None) -> SimResult:
    """Run `endpoint` against `trace`; `slo` overrides the spec's targets (None values keep them)."""
    options = options or SimOptions()
    if trace and isinstance(trace[0], TraceRequest):
        workload = build_workload(trace, engine_block(endpoint, options), options.knowledge == "informed")
    else:
        workload = list(trace)
    fleet = SimFleet(endpoint, workload, options, progress).run()
    targets, source = slo_of(endpoint, slo)
    report = build_report(fleet, targets, source)
    report["context_length"], report["warnings"] = context_check(fleet)
    report["warnings"] += sorted(fleet.profile_notes)
    report["placement_failures"] = dict(fleet.unplaced)
    if fleet.unplaced and not fleet.replicas:
        report["warnings"].append(f"no replica could be placed: {next(iter(fleet.unplaced))}")
    report["start"] = options.start  # the wall time of the trace's first second (cron floors, budgets read it)
    return SimResult(report, fleet)


def context_check(fleet: SimFleet) -> tuple[dict | None, list[str]]:
    """The declared context length and how many requests the fleet refused for it (prompt + completion as the
    trace has them, `SimFleet._arrive`), as a real engine answers them 400; the warning says how many and why."""
    if fleet.context is None:
        return None, []
    tokens, where = fleet.context
    total = len(fleet.workload)
    over = fleet.rejected["context_length_exceeded"]
    info = {"tokens": tokens, "source": where, "requests_over": over,
            "share_over": round(over / total, 6) if total else 0.0}
    if not over:
        return info, []
    return info, [f"{over} of {total} requests ({over / total:.1%}) need more than the "
                  f"{tokens}-token context length ({where}): refused (400 context_length_exceeded), as a real "
                  "engine refuses them"]
