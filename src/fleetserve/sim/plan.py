"""`fleetserve plan`: the cheapest spec that passes `verify` on a trace, found by simulation.

The search, in order (each step keeps the best passing spec so far, cheapest `cost_usd` first):
1. instance types: for each candidate type (the spec's own, then single-GPU types of other GPUs and the
   8-GPU nodes), the smallest *static* replica count that passes verify (doubling, then bisection): the
   static peak-sized fleet of that type;
2. autoscaling on the two cheapest types: minReplicaCount (0, 1, a quarter, half of the static count),
   the per-replica target of the first trigger (2, 4, 8, 16) and maxReplicaCount (the static count, +25 %),
   one coordinate at a time;
3. time-of-day floors (`sim.floors`): no floors, the input's (what every trial so far inherited), and floors at
   the trace's daily peaks on the winner and on the cheapest autoscaled trial of each type that missed latency
   or errors but not the budget;
4. routing strategy (every registered one) and KV cache tiers (L1 and L2 each on or off) on the winner.
`baseline_cost_usd` is the input spec run statically at its max replicas; `static_peak_cost_usd` the
cheapest passing static fleet. The input as written (when it autoscales) is a candidate too: a passing input
that no step beats is the winner, unchanged.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.placement import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, fits, replica_request
from fleetserve.capacity.prices import strings_in
from fleetserve.router.policies import registered_policies
from fleetserve.sim.floors import cold_start_s, lead_time, peak_windows, reached, schedules
from fleetserve.sim.plan_why import explain
from fleetserve.sim.ranking import BY_RANK, RANK_TOLERANCE, SWITCH_TOLERANCE, better
from fleetserve.sim.run import engine_block
from fleetserve.sim.setup import SimOptions, gpu_types, too_small_for_context
from fleetserve.sim.verify import Verdict, failed, short_placed, verify
from fleetserve.sim.workload import build_workload
from fleetserve.spec.context import context_limit, declared_limit, model_maximum, with_context_limit
from fleetserve.spec.load import load_spec_data

CANDIDATE_TYPES = ("g6.xlarge", "g5.xlarge", "g6e.xlarge", "p4d.24xlarge", "p5.48xlarge")
MAX_STATIC = 64
MAX_FLOOR_TRIALS = 9
ENGINE_BOUND_STEADY = 0.9  # an engine-bound miss that more replicas lowered by less than 10 % ends the doubling


@dataclass
class Trial:
    data: dict
    verdict: Verdict
    label: str
    step: str = ""  # the search step that ran it: baseline, static, auto, floors, routing, cache (plan_why.py)
    instance_type: str = ""  # the candidate type it runs (inherited from `parent`)
    # the trial whose spec this one changed (plan_why.py follows the chain); not compared or printed: a chain of
    # trials, each with its whole simulation
    parent: Trial | None = field(default=None, compare=False, repr=False)

    @property
    def cost(self) -> float:
        return self.verdict.result.report["cost_usd"]

    @property
    def rank(self) -> tuple[float, float, float]:
        """What the search ranks by: cost; at equal cost (a local fleet is $0 at any size) GPU-hours, then
        replica-hours. Compared with a tolerance (`compare`), never as a plain tuple."""
        report = self.verdict.result.report
        return self.cost, report["gpu_hours"], report["replica_hours"]


@dataclass
class PlanResult:
    winner: Trial | None
    baseline: Trial
    static_peak: Trial | None
    trials: int
    changes: list[dict] = field(default_factory=list)
    floors: dict | None = None
    closest: Trial | None = None  # without a winner: the failing trial nearest to passing
    context: dict | None = None  # the context length raised for the trace (from, to, source, requests_over, why)
    cut_short: str | None = None  # --max-trials ended the search before these steps: a "no winner" is not final
    notes: list[str] = field(default_factory=list)  # what the search left out, and why (said with the warnings)
    statics_tried: int = 0  # static fleets of the candidate types simulated (none: "not tried", not "none passed")
    interrupted: bool = False  # the user stopped the search (Ctrl-C): `cut_short` says after how many simulations


    def baseline_note(self) -> str | None:
        """Why the input at its max replicas cost $0, when it did: it served nothing (no replica could be
        placed: a $0.00 against the winner's price read as a bargain the input had), or its capacity is local."""
        if self.baseline.cost:
            return None
        report = self.baseline.verdict.result.report
        if report.get("requests") and report.get("failed") == report.get("requests"):
            why = next((c.reason for c in self.baseline.verdict.checks if not c.passed), "")
            return f"it served none of the {report['requests']} requests" + (f": {why}" if why else "")
        return "its capacity is this machine's, priced at capacity.localPricePerHour (0 unless set)"

    def to_json(self) -> dict:
        w = self.winner
        shown = w or self.closest  # the trial whose warnings and failures are reported
        return {"verified": bool(w and w.verdict.passed), "cost_usd": w.cost if w else None,
                "baseline_cost_usd": self.baseline.cost, "baseline_verified": self.baseline.verdict.passed,
                "baseline_note": self.baseline_note(),
                "static_peak_cost_usd": self.static_peak.cost if self.static_peak else None,
                "savings_vs_baseline": round(1 - w.cost / self.baseline.cost, 4) if w and self.baseline.cost else None,
                "changes": self.changes, "evaluated": self.trials, "winner": w.label if w else None,
                "floors": self.floors or {**floors_section(), "skipped": "--max-trials ran out before the floors step"},
                "report": w.verdict.result.report if w else None,
                "closest": self.closest.label if self.closest else None, "context": self.context,
                "cut_short": self.cut_short, "interrupted": self.interrupted,
                "prices": self.baseline.verdict.result.report.get("prices"),
                "warnings": self.notes + (list(shown.verdict.result.report.get("warnings") or []) if shown else []),
                "failures": [c.reason for c in shown.verdict.checks if not c.passed] if shown else []}


def floors_section(slot_s: int | None = None, peak_windows: list | None = None, cost_before: float | None = None
                   ) -> dict:
    """The `floors` part of the plan's JSON; `cold_start_s` and `chosen` stay null until floors are derived and
    a winner is explained."""
    return {"slot_s": slot_s, "peak_windows": peak_windows or [], "cost_before_usd": cost_before, "candidates": [],
            "cold_start_s": None, "chosen": None}


def _longest_stream(fleet) -> float:
    """The longest answer's stream, first token to last: what a drain lets finish (a queue's wait is not: in a
    failing baseline it had raised the timeout to 960 s for 60 s answers)."""
    return max((r.done - r.first for r in fleet.requests
                if r.done is not None and r.first is not None and r.error is None), default=0.0)


def _shortfall(trial: Trial) -> tuple[int, float]:
    """How far a trial is from passing: failed checks, then the worst value/limit among them."""
    missed = failed(trial.verdict.checks)  # a peak miss counted once, not again in the whole trace's row
    ratios = [c.value / c.limit for c in missed if c.value is not None and c.limit]
    return len(missed), max(ratios, default=math.inf)


def _max_replicas(spec: dict) -> int:
    """The input's largest fleet: a static `replicas: 0` is none (its baseline had run one replica, and plan
    compared its winner with a fleet the input never runs)."""
    auto = spec.get("autoscaling")
    if auto and auto.get("enabled", True):
        return int(auto.get("maxReplicaCount", 5))
    return max(0, int(spec.get("replicas", 1)))


def _static(data: dict, n: int) -> dict:
    """The same spec at a fixed replica count (autoscaling off)."""
    d = copy.deepcopy(data)
    d["spec"]["replicas"] = n
    auto = d["spec"].get("autoscaling")
    if auto:
        auto["enabled"] = False
        if isinstance(auto.get("maxReplicaCount"), int) and auto["maxReplicaCount"] < n:  # a static winner of 11
            auto["maxReplicaCount"] = n  # had kept maxReplicaCount 4: turned back on, it started over its maximum
    return d


def _fitting(instance_type: str, asked, catalog: Catalog, naming: str) -> str | None:
    """The candidate type, or where the replica's pod does not fit on it (its cpu or memory), the cheapest type of
    the same GPU that it fits on (HyperPod's example asks 6 cpu and 30Gi: g6e.xlarge has 4 and 32 GiB, and plan
    verified it); None when no such type exists."""
    if instance_type == "local":
        return instance_type
    wanted = catalog.get(instance_type)
    if fits(wanted, asked, allow_larger=True):
        return instance_type
    same_gpu = [t for t in catalog.types() if t.gpu == wanted.gpu and t.gpus >= wanted.gpus
                and fits(t, asked, allow_larger=True)]
    if not same_gpu:
        return None
    return naming + min(same_gpu, key=lambda t: (t.gpus, t.on_demand)).name


def replica_gpus(asked) -> int:
    """GPUs one replica takes (`capacity.placement.ReplicaRequest`; none asked, or not known: one)."""
    return max(1, asked.gpus if asked is not None and asked.gpus else 1)


def _with_type(data: dict, instance_type: str, catalog: Catalog, first: str | None = None,
               asked=None, cannot_start: set[str] = frozenset()) -> dict:
    """The spec placed on `instance_type` first. The input's other listed types follow it as fallbacks, in their
    order: a priority list is what keeps a fleet placeable through a capacity shortage, and plan had collapsed
    [g5.xlarge, g6e.xlarge, g5.2xlarge] to one type. Only cloud types the input could place a replica on (`asked`)
    stay, each once (the candidate `ml.g6e.xlarge` and the input's `g6e.xlarge` are one type; `local` is this
    machine, not a fallback), and none whose engine `cannot_start` with the spec's context. Node affinity is pinned
    to the type (`_pinned`)."""
    d = copy.deepcopy(data)
    s = d["spec"]
    placement = s.get("placement") or {}
    affinity = placement.get("nodeAffinity")
    capacity = s.setdefault("capacity", {})
    # larger than a replica: more GPUs than one asks (a 4-GPU replica on a 4-GPU type is not; it had read as one)
    larger_type = catalog.get(instance_type).gpus > replica_gpus(asked)
    if affinity:
        s["placement"] = {**placement, "nodeAffinity": _pinned(affinity, instance_type, first)}
        capacity["allowLargerInstances"] = larger_type
        return d
    larger = bool(capacity.get("allowLargerInstances"))
    unstartable = {Catalog.canonical(c) for c in cannot_start}
    fallbacks, seen = [], {Catalog.canonical(instance_type)}
    for t in placement.get("instanceTypes") or []:
        if t == "local" or t not in catalog or Catalog.canonical(t) in seen:
            continue
        if asked is not None and not fits(catalog.get(t), asked, allow_larger=larger):
            continue
        if Catalog.canonical(t) in unstartable:
            continue  # a fallback its engine cannot start on (`Planner._too_small_for_context`)
        seen.add(Catalog.canonical(t))
        fallbacks.append(t)
    s["placement"] = {**placement, "instanceTypes": [instance_type, *fallbacks]}
    capacity["allowLargerInstances"] = larger_type or \
        bool(fallbacks and capacity.get("allowLargerInstances"))  # the input's own, for its fallbacks
    return d


def _allows(term: dict, instance_type: str) -> bool:
    """Whether a node selector term lets a node of `instance_type` in (its instance-type expressions only; names
    compared without SageMaker's `ml.`)."""
    name = Catalog.canonical(instance_type)
    for e in term.get("matchExpressions") or []:
        if e.get("key") != INSTANCE_TYPE_LABEL:
            continue
        values = {Catalog.canonical(v) for v in e.get("values") or []}
        op = e.get("operator")
        if (op == "In" and name not in values) or (op == "NotIn" and name in values) or op == "DoesNotExist":
            return False
    return True


ON_DEMAND = " on-demand"  # the label of a type's on-demand variant (`Planner._spot_churn`)
PREFIX_ROUTED = " routed prefixaware"  # the label of a type's variant that routes for cache hits (`_cache_routed`)
CACHE_BLIND = ("roundrobin", "leastload")  # strategies that send a prompt wherever, whatever its prefix


def instance_of(label: str) -> str:
    """The instance type a candidate's label names (its on-demand and prefix-routed variants' too)."""
    return label.removesuffix(PREFIX_ROUTED).removesuffix(ON_DEMAND)


def _on_demand(data: dict) -> dict:
    """The spec on on-demand capacity only; node affinity that asks for a capacity type no longer does (a term
    requiring spot would place nothing)."""
    d = copy.deepcopy(data)
    d["spec"].setdefault("capacity", {})["capacityTypes"] = ["on-demand"]
    affinity = (d["spec"].get("placement") or {}).get("nodeAffinity")
    if affinity:
        def others(exprs):
            return [e for e in exprs or [] if e.get("key") != CAPACITY_TYPE_LABEL]

        required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
        for term in required.get("nodeSelectorTerms") or []:
            term["matchExpressions"] = others(term.get("matchExpressions"))
        for pref in affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
            pref.setdefault("preference", {})["matchExpressions"] = others(
                (pref.get("preference") or {}).get("matchExpressions"))
    return d


def _pinned(affinity: dict, instance_type: str, first: str | None = None) -> dict:
    """The input's node affinity with its instance-type expressions replaced by the chosen type: its other terms
    (a zone, a capacity type, a team's label) still hold; plan had replaced the whole placement, and a HyperPod
    spec pinned to us-west-2a came out free to land in any zone. Only the OR terms that let the type in are kept
    (pinning every term let g5.xlarge, allowed in us-west-2a only, land in any zone through a g6e term); a type
    no term names (a candidate of plan's own) takes the terms of the input's `first` type."""
    a = copy.deepcopy(affinity)

    def others(term: dict) -> list:
        return [e for e in term.get("matchExpressions") or [] if e.get("key") != INSTANCE_TYPE_LABEL]

    required = a.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    kept = [t for t in terms if _allows(t, instance_type)] or \
        [t for t in terms if first is not None and _allows(t, first)] or terms
    required["nodeSelectorTerms"] = [{**t, "matchExpressions": [  # a dict of its own each: no YAML anchors
        *others(t), {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [instance_type]}]} for t in kept]
    preferred = []
    for p in a.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        term = p.get("preference") or {}
        if others(term) or term.get("matchFields"):
            preferred.append({**p, "preference": {**term, "matchExpressions": others(term)}})
    if preferred:
        a["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    else:
        a.pop("preferredDuringSchedulingIgnoredDuringExecution", None)
    return a


def _input_target(data: dict) -> float | None:
    """The target `_autoscaled` would replace: the first trigger's, when it is a concurrency or PromQL one."""
    triggers = ((data["spec"].get("autoscaling") or {}).get("triggers")) or []
    if triggers and triggers[0].get("metric") in ("concurrency", "prometheus"):
        target = triggers[0].get("target")
        return float(target) if isinstance(target, int | float) and target > 0 else None
    return None


def _autoscaled(data: dict, low: int, high: int, target: float) -> dict:
    d = copy.deepcopy(data)
    s = d["spec"]
    auto = dict(s.get("autoscaling") or {})
    auto.update({"enabled": True, "minReplicaCount": low, "maxReplicaCount": max(high, low, 1)})
    triggers = [dict(t) for t in auto.get("triggers") or []]
    if triggers and triggers[0]["metric"] in ("concurrency", "prometheus"):
        triggers[0]["target"] = target
    else:
        triggers = [{"metric": "concurrency", "target": target}] + triggers
    auto["triggers"] = triggers
    auto["schedules"] = _floors_within(auto.get("schedules") or [], auto["maxReplicaCount"])
    fallback = auto.get("fallback")
    if isinstance(fallback, dict) and isinstance(fallback.get("replicas"), int):  # within the candidate's max, as
        # the spec wants it (a fallback above a smaller max stopped the whole plan with a spec error)
        auto["fallback"] = {**fallback, "replicas": min(fallback["replicas"], auto["maxReplicaCount"])}
    s["autoscaling"] = auto
    s["replicas"] = low
    return d


def _floors_within(floors: list[dict], most: int) -> list[dict]:
    """Time-of-day floors capped at a candidate's maxReplicaCount (the spec refuses a floor above it; the fleet
    could not keep one anyway)."""
    out = []
    for floor in floors:
        floor = dict(floor)
        key = "minReplicas" if "minReplicas" in floor else "min_replicas"
        if isinstance(floor.get(key), int):
            floor[key] = min(floor[key], most)
        out.append(floor)
    return out


def _autoscaling_on(data: dict) -> bool:
    auto = data["spec"].get("autoscaling")
    return bool(auto) and auto.get("enabled", True)


def _with_floors(data: dict, floors: list[dict], lead: int, low: int | None = None) -> dict:
    d = copy.deepcopy(data)
    auto = d["spec"]["autoscaling"]
    auto["schedules"] = _floors_within(floors, int(auto.get("maxReplicaCount", auto.get("max_replica_count", 5))))
    auto["scheduleLeadTime"] = lead if auto["schedules"] else 0  # no floor left: no lead to raise one early
    if low is not None:
        auto["minReplicaCount"] = d["spec"]["replicas"] = low
    return d


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: value}


SLO_FIELDS = {"ttft_p95_ms": "ttftP95Ms", "e2e_p95_ms": "e2eP95Ms", "cost_per_hour_usd": "costPerHourUsd"}


def diff(before: dict, after: dict) -> list[dict]:
    a, b = _flatten(before.get("spec", {}), "spec"), _flatten(after.get("spec", {}), "spec")
    return [{"path": k, "from": a.get(k), "to": b.get(k)} for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


class Planner:
    def __init__(self, endpoint, trace, options: SimOptions, slo: dict | None = None,
                 progress: Callable[[str], None] | None = None, max_trials: int = 80,
                 instance_types: tuple[str, ...] = CANDIDATE_TYPES, stop: Callable[[], bool] | None = None):
        self.base = endpoint.model_dump(mode="json", by_alias=True, exclude_none=True)
        self.endpoint = endpoint
        self.options = options
        self.slo = slo
        self.progress = progress
        self.max_trials = max_trials
        self.notes: list[str] = []
        self.on_demand_why = ""  # set when spot interruptions cut the input's streams (`_on_demand_if_spot_cut`)
        self.drain_why = ""  # set when the trace's answers outlast the input's drain timeout (`_fit_drain`)
        if options.profile is not None and instance_types:  # one engine's speed would stand for every GPU: an L4
            # planned at an L40S's speed won, and verify of the written spec failed at 19 s
            self.notes.append(f"--profile {getattr(options.profile, 'name', options.profile)} gives one engine's "
                              "speed, so plan tried no other GPU than the input's first instance type's and searched "
                              "replicas, scaling, floors, routing and cache; without --profile every type runs at "
                              "its own GPU's")
            instance_types = ()
        self.instance_types = instance_types
        self.catalog = options.catalog()
        self.workload = build_workload(trace, engine_block(endpoint, options), options.knowledge == "informed")
        self.keyed = any(r.engine_keys for r in self.workload)
        self.trials = 0
        self.best: Trial | None = None
        self.peak_misses: dict[str, Trial] = {}  # per instance type, the cheapest autoscaled trial that failed on
        # latency or errors only: floors are tried on each (one base for all types missed a cheaper type's floors)
        self.closest: Trial | None = None  # the failing trial nearest to passing: what a no-winner plan reports
        self.floors: dict | None = None
        self.context: dict | None = None  # the context length the search raised, and why (`_fit_context`)
        self.engine_bound: dict[str, Trial] = {}  # types whose doubling stopped: the engine alone misses a target
        self.loads_bound: set[str] = set()  # of those, the ones that miss it by their prefix loads from L1 / L2
        self.placement_bound: dict[str, Trial] = {}  # types whose doubling stopped: no more replicas could be placed
        self.budget_bound: dict[str, Trial] = {}  # types whose doubling stopped: over the budget already
        self.history: list[Trial] = []  # every trial, in order: what each change of the winner is explained by
        self.types: list[str] = []  # the candidate instance types, in the order tried
        self.exhausted = False  # a step wanted a simulation that --max-trials did not leave
        self.stop = stop or (lambda: False)  # the user's interrupt: no simulation after the current one
        self.interrupted = False
        self.unfit: dict[str, str] = {}  # candidate types dropped: no type of their GPU takes the replica's pod

    def run_trial(self, data: dict, label: str, step: str = "", instance_type: str = "",
                  parent: Trial | None = None) -> Trial:
        endpoint = load_spec_data(data).endpoint
        self.trials += 1
        if self.progress:
            self.progress(label)
        trial = Trial(data, verify(endpoint, self.workload, self.options, self.slo), label, step,
                      instance_type or (parent.instance_type if parent else ""), parent)
        self.history.append(trial)
        margin = SWITCH_TOLERANCE if step in ("routing", "cache") else RANK_TOLERANCE  # the winner's choice stays
        if trial.verdict.passed and (self.best is None or better(trial, self.best, margin)):  # unless clearly beaten
            self.best = trial
        missed = failed(trial.verdict.checks)
        if missed and (self.closest is None or _shortfall(trial) < _shortfall(self.closest)):
            self.closest = trial
        # a trial that missed latency or errors and not the budget is what floors may fix: replicas raised before
        # the trace's daily peaks, at the peak or in the quieter windows with requests around it (idle is never an
        # empty window, so a burst a scaled-down fleet meets cold can be idle's miss); floors only add cost
        kind = trial.instance_type
        if missed and all(c.metric != "cost_per_hour_usd" for c in missed) and _autoscaling_on(data) and \
                (kind not in self.peak_misses or better(trial, self.peak_misses[kind])):
            self.peak_misses[kind] = trial
        return trial

    def _room(self) -> bool:
        """Whether --max-trials leaves room for one more simulation; a step that wanted one and found none marks
        the search as cut short (a search whose last planned trial used the last of the budget was not)."""
        if self.stop():
            self.interrupted = True
            return False
        if self.trials < self.max_trials:
            return True
        self.exhausted = True
        return False

    def _static(self, data: dict, n: int, label: str) -> Trial:
        return self.run_trial(_static(data, n), f"{label} static x{n}", "static", label)

    def smallest_static(self, data: dict, label: str) -> tuple[int, Trial] | None:
        """The fewest static replicas that pass (doubling, then bisection). Doubling stops when two fleets in a
        row miss a latency target that their requests miss alone, with no queueing (`Check.floor`), and the
        second did not bring that floor down: more replicas of this type cannot pass (hits from a larger total
        cache can lower the floor, hence two)."""
        n, last_fail, found = 1, 0, None
        bound = None
        while n <= MAX_STATIC and self._room():
            t = self._static(data, n, label)
            if t.verdict.passed:
                found = (n, t)
                break
            if any(c.metric == "cost_per_hour_usd" and not c.passed for c in t.verdict.checks):
                self.budget_bound[label] = t  # a static fleet twice the size costs no less: p4d and p5 ran x1 to
                return None  # x64 over a $16/h budget that one node of them exceeds
            fleet = t.verdict.result.fleet
            span = [(0.0, max(fleet.end - fleet.t0, 1.0))]
            if fleet.unplaced and (max((p[2] for p in fleet.series), default=0) < n  # capacity caps the count (a
                                   # local machine's slots): x8 ... x64 ran the same fleet; or a shortage kept it
                                   # short for most of the trace (placed once it ended, the all-time count hid it)
                                   or short_placed(fleet, n, span) >= 0.5):
                self.placement_bound[label] = t
                return None
            # an engine floor; under cache-blind routing also a TTFT floor of prefix loads, which more replicas only
            # raise (each reloads what another holds: roundrobin fleets were doubled to x64); under a cache-aware one
            # more replicas hold more prefixes in engine memory (a g6.xlarge fleet whose loads fell 3 % from x1 to
            # x2 passed at x17), so the doubling goes on
            blind = data["spec"].get("routing", {}).get("strategy", "prefixaware") in CACHE_BLIND
            floors = [f / c.limit for c in t.verdict.checks
                      if not c.passed and c.limit and (f := c.floor or (c.load_floor if blind else None))]
            now = max(floors, default=None)
            if now is not None and bound is not None and now >= ENGINE_BOUND_STEADY * bound:
                self.engine_bound[label] = t
                if not any(c.floor for c in t.verdict.checks if not c.passed):
                    self.loads_bound.add(label)
                return None
            bound = now
            last_fail, n = n, n * 2
        if found is None:
            return None
        lo, hi = last_fail, found[0]
        while hi - lo > 1 and self._room():
            mid = (lo + hi) // 2
            t = self._static(data, mid, label)
            if t.verdict.passed:
                hi, found = mid, (mid, t)
            else:
                lo = mid
        return found

    def plan(self) -> PlanResult:
        base = self.base
        own = gpu_types(self.endpoint.spec, self.catalog)
        # a spec written with SageMaker names (HyperPod's ml.g5.8xlarge) gets its suggestions in them too
        placement = self.endpoint.spec.placement
        named = [*(placement.instance_types or ()), *strings_in(placement.node_affinity or {})]
        naming = "ml." if any(n.startswith("ml.") for n in named) else ""
        own = [naming + n for n in own]
        baseline = self.run_trial(_static(base, _max_replicas(base["spec"])), "input static at max replicas",
                                  "baseline", "the input's types")
        # the input as written is a candidate: its own target and bounds may lie off the search's grid (a passing
        # input at $3.39 lost to a planned $3.87 that plan called the cheapest)
        if _autoscaling_on(base) and self._room():
            self.run_trial(copy.deepcopy(base), "input as written", "input", "the input's types")
        # every type an instanceTypes list names is a candidate (its second had been a fallback only, never searched
        # nor explained); of a node affinity's many, the first
        listed = own if placement.instance_types else own[:1]
        types = list(dict.fromkeys([*listed, *(naming + t for t in self.instance_types)])) if own else ["local"]
        asked = replica_request(self.endpoint.spec.engine, self.endpoint.spec.model,
                                self.endpoint.spec.kv_cache)
        fitting = [(t, _fitting(t, asked, self.catalog, naming)) for t in types]
        self.unfit = {t: f"no {self.catalog.get(t).gpu or 'such'} type takes the replica ({asked})"
                      for t, fit in fitting if fit is None}
        types = self.types = list(dict.fromkeys(fit for _, fit in fitting if fit is not None)) or ["local"]
        fitted = self._fit_context(base)
        short = self._too_small_for_context(fitted, types)
        kept = [t for t in types if t not in short]
        if short and kept:  # with no candidate left the types stay as they are (the spec's own choice)
            self.unfit.update(short)
            types = self.types = kept
        else:
            short = {}  # nor are fallbacks dropped then, unsaid
        # what the input's largest fleet meets, read with the context the search uses: the requests the input
        # refused are the longest, and a spot notice cut none of them (the switch to on-demand missed such cuts)
        probe = baseline if fitted == base or not self._room() else self.run_trial(
            _static(fitted, _max_replicas(fitted["spec"])), "input static at max replicas, context raised",
            "baseline", "the input's types")
        fitted = self._fit_drain(self._on_demand_if_spot_cut(fitted, probe), probe)
        candidates = [(t, fitted if t == "local" else
                       _with_type(fitted, t, self.catalog, own[0] if own else None, asked, set(short)))
                      for t in types]
        if self._spot_churn(fitted, probe):
            candidates = [c for t, data in candidates for c in ((t, data), (t + ON_DEMAND, _on_demand(data)))]
            self.types = [t for t, _ in candidates]
        statics: list[tuple[str, int, Trial, dict]] = []
        for t, data in candidates:
            found = self.smallest_static(data, t)
            if found:
                n, trial = found
                statics.append((t, n, trial, data))
        passed = {t for t, *_ in statics}
        for t, data in self._cache_routed([c for c in candidates if c[0] not in passed]):
            found = self.smallest_static(data, t)
            if found:
                n, trial = found
                statics.append((t, n, trial, data))
        statics.sort(key=lambda s: BY_RANK(s[2]))
        static_peak = statics[0][2] if statics else None
        for t, n, trial, data in statics[:2]:
            if self._room():
                self._autoscale(data, n, t, trial)
        if self._room():
            self._floors()
        if self.best is not None:
            self._alternatives()
        winner = self.best
        if winner is not None and self.drain_why:
            winner = self.best = self._drain_of_winner(winner)
        if winner is not None:
            self._write_slo(winner)
            self._say_where_it_ran(winner)
            self._say_the_machine_is_shared(winner)
        changes = diff(base, winner.data) if winner else []
        self._explain_floors(changes)
        for c in changes:
            if c["path"] == "spec.capacity.capacityTypes" and self.on_demand_why:
                c["why"] = self.on_demand_why
        for c in changes:
            if c["path"] == "spec.engine.drainTimeoutSeconds" and self.drain_why:
                c["why"] = self.drain_why
        if self.context:
            for c in changes:
                if c["path"] in ("spec.engine.args", "spec.model.contextLength"):
                    c["why"] = self.context["why"]
        for c in changes:
            if c["path"].startswith("spec.slo."):
                c["why"] = ("the SLO given on the command line, which the search verified against: written so that "
                            "`verify` of the planned spec checks what `plan` checked")
        if winner is not None:
            explain(changes, self, winner)
        return PlanResult(winner, baseline, static_peak, self.trials, changes, self.floors,
                          None if winner else self.closest, self.context, self._cut_short(), self.notes,
                          sum(1 for t in self.history if t.step == "static"), self.interrupted)

    def _on_demand_if_spot_cut(self, data: dict, baseline: Trial) -> dict:
        """Spot interruptions that cut streams at the input's own size are not cured by more replicas (plan doubled
        such a fleet to 64, then picked $53.80 of p5 where on-demand passed at $2.23): the search then runs on
        on-demand capacity, and the change says why."""
        fleet = baseline.verdict.result.fleet
        cut, notices = fleet.disruptions.get("lost_mid_stream", 0), fleet.disruptions.get("spot_notices", 0)
        types = ((data["spec"].get("capacity") or {}).get("capacityTypes")) or []
        if not (cut and notices) or "spot" not in types:
            return data
        data = copy.deepcopy(data)
        data["spec"]["capacity"]["capacityTypes"] = ["on-demand"]
        self.on_demand_why = (f"spot interruptions ({notices} notice(s)) cut {cut} stream(s) of the input at its "
                              "largest size, which more replicas do not keep: the search ran on on-demand capacity")
        self.notes.append(self.on_demand_why)
        return data

    def _fit_drain(self, data: dict, baseline: Trial) -> dict:
        """The search's drain timeout: raised when the trace's longest answer outlasts the input's, since a replica
        that scale-down or consolidation drains stops that long after, cutting what it still streams, and more
        replicas do not keep such streams (verify names the cut). The longest stream (first token to last) of the
        input at its largest size, with half again as margin for a busier replica, rounded up to a minute. A longer
        timeout costs only while a drained replica still streams: it is billed until its last answer ends."""
        longest = _longest_stream(baseline.verdict.result.fleet)
        drain = self.endpoint.spec.engine.drain_timeout_seconds
        if longest <= drain:
            return data
        raised = max(drain, math.ceil(longest * 1.5 / 60) * 60)
        data = copy.deepcopy(data)
        data["spec"].setdefault("engine", {})["drainTimeoutSeconds"] = raised
        self.drain_why = (f"the trace's longest answer streamed for {longest:.0f} s on the input at its largest "
                          f"size, more than its engine.drainTimeoutSeconds ({drain:g} s): a replica that scale-down "
                          "or consolidation drains would cut such streams, which more replicas do not keep; every "
                          f"candidate lets a drained replica finish for {raised} s (1.5x the longest, in minutes; "
                          "it is billed until its last answer ends)")
        return data

    def _drain_of_winner(self, winner: Trial) -> Trial:
        """The drain timeout the winner needs, verified: the search's was sized on the input at its largest size,
        whose overload stretched every stream (a one-replica input's 915 s, where its winner's longest answer took
        12 s, wrote a 23-minute drain into the pods). The winner's longest stream with the same margin, never below
        the input's own timeout; kept as searched when the winner fails with it. One simulation past --max-trials
        where the search used them all: it checks the winner, and a budget had left pods a 34-minute drain."""
        engine = winner.data["spec"].get("engine") or {}
        searched = engine.get("drainTimeoutSeconds")
        own = self.endpoint.spec.engine.drain_timeout_seconds
        longest = _longest_stream(winner.verdict.result.fleet)
        need = own if longest <= own else max(own, math.ceil(longest * 1.5 / 60) * 60)  # as `_fit_drain` sizes it
        if searched is None or need >= searched or self.stop():
            return winner
        data = copy.deepcopy(winner.data)
        data["spec"]["engine"]["drainTimeoutSeconds"] = need  # the input's own (a default too) when it is enough
        self.trials += 1
        if self.progress:
            self.progress(f"{winner.label}, drain fitted")
        trial = Trial(data, verify(load_spec_data(data).endpoint, self.workload, self.options, self.slo),
                      f"{winner.label}, drain fitted", winner.step, winner.instance_type, winner)
        self.history.append(trial)
        if not trial.verdict.passed:
            return winner
        self.drain_why = "" if need == own else (
            f"the trace's longest answer streamed for {longest:.0f} s on the planned fleet, more than the input's "
            f"engine.drainTimeoutSeconds ({own:g} s): a replica that scale-down or consolidation drains would cut "
            f"such streams; it lets a drained replica finish for {need} s (1.5x the longest, in minutes; it is "
            "billed until its last answer ends)")
        return trial

    def _spot_churn(self, data: dict, probe: Trial) -> bool:
        """Whether spot notices came while the input's largest fleet missed its targets: capacity lost to
        interruptions and re-provisioned late shows as latency, not as cut streams, and more spot replicas may
        cost more than fewer on-demand ones (a spot fleet of 17 won at $2.41 where one on-demand node passed at
        $0.47). Each type is then searched on on-demand capacity too, and the cheaper wins."""
        types = (data["spec"].get("capacity") or {}).get("capacityTypes") or []
        notices = probe.verdict.result.fleet.disruptions.get("spot_notices", 0)
        if "spot" not in types or not notices or probe.verdict.passed:
            return False
        self.notes.append(f"spot interruptions ({notices} notice(s)) came while the input at its largest size "
                          "missed its targets: every type was searched on on-demand capacity too")
        return True

    def _cut_short(self) -> str | None:
        """That --max-trials ended the search, and the steps that ran no trial; None when it did not end it."""
        if not (self.exhausted or self.interrupted):
            return None
        steps = {t.step for t in self.history}
        missing = [name for step, name in (("static", "instance types' static fleets"), ("auto", "autoscaling"),
                                           ("floors", "time-of-day floors"), ("routing", "routing strategies"),
                                           ("cache", "cache tiers")) if step not in steps]
        left = f"; not tried: {', '.join(missing)}" if missing else ""
        if self.interrupted:
            return f"interrupted (Ctrl-C) after {self.trials} simulations{left}"
        return f"--max-trials ({self.max_trials}) ended the search{left}"

    def _write_slo(self, winner: Trial) -> None:
        """The targets given as flags (`--ttft-p95-ms` ...) go into the planned spec's `slo`: without them the
        written spec was verified against its own, stricter targets and failed on the trace it was planned on."""
        given = {SLO_FIELDS[k]: v for k, v in (self.slo or {}).items() if v is not None and k in SLO_FIELDS}
        if given:
            winner.data = copy.deepcopy(winner.data)
            winner.data["spec"].setdefault("slo", {}).update(given)

    def _too_small_for_context(self, data: dict, types: list[str]) -> dict[str, str]:
        """The candidate types (and the input's own, the fallbacks) whose KV cache cannot hold one sequence of the
        declared (or raised) context (`setup.too_small_for_context`), with why: plan had raised the context to
        131,072 and kept g5.8xlarge (46,080 tokens of KV past an 8B's weights) as the fallback."""
        spec = load_spec_data(data).endpoint.spec
        limit = declared_limit(spec)
        held = too_small_for_context(spec, [*types, *gpu_types(spec, self.catalog)], self.catalog, self.options)
        return {t: f"its KV cache holds {n:,} tokens, less than one sequence of the {limit[0]:,}-token context "
                   f"({limit[1]}): the engine refuses to start there" for t, n in held.items()}

    def _fit_context(self, data: dict) -> dict:
        """The search's starting spec: the input, with its context length raised (to a multiple of 1,024) when the
        trace's requests need more than it declares, since no replica count serves a request that cannot fit;
        never past the model's own maximum where it is known (`spec.context.model_maximum`). The KV memory it takes
        is checked per type after (`_too_small_for_context`)."""
        declared = context_limit(self.endpoint.spec)
        need = max((w.prompt + w.output for w in self.workload), default=0)
        if declared is None or need <= declared[0]:
            return data
        tokens, where = declared
        raised = -(-need // 1024) * 1024
        over = sum(1 for w in self.workload if w.prompt + w.output > tokens)
        native = model_maximum(self.endpoint.spec)
        if native is not None:
            raised = min(raised, native[0])
        if raised <= tokens:  # the model cannot take more: the requests stay refused, and the plan says so
            self.context = {"from": tokens, "to": tokens, "source": where, "requests_over": over,
                            "why": f"{over} of the trace's {len(self.workload)} requests need up to {need} tokens of "
                                   f"context, more than {tokens} ({where}): the model cannot serve them, whatever "
                                   "the spec; a model with a longer context can"}
            return data
        d = with_context_limit(copy.deepcopy(data), raised, where)
        still = sum(1 for w in self.workload if w.prompt + w.output > raised)
        capped = (f", capped at {native[1]}: {still} request(s) over it stay refused, whatever the spec"
                  if still else "")
        self.context = {"from": tokens, "to": raised, "source": where, "requests_over": over,
                        "why": f"{over} of the trace's {len(self.workload)} requests need up to {need} tokens of "
                               f"context, more than the input's {tokens} ({where}): an engine refuses them, so "
                               f"every candidate has {raised}{capped}"}
        return d

    def _say_where_it_ran(self, winner: Trial) -> None:
        """A winner named by its first type whose replicas ran on a fallback (the first short of capacity): its
        label and cost were read as the first type's."""
        ran = winner.verdict.result.report.get("node_hours_by_type") or {}
        listed = (winner.data["spec"].get("placement") or {}).get("instanceTypes") or []
        total = sum(ran.values())
        if not listed or total <= 0:
            return
        first = Catalog.canonical(listed[0])
        on_first = sum(h for t, h in ran.items() if Catalog.canonical(t) == first)
        if on_first < 0.5 * total:
            mostly = max(ran, key=ran.get)
            self.notes.append(f"the winner lists {listed[0]} first, but its replicas ran mostly on {mostly} "
                              f"({ran[mostly]:.2f} of {total:.2f} node-hours): {listed[0]} was short of capacity for "
                              f"most of the trace, and the cost is mostly {mostly}'s")

    def _say_the_machine_is_shared(self, winner: Trial) -> None:
        """A local winner of several replicas: the profile times one engine with the machine to itself, and nothing
        bounds the count but `capacity.localSlots` (x15 of the CPU engine won on 2 cores, unsaid)."""
        spec = winner.data["spec"]
        placement = (spec.get("placement") or {}).get("instanceTypes")
        most = winner.verdict.result.report.get("replicas_max") or 0
        if placement or most <= 1 or (spec.get("capacity") or {}).get("localSlots"):
            return
        import os

        self.notes.append(f"the winner runs up to {most} replicas on this machine, each at the speed the profile "
                          f"measured for one engine with the machine to itself ({os.cpu_count()} CPU core(s) here): "
                          "replicas on one machine share its cores and memory, so its figures hold only where each "
                          "has its own; set capacity.localSlots to the replicas this machine holds and plan again")

    def _autoscale(self, data: dict, n: int, label: str, static: Trial) -> None:
        # the input's own target first: on a tie (the first found stays) it is kept, not changed for nothing
        low, high, target = max(1, n // 2), n, _input_target(data) or 4.0
        def run(low: int, high: int, target: float) -> Trial:
            return self.run_trial(_autoscaled(data, low, high, target), f"{label} auto {low}-{high} t{target:g}",
                                  "auto", label, static)

        current = run(low, high, target)

        def improves(trial: Trial) -> bool:
            return trial.verdict.passed and (not current.verdict.passed or better(trial, current))

        for cand in sorted({0, 1, max(1, n // 4)} - {low}):
            if not self._room():
                return
            t = run(cand, high, target)
            if improves(t):
                current, low = t, cand
        for cand in sorted({2.0, 4.0, 8.0, 16.0} - {target}):
            if not self._room():
                return
            t = run(low, high, cand)
            if improves(t):
                current, target = t, cand
        bigger = high + max(1, math.ceil(high / 4))
        if not current.verdict.passed and self._room():
            run(low, bigger, target)

    def _floors(self) -> None:
        """No floors, the input's, and floors at the trace's daily peaks: the cheapest passing one stays."""
        epoch = self.options.start_epoch
        windows, slot = peak_windows([r.arrival for r in self.workload], epoch)
        before = self.best
        info = floors_section(slot, [{"window": w.label, "arrivals_per_slot": w.arrivals,
                                      "off_peak_per_slot": round(w.typical, 1)} for w in windows],
                              before.cost if before else None)
        self.floors = info
        candidates: list[tuple[tuple, str, dict, str, Trial]] = []  # ((priority: the likelier saving first, then
        # the cheaper base), ...)
        if before is not None and _autoscaling_on(before.data) and before.data["spec"]["autoscaling"].get("schedules"):
            candidates.append(((0, 0), "no floors", _with_floors(before.data, [], 0), "none", before))
        misses = sorted((t for t in self.peak_misses.values() if before is None or better(t, before)),
                        key=BY_RANK)  # a miss that does not rank before the best passing spec cannot win with floors
        bases = [t for t in (before, *misses) if t is not None and _autoscaling_on(t.data)]
        for order, base in enumerate(bases if windows else []):
            fleet = base.verdict.result.fleet
            auto = base.data["spec"]["autoscaling"]
            low, high = int(auto.get("minReplicaCount", 1)), int(auto.get("maxReplicaCount", 5))
            levels = [min(high, max(1, reached(fleet.series, epoch, w))) for w in windows]
            kept = [(w, n) for w, n in zip(windows, levels, strict=True) if n > low]
            if not kept:
                continue
            cold = cold_start_s(fleet)
            if info["cold_start_s"] is None:
                info["cold_start_s"] = round(cold, 1)
            lead = lead_time(cold)
            on = "the best so far" if base is before else f"{base.label} (which alone missed latency or errors)"
            what = ", ".join(f"{w.label} x{n}" for w, n in kept)
            floors = schedules([w for w, _ in kept], [n for _, n in kept])
            candidates.append(((1, order), f"floors {what}, min {low}, on {on}", _with_floors(base.data, floors, lead),
                               "derived", base))
            if low > 0:
                candidates.append(((3, order), f"floors {what}, min 0, on {on}",
                                   _with_floors(base.data, floors, lead, 0), "derived", base))
            if base is not before and any(n < high for _, n in kept):
                full = schedules([w for w, _ in kept], [high] * len(kept))
                candidates.append(((2, order), f"floors {', '.join(w.label for w, _ in kept)} x{high}, min {low}, "
                                   f"on {on}", _with_floors(base.data, full, lead), "derived", base))
        seen: list[dict] = [t.data for t in (before, *self.peak_misses.values()) if t is not None]
        candidates.sort(key=lambda c: c[0])
        ran = 0
        for _, label, data, kind, parent in candidates:
            if data in seen or ran >= MAX_FLOOR_TRIALS or not self._room():
                continue  # a duplicate takes no slot of the cap: the cap counts simulations run
            seen.append(data)
            ran += 1
            t = self.run_trial(data, label, "floors", parent=parent)
            info["candidates"].append({"label": label, "kind": kind, "cost_usd": t.cost,
                                       "verified": t.verdict.passed})

    def _explain_floors(self, changes: list[dict]) -> None:
        """Say why the winner's floors differ from the input's (what the trace's peak is, what it costs)."""
        info = self.floors
        if not info or self.best is None:
            return
        auto = self.best.data["spec"].get("autoscaling") or {}
        if not _autoscaling_on(self.best.data):  # a static winner: schedules kept in the file act on nothing
            info["chosen"] = "none"
            return
        floors = auto.get("schedules") or []
        before = info["cost_before_usd"]
        had = "the input's floors" if (self.base["spec"].get("autoscaling") or {}).get("schedules") else "no floors"
        versus = f" against ${before:.2f} for the best spec with {had}" if before is not None else \
            f"; no spec with {had} passed"
        if floors:
            peaks = "; ".join(f"{p['window']}: {p['arrivals_per_slot']} arrivals per {info['slot_s'] // 60} min "
                              f"against {p['off_peak_per_slot']:g} off-peak" for p in info["peak_windows"])
            arrivals = [r.arrival for r in self.workload]
            days = (max(arrivals) - min(arrivals)) / 86400 if arrivals else 0.0
            if days < 2 and floors != (self.base["spec"].get("autoscaling") or {}).get("schedules"):
                # one sighting made a rule: a 40 s burst became 18 replicas every day
                self.notes.append(f"the time-of-day floors repeat every day what a trace of {days * 24:.1f} hours "
                                  f"showed once ({peaks}): check that the peak comes back daily before keeping them")
            lead = auto.get("scheduleLeadTime", 0)
            levels = ", ".join(f"{f['minReplicas']}" for f in floors)
            why = (f"floors at the trace's daily peak ({peaks}) keep {levels} replica(s) there, "
                   f"raised {lead:g} s early to cover the cold start (~{info['cold_start_s'] or 0:g} s); off-peak "
                   f"the autoscaler keeps "
                   f"minReplicaCount {auto.get('minReplicaCount', 1)}: ${self.best.cost:.2f}{versus}")
            info["chosen"] = "derived"
        else:
            why = f"no floors: the autoscaler alone passes verify for ${self.best.cost:.2f}{versus}"
            info["chosen"] = "none"
        touched = False
        for c in changes:
            if c["path"] in ("spec.autoscaling.schedules", "spec.autoscaling.scheduleLeadTime"):
                c["why"] = why
                touched = True
        if not touched:  # the winner's floors are the input's: its own, or none when it had none
            info["chosen"] = "input" if floors else "none"

    def _cache_routed(self, candidates: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
        """The candidates no static fleet passed on, again routed by prefix, where the input's strategy ignores
        prefixes and the trace shares them. Only the winner's routing was varied, so a roundrobin input whose
        prompts loaded their prefixes from L2 on every replica missed its TTFT on every type but the fastest:
        plan chose a p5 at $8.20 where two g6e.xlarge routed by prefix passed for $0.34."""
        if not self.keyed:
            return []
        out = []
        for t, data in candidates:
            if data["spec"].get("routing", {}).get("strategy", "prefixaware") in CACHE_BLIND:
                d = copy.deepcopy(data)
                d["spec"].setdefault("routing", {})["strategy"] = "prefixaware"
                out.append((t + PREFIX_ROUTED, d))
        self.types += [t for t, _ in out]
        return out

    def _alternatives(self) -> None:
        best = self.best
        for strategy in registered_policies():
            if strategy == best.data["spec"].get("routing", {}).get("strategy") or not self._room():
                continue
            if strategy == "session" and not any(r.session for r in self.workload):
                continue  # no session keys in this trace: session routing would be leastload in disguise
            d = copy.deepcopy(best.data)
            d["spec"].setdefault("routing", {})["strategy"] = strategy
            self.run_trial(d, f"routing {strategy}", "routing", parent=best)
        if not self.keyed:
            return  # no shared prefixes in the trace: cache tiers cannot matter
        best = self.best
        for l1, l2 in ((True, False), (False, False), (True, True), (False, True)):
            d = copy.deepcopy(best.data)
            kv = d["spec"].setdefault("kvCache", {})
            kv.setdefault("l1", {})["enabled"] = l1
            kv.setdefault("l2", {})["enabled"] = l2
            if d != best.data and self._room():
                self.run_trial(d, f"cache l1={l1} l2={l2}", "cache", parent=best)


def plan(endpoint, trace, options: SimOptions | None = None, slo: dict | None = None, progress=None,
         max_trials: int = 80, instance_types: tuple[str, ...] = CANDIDATE_TYPES,
         stop: Callable[[], bool] | None = None) -> PlanResult:
    """`stop`: asked before each simulation; once true the search ends there, and the result says it was
    interrupted (with the best spec that passed so far, as --max-trials cutting it short does)."""
    return Planner(endpoint, trace, options or SimOptions(), slo, progress, max_trials, instance_types, stop).plan()
