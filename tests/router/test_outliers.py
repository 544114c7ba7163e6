"""Server errors judged by ratio against the fleet (router/outliers.py), in the pool's virtual time."""

import random

import pytest

from fleetserve.clock import ManualClock
from fleetserve.router.outliers import AnswerWindow, OutlierSettings, is_outlier
from fleetserve.router.pool import BackendPool, BreakerSettings

S = OutlierSettings()


def window(errors: int, answers: int, size: int = S.window) -> AnswerWindow:
    w = AnswerWindow(size)
    for i in range(answers):
        w.record(i < errors)
    return w


def pool_of(n: int, clock: ManualClock, **breaker) -> BackendPool:
    pool = BackendPool([], breaker=BreakerSettings(**breaker), clock=clock)
    urls = [f"http://r{i}" for i in range(n)]
    pool.set_backends(urls, ready=set(urls))
    return pool


def test_a_window_keeps_the_last_answers_only():
    w = window(20, 20, size=20)
    assert w.ratio == 1.0
    for _ in range(15):
        w.record(False)
    assert len(w) == 20 and w.errors == 5 and w.ratio == 0.25
    w.clear()
    assert len(w) == 0 and w.ratio == 0.0


def test_an_outlier_fails_much_and_clearly_more_than_the_others_pooled():
    assert is_outlier(window(10, 10), [window(0, 10)], S)  # all against none: z 4.5
    assert not is_outlier(window(9, 9), [window(0, 30)], S)  # too few answers for a verdict
    assert not is_outlier(window(4, 10), [window(0, 30)], S)  # under min_ratio
    assert not is_outlier(window(10, 10), [window(10, 10), window(6, 10)], S)  # every one fails: the requests'
    assert not is_outlier(window(10, 10), [window(0, 9)], S)  # no comparable replica: no verdict
    assert not is_outlier(window(10, 10), [], S)
    assert not is_outlier(window(10, 20), [window(6, 20), window(6, 20), window(5, 20)], S)  # 0.5 vs 0.28: noise
    assert is_outlier(window(15, 30), [window(0, 30)], S)  # half of its answers where the other fails none


@pytest.mark.parametrize("replicas,poison", [(2, 0.2), (4, 0.3), (8, 0.3), (16, 0.3), (4, 0.5)])
def test_poison_spread_over_the_fleet_ejects_no_replica(replicas, poison):
    """Requests routed at random, a share of them poison (every replica answers them 500): compared with the lowest
    other ratio over 20 answers, 30 % poison ejected replicas in every seeded run (61 ejections on 4 replicas)."""
    ejections = 0
    for seed in range(10):
        rng = random.Random(seed)
        clock = ManualClock()
        pool = pool_of(replicas, clock)
        backends = list(pool.backends.values())
        for _ in range(2000):
            clock.advance(0.05)
            b = rng.choice([b for b in backends if b.eligible] or backends)
            was = b.breaker
            if rng.random() < poison:
                pool.request_failed(b, "status 500", server_error=True)
            else:
                pool.request_succeeded(b)
            ejections += was != "open" and b.breaker == "open"
    assert ejections == 0


def test_a_replica_failing_alone_goes_out_whether_always_or_every_other_time():
    for period in (1, 2):  # every answer a 500, or every other one
        clock = ManualClock()
        pool = pool_of(4, clock)
        bad, *good = pool.backends.values()
        answers = 0
        while bad.breaker == "closed":
            answers += 1
            assert answers <= 50, period
            for b in good:
                pool.request_succeeded(b)
            if answers % period == 0:
                pool.request_failed(bad, "status 500", server_error=True)
            else:
                pool.request_succeeded(bad)
        assert all(b.breaker == "closed" for b in good)


def test_ejections_for_server_errors_stop_at_half_of_the_replicas():
    """Three replicas of four failing everything: two go out, the third stays (Envoy's ejection cap)."""
    clock = ManualClock()
    pool = pool_of(4, clock)
    bad = [pool.get(f"r{i}") for i in range(3)]
    good = pool.get("r3")
    for _ in range(30):
        pool.request_succeeded(good)
        for b in bad:
            pool.request_failed(b, "status 500", server_error=True)
    assert sorted(b.breaker for b in bad) == ["closed", "open", "open"] and good.breaker == "closed"


def test_answers_to_requests_sent_before_the_breaker_opened_neither_close_it_nor_lift_the_cap():
    """Three such answers had set it closed while it took no traffic: /health read "closed", and the cap no longer
    counted it, so a third replica of four went out."""
    clock = ManualClock()
    pool = pool_of(4, clock, successes_to_close=3, open_seconds=60)
    bad = [pool.get(f"r{i}") for i in range(3)]
    good = pool.get("r3")
    for _ in range(30):
        pool.request_succeeded(good)
        for b in bad:
            if b.breaker == "open":
                for _ in range(3):
                    pool.request_succeeded(b)  # replies to what it had been sent
            else:
                pool.request_failed(b, "status 500", server_error=True)
    assert sorted(b.breaker for b in bad) == ["closed", "open", "open"]
    assert sum(1 for b in pool.backends.values() if not b.eligible) == 2


def test_a_replica_back_from_its_breaker_is_judged_on_its_new_answers():
    clock = ManualClock()
    pool = pool_of(2, clock, successes_to_close=2, open_seconds=60)
    a, b = pool.get("r0"), pool.get("r1")
    for _ in range(10):
        pool.request_succeeded(b)
        pool.request_failed(a, "status 500", server_error=True)
    assert a.breaker == "open" and len(a.answers) == 0
    clock.advance(61)
    assert a.breaker == "half-open"
    pool.request_failed(a, "status 500", server_error=True)  # one 500 is no evidence: it stays half-open
    assert a.breaker == "half-open"
    pool.request_succeeded(a)
    pool.request_succeeded(a)
    assert a.breaker == "closed" and len(a.answers) == 0


def test_a_half_open_replica_counts_in_the_cap_and_reopening_respects_it():
    """The cap counted open breakers only: a replica half-open when two others opened reopened as an outlier,
    and three of four replicas were out."""
    clock = ManualClock()
    pool = pool_of(4, clock, open_seconds=60)
    a, b, c, d = (pool.get(f"r{i}") for i in range(4))

    def outlier(bad, good):
        for _ in range(30):
            if bad.breaker == "open":
                return
            pool.request_succeeded(good)
            pool.request_failed(bad, "status 500", server_error=True)

    outlier(a, d)
    assert a.breaker == "open"
    clock.advance(61)
    assert a.breaker == "half-open"
    outlier(b, d)
    assert b.breaker == "open"
    outlier(c, d)  # a (half-open) and b are out: the cap of 2 holds c in
    outlier(a, d)
    assert sum(1 for x in (a, b, c, d) if x.breaker == "open") <= 2
