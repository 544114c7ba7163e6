"""The scaling policy, pure: `decide(policy, state, metrics, now) -> ScaleDecision`.

KEDA semantics in one function, so that the live controller, the simulator and the Kubernetes rendering
share it:
- activation (0<->1): a trigger is active when its value is strictly greater than its activationTarget, or
  when requests are buffered at the router; requests routed to replicas since the last poll are activity too
  (they keep a serving fleet from zero, never wake one); scale to 0 only after `cooldownPeriod` without
  activity (a fleet never active since its creation: `initialCooldownPeriod` after it, as KEDA's executor)
  and only when no floor holds. A
  time-of-day floor counts as activity while it holds, as KEDA's cron trigger (which renders it) is active
  to its window's end: the countdown to zero starts when the window closes, not at the last request before
  it (else a fleet whose floor ended after a quiet spell went to zero at once, and a latency sample of a
  request served in its last seconds, seen a scrape later, woke it again from zero for nothing);
- scaling (1<->N), HPA maths: AverageValue `ceil(total / target)`, Value `ceil(current * value / target)`,
  no change within a tolerance of 0.1, the highest desired count over triggers, stabilization windows
  (scale-up: lowest recommendation in the window; scale-down: highest) and rate policies (up: +100% or
  +4 pods per 15 s, whichever is larger; down: -100% per 15 s);
- `fallback`, per trigger as KEDA (`fallback.go`, for Value triggers too since KEDA 2.18): each trigger counts
  its own failed reads in a row; one past `failureThreshold` reads as the value for which the HPA maths
  recommend `fallback.replicas`, the other triggers still count (the highest wins) and the stabilization
  windows and rate policies apply as to any recommendation. A trigger that cannot be read is never active:
  with no trigger active and one in fallback, the count is `fallback.replicas` (KEDA's executor; from zero
  too, and never zero while it fails, unless `fallback.replicas` is 0). A trigger that still fails (below
  the threshold, or without a fallback) never lets the fleet scale down: the current count holds for as
  long as it fails (never to zero: an unreadable trigger is not an idle one). The decision says
  `metrics_ready=False` while any read fails, as KEDA marks the ScaledObject not ready. No data at zero
  traffic is zero load, not a failure;
- time-of-day floors from `Schedule`, never below `minReplicaCount`.
The state is a frozen value that round-trips through JSON; decisions carry a reason string.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

from fleetserve.autoscale.schedule import Schedule, lead_minutes

TOLERANCE = 0.1
#: metric name -> HPA metric type: fleet totals are AverageValue, latencies are Value.
METRIC_KIND = {"concurrency": "average", "queue_depth": "average", "request_rate": "average",
               "ttft_p95": "value", "prometheus": "average"}


@dataclass(frozen=True)
class RatePolicy:
    kind: str  # "percent" or "pods"
    value: float
    period: float = 15.0


@dataclass(frozen=True)
class Trigger:
    metric: str
    target: float
    activation_target: float = 0.0
    metric_type: str | None = None  # the spec's KEDA metricType, over the metric's own kind (AverageValue: the
    # total over replicas; Value: the value itself, scaled by the current count, as the HPA computes each)

    @property
    def kind(self) -> str:
        if self.metric_type is not None:
            return "average" if self.metric_type == "AverageValue" else "value"
        return METRIC_KIND[self.metric]


#: what a spec whose autoscaling names no trigger scales on, in every place (KEDA refuses a ScaledObject without one)
DEFAULT_TRIGGER = Trigger("concurrency", 4.0, 0.0)


@dataclass(frozen=True)
class ScalingPolicy:
    min_replicas: int = 1
    max_replicas: int = 5
    polling_interval: float = 30.0
    cooldown: float = 300.0
    initial_cooldown: float = 300.0
    up_window: float = 0.0
    down_window: float = 300.0
    triggers: tuple[Trigger, ...] = ()
    schedule: Schedule = field(default_factory=lambda: Schedule([]))
    schedule_lead: float = 0.0  # floors rise this early, so replicas are ready when the window opens
    fallback_threshold: int | None = None
    fallback_replicas: int = 0
    tolerance: float = TOLERANCE
    up_policies: tuple[RatePolicy, ...] = (RatePolicy("percent", 100), RatePolicy("pods", 4))
    down_policies: tuple[RatePolicy, ...] = (RatePolicy("percent", 100),)

    @classmethod
    def from_spec(cls, section) -> ScalingPolicy:
        """From the spec's `autoscaling` section (fleetserve.spec.endpoint.AutoscalingSection)."""
        return cls(
            min_replicas=section.min_replica_count,
            max_replicas=section.max_replica_count,
            polling_interval=section.polling_interval,
            cooldown=section.cooldown_period,
            initial_cooldown=section.initial_cooldown_period,
            up_window=section.scale_up_stabilization_time,
            down_window=section.scale_down_stabilization_time,
            triggers=tuple(Trigger(t.metric, t.target, t.activation_target, t.metric_type)
                           for t in section.triggers)
            or (DEFAULT_TRIGGER,),
            schedule=Schedule.from_spec(section.schedules),
            schedule_lead=60.0 * lead_minutes(section.schedule_lead_time),
            fallback_threshold=section.fallback.failure_threshold if section.fallback else None,
            fallback_replicas=section.fallback.replicas if section.fallback else 0,
        )

    def floor(self, now: float) -> int:
        scheduled = 0
        if self.schedule.windows:
            scheduled = self.schedule.floor(datetime.fromtimestamp(now, UTC), self.schedule_lead)
        return min(self.max_replicas, max(self.min_replicas, scheduled))

    def floor_names(self, now: float) -> list[str]:
        """The schedule windows open now, or opening within the lead time: what `floor` reads."""
        return self.schedule.active_names(datetime.fromtimestamp(now, UTC), self.schedule_lead)


@dataclass(frozen=True)
class ScalingMetrics:
    """One poll: a value per trigger (None when the read failed) and the requests buffered at zero."""

    values: tuple[float | None, ...]
    pending: int = 0
    # requests sent to replicas since the last poll: a fleet serving is active, even when no request is in flight
    # at the poll itself (one short request every few seconds had it go to zero and cold-start over and over);
    # never a reason to wake from zero (at zero nothing is routed: what waits there is `pending`)
    routed: int = 0


@dataclass(frozen=True)
class ScalingState:
    current: int  # the replica count last decided (the scale target)
    created: float
    last_active: float | None = None
    failures: tuple[int, ...] = ()  # per trigger, its failed reads in a row
    recommendations: tuple[tuple[float, int], ...] = ()
    events: tuple[tuple[float, int], ...] = ()  # (time, change in replicas)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ScalingState:
        return cls(
            current=int(data["current"]),
            created=float(data["created"]),
            last_active=data.get("last_active"),
            failures=_failures(data.get("failures", ())),
            recommendations=tuple((float(t), int(r)) for t, r in data.get("recommendations", ())),
            events=tuple((float(t), int(d)) for t, d in data.get("events", ())),
        )

    @classmethod
    def initial(cls, policy: ScalingPolicy, replicas: int, now: float) -> ScalingState:
        """The starting count is the first recommendation: it holds for the scale-down window."""
        current = min(policy.max_replicas, max(policy.floor(now), replicas))
        return cls(current=current, created=now, recommendations=((now, current),))


def _failures(raw) -> tuple[int, ...]:
    """A saved state's failure counts; a single count (states saved before they were per trigger) is kept as
    one entry, which `decide` reads as every trigger's."""
    if isinstance(raw, int | float):
        return (int(raw),)
    return tuple(int(n) for n in raw)


@dataclass(frozen=True)
class ScaleDecision:
    desired: int
    reason: str
    active: bool
    floor: int
    state: ScalingState
    metrics_ready: bool = True  # False while a trigger cannot be read (KEDA: ScaledObject Ready=False)


def _recommend(policy: ScalingPolicy, current: int, values: tuple[float | None, ...]) -> tuple[int, str]:
    """HPA: the highest per-trigger desired count, within tolerance no change. Failed reads are skipped."""
    best, why = None, "no readable trigger"
    base = max(current, 1)
    for trig, value in zip(policy.triggers, values, strict=True):
        if value is None:
            continue
        if trig.kind == "average":
            ratio = value / (trig.target * base)
            want = base if abs(ratio - 1.0) <= policy.tolerance else math.ceil(value / trig.target)
        else:
            ratio = value / trig.target
            want = base if abs(ratio - 1.0) <= policy.tolerance else math.ceil(base * ratio)
        if best is None or want > best:
            best, why = want, f"{trig.metric}={value:g} (target {trig.target:g}/replica)" if trig.kind == "average" \
                else f"{trig.metric}={value:g} (target {trig.target:g})"
    return (base if best is None else best), why


def _stabilize(policy: ScalingPolicy, state: ScalingState, raw: int, now: float) -> tuple[int, tuple]:
    # like the HPA: a past recommendation counts while it is strictly inside the window
    past = state.recommendations
    up = min([r for t, r in past if now - t < policy.up_window] + [raw])
    down = max([r for t, r in past if now - t < policy.down_window] + [raw])
    keep = max(policy.up_window, policy.down_window)
    recs = tuple((t, r) for t, r in past if now - t < keep) + ((now, raw),)
    result = state.current
    if result < up:
        result = up
    if result > down:
        result = down
    return result, recs


def _rate_limit(policy: ScalingPolicy, state: ScalingState, desired: int, now: float) -> int:
    current = state.current
    if desired == current:
        return desired
    policies = policy.up_policies if desired > current else policy.down_policies
    limits = []
    for p in policies:
        added = sum(d for t, d in state.events if now - t < p.period and d > 0)
        removed = -sum(d for t, d in state.events if now - t < p.period and d < 0)
        start = current - added + removed
        if desired > current:
            limits.append(math.ceil(start * (1 + p.value / 100)) if p.kind == "percent" else start + int(p.value))
        else:
            limits.append(math.floor(start * (1 - p.value / 100)) if p.kind == "percent" else start - int(p.value))
    if not limits:
        return desired
    return min(desired, max(limits)) if desired > current else max(desired, min(limits))


def _fall_back(policy: ScalingPolicy, state: ScalingState,
               values: tuple[float | None, ...]) -> tuple[tuple[int, ...], tuple[float | None, ...], list[str]]:
    """KEDA's fallback (`fallback.go`; for Value triggers too since KEDA 2.18): per trigger, its failed reads in a
    row; a trigger failing more than `failureThreshold` times reads as the value that makes the HPA maths
    recommend `fallback.replicas` for it (AverageValue: replicas x target; Value: target x replicas / current).
    Returns the counts, the values with those filled in, and what was filled (for the reason)."""
    before = state.failures
    if len(before) != len(values):
        # one count (saved before they were per trigger) stands for every trigger; a changed trigger list restarts
        before = before * len(values) if len(before) == 1 else (0,) * len(values)
    counts = tuple(n + 1 if v is None else 0 for n, v in zip(before, values, strict=True))
    if policy.fallback_threshold is None:
        return counts, values, []
    filled, fell = list(values), []
    replicas, base = policy.fallback_replicas, max(state.current, 1)
    for i, (trig, n) in enumerate(zip(policy.triggers, counts, strict=True)):
        if values[i] is None and n > policy.fallback_threshold:
            filled[i] = replicas * trig.target if trig.kind == "average" else trig.target * replicas / base
            fell.append(f"{trig.metric} failed {n} reads in a row (> {policy.fallback_threshold}), "
                        f"read as {replicas} replica(s)")
    return counts, tuple(filled), fell


def decide(policy: ScalingPolicy, state: ScalingState, metrics: ScalingMetrics, now: float) -> ScaleDecision:
    floor = policy.floor(now)
    failures, values, fell = _fall_back(policy, state, metrics.values)
    ready = all(v is not None for v in metrics.values)  # KEDA: Ready=False while a read fails, fallback or not
    failed = any(v is None for v in values)  # still unknown: below the threshold, or no fallback
    # a trigger that cannot be read is never active (KEDA), whatever its fallback reads as
    fired = [t for t, v in zip(policy.triggers, metrics.values, strict=True)
             if v is not None and v > t.activation_target]
    active = metrics.pending > 0 or bool(fired)
    held = floor > policy.min_replicas  # a schedule window is open (KEDA: its cron trigger is active)
    last_active = now if active or held or metrics.routed > 0 else state.last_active
    state = replace(state, failures=failures, last_active=last_active)
    current = state.current

    def done(desired: int, reason: str, recs: tuple | None = None) -> ScaleDecision:
        desired = max(0, min(policy.max_replicas, desired))
        events = tuple((t, d) for t, d in state.events if now - t < 600)
        if desired != current:
            events += ((now, desired - current),)
        new = replace(state, current=desired, events=events,
                      recommendations=state.recommendations if recs is None else recs)
        if fell and not reason.startswith("fallback"):  # the action leads: it labels the decision (metrics)
            reason = f"{reason} (fallback: {'; '.join(fell)})"
        return ScaleDecision(desired, reason, active, floor, new, metrics_ready=ready)

    if not active and fell and policy.fallback_replicas:
        # KEDA's executor: no trigger active, a scaler in error and fallback.replicas set: scale to it (from zero
        # too), never to zero while it fails
        target = max(floor, policy.fallback_replicas)
        return done(target, f"fallback: {'; '.join(fell)}; no trigger active, so {target} replica(s)")

    if failed and not active:
        # Unknown is not idle: no activation countdown, no scale-down (to zero or otherwise) while blind.
        why = "no fallback configured" if policy.fallback_threshold is None else \
            f"the fallback waits for more than {policy.fallback_threshold} failed reads"
        return done(max(current, floor), f"holding {max(current, floor)}: {max(failures)} failed metric read(s) "
                                          f"in a row and {why} (metrics not ready)")

    if current == 0:
        if not active:
            if not floor:
                return done(0, "idle at zero: nothing waiting and no trigger above its activationTarget; the next "
                               "request wakes the fleet")
            return done(floor, f"scale up 0 -> {floor}: {_floor_label(policy, floor, now)}")
        raw, why = _recommend(policy, 1, values)
        cause = f"{metrics.pending} request(s) waiting" if metrics.pending else why
        woken = max(1, floor, raw)
        # the count woken to is a recommendation like any other: the scale-down window holds it (unrecorded, the
        # next poll scaled 2 -> 1 before either replica was ready, and back up a minute later: more cold starts)
        keep = max(policy.up_window, policy.down_window)
        recs = tuple((t, r) for t, r in state.recommendations if now - t < keep) + ((now, woken),)
        return done(woken, f"activated from zero: {cause}", recs)

    raw, why = _recommend(policy, current, values)
    if failed:
        raw = max(raw, current)  # HPA: a metric error never drives a scale-down
        why += "; a trigger failed, no scale-down"
    to_zero = ""  # what a fleet that may go to zero waits for, named while it holds (it read "steady at 1")
    if not active and floor == 0:
        # KEDA's executor (scaleToZeroOrIdle): never active since created, zero once initialCooldownPeriod has
        # passed; active once, zero cooldownPeriod after the last activity. (Counting the cooldown from the end of
        # the initial one kept an unused fleet up to cooldownPeriod longer than KEDA does.)
        if last_active is None:
            idle = now - state.created
            if idle >= policy.initial_cooldown:
                # "no activity for": the decisions' metric label (observe/vocabulary.py) reads it as the cooldown's
                return done(0, f"no activity for {idle:.0f}s since the start >= initialCooldownPeriod "
                               f"{policy.initial_cooldown:.0f}s")
            to_zero = f"initialCooldownPeriod: zero in {policy.initial_cooldown - idle:.0f}s without activity"
        else:
            idle = now - last_active
            if idle >= policy.cooldown:
                return done(0, f"no activity for {idle:.0f}s >= cooldownPeriod {policy.cooldown:.0f}s")
            to_zero = f"cooldownPeriod: zero in {policy.cooldown - idle:.0f}s without activity"
    asked = raw  # what the triggers alone want
    raw = max(raw, floor, 1)
    stabilized, recs = _stabilize(policy, state, raw, now)
    limited = _rate_limit(policy, state, stabilized, now)
    desired = max(floor, 1, min(limited, policy.max_replicas))
    if desired == current:
        reason = f"steady at {current}: {why}"
        if raw != current:  # what held it: the first of the steps that brought `raw` back to `current`
            held = ("stabilization window" if stabilized == current else "scaling rate limit" if limited == current
                    else "maxReplicaCount" if policy.max_replicas == current else "floor")
            reason += f" (wants {raw}, held by {held})"
        elif asked < current and floor >= current and floor > policy.min_replicas:
            reason += f" (held by the {_floor_label(policy, floor, now)})"
        elif to_zero:
            reason += f" ({to_zero})"
    else:
        reason = f"{'scale up' if desired > current else 'scale down'} {current} -> {desired}: {why}"
        if floor > 1 and desired == floor:
            reason += f" ({_floor_label(policy, floor, now)})"
    return done(desired, reason, recs)


def _floor_label(policy: ScalingPolicy, floor: int, now: float) -> str:
    """Which floor holds the fleet: the schedule windows open now (by name), or minReplicaCount. A reason that said
    "floor 3" left the reader to find which window of the schedule it was."""
    if floor > policy.min_replicas:
        return f"schedule floor {floor}: {', '.join(policy.floor_names(now)) or 'a window'}"
    return f"floor {floor}: minReplicaCount"
