"""Server errors judged by ratio against the fleet (router/outliers.py), in the pool's virtual time."""

from fleetserve.clock import ManualClock
from fleetserve.router.outliers import AnswerWindow, OutlierSettings, is_outlier
from fleetserve.router.pool import BackendPool, BreakerSettings

S = OutlierSettings(window=20, min_answers=10, min_ratio=0.5, relative=0.5)


def window(errors: int, answers: int) -> AnswerWindow:
    w = AnswerWindow(S.window)
    for i in range(answers):
        w.record(i < errors)
    return w


def test_a_window_keeps_the_last_answers_only():
    w = window(20, 20)
    assert w.ratio == 1.0
    for _ in range(15):
        w.record(False)
    assert len(w) == 20 and w.errors == 5 and w.ratio == 0.25
    w.clear()
    assert len(w) == 0 and w.ratio == 0.0


def test_an_outlier_fails_much_and_more_than_the_healthiest_comparable_replica():
    assert is_outlier(window(10, 10), [window(0, 10)], S)
    assert not is_outlier(window(9, 9), [window(0, 10)], S)  # too few answers for a verdict
    assert not is_outlier(window(4, 10), [window(0, 10)], S)  # under min_ratio
    assert not is_outlier(window(10, 10), [window(10, 10), window(6, 10)], S)  # every one fails: the requests'
    assert is_outlier(window(10, 10), [window(10, 10), window(1, 10)], S)  # one healthy replica is enough
    assert is_outlier(window(10, 10), [window(0, 2)], S)  # a quiet other is no evidence: taken as healthy
    assert is_outlier(window(10, 10), [], S)
    assert not is_outlier(window(6, 10), [window(4, 10)], S)  # 0.4 > 0.5 x 0.6: alike enough


def test_ejections_for_server_errors_stop_at_half_of_the_replicas():
    """Three replicas of four failing everything: two go out, the third stays (Envoy's ejection cap)."""
    clock = ManualClock()
    pool = BackendPool([], breaker=BreakerSettings(outliers=S), clock=clock)
    urls = [f"http://r{i}" for i in range(4)]
    pool.set_backends(urls, ready=set(urls))
    bad = [pool.get(f"r{i}") for i in range(3)]
    good = pool.get("r3")
    for _ in range(10):
        pool.request_succeeded(good)
        for b in bad:
            pool.request_failed(b, "status 500", server_error=True)
    assert [b.breaker for b in bad] == ["open", "open", "closed"] and good.breaker == "closed"


def test_a_replica_back_from_its_breaker_is_judged_on_its_new_answers():
    clock = ManualClock()
    pool = BackendPool([], breaker=BreakerSettings(successes_to_close=2, open_seconds=60, outliers=S), clock=clock)
    pool.set_backends(["http://a", "http://b"], ready={"http://a", "http://b"})
    a, b = pool.get("a"), pool.get("b")
    for _ in range(10):
        pool.request_succeeded(b)
        pool.request_failed(a, "status 500", server_error=True)
    assert a.breaker == "open"
    clock.now += 61
    pool.request_succeeded(a)
    pool.request_succeeded(a)
    assert a.breaker == "closed" and len(a.answers) == 0
    pool.request_failed(a, "status 500", server_error=True)  # one 500 is no verdict
    assert a.breaker == "closed"
