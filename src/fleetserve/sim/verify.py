"""`fleetserve verify`: does the spec's scaling policy meet its latency target and GPU budget at peak *and* at idle?

Four checks per window (peak, idle), each against the spec's `slo` (or the documented defaults): TTFT p95,
E2E p95, error rate (refused or failed requests) and cost per hour (only when a limit is set; at peak, the
costliest window's, since replicas scaled for a burst run on after it). A window
without requests passes its latency checks (there is no latency to miss) but not its cost check. The whole
trace (`all`) is held to the same latency and error targets: a scale from zero in a middling window is neither
peak nor idle (with idle all empty windows, 20 % of a trace's requests waited for cold starts and verify passed).
A failed check carries a reason naming the likely cause, read off the simulation: replicas held at
maxReplicaCount, cold starts (scale from zero: node provisioning + model load), or requests refused by limits
and buffers; for `all`, of the window with the most misses (the report's `worst`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import asdict, dataclass

import numpy as np

from fleetserve.autoscale.failing import STATIC_ZERO
from fleetserve.capacity.providers import SPOT_NOTICE_SECONDS
from fleetserve.sim.fleet import KV_BOUND, series_at, span_hours
from fleetserve.sim.report import missed, window_bounds, window_requests, windows, worst_section
from fleetserve.sim.run import SimResult, simulate, unplaced_reason
from fleetserve.sim.setup import SimOptions
from fleetserve.spec.context import MODEL_MAXIMUM

WINDOWS = ("peak", "idle")  # each judged on every check; "all" (the whole trace) on latency and errors


@dataclass(frozen=True)
class Check:
    window: str
    metric: str
    value: float | None
    limit: float | None
    passed: bool
    reason: str
    floor: float | None = None  # a latency target the requests miss alone (no queueing): their p95 then, in ms
    # a TTFT target they miss alone only with the loads of the prefixes they found in L1 / L2: that p95, in ms
    # (more replicas may keep more prefixes in engine memory and lower it, or, under roundrobin, not)
    load_floor: float | None = None


@dataclass
class Verdict:
    passed: bool
    checks: list[Check]
    result: SimResult

    def to_json(self) -> dict:
        report = self.result.report
        return {"passed": self.passed, "slo": report["slo"], "checks": [asdict(c) for c in self.checks],
                "failures": [c.reason for c in self.checks if not c.passed], "report": report}


def prefill_floor_ms(result: SimResult, window: str) -> float | None:
    """TTFT p95 of the window's requests with no queueing at all: each one's uncached prompt alone on its replica.

    When this alone exceeds the target, more replicas cannot help (a faster instance type, a smaller model or
    more cache hits can), and `verify` says so instead of blaming capacity."""
    return _alone_p95_ms(result, window, decode=False)


def decode_floor_ms(result: SimResult, window: str) -> float | None:
    """E2E p95 of the window's requests with no queueing and no batching: the prefill floor, then every output
    token decoded alone (a batch of one). Above the E2E target, the answers are too long for this engine at any
    fleet size (64 replicas and one request a minute failed a 10 s E2E with 2,000-token answers, blamed on
    capacity before)."""
    return _alone_p95_ms(result, window, decode=True)


def _account(report: dict, window: str) -> dict:
    """The report's section for a window: peak, idle, or all (the whole trace: the report's top level, its span)."""
    if window == "all":
        return {**report, "windows": [[0.0, report["duration_s"]]]}
    return report[window]


def _single(report: dict) -> bool:
    """The trace spans one window: its peak and its idle are the same window."""
    return len(report["windows"]["arrivals"]) == 1


def failed(checks: list[Check]) -> list[Check]:
    """The failed checks, each miss once: an `all` check is left out when the same metric failed at peak or idle
    (the whole trace's miss is then theirs), so a peak miss does not weigh twice against an idle one."""
    windowed = {c.metric for c in checks if not c.passed and c.window != "all"}
    return [c for c in checks if not c.passed and not (c.window == "all" and c.metric in windowed)]


def _requests(result: SimResult, window: str) -> list:
    fleet = result.fleet
    if window == "all":
        return fleet.requests
    return window_requests(fleet, _account(result.report, window)["windows"], len(windows(fleet)[2]))


def load_floor_ms(result: SimResult, window: str) -> float | None:
    """The prefill floor with each request's load of the prefix it found in L1 or L2 added: no queue causes that
    either, but it is no engine floor (`plan` stops doubling on those): more replicas keep more prefixes in engine
    memory under a cache-aware strategy, and under roundrobin each turn reloads its prefix wherever it lands (64
    replicas missed a 400 ms TTFT by the load alone, and verify blamed the fleet's size)."""
    return _alone_p95_ms(result, window, decode=False, loads=True)


def _alone_p95_ms(result: SimResult, window: str, decode: bool, loads: bool = False) -> float | None:
    alone = []
    for r in _requests(result, window):
        # answered requests, and those the router timed out waiting at a replica: an overloaded fleet's long
        # prompts time out and only its short ones are answered, so the answered alone hid the engine's floor
        # (1,699 of a peak's 1,739 timed out, and verify blamed capacity alone for 18 s prompts)
        if r.replica is None or r.done is None or r.error not in (None, "upstream_timeout"):
            continue
        prof = r.replica.profile
        cached = r.cached if r.error is None else (r.seq.cached if r.seq is not None else 0)  # not looked up: 0
        loaded = r.seq.load_s if loads and r.seq is not None else 0.0  # from L1 / L2, before the prefill
        seconds = prof.alone_prefill_time(r.spec.prompt - cached) + loaded + r.overhead
        if decode and r.spec.output > 1:
            steps = r.spec.output - 1  # the first token comes with the prefill
            seconds += steps * (prof.decode_base_s + prof.decode_per_seq_s) + prof.decode_per_ctx_token_s * (
                steps * r.spec.prompt + steps * (steps + 1) / 2)
        alone.append(seconds * 1000)
    if not alone:
        return None
    return float(np.percentile(alone, 95))


def _engine_floor(result: SimResult, window: str, metric: str) -> float | None:
    """The window's p95 of a latency metric with each request alone (no queueing), when it is above the target:
    the engine's, which more replicas cannot meet; else None."""
    if metric not in ENGINE_BOUND:
        return None
    floor = ENGINE_BOUND[metric][0](result, window)
    return floor if floor is not None and floor > result.report["slo"][metric] else None


def _cause(result: SimResult, window: str, metric: str = "", value: float | None = None,
           floor: float | None = None, loaded: float | None = None) -> str:
    """Why a window failed; a latency target the requests miss alone (`floor`, from `_engine_floor`), and requests
    refused for the context length, are named first."""
    single = window == "idle" and _single(result.report)
    if window == "all":
        capacity = _where_misses_fall(result, metric)
    else:
        capacity = _capacity_cause(result, "peak" if single else window)  # one window: one account of it
    if single:
        capacity += " (the trace spans a single window, so its idle is its peak: a shorter --window separates them)"
    ctx = result.report.get("context_length") or {}
    in_window = _account(result.report, window)["failed_by_reason"]
    over = in_window.get("context_length_exceeded", 0)
    if metric == "error_rate" and over:
        others = sum(n for code, n in in_window.items() if code != "context_length_exceeded")
        source = str(ctx.get("source", ""))
        remedy = ("serve them with a model of a longer context, or shorten them" if source.startswith(MODEL_MAXIMUM)
                  else "give each replica more KV memory (an instance type with more GPU memory, or more "
                       "engine.gpus), or shorten them" if source == KV_BOUND else
                  "raise it (the model and KV memory permitting; `plan` does) or shorten them")
        which = "the trace" if window == "all" else f"the {window} window"
        return (f"{over} {'request' if over == 1 else 'requests'} of {which} "
                f"{'needs' if over == 1 else 'need'} more than the {ctx['tokens']}-token context "
                f"length ({ctx['source']}) and are refused: {remedy}"
                + (f"; and {others} more failed: {capacity}" if others else ""))
    lost = in_window.get("upstream_failed", 0)
    if metric == "error_rate" and lost and result.fleet.disruptions.get("lost_mid_stream"):
        others = sum(n for code, n in in_window.items() if code != "upstream_failed")
        return _cut_streams(result, lost) + (f"; and {others} more failed: {capacity}" if others else "")
    if floor is not None:
        engine = ENGINE_BOUND[metric][1].format(floor=floor)
        queued = value is not None and value > 1.5 * floor
        return f"{engine}; and queueing on top: {capacity}" if queued else engine
    if loaded is not None:
        loads = LOADS_BOUND.format(floor=loaded, strategy=result.fleet.strategy)
        queued = value is not None and value > 1.5 * loaded
        return f"{loads}; and queueing on top: {capacity}" if queued else loads
    return capacity


def _cut_streams(result: SimResult, lost: int) -> str:
    """Streams cut when their replica stopped (`upstream_failed` after the first byte): a spot interruption, or a
    drain (scale-down, consolidation) that ran past `engine.drainTimeoutSeconds`, each named with what keeps them.
    More replicas do not; `verify` had said "a static fleet of 3 replica(s) cannot carry the peak load", and plan
    doubled to 64 replicas."""
    cuts = result.fleet.disruptions
    notices, by_spot, by_drain = cuts.get("spot_notices", 0), cuts.get("cut_by_spot", 0), cuts.get("cut_by_drain", 0)
    drain = result.fleet.spec.engine.drain_timeout_seconds
    parts = []
    if by_spot:
        serves = min(SPOT_NOTICE_SECONDS, drain)
        limit = f"the {SPOT_NOTICE_SECONDS:.0f} s notice" if serves == SPOT_NOTICE_SECONDS else \
            f"engine.drainTimeoutSeconds ({drain:g} s, shorter than the {SPOT_NOTICE_SECONDS:.0f} s notice)"
        parts.append(f"{by_spot} by {notices} spot interruption notice(s), after which a replica serves at most "
                     f"{serves:g} s ({limit}); more replicas do not keep them, on-demand capacity "
                     "(capacity.capacityTypes), shorter answers (max_tokens) or a faster instance type do"
                     + ("" if serves == SPOT_NOTICE_SECONDS else ", and a drain timeout up to the notice"))
    if by_drain:
        parts.append(f"{by_drain} by scale-down or consolidation drains, which stop a replica {drain:g} s later "
                     "whatever it still serves (engine.drainTimeoutSeconds; terminationGracePeriodSeconds on "
                     "Kubernetes): a longer engine.drainTimeoutSeconds, shorter answers (max_tokens), a longer "
                     "scaleDownStabilizationTime or a faster instance type keep them")
    return f"{lost} stream(s) were cut when their replica stopped: " + "; ".join(parts or ["by a stopped replica"])


# a latency target the requests miss alone, with no queueing, is the engine's: (the floor, what to say)
# a TTFT target the requests miss alone only with their loads from L1 / L2: the tiers' speed and where prefixes land
LOADS_BOUND = ("the prompts alone, with no queueing, take {floor:.0f} ms to first token at p95 with the load of the "
               "prefixes they found in L1 or L2 (at the tiers' speed): queueing is not the cause while the prefixes "
               "come from there; prefixes kept in engine memory cut it (routing {strategy}: under a cache-blind one, "
               "a cache-aware strategy keeps a conversation on the replica that holds it; under a cache-aware one, "
               "more replicas or GPU memory hold more)")
ENGINE_BOUND = {
    "ttft_p95_ms": (prefill_floor_ms,
                    "the prompts alone take {floor:.0f} ms to prefill at p95 on this engine, with no queueing: more "
                    "replicas cannot meet it (a faster instance type or engine profile, a smaller model, or more "
                    "prefix-cache hits can)"),
    "e2e_p95_ms": (decode_floor_ms,
                   "each request alone (its prefill, then its output decoded at a batch of one) takes {floor:.0f} ms "
                   "at p95 on this engine: more replicas cannot meet it (shorter answers (max_tokens), a faster "
                   "instance type or engine profile, or a smaller model can)"),
}


def _where_misses_fall(result: SimResult, metric: str) -> str:
    """The whole trace's cause: the window with the most misses of the failed metric (refused or failed requests
    for the error rate), where it lies, and what the fleet did there."""
    fleet = result.fleet
    peak, idle, counts = windows(fleet)
    worst = worst_section(fleet, result.report["slo"], window_bounds(fleet, len(counts)), peak, idle, metric)
    if not worst:
        return _capacity_cause(result, "peak")
    a, b = worst["windows"][0]
    where = {"peak": "a peak window", "idle": "an idle window"}.get(worst["kind"], "neither a peak nor an idle window")
    spread = worst["windows_with_misses"]
    others = f" (misses in {spread} windows of {len(counts)})" if spread > 1 else ""
    # a latency target is judged on the answered requests: where most requests failed, the error rate's row names
    # that window, and this one said "most misses" of another window in the same table
    failed = metric in ("ttft_p95_ms", "e2e_p95_ms") and result.report.get("failed")
    what = "most answered requests over the target" if failed else "most misses"
    return (f"{what} ({worst['misses']} of its {worst['requests']} requests) fall in {a:.0f}-{b:.0f} s, "
            f"{where}{others}: " + _capacity_cause(result, "worst", worst))


def _window_points(fleet, spans) -> list[tuple]:
    """The fleet's recorded states in the windows, and the state entering each of them (a quiet window records
    nothing of its own), stamped at the window's start; a state recorded at the very start replaces it."""
    times = [p[0] for p in fleet.series]
    points = []
    for a, b in spans:
        i = bisect_right(times, a)
        if i > 0:
            points.append((a, *fleet.series[i - 1][1:]))
        elif times and times[0] > a:  # before the first placement nothing was placed ("as few as 2" of 2 was said)
            points.append((a, 0, 0, 0, 0.0, 0))
        points.extend(fleet.series[i:bisect_left(times, b, lo=i)])
    return points or fleet.series[:1]


def _share(series: list[tuple], spans, test) -> float:
    """The share of the windows' time during which the fleet's state passes `test` (the step series integrated as
    the report integrates cost); for windows of no length, of the state entering each."""
    if not series:
        return 0.0
    total = sum(max(0.0, b - a) for a, b in spans)
    if total <= 0:
        return sum(bool(test(series_at(series, a))) for a, _ in spans) / max(len(spans), 1)
    passing = [(p[0], float(bool(test(p)))) for p in series]
    return sum(span_hours(passing, a, b, 1) for a, b in spans) * 3600 / total


def short_placed(fleet, n: int, spans) -> float:
    """The share of the spans' time with fewer than `n` replicas placed on nodes (a capacity shortage or limit):
    the all-time count hid a type short for the whole trace, placed only once its shortage ended. Before the first
    recorded state nothing was placed (the series starts at the first placement)."""
    series = fleet.series
    if not series or series[0][0] > 0:
        series = [(0.0, 0, 0, 0, 0.0, 0), *series]
    return _share(series, spans, lambda p: p[2] < n)


def _capacity_cause(result: SimResult, window: str, section: dict | None = None) -> str:
    """What the fleet's size and scaling did in the window (peak, idle, or another window's `section`): at max
    replicas, too slow to scale, scaled to zero."""
    fleet = result.fleet
    report = result.report
    most = fleet.policy_scaling.max_replicas if fleet.policy_scaling else fleet.static
    least = fleet.policy_scaling.min_replicas if fleet.policy_scaling else fleet.static
    section = section or _account(report, window)
    if window in ("peak", "idle"):
        name = window
    else:
        a, b = section["windows"][0]
        name = f"{a:.0f}-{b:.0f} s window"
    by_reason = section["failed_by_reason"]  # this window's requests, not the whole trace's
    if by_reason:
        codes = ", ".join(f"{k} x{v}" for k, v in sorted(by_reason.items()))
        refused = f"; requests failed: {codes}"
    else:
        refused = ""
    cold, cold_s = "", 0.0
    if fleet.replicas:
        types = sorted({r.instance_type for r in fleet.replicas})
        delay = getattr(fleet.capacity.provider, "provisioning_delay", 0.0)
        cold_s = delay + fleet.replicas[0].profile.load_s
        cold = f" (cold start ~{cold_s:.0f} s: {delay:.0f} s node provisioning + " \
               f"{fleet.replicas[0].profile.load_s:.0f} s model load, {', '.join(types)})"
    notices = fleet.disruptions.get("spot_notices", 0)
    if notices:  # capacity lost and provisioned again: more replicas of spot lose more (a static 6 passed without)
        refused += (f"; {notices} spot interruption notice(s) took replicas away, each replaced after a cold start"
                    f"{cold}: on-demand capacity (capacity.capacityTypes) keeps the fleet whole")
    points = _window_points(fleet, section["windows"])
    zero = any(p[1] == 0 for p in points)  # no replica serving at some point in the window
    # held at max: ready replicas at maxReplicaCount for at least half the time the fleet served (after a scale
    # from zero the minutes at zero are the cold start's); a fleet that touched max for a moment after lagging all
    # along was blamed on max (an autoscaled 3-7 at ~3.8 replicas on average, while a static 7 passed)
    serving = _share(fleet.series, section["windows"], lambda p: p[1] > 0)
    at_max = bool(most) and serving > 0 and \
        _share(fleet.series, section["windows"], lambda p: p[1] >= most) >= 0.5 * serving
    if fleet.unplaced and not fleet.replicas:  # not a question of size: no node type takes the replica
        return f"no replica could be placed: {unplaced_reason(fleet)}{refused}"
    if fleet.unplaced:
        placed = max((p[2] for p in fleet.series), default=0)
        if fleet.policy_scaling is None and placed < most:  # the fleet never had the size the spec asks for
            return f"only {placed} of the static fleet's {most} replicas could be placed: {unplaced_reason(fleet)}" \
                   f"{refused}"
        short = short_placed(fleet, most, section["windows"])
        if fleet.policy_scaling is None and short >= 0.5:  # placed, but late: a shortage for most of the window
            fewest = min((p[2] for p in _window_points(fleet, section["windows"])), default=0)
            return (f"the static fleet's {most} replicas were not all placed for {short:.0%} of the {name} (as few "
                    f"as {fewest}): {unplaced_reason(fleet)}; more replicas of this type are placed no sooner"
                    f"{refused}")
        launches = sum(fleet.unplaced.values())
        refused += f"; {launches} replica launch(es) found no capacity ({unplaced_reason(fleet)})"
    if fleet.policy_scaling is None and not most:
        return f"{STATIC_ZERO}{refused}"  # not a question of load: nothing serves any
    if fleet.policy_scaling is None:
        return f"a static fleet of {most} replica(s) cannot carry the {name} load{refused}"
    # a p95 far beyond the cold start is not the cold start's doing (a burst at zero that then waited at max)
    p95_s = (section["ttft_ms"]["p95"] or 0) / 1000
    from_zero = zero and least == 0
    if from_zero and not (at_max and p95_s > 2 * cold_s):
        return f"scale from zero: requests wait for a cold start{cold}{refused}"
    if at_max and window == "idle" and not from_zero and (lull := _misses_in_a_lull(fleet, report, section, most)):
        return lull + cold + " (a longer scaleDownStabilizationTime or cooldownPeriod, or a higher minReplicaCount, " \
            f"keeps replicas through such a lull){refused}"
    if at_max:
        after = f", after a scale from zero{cold}" if from_zero else ""
        return f"replicas held at maxReplicaCount={most} during the {name}: not enough capacity{after}{refused}"
    if window != "idle":
        # in the window (the trace's max may come after it); a spot replacement starting while the replica it
        # replaces drains is not a step of the scale: "19 of 18" was said
        reached = min(most, max((p[2] for p in points), default=0))
        return f"scaling did not keep up with the {name}: replicas reached {reached} of {most}{cold}{refused}"
    if (report["idle"]["ttft_ms"]["p95"] or 0) / 1000 > cold_s + 60:
        return f"the queue built earlier is still draining at idle{refused}"
    ready = sorted({p[1] for p in points}) or [0]
    kept = f"{ready[0]}" if len(ready) == 1 else f"{ready[0]}-{ready[-1]}"
    return f"too little capacity at idle: {kept} replica(s) ready (minReplicaCount {least}){refused}"


def _misses_in_a_lull(fleet, report: dict, section: dict, most: int) -> str | None:
    """At idle a fleet can be at max most of the time and still miss mostly while it was not: a scale-down in a
    lull, then a scale-up a cold start too late. "replicas held at maxReplicaCount" was said there, and raising the
    maximum would not mend it. Says so when most misses arrived with fewer than `most` replicas ready."""
    spans = section["windows"]
    missed_at = [t for r in fleet.requests if missed(r, report["slo"])
                 for t in (r.arrival - fleet.t0,) if any(a <= t < b for a, b in spans)]
    below = sum(1 for t in missed_at if series_at(fleet.series, t)[1] < most)
    if not missed_at or below < 0.5 * len(missed_at):
        return None
    fewest = min(p[1] for p in _window_points(fleet, spans))
    return (f"replicas went down to {fewest} during the idle and {below} of its {len(missed_at)} misses came while "
            f"fewer than the {most} it had most of the time were ready: the scale-down came before the load did, "
            "and the scale-up after it")


def judge(result: SimResult) -> list[Check]:
    report = result.report
    slo = report["slo"]
    checks = []
    for window in (*WINDOWS, "all"):
        sec = _account(report, window)
        has = sec["requests"] > 0
        for metric, key, limit in (("ttft_p95_ms", "ttft_ms", slo["ttft_p95_ms"]),
                                   ("e2e_p95_ms", "e2e_ms", slo["e2e_p95_ms"])):
            value = sec[key]["p95"]
            if not has or value is None:
                ok = sec["failed"] == 0
                why = "no requests in this window" if ok else \
                    ("its one request failed" if sec["failed"] == 1 else f"all {sec['failed']} requests failed")
                checks.append(Check(window, metric, value, limit, ok, f"{window}: {metric}: {why}"))
                continue
            ok = value <= limit
            name = metric.split("_")[0].upper()
            floor = None if ok else _engine_floor(result, window, metric)
            loaded = None if ok or floor is not None or metric != "ttft_p95_ms" else load_floor_ms(result, window)
            loaded = loaded if loaded is not None and loaded > limit else None
            why = f"{window}: {name} p95 {value:.0f} ms <= {limit:.0f} ms" if ok else \
                f"{window}: {name} p95 {value:.0f} ms > {limit:.0f} ms target: " \
                f"{_cause(result, window, metric, value, floor, loaded)}"
            checks.append(Check(window, metric, value, limit, ok, why,
                                None if floor is None else round(floor, 3),  # ms, as the report's figures
                                None if loaded is None else round(loaded, 3)))
        rate, most = sec["error_rate"], slo["max_error_rate"]
        ok = rate <= most
        why = f"{window}: error rate {rate:.2%} <= {most:.2%}" if ok else \
            f"{window}: error rate {rate:.2%} > {most:.2%}: {_cause(result, window, 'error_rate')}"
        checks.append(Check(window, "error_rate", rate, most, ok, why))
        if window != "all":  # the whole trace's cost per hour is never above its costliest window's, checked at peak
            checks.append(_cost_check(result, window, slo["cost_per_hour_usd"]))
    return checks


def _cost_check(result: SimResult, window: str, budget: float | None) -> Check:
    """The budget at idle is the idle windows' cost per hour; at peak it is the costliest window's, wherever it
    falls: scaling lags the load, and a burst's replicas run on into the window after it (4 nodes at $7.44/h
    for the whole window after a burst passed a $5/h budget, the burst's own window costing $4.28/h)."""
    report = result.report
    per_hour, where = report[window]["cost_per_hour_usd"], ""
    costliest = report.get("costliest_window")
    if window == "peak" and costliest and report["cost_per_hour_max_usd"] > per_hour:
        per_hour = report["cost_per_hour_max_usd"]
        where = f" in the costliest window, {costliest[0]:.0f}-{costliest[1]:.0f} s"
    if budget is None:
        return Check(window, "cost_per_hour_usd", per_hour, None, True,
                     f"{window}: ${per_hour:.2f}/h{where} (no cost limit set)")
    ok = per_hour <= budget
    why = f"{window}: ${per_hour:.2f}/h{where} <= ${budget:.2f}/h" if ok else \
        f"{window}: cost ${per_hour:.2f}/h{where} > ${budget:.2f}/h budget: " + _overspend(result, window)
    return Check(window, "cost_per_hour_usd", per_hour, budget, ok, why)


def _overspend(result: SimResult, window: str) -> str:
    """What the money bought: a static fleet, replicas a floor held up (minReplicaCount, a schedule), replicas
    scaled for earlier load that ran on into a quieter window, or load."""
    fleet = result.fleet
    if fleet.policy_scaling is None:
        return f"a static fleet of {fleet.static} replica(s) costs more than the budget"
    report = result.report
    span = report.get("costliest_window") if window == "peak" else None
    spans = [tuple(span)] if span else report[window]["windows"]
    points = _window_points(fleet, spans)  # each stamped no earlier than its window's start: the floor then holds it
    floors = [fleet.policy_scaling.floor(fleet.t0 + p[0]) for p in points]
    held = max(floors, default=0)
    if held > 0 and all(p[2] <= f for p, f in zip(points, floors, strict=True)):
        which = "minReplicaCount" if held <= fleet.policy_scaling.min_replicas else "a schedule floor"
        return (f"{which} holds {held} replica(s) up in this window without load needing more: a lower floor "
                "(or none) at this time fits the budget")
    # most of the windows' time on nodes without a replica: a request now and then wakes one for a while
    if points and _share(fleet.series, spans, lambda p: p[2] == 0 and p[3] > 0) >= 0.5:
        return ("nodes stay up with no replica on them until consolidation removes them "
                "(capacity.consolidation: policy, consolidateAfter)")
    if window == "idle" and not _single(report):  # one window: the same account as the peak's
        policy = fleet.policy_scaling
        up = max((p[2] for p in points), default=0)
        if policy.min_replicas == 0 and up == 0:  # nothing ran: the money went on nodes without a replica
            return ("nodes stay up with no replica on them until consolidation removes them "
                    "(capacity.consolidation: policy, consolidateAfter)")
        if policy.min_replicas == 0 and up <= 1:
            # the cooldown is the cause only where a replica woken by a request is what the money bought, and
            # only where it does stop now and then: a replica never let go is the load's
            if _share(fleet.series, spans, lambda p: p[2] == 0) > 0:
                return (f"the idle requests wake replicas that run on for cooldownPeriod ({policy.cooldown:.0f} s) "
                        "after each; a shorter cooldown fits the budget, at the price of more cold starts")
            return (f"one replica stays up through the idle windows: requests come more often than cooldownPeriod "
                    f"({policy.cooldown:.0f} s) lets it stop, so scaling to zero cannot save here; a cheaper "
                    "instance type, or a budget that pays for one replica, fits")
        kept = sorted({p[2] for p in points}) or [0]
        held = f"{kept[0]}" if len(kept) == 1 else f"{kept[0]}-{kept[-1]}"
        return (f"{held} replica(s) up while idle (minReplicaCount {policy.min_replicas}, {_target(fleet)}): the "
                f"load in these windows asked for them, or the load before them did and they scale down only after "
                f"scaleDownStabilizationTime ({policy.down_window:.0f} s); a higher target per replica or a shorter "
                "stabilization fits the budget if fewer meet the latency targets")
    if span and span[0] not in {w[0] for w in report["peak"]["windows"]}:  # by its start: the last window's
        return _ran_on(result, span, points)  # end takes in the drain in one and not in the other
    reached = max((p[2] for p in points), default=0)  # the autoscaler's doing, not necessarily the load's need:
    # a 1-4 fleet at target 4 ran 4 at the peak where a fleet of 1 passed every check under the budget
    first = min(a for a, _ in spans)
    if first <= 0 and 0 < reached <= _entered(fleet, first):  # what the fleet started with: it had blamed the
        return (f"the fleet started with {reached} replica(s) (spec.replicas, raised to minReplicaCount or a "  # scaler
                "schedule's floor where those are higher) and ran no more in these windows: a lower start "
                f"(spec.replicas, or the floor that raised it) fits the budget if fewer replicas meet the latency "
                "targets")
    return (f"the autoscaler ran up to {reached} replica(s) at the peak (maxReplicaCount "
            f"{fleet.policy_scaling.max_replicas}, {_target(fleet)}): a higher target per replica or a lower "
            "maxReplicaCount fits the budget if fewer replicas meet the latency targets; otherwise the peak needs "
            "more GPUs than the budget pays for")


def _target(fleet) -> str:
    """The first trigger's target, as the autoscaler reads it."""
    triggers = fleet.policy_scaling.triggers
    if not triggers:
        return "no trigger"
    t = triggers[0]
    return f"{t.metric} target {t.target:g}" + ("/replica" if t.kind == "average" else "")


def _ran_on(result: SimResult, span, points) -> str:
    """The costliest window is not a peak window: either the fleet scaled up inside it for a burst in it (more
    replicas than the peak kept), or for load before it (scaling lags: a burst at the end of the window before
    woke replicas that came up in this one), or entered it scaled up, or it is the drain after the last arrival;
    and the replicas ran on until scale-down."""
    report, fleet = result.report, result.fleet
    policy = fleet.policy_scaling
    peak_rate = max(_rate(report, w) for w in report["peak"]["windows"])
    here = _rate(report, span)
    enter = _entered(fleet, span[0])
    up = max((p[2] for p in points), default=0)
    remedy = (f"a lower maxReplicaCount ({policy.max_replicas} now), a higher target per replica or a shorter "
              "stabilization fits the budget")
    load = "after the last arrival" if here is None else \
        f"{here:.2f} requests/s in it against {peak_rate:.2f}/s in the busiest peak window"
    w = report["windows"]["window_s"]
    before = _rate(report, (span[0] - w, span[0])) if span[0] >= w else None
    to_zero = f"; to zero after cooldownPeriod {policy.cooldown:.0f} s" if policy.min_replicas == 0 else ""
    kept = f"replicas scale down only after scaleDownStabilizationTime ({policy.down_window:.0f} s{to_zero})"
    if span[0] <= 0 and up <= enter:
        return (f"the costliest window is not a peak window ({load}): it is the first, and the fleet started with "
                f"{enter} replica(s) (spec.replicas, raised to minReplicaCount or a schedule's floor where those are "
                f"higher) and {kept}: a lower start (spec.replicas, or the floor that raised it), or {remedy}")
    if here is not None and up > enter and (before is None or here > before):
        return (f"the costliest window is not a peak window ({load}): the fleet scaled from {enter} to {up} "
                f"replica(s) in it, for a burst the autoscaler answered with more replicas than the peak kept, and "
                f"{kept}: {remedy}")
    grew = f"grew from {enter} to {up} replica(s) in it" if up > enter else f"entered it with {enter} replica(s)"
    return (f"the costliest window is not a peak window ({load}): the fleet {grew}, scaled for load before it "
            f"(scaling lags the load: polling, node provisioning, model load), and {kept}: {remedy}")


def _entered(fleet, start: float) -> int:
    """Replicas the fleet had as a window began; the first window is entered with the replicas the run starts
    with (spec.replicas): 0 there had blamed the autoscaler ("scaled from 0 to 2") for the warm start of a fleet
    that only ever scaled down."""
    return series_at(fleet.series, start - 1e-9 if start > 0 else 0.0)[2] if fleet.series else 0


def _rate(report: dict, span) -> float | None:
    """Arrivals per second in a window of the trace (by its start), or None for a drain window after the trace."""
    arrivals, w = report["windows"]["arrivals"], report["windows"]["window_s"]
    i = round(span[0] / w)
    if i >= len(arrivals):
        return None
    return arrivals[i] / max(span[1] - span[0], 1e-9)


def verify(endpoint, trace, options: SimOptions | None = None, slo: dict | None = None, progress=None) -> Verdict:
    result = simulate(endpoint, trace, options, slo, progress)
    checks = judge(result)
    return Verdict(all(c.passed for c in checks), checks, result)
