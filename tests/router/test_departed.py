"""The series of replicas that left: kept a while (the scrapes read their last increments), then gone."""

from prometheus_client import generate_latest

from fleetserve.clock import ManualClock
from fleetserve.observe.metrics import ModelIdentity, child
from fleetserve.router.departed import RETAIN_S, Departures
from fleetserve.router.gateway import Gateway, RouterSettings
from fleetserve.router.pool import BackendPool
from fleetserve.router.workers import _LiveBackendsOnly


def test_departures_expire_after_the_time_and_a_label_in_use_again_is_kept():
    d = Departures(retain_s=100)
    assert d.update({"a:1": "r0", "b:2": "r1"}, 0) == ([], [])
    assert d.update({"b:2": "r1"}, 10) == ([], [])  # a left at 10
    assert d.kept() == (frozenset({"a:1", "b:2"}), frozenset({"r0", "r1"}))
    assert d.update({"b:2": "r1"}, 109) == ([], [])
    assert d.update({"b:2": "r1"}, 110) == (["a:1"], ["r0"])
    assert d.kept() == (frozenset({"b:2"}), frozenset({"r1"}))
    d.update({"c:3": "r1"}, 120)  # r1 restarted on a new port: b left, its label lives on
    assert d.update({"c:3": "r1"}, 220) == (["b:2"], [])
    d.update({"c:3": "r1", "d:4": "r2"}, 230)
    d.update({"c:3": "r1"}, 240)
    assert d.update({"c:3": "r1", "d:4": "r2"}, 400) == ([], [])  # back within the time: never gone
    d.update({"c:3": "r1", "d:4": "r5"}, 500)  # a new replica given r2's freed port: r2's label is gone
    assert d.update({"c:3": "r1", "d:4": "r5"}, 600) == ([], ["r2"])
    assert d.kept() == (frozenset({"c:3", "d:4"}), frozenset({"r1", "r5"}))


def scrape(gw: Gateway) -> str:
    gw.refresh_gauges()
    return generate_latest(gw.metrics_registry()).decode()


def test_the_counters_of_a_replica_that_left_go_after_the_time_in_one_router_process():
    """They stayed for good: every replica brought back from zero on a new port, every pod on Kubernetes, added a
    set of series (the cached-token feedback, ejections, the model_* series per replica) to the router's /metrics."""
    clock = ManualClock()
    pool = BackendPool(["http://10.0.0.1:8000", "http://10.0.0.2:8000"], clock=clock)
    gw = Gateway(pool, RouterSettings(model_identity=ModelIdentity("ns", "m", "1", "local")))
    for backend in pool.backends.values():
        child(gw.metrics.backend_cached_tokens, backend.id, "reported").inc(5)
        child(gw.metrics.backend_prompt_tokens, backend.id).inc(9)
        gw.metrics.ejections.labels(backend.id, "breaker").inc()
        gw._ejected.add(backend.id)
        gw.model_metrics.sent(backend.label)
        gw.model_metrics.answered(backend.label, 200, 3.0)
        gw.model_metrics.ended(backend.label, 12.0)
    gw.model_metrics.refused(503)
    text = scrape(gw)
    assert text.count("10.0.0.1:8000") >= 5
    gw.set_backends(["http://10.0.0.2:8000"], from_peer=False)
    scrape(gw)  # noticed gone (the router refreshes every second, and at each scrape)
    clock.advance(RETAIN_S - 1)
    text = scrape(gw)  # within the time: its last increments are still read
    assert 'fleetserve_router_backend_prompt_tokens_total{backend="10.0.0.1:8000"} 9.0' in text
    assert 'model_invocations_total{instance_type="local",model_name="m",model_version="1",namespace="ns",' \
           'replica="10.0.0.1:8000"} 1.0' in text
    clock.advance(1)
    text = scrape(gw)
    assert "10.0.0.1:8000" not in text, [line for line in text.splitlines() if "10.0.0.1:8000" in line]
    assert 'fleetserve_router_backend_prompt_tokens_total{backend="10.0.0.2:8000"} 9.0' in text  # the live one
    assert 'replica="router"' in text  # the router's own refusals are no replica's


class Family:
    def __init__(self, name, samples):
        self.name, self.samples = name, samples


class Sample:
    def __init__(self, labels):
        self.labels = labels


def test_with_workers_the_merged_scrape_shows_each_family_for_the_replicas_it_keeps():
    inner = type("Inner", (), {"collect": lambda self: [
        Family("fleetserve_router_backend_healthy", [Sample({"backend": "a"}), Sample({"backend": "b"})]),
        Family("fleetserve_router_ejections", [Sample({"backend": "a"}), Sample({"backend": "gone"})]),
        Family("model_latency_milliseconds", [Sample({"replica": "r0", "le": "5"}), Sample({"replica": "r9"}),
                                              Sample({"replica": "router"})]),
        Family("fleetserve_router_requests", [Sample({"path": "x"})]),
    ]})()
    shown = {"fleetserve_router_backend_healthy": ("backend", frozenset({"a"})),
             "fleetserve_router_ejections": ("backend", frozenset({"a", "b"})),
             "model_latency_milliseconds": ("replica", frozenset({"r0", "router"}))}
    kept = {f.name: [s.labels for s in f.samples] for f in _LiveBackendsOnly(inner, shown).collect()}
    assert kept == {"fleetserve_router_backend_healthy": [{"backend": "a"}],
                    "fleetserve_router_ejections": [{"backend": "a"}],
                    "model_latency_milliseconds": [{"replica": "r0", "le": "5"}, {"replica": "router"}],
                    "fleetserve_router_requests": [{"path": "x"}]}
