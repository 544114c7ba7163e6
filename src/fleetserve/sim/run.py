"""One simulation from a spec and a trace: the entry point the CLI, verify, plan and the benchmarks share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetserve.capacity.prices import sagemaker_pricing
from fleetserve.sim.fleet import SimFleet
from fleetserve.sim.report import build_report, slo_of
from fleetserve.sim.setup import SimOptions, profile_for, uses_cloud
from fleetserve.sim.workload import SimRequestSpec, build_workload, cannot_act, keys_exact
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
    report["warnings"][:0] = options.input_warnings
    report["warnings"] += sorted(fleet.profile_notes) + sagemaker_pricing(endpoint.spec, options.prices)
    report["warnings"] += silent_defaults(endpoint.spec, workload, options.knowledge) + spec_notes(endpoint)
    report["warnings"] += context_unheld(endpoint.spec, options)
    if trace and isinstance(trace[0], TraceRequest):
        block = engine_block(endpoint, options)
        asked = endpoint.spec.kv_cache.block_size
        if "block_size" in endpoint.spec.kv_cache.model_fields_set and asked != block:  # it was used without a word
            report["warnings"].append(f"kvCache.blockSize {asked} is not simulated: the engines' blocks are the "
                                      f"profile's {block} tokens (`fleetserve profile --block-size {asked}` "
                                      "measures a profile with yours)")
    report["prices"] = {name: {"on_demand": od, "spot": spot} for name, (od, spot) in sorted(options.prices.items())
                        } if options.prices else None  # --prices: the $/h the cost figures used instead of the list
    report["placement_failures"] = dict(fleet.unplaced)
    if fleet.unplaced:
        report["warnings"].append(placement_warning(fleet, report["replicas_max"]))
    report["start"] = options.start  # the wall time of the trace's first second (cron floors, budgets read it)
    return SimResult(report, fleet)


#: the spec's own warnings (`fleetserve validate`) that hold for the simulated fleet too
SIMULATED_NOTES = frozenset({"spec.replicas", "spec.routing.sessionKey", "spec.placement.nodeAffinity"})


def spec_notes(endpoint) -> list[str]:
    """What `validate` warns about the spec that the run acts on too: a `replicas` above maxReplicaCount ran at
    the max, and `simulate` said nothing of it."""
    from fleetserve.spec.effects import inert_settings

    return [str(n) for n in inert_settings(endpoint) if said_by_the_run(n, endpoint)]


def said_by_the_run(note, endpoint) -> bool:
    """Whether `spec_notes` says this spec warning (by fleetserve's path, for one named by a HyperPod field): a
    command that adds the spec's own warnings leaves these out, or they were said twice."""
    from fleetserve.spec.effects import ZERO_GPUS

    zero_gpus = ZERO_GPUS.format(kind=endpoint.spec.engine.kind)
    return note.fleetserve_path in SIMULATED_NOTES or note.message.startswith(zero_gpus)


def silent_defaults(spec, workload: list[SimRequestSpec], knowledge: str = "blind") -> list[str]:
    """Spec choices the run could not act on as written, said rather than simulated in another's name."""
    notes = []
    l2 = spec.kv_cache.l2
    if l2.enabled and not l2.price_per_hour:
        notes.append("kvCache.l2 is enabled without pricePerHour: the Redis server it needs costs nothing in cost_usd "
                     "(set kvCache.l2.pricePerHour to count it; plan weighs L2 by it)")
    if knowledge == "informed" and spec.engine.kind in ("vllm", "sglang", "container"):
        notes.append(f"--knowledge informed: the router was given KV events, capacity and queue, which "
                     f"engine.kind {spec.engine.kind} does not publish to it live; --knowledge blind is what this "
                     "fleet's router gets")
    strategy = spec.routing.strategy
    reason = cannot_act(strategy, knowledge, any(w.session for w in workload), keys_exact(workload)) \
        if workload else None
    if reason:
        notes.append(f"routing strategy {strategy}: {reason}")
    auto = spec.autoscaling
    if auto is not None and auto.enabled and not auto.triggers:
        notes.append("spec.autoscaling has no triggers: the controller scaled on concurrency, 4 requests in flight "
                     "per replica (the default trigger)")
    return notes


def placement_warning(fleet: SimFleet, ran: int) -> str:
    """What found no capacity: none placed, or fewer than the fleet asked for (a static 4 on one local slot ran 1
    replica, and verify blamed the size of a fleet it never had)."""
    reason = unplaced_reason(fleet)
    if not fleet.replicas:
        return f"no replica could be placed: {reason}"
    launches = sum(fleet.unplaced.values())
    return (f"{launches} replica launch{'es' if launches != 1 else ''} found no capacity ({reason}); at most {ran} "
            "replica(s) ran")


def unplaced_reason(fleet: SimFleet) -> str:
    """The commonest reason launches found no capacity, with the local machine's slot count when it is that."""
    reason = fleet.unplaced.most_common(1)[0][0]
    slots = fleet.spec.capacity.local_slots
    if slots and "[local]" in reason:
        reason += f": the local machine takes capacity.localSlots = {slots} replica(s)"
    return reason


def context_unheld(spec, options: SimOptions) -> list[str]:
    """The spec's instance types an engine with its declared context cannot start on (`setup.too_small_for_context`):
    the run places and serves replicas there as if it could, so it says so."""
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.sim.setup import gpu_types, too_small_for_context
    from fleetserve.spec.context import declared_limit

    catalog = options.catalog()
    held = too_small_for_context(spec, gpu_types(spec, catalog), catalog, options)
    if not held:
        return []
    tokens, where = declared_limit(spec)
    each = ", ".join(f"{Catalog.canonical(t)} ({n:,} tokens)" for t, n in held.items())
    return [f"the {tokens:,}-token context ({where}) does not fit the KV cache one replica has on {each}: "
            f"{spec.engine.kind} refuses to start there (max seq len larger than its KV cache), while the simulator "
            "placed and served replicas on it; shorten the context or use a type with more GPU memory"]


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
    share = f"{over / total:.1%}" if over / total >= 0.0005 else "<0.1%"  # 17 of 86,691 had read "0.0%"
    return info, [f"{over} of {total} requests ({share}) need more than the "
                  f"{tokens}-token context length ({where}): refused (400 context_length_exceeded), as a real "
                  "engine refuses them"]
