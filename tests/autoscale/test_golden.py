"""Golden scenarios of the scaling policy, in virtual time (no clock is read, nothing sleeps)."""

import json
import math
import random
from datetime import UTC, datetime

from fleetserve.autoscale.policy import (
    ScalingMetrics,
    ScalingPolicy,
    ScalingState,
    Trigger,
    decide,
)
from fleetserve.autoscale.schedule import Schedule
from fleetserve.spec.endpoint import ScheduleFloor


class VirtualFleet:
    """Replicas that become ready `cold_start` seconds after the policy asks for them."""

    def __init__(self, policy: ScalingPolicy, now: float, replicas: int, cold_start: float = 60.0):
        self.policy = policy
        self.state = ScalingState.initial(policy, replicas, now)
        self.cold_start = cold_start
        self.ready_at: list[float] = [now] * self.state.current
        self.history: list[tuple[float, int, str]] = []

    def poll(self, now: float, *values, pending: int = 0):
        decision = decide(self.policy, self.state, ScalingMetrics(tuple(values), pending), now)
        self.state = decision.state
        while len(self.ready_at) < decision.desired:
            self.ready_at.append(now + self.cold_start)
        del self.ready_at[decision.desired:]
        self.history.append((now, decision.desired, decision.reason))
        return decision

    def ready(self, now: float) -> int:
        return sum(1 for t in self.ready_at if t <= now)


CONCURRENCY = (Trigger("concurrency", target=4.0, activation_target=0.0),)


def changes(history) -> int:
    return sum(1 for a, b in zip(history, history[1:], strict=False) if a[1] != b[1])


def test_no_two_one_oscillation_under_steady_load_near_threshold():
    policy = ScalingPolicy(min_replicas=1, max_replicas=5, polling_interval=15, triggers=CONCURRENCY)
    fleet = VirtualFleet(policy, 0.0, replicas=1)
    rng = random.Random(7)
    for step in range(240):  # one hour, a poll every 15 s; load hovers around 1 replica's worth (4)
        fleet.poll(step * 15.0, rng.uniform(3.6, 4.8))
    assert changes(fleet.history) <= 2, [h[1] for h in fleet.history]
    # without the scale-down window the same series flips 1 <-> 2 many times
    eager = VirtualFleet(ScalingPolicy(min_replicas=1, max_replicas=5, triggers=CONCURRENCY, down_window=0),
                         0.0, replicas=1)
    rng = random.Random(7)
    for step in range(240):
        eager.poll(step * 15.0, rng.uniform(3.6, 4.8))
    assert changes(eager.history) > 10


def test_burst_during_cold_start_does_not_overshoot():
    policy = ScalingPolicy(min_replicas=1, max_replicas=20, polling_interval=15, triggers=CONCURRENCY)
    fleet = VirtualFleet(policy, 0.0, replicas=1, cold_start=120.0)
    peak = 40  # 40 concurrent requests -> 10 replicas of target 4
    for step in range(40):
        now = step * 15.0
        # while replicas are cold, load stays at the burst level; the total does not shrink
        fleet.poll(now, float(peak))
    desired = [h[1] for h in fleet.history]
    assert max(desired) == math.ceil(peak / 4)
    assert desired == sorted(desired)  # monotone: never up-down-up while replicas start
    # rate policy: at most max(+100%, +4) per 15 s
    assert desired[0] == 5 and desired[1] == 10


def test_burst_at_zero_activates_on_buffered_requests_at_once():
    policy = ScalingPolicy(min_replicas=0, max_replicas=4, triggers=CONCURRENCY, cooldown=300)
    fleet = VirtualFleet(policy, 0.0, replicas=0)
    assert fleet.poll(0.0, 0.0).desired == 0
    d = fleet.poll(30.0, 0.0, pending=3)  # requests wait in the router: that alone activates
    assert d.desired == 1 and d.active and "3 request(s) waiting" in d.reason


def test_the_count_woken_to_from_zero_is_held_by_the_scale_down_window():
    """Woken to 2 by a queue of 5, the next poll (queue 3 at target 3) scaled to 1 before either replica was
    ready, and back to 2 a minute later; from 1 replica the same reads are held at 2 by the window."""
    queue = (Trigger("queue_depth", target=3.0, activation_target=0.0),)
    policy = ScalingPolicy(min_replicas=0, max_replicas=2, triggers=queue, cooldown=60, down_window=300)
    fleet = VirtualFleet(policy, 1000.0, replicas=0)
    assert fleet.poll(1000.0, 5.0, pending=5).desired == 2
    for now in (1030.0, 1060.0, 1290.0):
        decision = fleet.poll(now, 3.0)
        assert decision.desired == 2 and "held by stabilization window" in decision.reason, decision.reason
    assert fleet.poll(1301.0, 3.0).desired == 1  # the window has passed


def test_a_count_the_schedule_floor_holds_names_the_window():
    """Inside a schedule window with no load the reason read "steady at 2: concurrency=0", not what held the 2."""
    floors = [ScheduleFloor(name="allday", timezone="UTC", start="0 8 * * *", end="0 20 * * *", min_replicas=2)]
    policy = ScalingPolicy(min_replicas=0, max_replicas=4, triggers=CONCURRENCY, schedule=Schedule.from_spec(floors))
    noon = datetime(2026, 1, 6, 12, tzinfo=UTC).timestamp()
    fleet = VirtualFleet(policy, noon, replicas=2)
    decision = fleet.poll(noon, 0.0)
    assert decision.desired == 2 and decision.reason.endswith("(held by the schedule floor 2: allday)"), decision.reason


def test_activation_is_strictly_greater_than():
    policy = ScalingPolicy(min_replicas=0, max_replicas=4, triggers=(Trigger("concurrency", 4.0, 1.0),))
    fleet = VirtualFleet(policy, 0.0, replicas=0)
    asleep = fleet.poll(0.0, 1.0)
    assert asleep.desired == 0  # equal to activationTarget: stays asleep, and says what wakes it
    assert asleep.reason.startswith("idle at zero: nothing waiting and no trigger above its activationTarget")
    assert fleet.poll(30.0, 1.5).desired == 1


def test_traffic_falling_to_zero_waits_for_cooldown():
    policy = ScalingPolicy(min_replicas=0, max_replicas=5, cooldown=300, initial_cooldown=0, triggers=CONCURRENCY)
    fleet = VirtualFleet(policy, 0.0, replicas=3)
    fleet.poll(0.0, 12.0)  # last activity at t=0
    for now in range(30, 300, 30):
        d = fleet.poll(float(now), 0.0)
        assert d.desired >= 1, (now, d.reason)
    d = fleet.poll(300.0, 0.0)
    assert d.desired == 0 and "cooldownPeriod" in d.reason


def test_a_fleet_held_at_one_by_the_cooldown_or_the_initial_cooldown_says_which_and_for_how_long():
    """An idle fleet of one on its way to zero read "steady at 1: concurrency=0" for the whole countdown, while other
    holds (a stabilization window, a schedule floor) were named."""
    policy = ScalingPolicy(min_replicas=0, max_replicas=5, cooldown=60, initial_cooldown=100, triggers=CONCURRENCY)
    fleet = VirtualFleet(policy, 0.0, replicas=1)
    assert fleet.poll(30.0, 0.0).reason == ("steady at 1: concurrency=0 (target 4/replica) (initialCooldownPeriod: "
                                            "zero in 70s without activity)")
    assert fleet.poll(100.0, 0.0).desired == 0  # never active: zero when the initial cooldown ends, as KEDA
    busy = VirtualFleet(policy, 0.0, replicas=1)
    assert "cooldownPeriod" not in busy.poll(130.0, 2.0).reason  # active: no countdown
    assert busy.poll(160.0, 0.0).reason.endswith("(cooldownPeriod: zero in 30s without activity)")
    assert busy.poll(190.0, 0.0).desired == 0


def test_initial_cooldown_counts_only_for_a_fleet_never_active_as_kedas_executor():
    """KEDA's scaleToZeroOrIdle: no LastActiveTime -> zero at creation + initialCooldownPeriod; a LastActiveTime ->
    zero at it + cooldownPeriod, whatever the initial cooldown. The countdown had started only when the initial
    cooldown ended: a fleet busy at 10 s went to zero at 610 s where KEDA takes it there at 310 s."""
    policy = ScalingPolicy(min_replicas=0, max_replicas=3, cooldown=300, initial_cooldown=300, triggers=CONCURRENCY)
    fleet = VirtualFleet(policy, 0.0, replicas=1)
    assert fleet.poll(10.0, 3.0).active
    assert fleet.poll(300.0, 0.0).desired == 1
    assert fleet.poll(310.0, 0.0).desired == 0
    idle = VirtualFleet(policy, 0.0, replicas=1)
    assert idle.poll(290.0, 0.0).reason.endswith("(initialCooldownPeriod: zero in 10s without activity)")
    zero = idle.poll(300.0, 0.0)
    from fleetserve.observe.vocabulary import decision_reason

    # counted as the scale to zero it is (it had been "other": no dashboard mark, no counts in the log)
    assert zero.desired == 0 and decision_reason(zero.reason) == "cooldownPeriod elapsed"


def test_traffic_falling_keeps_the_floor():
    policy = ScalingPolicy(min_replicas=2, max_replicas=5, cooldown=60, triggers=CONCURRENCY)
    fleet = VirtualFleet(policy, 0.0, replicas=4)
    fleet.poll(0.0, 16.0)  # busy, then nothing
    for now in range(30, 3600, 30):
        d = fleet.poll(float(now), 0.0)
    assert d.desired == 2
    # scale-down waited for the 300 s stabilization window
    first_down = next(t for t, r, _ in fleet.history if r < 4)
    assert first_down >= 300


def _seoul_schedule():
    floors = [ScheduleFloor(name="business-hours", timezone="Asia/Seoul", start="0 9 * * 1-5", end="0 18 * * 1-5",
                            min_replicas=2)]
    return Schedule.from_spec(floors)


def test_nightly_zero_then_0900_ramp_with_floor_ready_before_0900():
    cold_start = 120.0
    policy = ScalingPolicy(min_replicas=0, max_replicas=6, cooldown=300, initial_cooldown=0, triggers=CONCURRENCY,
                           schedule=_seoul_schedule(), schedule_lead=300.0)
    # Monday 2026-11-30 17:00 Seoul = 08:00 UTC; run through the night to Tuesday 09:30 Seoul
    start = datetime(2026, 11, 30, 8, 0, tzinfo=UTC).timestamp()
    fleet = VirtualFleet(policy, start, replicas=2, cold_start=cold_start)
    nine_tuesday = datetime(2026, 12, 1, 0, 0, tzinfo=UTC).timestamp()  # 09:00 Seoul
    night_zero_seen = False
    for step in range(int((nine_tuesday + 1800 - start) // 30)):
        now = start + step * 30
        load = 3.0 if now < start + 3600 else 0.0  # traffic until 18:00 Seoul, then none
        d = fleet.poll(now, load)
        if now < start + 3600:
            assert d.desired >= 2
        if start + 3600 + 300 + 60 < now < nine_tuesday - 600:
            assert d.desired == 0, d.reason  # night: zero, after the cooldown
            night_zero_seen = True
    assert night_zero_seen
    assert fleet.ready(nine_tuesday) >= 2  # the floor is ready when the window opens
    ramp = next(t for t, r, _ in fleet.history if t > start + 7200 and r >= 2)
    assert ramp <= nine_tuesday - cold_start
    # the ramp from zero names its window, and the night's zero says what wakes the fleet
    reasons = {r for t, d, r in fleet.history}
    assert "scale up 0 -> 2: schedule floor 2: business-hours" in reasons, reasons
    assert any(r.startswith("no activity for") for r in reasons)
    assert any(r.startswith("idle at zero: ") for r in reasons)


def test_schedule_is_dst_correct():
    floors = [ScheduleFloor(name="ny", timezone="America/New_York", start="0 9 * * *", end="0 17 * * *",
                            min_replicas=3)]
    schedule = Schedule.from_spec(floors)
    # 09:30 New York is 14:30 UTC in winter (EST) and 13:30 UTC in summer (EDT)
    assert schedule.floor(datetime(2026, 1, 15, 14, 30, tzinfo=UTC)) == 3
    assert schedule.floor(datetime(2026, 1, 15, 13, 30, tzinfo=UTC)) == 0
    assert schedule.floor(datetime(2026, 7, 15, 13, 30, tzinfo=UTC)) == 3
    # the Sunday of the spring change (2026-03-08): 09:30 EDT = 13:30 UTC
    assert schedule.floor(datetime(2026, 3, 8, 13, 30, tzinfo=UTC)) == 3


def test_overlapping_windows_are_rejected():
    import pytest

    from fleetserve.autoscale.schedule import ScheduleError

    floors = [
        ScheduleFloor(name="day", timezone="UTC", start="0 8 * * *", end="0 18 * * *", min_replicas=2),
        ScheduleFloor(name="late", timezone="UTC", start="0 17 * * *", end="0 22 * * *", min_replicas=1),
    ]
    with pytest.raises(ScheduleError, match="'day' and 'late' overlap"):
        Schedule.from_spec(floors)
    # the check looked at 8 days only: yearly (and monthly) windows that overlap passed
    def floor(name, start, end, tz="UTC"):
        return ScheduleFloor(name=name, timezone=tz, start=start, end=end, min_replicas=1)

    for first, second in ((floor("xmas", "0 0 24 12 *", "0 0 27 12 *"), floor("boxing", "0 0 25 12 *", "0 0 28 12 *")),
                          (floor("leap", "0 0 29 2 *", "0 18 29 2 *"), floor("feb", "0 12 29 2 *", "0 20 29 2 *")),
                          (floor("month-end", "0 20 28-31 * *", "0 23 28-31 * *"), floor("on-the-31st", "0 22 31 * *",
                                                                                           "30 22 31 * *"))):
        with pytest.raises(ScheduleError, match=f"'{first.name}' and '{second.name}' overlap|"
                                                f"'{second.name}' and '{first.name}' overlap"):
            Schedule.from_spec([first, second])
    apart = [floor("xmas", "0 0 24 12 *", "0 0 25 12 *"), floor("boxing", "0 0 26 12 *", "0 0 27 12 *"),
             floor("new-year", "0 18 31 12 *", "0 6 1 1 *", "Asia/Seoul")]
    assert Schedule.from_spec(apart).floor(datetime(2026, 12, 24, 12, tzinfo=UTC)) == 1


def test_windows_of_one_name_are_refused_and_errors_name_start_or_end():
    """Two windows named alike were never compared for overlap (the sweep compared names), and a bad cron said
    neither which of start and end it was nor the names a day may take."""
    import pytest

    from fleetserve.autoscale.schedule import ScheduleError

    def floor(start, end, name="x"):
        return ScheduleFloor(name=name, timezone="UTC", start=start, end=end, min_replicas=1)

    with pytest.raises(ScheduleError, match=r"schedules\[1\]\.name: 'x' is schedules\[0\]'s name too"):
        Schedule.from_spec([floor("0 9 * * *", "0 18 * * *"), floor("0 10 * * *", "0 11 * * *")])
    with pytest.raises(ScheduleError, match=r"schedules\[0\]\.end: day of week: 'fry' .*sun, mon"):
        Schedule.from_spec([floor("0 9 * * mon", "0 18 * * fry")])
    with pytest.raises(ScheduleError, match=r"schedules\[0\]\.start: hour: '25' is outside 0-23"):
        Schedule.from_spec([floor("0 25 * * *", "0 18 * * *")])


def test_a_window_whose_starts_and_ends_do_not_alternate_is_refused_as_keda_would_read_it_otherwise():
    """KEDA's cron scaler reads a window by its next start and end, fleetserve (and the simulator) by the last
    ones: a start every 30 minutes until an end at 18:00 was active all day here and never on Kubernetes."""
    import pytest

    from fleetserve.autoscale.schedule import ScheduleError

    def floor(start, end):
        return ScheduleFloor(name="x", timezone="UTC", start=start, end=end, min_replicas=1)

    with pytest.raises(ScheduleError, match=r"schedules\[0\]: its start fires at .* and again at .* with no end"):
        Schedule.from_spec([floor("*/30 9-17 * * *", "0 18 * * *")])
    with pytest.raises(ScheduleError, match=r"its start fires .* no end between"):  # a Saturday start, no end
        Schedule.from_spec([floor("0 9 * * *", "0 17 * * 1-5")])
    with pytest.raises(ScheduleError, match=r"its end fires .* no start between"):
        Schedule.from_spec([floor("0 9 * * 1-5", "0 17 * * *")])
    assert Schedule.from_spec([floor("0 9 * * 1-5", "0 17 * * 1-5")]).floor(datetime(2026, 12, 7, 10, tzinfo=UTC)) == 1
    assert Schedule.from_spec([floor("0 22 * * *", "0 6 * * *")])  # across midnight: they still alternate
    in_the_gap = ScheduleFloor(name="x", timezone="Europe/Berlin", start="30 2 * * *", end="0 3 * * *", min_replicas=1)
    with pytest.raises(ScheduleError, match="out of the hour the change to or from daylight saving time skips"):
        Schedule.from_spec([in_the_gap])  # 02:30 does not occur on the spring change: the message says why


def test_spec_errors_inside_a_section_carry_the_fields_path():
    from fleetserve.spec import SpecError, load_spec_text

    spec = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: s}
spec:
  model: {source: "builtin:smollm2-135m"}
  autoscaling: {minReplicaCount: 0, schedules: [{name: x, start: "0 9 * * mon-fry", end: "0 18 * * *", minReplicas: 1}]}
"""
    import pytest

    with pytest.raises(SpecError) as bad:
        load_spec_text(spec)
    (problem,) = bad.value.problems
    assert problem.path == "spec.autoscaling.schedules[0].start" and problem.message.startswith("day of week")
    with pytest.raises(SpecError) as no_buffer:  # a fleet at zero wakes on held requests: none could be held
        load_spec_text(spec.replace('"0 9 * * mon-fry"', '"0 9 * * *"') + "  router: {bufferSize: 0}\n")
    (problem,) = no_buffer.value.problems
    assert problem.path == "spec.router.bufferSize" and "none wakes the fleet" in problem.message


def test_metrics_source_down_triggers_fallback():
    policy = ScalingPolicy(min_replicas=1, max_replicas=8, triggers=CONCURRENCY, fallback_threshold=3,
                           fallback_replicas=4)
    fleet = VirtualFleet(policy, 0.0, replicas=2)
    fleet.poll(0.0, 8.0)
    reasons = [fleet.poll(15.0 * i, None) for i in range(1, 6)]
    assert [d.desired for d in reasons[:3]] == [2, 2, 2]  # failures below the threshold: hold, never scale down
    assert reasons[3].desired == 4 and "fallback" in reasons[3].reason
    back = fleet.poll(100.0, 8.0)  # the source recovers: normal scaling again
    assert "fallback" not in back.reason and back.state.failures == (0,)


def test_fallback_is_per_trigger_and_the_highest_recommendation_still_wins_like_keda():
    """KEDA's fallback.go replaces the failing trigger's metric with fallback.replicas x target; the HPA still
    takes the highest recommendation over triggers, so a healthy trigger asking for more keeps its count."""
    triggers = (Trigger("concurrency", 4.0), Trigger("request_rate", 2.0))
    policy = ScalingPolicy(min_replicas=1, max_replicas=10, triggers=triggers, fallback_threshold=2,
                           fallback_replicas=2)
    fleet = VirtualFleet(policy, 0.0, replicas=2)
    for i in range(6):
        d = fleet.poll(15.0 * i, None, 12.0)  # concurrency unreadable, 12 req/s asks for 6
    assert d.desired == 6 and "(fallback: concurrency failed 6 reads in a row (> 2)" in d.reason
    assert d.reason.startswith("steady at 6")  # the action leads: it labels the decision in the metrics
    from fleetserve.observe.vocabulary import decision_reason
    assert decision_reason(d.reason) == "steady"  # was "fallback" for every decision while one trigger failed
    assert d.state.failures == (6, 0) and not d.metrics_ready


def test_failures_count_per_trigger_so_alternating_failures_never_fall_back():
    triggers = (Trigger("concurrency", 4.0), Trigger("request_rate", 2.0))
    policy = ScalingPolicy(min_replicas=1, max_replicas=10, triggers=triggers, fallback_threshold=1,
                           fallback_replicas=9)
    fleet = VirtualFleet(policy, 0.0, replicas=3)
    for i in range(8):
        d = fleet.poll(15.0 * i, *((None, 6.0) if i % 2 else (12.0, None)))
        assert "fallback" not in d.reason and d.desired == 3
    assert max(d.state.failures) == 1


def test_a_value_trigger_falls_back_too_as_since_keda_2_18():
    policy = ScalingPolicy(min_replicas=0, max_replicas=8, triggers=(Trigger("ttft_p95", 500.0),),
                           fallback_threshold=1, fallback_replicas=6, cooldown=60, initial_cooldown=0)
    fleet = VirtualFleet(policy, 0.0, replicas=2)
    decisions = [fleet.poll(15.0 * i, None) for i in range(1, 20)]
    assert decisions[0].desired == 2 and "holding 2" in decisions[0].reason  # below the threshold: held
    assert {d.desired for d in decisions[1:]} == {6} and decisions[-1].reason.startswith("fallback: ttft_p95")


def test_a_failing_trigger_is_never_activity_and_never_lets_the_fleet_reach_zero():
    """Its fallback value at or under activationTarget scaled the fleet to zero while the read kept failing."""
    policy = ScalingPolicy(min_replicas=0, max_replicas=8, triggers=(Trigger("concurrency", 4.0, 10.0),),
                           fallback_threshold=2, fallback_replicas=2, cooldown=60, initial_cooldown=0)
    fleet = VirtualFleet(policy, 0.0, replicas=3)
    decisions = [fleet.poll(15.0 * i, None) for i in range(40)]
    assert min(d.desired for d in decisions) == 2 and decisions[-1].desired == 2
    assert all(not d.active for d in decisions)  # KEDA: an erroring scaler is not active


def test_at_zero_a_trigger_in_fallback_scales_to_fallback_replicas_like_kedas_executor():
    policy = ScalingPolicy(min_replicas=0, max_replicas=8, triggers=CONCURRENCY, fallback_threshold=1,
                           fallback_replicas=3, cooldown=60, initial_cooldown=0)
    fleet = VirtualFleet(policy, 0.0, replicas=0)
    decisions = [fleet.poll(15.0 * i, None) for i in range(4)]
    assert [d.desired for d in decisions] == [0, 3, 3, 3]  # the second failed read passes failureThreshold 1
    zero = ScalingPolicy(min_replicas=0, max_replicas=8, triggers=CONCURRENCY, fallback_threshold=1,
                         fallback_replicas=0, cooldown=60, initial_cooldown=0)
    fleet = VirtualFleet(zero, 0.0, replicas=2)
    assert [fleet.poll(15.0 * i, None) for i in range(12)][-1].desired == 0  # fallback.replicas 0: KEDA's zero


def test_falling_back_below_the_current_count_waits_for_the_scale_down_window():
    """While another trigger is active the HPA decides, and its stabilization applies to the fallback as to any
    recommendation."""
    triggers = (Trigger("concurrency", 4.0), Trigger("request_rate", 100.0))
    policy = ScalingPolicy(min_replicas=1, max_replicas=8, triggers=triggers, fallback_threshold=1,
                           fallback_replicas=2, down_window=300)
    fleet = VirtualFleet(policy, 0.0, replicas=6)
    fleet.poll(0.0, 24.0, 1.0)
    steps = [(15.0 * i, fleet.poll(15.0 * i, None, 1.0).desired) for i in range(1, 30)]
    assert all(n == 6 for t, n in steps if t < 300) and steps[-1][1] == 2


def test_a_changed_trigger_list_starts_its_failure_counts_afresh():
    policy = ScalingPolicy(triggers=(Trigger("concurrency", 4.0), Trigger("request_rate", 2.0),
                                     Trigger("queue_depth", 4.0)), fallback_threshold=2, fallback_replicas=5,
                           max_replicas=8)
    state = ScalingState(current=3, created=0.0, failures=(5, 0))
    d = decide(policy, state, ScalingMetrics((1.0, 1.0, None)), 10.0)
    assert d.state.failures == (0, 0, 1) and "fallback" not in d.reason


def test_a_state_saved_with_one_failure_count_reads_as_every_triggers():
    state = ScalingState.from_json({"current": 3, "created": 0.0, "failures": 4})
    policy = ScalingPolicy(triggers=(Trigger("concurrency", 4.0), Trigger("request_rate", 2.0)),
                           fallback_threshold=4, fallback_replicas=5, max_replicas=8)
    d = decide(policy, state, ScalingMetrics((None, None)), 10.0)
    assert d.state.failures == (5, 5) and d.desired == 5 and d.reason.startswith("fallback")


def test_every_trigger_failing_without_fallback_holds_the_count_like_keda():
    """Unreadable is not idle: no scale to zero after the cooldown, and the decision says metrics not ready."""
    policy = ScalingPolicy(min_replicas=0, max_replicas=8, triggers=CONCURRENCY, cooldown=60, initial_cooldown=0)
    fleet = VirtualFleet(policy, 0.0, replicas=3)
    fleet.poll(0.0, 12.0)
    held = [fleet.poll(15.0 * i, None) for i in range(1, 60)]  # 15 minutes of failed reads, 15x the cooldown
    assert {d.desired for d in held} == {3}
    assert not any(d.metrics_ready for d in held) and "metrics not ready" in held[-1].reason
    back = fleet.poll(1000.0, 0.0)  # readable again and idle: the cooldown counts from the last activity
    assert back.metrics_ready and back.desired == 0


def test_no_data_at_zero_traffic_is_zero_load_not_a_failure():
    policy = ScalingPolicy(min_replicas=0, max_replicas=3, triggers=CONCURRENCY, fallback_threshold=1,
                           fallback_replicas=2, cooldown=60, initial_cooldown=0)
    fleet = VirtualFleet(policy, 0.0, replicas=1)
    for i in range(10):
        d = fleet.poll(30.0 * i, 0.0)
    assert d.desired == 0 and d.state.failures == (0,)


def test_state_round_trips_through_json():
    policy = ScalingPolicy(triggers=CONCURRENCY)
    fleet = VirtualFleet(policy, 0.0, replicas=1)
    fleet.poll(0.0, 9.0)
    fleet.poll(15.0, 2.0)
    state = fleet.state
    assert ScalingState.from_json(json.loads(json.dumps(state.to_json()))) == state


def test_a_floor_is_activity_so_the_cooldown_starts_when_its_window_closes():
    """KEDA renders a floor as a cron trigger, active to its window's end: a quiet fleet at its floor goes to zero
    one cooldownPeriod after the window closes, not at the close (the last request was long before)."""
    policy = ScalingPolicy(min_replicas=0, max_replicas=6, cooldown=300, initial_cooldown=0, triggers=CONCURRENCY,
                           schedule=_seoul_schedule())
    start = datetime(2026, 11, 30, 8, 0, tzinfo=UTC).timestamp()  # Monday 17:00 Seoul, window until 18:00
    fleet = VirtualFleet(policy, start, replicas=2)
    fleet.poll(start, 1.0)  # the last request of the day, an hour before the window closes
    closes = start + 3600
    for now in range(int(start) + 30, int(closes + 900), 30):
        fleet.poll(float(now), 0.0)
    last_held = max(t for t, _, _ in fleet.history if t < closes)  # the last poll inside the window
    zero_at, _, why = next(h for h in fleet.history if h[1] == 0)
    assert zero_at == last_held + 300 and "cooldownPeriod" in why
    assert all(r == 2 for t, r, _ in fleet.history if t < zero_at)
    assert all(r == 0 for t, r, _ in fleet.history if t >= zero_at)


def test_a_trigger_s_metric_type_is_the_one_kubernetes_renders():
    """`metricType: Value` went into the KEDA ScaledObject while the local controller and the simulator kept the
    metric's own AverageValue: 20 requests in flight on 2 replicas at a target of 4 ask the HPA for 10 replicas
    (2 x 20 / 4; its scale-up policy lets 2 become 6 in one step), and they asked 5 here."""
    from fleetserve.spec.load import load_spec_data

    def policy(metric_type):
        trigger = {"metric": "concurrency", "target": 4, **({"metricType": metric_type} if metric_type else {})}
        spec = {"model": {"source": "builtin:smollm2-135m"}, "replicas": 2,
                "autoscaling": {"minReplicaCount": 1, "maxReplicaCount": 20, "triggers": [trigger]}}
        endpoint = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "m"},
                                   "spec": spec}).endpoint
        return ScalingPolicy.from_spec(endpoint.spec.autoscaling)

    wanted = {}
    for metric_type in (None, "AverageValue", "Value"):
        p = policy(metric_type)
        state = ScalingState.initial(p, 2, 0.0)
        wanted[metric_type] = decide(p, state, ScalingMetrics((20.0,), 0), 0.0).desired
    assert wanted == {None: 5, "AverageValue": 5, "Value": 6}


def test_a_steady_decision_names_what_held_it():
    """6 requests in flight at target 2 on a fleet at its max of 2 read "held by stabilization window": it was
    maxReplicaCount. A scale-down the window holds still names the window."""
    t0 = 1_000_000.0
    at_max = VirtualFleet(ScalingPolicy(min_replicas=1, max_replicas=2, triggers=(Trigger("concurrency", 2.0, 0.0),)),
                          t0, 2)
    assert at_max.poll(t0 + 30, 6.0).reason.endswith("(wants 3, held by maxReplicaCount)")
    cooling = VirtualFleet(ScalingPolicy(min_replicas=1, max_replicas=4, triggers=CONCURRENCY), t0, 3)
    cooling.poll(t0 + 30, 12.0)
    assert cooling.poll(t0 + 60, 4.0).reason.endswith("(wants 1, held by stabilization window)")


def test_a_window_shorter_than_the_lead_holds_its_floor_through_the_whole_lead():
    """The floor read only `now` and `now + lead`: a 12:00-12:02 window with a 300 s lead gave 2 at 11:55-11:56,
    0 at 11:57-11:59 (both instants outside the window) and 2 again at 12:00, so a fleet went to zero just before
    the window it was meant to be warm for. It holds from start - lead to the end now, as the Kubernetes cron
    trigger whose start is moved earlier does."""
    floors = [ScheduleFloor(name="rush", timezone="UTC", start="0 12 * * *", end="2 12 * * *", min_replicas=2)]
    policy = ScalingPolicy(min_replicas=0, max_replicas=4, cooldown=60, initial_cooldown=0, triggers=CONCURRENCY,
                           schedule=Schedule.from_spec(floors), schedule_lead=300.0)
    at = {m: datetime(2026, 12, 7, 11, 54, tzinfo=UTC).timestamp() + 60 * m for m in range(10)}  # 11:54 .. 12:03
    floors_by_minute = [policy.floor(at[m]) for m in range(10)]
    assert floors_by_minute == [0, 2, 2, 2, 2, 2, 2, 2, 0, 0], floors_by_minute
    assert policy.floor_names(at[4]) == ["rush"]  # 11:58: the decision names the window it prepares for


def test_a_lead_of_part_of_a_minute_raises_the_floor_as_early_as_kubernetes_does():
    """Cron fires on minutes: KEDA's trigger moved a 90 s lead to 2 minutes, while the live autoscaler and the
    simulator raised the floor 90 s early. All three round the lead up to whole minutes now."""
    from fleetserve.spec.endpoint import AutoscalingSection

    section = AutoscalingSection.model_validate({
        "minReplicaCount": 0, "maxReplicaCount": 4, "scheduleLeadTime": 90,
        "schedules": [{"name": "rush", "timezone": "UTC", "start": "0 12 * * *", "end": "0 13 * * *",
                       "minReplicas": 2}]})
    policy = ScalingPolicy.from_spec(section)
    assert policy.schedule_lead == 120
    noon = datetime(2026, 12, 7, 12, 0, tzinfo=UTC).timestamp()
    assert policy.floor(noon - 119) == 2 and policy.floor(noon - 121) == 0


def test_requests_routed_between_polls_hold_off_the_cooldown_to_zero_but_never_wake_a_fleet():
    """One short request every 7 s, none in flight at most 2 s polls: the fleet went to zero every cooldownPeriod
    (20 s) and the next request waited for a cold start, five times in 150 s (found in a black-box pass). Requests
    routed since the last poll are activity; at zero nothing is routed, and what waits there is `pending`."""
    from fleetserve.autoscale.policy import ScalingMetrics, ScalingPolicy, ScalingState, Trigger, decide

    policy = ScalingPolicy(min_replicas=0, max_replicas=3, cooldown=20.0, initial_cooldown=10.0,
                           triggers=(Trigger("concurrency", 2.0),))
    state = ScalingState.initial(policy, 1, 0.0)
    for t in range(2, 150, 2):  # a request routed every 7 s, never in flight at a poll
        routed = 1 if t % 7 in (0, 1) else 0
        decision = decide(policy, state, ScalingMetrics((0.0,), 0, routed), float(t))
        state = decision.state
        assert decision.desired == 1, (t, decision.reason)
    zero_at = None
    for t in range(150, 200, 2):  # then silence: zero after cooldownPeriod from the last routed request (147 s)
        decision = decide(policy, state, ScalingMetrics((0.0,), 0, 0), float(t))
        state = decision.state
        if decision.desired == 0 and zero_at is None:
            zero_at = t
            assert "no activity" in decision.reason
    assert zero_at == 168
    # at zero, a count of routed requests (a stale reading) wakes nothing; a held request does
    assert decide(policy, state, ScalingMetrics((0.0,), 0, 5), 300.0).desired == 0
    assert decide(policy, state, ScalingMetrics((0.0,), 1, 0), 300.0).desired == 1


def test_the_routers_load_report_gives_the_requests_routed_since_the_last_poll():
    from fleetserve.autoscale.policy import ScalingPolicy, Trigger
    from fleetserve.autoscale.signals import metrics_from_load

    policy = ScalingPolicy(min_replicas=0, triggers=(Trigger("concurrency", 2.0),))
    load = {"pending": 0, "in_flight": 0, "waiting": 0, "requests_total": 10, "routed_total": 12, "ttft_p95_ms": 0}
    first, reading = metrics_from_load(policy, load, None, 0.0)
    assert first.routed == 0  # nothing to compare with yet
    second, _ = metrics_from_load(policy, {**load, "requests_total": 13, "routed_total": 16}, reading, 2.0)
    assert second.routed == 4 and second.values == (0.0,)
    third, _ = metrics_from_load(policy, None, reading, 4.0)  # an unread report: no activity claimed
    assert third.routed == 0
