"""Why the planned spec differs from the input, change by change, in the figures of the trials that decided it.

`plan` reports each changed field with a `why`: a user who is asked to pay for 16 replicas of another instance
type must see what the alternatives cost and why fewer replicas were not enough. Every sentence is built from
trials the search really ran (`Planner.history`). The winner is followed back through the trials it was built
from (`Trial.parent`: a cache trial on a routing trial on a floors trial on an autoscaled one on a static one),
and each change is explained by the step of that chain which made it, against that step's other candidates:
cheaper, or at equal cost fewer GPU-hours, then fewer replica-hours (what the search ranks by), or a tie kept
because it was found first. A step the trial budget cut short says so. The context length, the SLO fields
and the time-of-day floors are explained where they are decided (`plan.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetserve.sim.ranking import BY_RANK, SWITCH_TOLERANCE, compare
from fleetserve.sim.verify import failed

if TYPE_CHECKING:
    from fleetserve.sim.plan import Planner, Trial

AUTOSCALING_DECIDED = ("spec.autoscaling.minReplicaCount", "spec.autoscaling.maxReplicaCount",
                       "spec.autoscaling.triggers", "spec.autoscaling.enabled")
SHOWN = 4  # other candidates named per reason


def _failure(trial: Trial) -> str:
    missed = [c.reason for c in trial.verdict.checks if not c.passed]
    return missed[0] if missed else "passes"


def _figures(trial: Trial) -> str:
    report = trial.verdict.result.report
    return f"${trial.cost:.4f}, {report['gpu_hours']:.3f} GPU-h, {report['replica_hours']:.3f} replica-h"


def _outcome(trial: Trial) -> str:
    return _figures(trial) if trial.verdict.passed else f"fails ({_failure(trial)})"


def _versus(chosen: Trial, other: Trial, name: str | None = None) -> str:
    """`other` as it compares with `chosen`, by what the search ranks: cost, GPU-hours, replica-hours."""
    name = name or other.label
    if not other.verdict.passed:
        return f"{name} fails ({_failure(other)})"
    theirs = other.rank
    decided = compare(chosen, other)[1]  # equal within the search's tolerance is the same
    if decided == 0:
        return f"{name} ${other.cost:.4f}"
    if decided == 1:
        return f"{name} the same cost with {theirs[1]:.3f} GPU-h"
    if decided == 2:
        return f"{name} the same cost and GPU-hours with {theirs[2]:.3f} replica-h"
    return f"{name} a tie on cost, GPU-hours and replica-hours (the one found first is kept)"


def _chain(trial: Trial) -> list[Trial]:
    out = []
    while trial is not None:
        out.append(trial)
        trial = trial.parent
    return out


def _in_chain(winner: Trial, step: str) -> Trial | None:
    return next((t for t in _chain(winner) if t.step == step), None)


def _budget(search: Planner) -> str:
    return f"; --max-trials ({search.max_trials}) ended the search" if search.exhausted else ""


def _types(search: Planner) -> str:
    """Each candidate type's smallest passing static fleet (the static peak-sized fleet), or why none passed."""
    parts = []
    for t in search.types:
        tried = [x for x in search.history if x.step == "static" and x.instance_type == t]
        passing = [x for x in tried if x.verdict.passed]
        if passing:
            smallest = min(passing, key=lambda x: x.data["spec"]["replicas"])
            parts.append(f"{t} x{smallest.data['spec']['replicas']} {_figures(smallest)}")
        elif tried:
            largest = max(tried, key=lambda x: x.data["spec"]["replicas"])
            stopped = " (more were not tried: its requests miss the target alone, with their prefix loads from L1 " \
                "or L2)" if t in search.loads_bound else \
                " (more were not tried: the engine alone misses the target)" if t in search.engine_bound else \
                " (more were not tried: capacity placed no more, or not for most of the trace)" \
                if t in search.placement_bound else \
                " (more were not tried: this many already cost more than the budget)" if t in search.budget_bound \
                else ""
            parts.append(f"{t}: none passed up to {largest.data['spec']['replicas']} replica(s){stopped} "
                         f"({_failure(largest)})")
        else:
            parts.append(f"{t}: not tried (--max-trials ran out)")
    parts += [f"{t}: not a candidate, {why}" for t, why in search.unfit.items()]  # said, not silently dropped
    return "; ".join(parts)


def _instance_type(search: Planner, winner: Trial) -> str:
    """The winner's type: the one whose smallest passing static fleet costs least, or, when autoscaling or floors
    made another type the cheapest, that one and how."""
    statics = [x for x in search.history if x.step == "static" and x.verdict.passed]
    cheapest = min(statics, key=BY_RANK).instance_type if statics else None
    if cheapest is None or winner.instance_type == cheapest:
        return f"the instance type whose smallest passing static fleet costs least: {_types(search)}"
    how = "with time-of-day floors" if _in_chain(winner, "floors") else "autoscaled"
    return (f"{winner.instance_type} {how} costs least ({_figures(winner)}), though {cheapest}'s static fleet is the "
            f"cheapest static one; each type's smallest passing static fleet: {_types(search)}")


def _static_replicas(search: Planner, winner: Trial) -> str:
    """The static fleets of the winner's type the search ran, fewest replicas first."""
    start = _in_chain(winner, "baseline")
    if start is not None:  # the input's own types, fall-through included: no one type
        ctx = search.context if "context raised" in start.label else None  # not baseline_cost_usd's trial
        what = (f"with its context raised to {ctx['to']} ({_figures(winner)})" if ctx else
                f"(the baseline, {_figures(winner)})")
        note = (f"; baseline_cost_usd is the input as written (context {ctx['from']}: {ctx['requests_over']} "
                "requests refused)" if ctx else "")
        return (f"the input at its max replicas {what}, which no cheaper candidate beat; each type's smallest passing "
                f"static fleet: {_types(search)}{note}{_budget(search)}")
    kind = winner.instance_type
    tried = sorted((x for x in search.history if x.step == "static" and x.instance_type == kind),
                   key=lambda x: x.data["spec"]["replicas"])
    runs = "; ".join(f"x{x.data['spec']['replicas']} {_outcome(x)}" for x in tried)
    return f"the cheapest static fleet of {kind} that passes verify ({runs}){_budget(search)}"


def _autoscaled(search: Planner, winner: Trial) -> str:
    source = _in_chain(winner, "auto")
    autos = [x for x in search.history if x.step == "auto"]
    passing = sum(1 for x in autos if x.verdict.passed)
    if source is None:
        return f"the autoscaling of the winning trial ({winner.label}: {_figures(winner)})"
    if source.verdict.passed:
        why = f"{source.label}, the best autoscaled candidate ({_figures(source)})"
    else:
        why = f"{source.label}, which alone fails ({_failure(source)}) and passes with the time-of-day floors"
    others = sorted((x for x in autos if x is not source and x.instance_type == source.instance_type),
                    key=lambda x: (not x.verdict.passed, x.rank))[:SHOWN]
    if others:
        why += "; against " + "; ".join(_versus(source, x) for x in others)
    static = source.parent
    if static is not None:
        why += f"; its type's smallest passing static fleet: {static.label} {_figures(static)}"
    return why + f" ({passing} of {len(autos)} autoscaled candidates passed){_budget(search)}"


def _static_won(search: Planner, winner: Trial) -> str:
    autos = [x for x in search.history if x.step == "auto"]
    if not autos:
        return f"a static fleet: --max-trials ({search.max_trials}) ran out before autoscaled candidates were tried"
    passing = [x for x in autos if x.verdict.passed]
    if passing:
        best = min(passing, key=BY_RANK)
        return f"a static fleet ({_figures(winner)}); the best autoscaled candidate: {_versus(winner, best)}"
    closest = min(autos, key=lambda x: len(failed(x.verdict.checks)))
    return (f"a static fleet: none of the {len(autos)} autoscaled candidates passed verify (e.g. {closest.label}: "
            f"{_failure(closest)}){_budget(search)}")


def _alternative(search: Planner, chosen: Trial, what: str) -> str:
    """A routing or cache trial of the winner's chain, against the spec it started from and its siblings."""
    start = chosen.parent
    siblings = [x for x in search.history if x.step == chosen.step and x.parent is start and x is not chosen]
    against = [_versus(chosen, start, f"{what} before this step ({start.label})")] if start is not None else []
    against += [_versus(chosen, x) for x in siblings]
    return f"{chosen.label} ({_figures(chosen)}) against " + "; ".join(against) + _budget(search)


def _kept(search: Planner, winner: Trial, step: str, what: str) -> str:
    """A field the step tried to change and kept: the input's value won against the step's candidates."""
    chain = {id(t) for t in _chain(winner)}
    tried = [x for x in search.history if x.step == step and x.parent is not None and id(x.parent) in chain]
    if not tried:
        return f"{what}: the step did not run{_budget(search)}"
    base = tried[0].parent
    return (f"{what} kept ({_figures(base)}) against " + "; ".join(_versus(base, x) for x in tried)
            + f" (a change of this step must save more than {SWITCH_TOLERANCE:.0%})" + _budget(search))


def _larger(search: Planner, winner: Trial, allowed) -> str:
    """allowLargerInstances follows the winner's first type: a type of more GPUs than one replica asks is larger
    than a replica, and Karpenter may only pack several replicas onto it when larger types are allowed."""
    from fleetserve.capacity.placement import replica_request
    from fleetserve.sim.plan import instance_of, replica_gpus

    spec = winner.data["spec"]
    listed = (spec.get("placement") or {}).get("instanceTypes") or []
    kind = listed[0] if listed else instance_of(winner.instance_type)
    if kind not in search.catalog:
        return f"as in the winning trial ({winner.label}: {_figures(winner)})"
    gpus = search.catalog.get(kind).gpus
    asked = search.endpoint.spec
    asks = replica_gpus(replica_request(asked.engine, asked.model, asked.kv_cache))
    if allowed and gpus > asks:
        return (f"{kind} has {gpus} GPUs, more than one replica asks ({asks}): several replicas share one of its "
                "nodes, which needs larger instances allowed")
    if allowed and listed[1:]:
        return f"as the input's, for its fallback types after {kind} ({', '.join(listed[1:])})"
    return f"{kind} has {gpus} GPU(s): one replica per node, no larger instance needed"


def explain(changes: list[dict], search: Planner, winner: Trial) -> None:
    """Give every change that has no `why` yet one from the trials (in place)."""
    from fleetserve.sim.plan import PREFIX_ROUTED, instance_of

    spec = winner.data["spec"]
    autoscaled = bool(spec.get("autoscaling")) and spec["autoscaling"].get("enabled", True)
    routing, cache = _in_chain(winner, "routing"), _in_chain(winner, "cache")
    for c in changes:
        if c.get("why"):
            continue
        path = c["path"]
        if path == "spec.capacity.allowLargerInstances":
            why = _larger(search, winner, c["to"])
        elif path.startswith("spec.placement.") or path.startswith("spec.capacity.capacityTypes"):  # the latter:
            # a type's on-demand variant, searched beside it when spot notices came (`Planner._spot_churn`)
            why = _instance_type(search, winner)
            listed = (spec.get("placement") or {}).get("instanceTypes") or []
            if path.startswith("spec.placement.instanceTypes") and len(listed) > 1:
                why += (f"; the input's other types follow it in the list ({', '.join(listed[1:])}), as fallbacks "
                        "through a capacity shortage")
        elif path == "spec.replicas":
            why = "the autoscaler's minReplicaCount: the fleet starts there" if autoscaled else \
                _static_replicas(search, winner)
        elif path.startswith(AUTOSCALING_DECIDED):
            why = _autoscaled(search, winner) if autoscaled else _static_won(search, winner)
        elif path.startswith("spec.routing.") and routing is None and winner.instance_type.endswith(PREFIX_ROUTED):
            why = (f"the input's {c['from'] or 'default'} routing ignores the prompts' shared prefixes and no static "
                   f"fleet of {instance_of(winner.instance_type)} passed with it (each replica loads or recomputes "
                   f"them); routed by prefix one did: {_types(search)}")
        elif path.startswith("spec.routing."):
            why = _alternative(search, routing, "the strategy") if routing is not None else \
                _kept(search, winner, "routing", "the input's strategy")
        elif path.startswith("spec.kvCache."):
            why = _alternative(search, cache, "the tiers") if cache is not None else \
                _kept(search, winner, "cache", "the input's tiers")
        else:
            why = f"as in the winning trial ({winner.label}: {_figures(winner)}), the cheapest that passes verify"
        c["why"] = why
