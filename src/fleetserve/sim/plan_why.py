"""Why the planned spec differs from the input, change by change, in the figures of the trials that decided it.

`plan` reports each changed field with a `why`: a user who is asked to pay for 16 replicas of another instance
type must see what the alternatives cost and why fewer replicas were not enough. Every sentence is built from
trials the search really ran (`Planner.history`); a change the search made without a trial to compare with
(its trial budget ran out) says that instead. The context length, the SLO fields and the time-of-day floors are
explained where they are decided (`plan.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetserve.sim.plan import Planner, Trial

AUTOSCALING_DECIDED = ("spec.autoscaling.minReplicaCount", "spec.autoscaling.maxReplicaCount",
                       "spec.autoscaling.triggers", "spec.autoscaling.enabled")


def _first_failure(trial: Trial) -> str:
    missed = [c.reason for c in trial.verdict.checks if not c.passed]
    return missed[0] if missed else "passes"


def _outcome(trial: Trial) -> str:
    """What a passing trial is ranked by (cost, then GPU-hours, then replica-hours), or why it fails."""
    if not trial.verdict.passed:
        return f"fails ({_first_failure(trial)})"
    report = trial.verdict.result.report
    return f"${trial.cost:.4f}, {report['gpu_hours']:.3f} GPU-h, {report['replica_hours']:.3f} replica-h"


def _types(search: Planner) -> str:
    """Each candidate type's smallest passing static fleet, as the search found it."""
    parts = []
    for t in search.types:
        passing = [x for x in search.history if x.step == "static" and x.instance_type == t and x.verdict.passed]
        tried = [x for x in search.history if x.step == "static" and x.instance_type == t]
        if passing:
            best = min(passing, key=lambda x: x.rank)
            parts.append(f"{t} x{best.data['spec']['replicas']} ${best.cost:.2f}")
        elif tried:
            most = max(x.data["spec"]["replicas"] for x in tried)
            parts.append(f"{t}: none passed up to {most} replicas")
        else:
            parts.append(f"{t}: not tried (--max-trials ran out)")
    return "; ".join(parts)


def _static_replicas(search: Planner, winner: Trial) -> str:
    """The static fleets of the winner's type the search ran, fewest replicas first: the cheapest passing won."""
    tried = sorted((x for x in search.history if x.step == "static" and x.instance_type == winner.instance_type),
                   key=lambda x: x.data["spec"]["replicas"])
    runs = "; ".join(f"x{x.data['spec']['replicas']} {_outcome(x)}" for x in tried)
    return f"the cheapest static fleet of {winner.instance_type} that passes verify ({runs})"


def _autoscaled(search: Planner, winner: Trial) -> str:
    autos = [x for x in search.history if x.step == "auto"]
    passing = sum(1 for x in autos if x.verdict.passed)
    statics = [x.cost for x in search.history if x.step == "static" and x.verdict.passed]
    keys = ("minReplicaCount", "maxReplicaCount", "triggers")
    mine = {k: winner.data["spec"]["autoscaling"].get(k) for k in keys}
    same = [x for x in autos if {k: x.data["spec"]["autoscaling"].get(k) for k in keys} == mine]
    source = min(same, key=lambda x: (not x.verdict.passed, x.rank)) if same else None
    if source is None:
        why = f"the autoscaling of the winning trial ({winner.label}: ${winner.cost:.2f})"
    elif source.verdict.passed:
        why = f"the cheapest autoscaled candidate that passes verify ({source.label}: ${source.cost:.2f})"
    else:
        why = (f"the autoscaled candidate {source.label}, which alone fails ({_first_failure(source)}) and passes "
               f"with the time-of-day floors ({winner.label}: ${winner.cost:.2f})")
    why += f"; {passing} of {len(autos)} autoscaled candidates passed"
    return why + (f"; the cheapest static fleet that passes costs ${min(statics):.2f}" if statics else "")


def _static_won(search: Planner, winner: Trial) -> str:
    autos = [x for x in search.history if x.step == "auto"]
    if not autos:
        return f"a static fleet: --max-trials ({search.max_trials}) ran out before autoscaled candidates were tried"
    passing = [x for x in autos if x.verdict.passed]
    if passing:
        best = min(passing, key=lambda x: x.rank)
        return (f"a static fleet: the cheapest autoscaled candidate that passes ({best.label}) costs ${best.cost:.2f},"
                f" not less than this fleet's ${winner.cost:.2f}")
    closest = min(autos, key=lambda x: sum(1 for c in x.verdict.checks if not c.passed))
    return (f"a static fleet: none of the {len(autos)} autoscaled candidates passed verify (e.g. {closest.label}: "
            f"{_first_failure(closest)})")


def _alternative(search: Planner, winner: Trial, step: str, what: str) -> str:
    """The routing or cache step: the winner against the spec it started from and the other candidates."""
    start = search.before_alternatives
    others = [x for x in search.history if x.step == step and x is not winner]
    against = [f"{x.label}: {_outcome(x)}" for x in others]
    if start is not None and start is not winner:
        against.insert(0, f"{what} before this step: {_outcome(start)}")
    return f"{winner.label}: {_outcome(winner)}" + (f" against {'; '.join(against)}" if against else "")


def explain(changes: list[dict], search: Planner, winner: Trial) -> None:
    """Give every change that has no `why` yet one from the trials (in place)."""
    spec = winner.data["spec"]
    autoscaled = bool(spec.get("autoscaling")) and spec["autoscaling"].get("enabled", True)
    decided_by = {x.step for x in search.history if x.data == winner.data}
    for c in changes:
        if c.get("why"):
            continue
        path = c["path"]
        if path in ("spec.placement.instanceTypes", "spec.capacity.allowLargerInstances"):
            why = f"the instance type whose smallest passing static fleet costs least: {_types(search)}"
            if path == "spec.capacity.allowLargerInstances":
                why += "; a multi-GPU type takes several replicas on one node"
        elif path == "spec.replicas":
            why = "the autoscaler's minReplicaCount: the fleet starts there" if autoscaled else \
                _static_replicas(search, winner)
        elif path.startswith(AUTOSCALING_DECIDED):
            why = _autoscaled(search, winner) if autoscaled else _static_won(search, winner)
        elif path.startswith("spec.routing.") and "routing" in decided_by:
            why = _alternative(search, winner, "routing", "the strategy")
        elif path.startswith("spec.kvCache.") and "cache" in decided_by:
            why = _alternative(search, winner, "cache", "the tiers")
        else:
            why = f"as in the winning trial ({winner.label}, ${winner.cost:.2f}), the cheapest that passes verify"
        c["why"] = why
