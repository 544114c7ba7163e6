# ruff: noqa: E501  (exposition lines are long)
"""The router's /dashboard and /dashboard/data: access, self-contained page, series computed like PromQL."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from fleetserve.observe.grafana import PANELS
from fleetserve.observe.livedata import LiveData, Sample, parse, quantile
from fleetserve.router.admin import build_control_app
from fleetserve.router.gateway import Gateway, RouterSettings
from fleetserve.router.pool import BackendPool

ADMIN = "a" * 24
INTERNAL = "i" * 24

ENGINE = """\
# TYPE model_invocations_total counter
model_invocations_total{{namespace="ns",model_name="m",model_version="2",instance_type="{it}",replica="{r}"}} {calls}
# TYPE model_errors_total counter
model_errors_total{{namespace="ns",model_name="m",model_version="2",instance_type="{it}",replica="{r}",status="500"}} {errors}
model_errors_total{{namespace="ns",model_name="m",model_version="2",instance_type="{it}",replica="{r}",status="400"}} {client}
# TYPE model_concurrent_requests gauge
model_concurrent_requests{{namespace="ns",model_name="m",model_version="2",instance_type="{it}",replica="{r}"}} 3
# TYPE model_latency_milliseconds histogram
model_latency_milliseconds_bucket{{namespace="ns",model_name="m",model_version="2",instance_type="{it}",replica="{r}",le="100.0"}} {fast}
model_latency_milliseconds_bucket{{namespace="ns",model_name="m",model_version="2",instance_type="{it}",replica="{r}",le="1000.0"}} {calls}
model_latency_milliseconds_bucket{{namespace="ns",model_name="m",model_version="2",instance_type="{it}",replica="{r}",le="+Inf"}} {calls}
model_latency_milliseconds_count{{namespace="ns",model_name="m",model_version="2",instance_type="{it}",replica="{r}"}} {calls}
model_latency_milliseconds_sum{{namespace="ns",model_name="m",model_version="2",instance_type="{it}",replica="{r}"}} 1
# TYPE fleetserve_kv_tier_hits_total counter
fleetserve_kv_tier_hits_total{{tier="engine"}} {hits}
fleetserve_kv_tier_hits_total{{tier="l1"}} {hits}
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{model_name="m"}} {hit_tokens}
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{model_name="m"}} {query_tokens}
"""
SUPERVISOR = """\
# TYPE fleetserve_autoscaler_desired_replicas gauge
fleetserve_autoscaler_desired_replicas {desired}
# TYPE fleetserve_autoscaler_ready_replicas gauge
fleetserve_autoscaler_ready_replicas 1
# TYPE fleetserve_autoscaler_decisions_total counter
fleetserve_autoscaler_decisions_total{{reason="scale up"}} {decisions}
# TYPE fleetserve_cost_per_hour_dollars gauge
fleetserve_cost_per_hour_dollars 1.5
# TYPE fleetserve_nodes gauge
fleetserve_nodes{{instance_type="g5.xlarge",capacity_type="on-demand"}} 2
"""


def engine(it="g5", r="r0", calls=0, errors=0, fast=0, hits=0, hit_tokens=0, query_tokens=0, client=0):
    return parse(ENGINE.format(it=it, r=r, calls=calls, errors=errors, fast=fast, hits=hits, hit_tokens=hit_tokens,
                               query_tokens=query_tokens, client=client), r)


def sample(t, *parts, desired=1, decisions=0):
    values = {}
    for p in parts:
        values.update(p)
    values.update(parse(SUPERVISOR.format(desired=desired, decisions=decisions), "supervisor"))
    return Sample(t, values)


def panel(payload, key):
    (found,) = [p for p in payload["panels"] if p["key"] == key]
    return {s["name"]: s["points"] for s in found["series"]}


def test_quantile_interpolates_like_histogram_quantile():
    assert quantile(0.5, {"100": 10, "1000": 20, "+Inf": 20}) == pytest.approx(100.0)
    assert quantile(0.75, {"100": 10, "1000": 20, "+Inf": 20}) == pytest.approx(550.0)
    assert quantile(0.99, {"100": 0, "1000": 0, "+Inf": 4}) == 1000.0  # in +Inf: the highest finite bound
    assert quantile(0.5, {"100": 0, "+Inf": 0}) is None


def test_payload_has_every_panel_with_rates_percentiles_and_decisions():
    live = LiveData(window_s=10)
    live.add(sample(0, engine(calls=0)))
    live.add(sample(10, engine(calls=20, errors=2, fast=10, hits=5, hit_tokens=160, query_tokens=320, client=6),
                    engine(it="c7i", r="r1", calls=4, fast=4), desired=2, decisions=1))
    payload = live.payload()
    assert [p["key"] for p in payload["panels"]] == [p.key for p in PANELS]
    assert panel(payload, "latency")["p50"][-1][1] == pytest.approx(100.0 * 12 / 14)  # 12 of 24 in the first bucket
    assert panel(payload, "errors")["server (5xx, 429)"][-1] == [10, pytest.approx(2 / 24)]
    assert panel(payload, "errors")["client (other 4xx)"][-1] == [10, pytest.approx(6 / 24)]  # not the budget's
    assert panel(payload, "throughput")["2"][-1][1] == pytest.approx(2.4)
    assert panel(payload, "concurrency") == {"c7i": [[0, 0.0], [10, 3.0]], "g5": [[0, 3.0], [10, 3.0]]}
    assert panel(payload, "latency_by_instance")["c7i"][-1][1] == pytest.approx(95.0)  # p95 inside 0..100
    assert panel(payload, "cache_tiers") == {"engine": [[10, 0.25]], "l1": [[10, 0.25]]}
    assert panel(payload, "replicas")["desired"][-1] == [10, 2.0]
    assert panel(payload, "nodes") == {"g5.xlarge on-demand": [[0, 2.0], [10, 2.0]]}
    assert panel(payload, "cost")["$/h"][-1] == [10, 1.5]
    assert payload["annotations"] == [{"t": 10, "text": "scaling: scale up"}]
    assert payload["options"]["instance_type"] == ["c7i", "g5"]
    filtered = live.payload({"instance_type": "c7i", "bogus": "x"})
    assert filtered["filters"] == {"instance_type": "c7i"}
    assert set(panel(filtered, "concurrency")) == {"c7i"}
    assert panel(filtered, "errors")["server (5xx, 429)"][-1][1] == 0.0


def test_a_replica_that_went_away_does_not_make_rates_negative():
    live = LiveData(window_s=5)
    live.add(sample(0, engine(calls=10), engine(r="r1", calls=50)))
    live.add(sample(5, engine(calls=14)))
    assert panel(live.payload(), "throughput")["2"][-1][1] == pytest.approx(0.8)


def test_a_replica_that_did_not_answer_one_sample_adds_no_traffic_and_a_restart_counts_from_zero():
    """A replica whose /metrics missed the 2 s limit once (a busy machine) had its whole lifetime's counters read
    as the next window's traffic: 1.8 invocations/s and a p95 on an idle fleet (found in review). A counter that
    went down (its engine restarted) counts from 0, as rate() does; it had read nothing."""
    live = LiveData(window_s=5)
    both = frozenset({"router", "supervisor", "r0", "r1"})
    live.add(Sample(0, {**engine(calls=10), **engine(r="r1", calls=50)}, sources=both))
    live.add(Sample(5, {**engine(calls=10)}, sources=both - {"r1"}))  # r1 did not answer in time
    live.add(Sample(10, {**engine(calls=10), **engine(r="r1", calls=50)}, sources=both))
    assert [p[1] for p in panel(live.payload(), "throughput")["2"]] == [0.0, 0.0]
    live.add(Sample(15, {**engine(calls=3), **engine(r="r1", calls=50)}, sources=both))  # r0 restarted, 3 since
    assert panel(live.payload(), "throughput")["2"][-1][1] == pytest.approx(3 / 5)
    # a replica new since the window began (a scale-up) counts from 0: it had been left out for a window
    live.add(Sample(20, {**engine(calls=3), **engine(r="r1", calls=50), **engine(r="r2", calls=10)},
                    sources=both | {"r2"}))
    assert panel(live.payload(), "throughput")["2"][-1][1] == pytest.approx(10 / 5)


def test_a_restarted_replicas_histogram_counts_from_zero_whole():
    """Series by series, a restart left buckets that were no longer cumulative (p95 38 ms for one over 100 ms)."""
    live = LiveData(window_s=5)
    srcs = frozenset({"router", "supervisor", "r0"})
    live.add(Sample(0, engine(calls=10, fast=10), sources=srcs))  # 10 fast, before the restart
    live.add(Sample(5, engine(calls=12, fast=5), sources=srcs))  # restarted: 5 fast, 7 slow since
    p95 = panel(live.payload(), "latency")["p95"][-1][1]
    assert p95 > 100, p95
    assert panel(live.payload(), "throughput")["2"][-1][1] == pytest.approx(12 / 5)  # all 12 since it started


def test_a_supervisor_that_missed_a_sample_marks_no_old_decision():
    live = LiveData(window_s=5)
    all_of = frozenset({"router", "supervisor", "r0"})
    live.add(Sample(0, sample(0, decisions=7).values, sources=all_of))
    live.add(Sample(5, engine(calls=1), sources=all_of - {"supervisor"}))
    live.add(Sample(10, sample(10, decisions=7).values, sources=all_of))
    assert live.annotations() == []
    live.add(Sample(15, sample(15, decisions=8).values, sources=all_of))
    assert live.annotations() == [{"t": 15, "text": "scaling: scale up"}]


def test_after_a_scale_to_zero_counts_read_zero_and_latencies_a_gap():
    """The replicas' series vanish with them: the panels' lines and headlines kept the last value (3 requests in
    flight, 2.4 invocations/s, a p95) while the fleet sat at zero."""
    live = LiveData(window_s=5)
    live.add(sample(0, engine(calls=0)))
    live.add(sample(5, engine(calls=20, fast=10)))
    live.add(sample(10, desired=0))  # scaled to zero: no replica to read
    live.add(sample(15, desired=0))
    payload = live.payload()
    assert panel(payload, "concurrency") == {"g5": [[0, 3.0], [5, 3.0], [10, 0.0], [15, 0.0]]}
    assert panel(payload, "throughput")["2"] == [[5, 4.0], [10, 0.0], [15, 0.0]]
    assert panel(payload, "latency")["p95"][-1] == [15, None]
    assert panel(payload, "latency_by_instance")["g5"][-2:] == [[10, None], [15, None]]
    assert panel(payload, "errors")["server (5xx, 429)"][-1] == [15, None]
    assert panel(payload, "replicas")["desired"][-1] == [15, 0.0]


def test_history_is_bounded():
    live = LiveData(history_s=10)
    for t in range(30):
        live.add(sample(t, engine(calls=t)))
    assert live.samples[0].t == 19 and len(live.samples) == 11


@pytest.fixture()
def client():
    gateway = Gateway(BackendPool([]), RouterSettings(admin_token=ADMIN, internal_token=INTERNAL))
    return TestClient(build_control_app(gateway), follow_redirects=False)  # not started: no health loop needed


def test_dashboard_needs_the_admin(client):
    assert client.get("/dashboard").status_code == 403
    assert client.get("/dashboard/data").status_code == 403
    assert client.get("/dashboard?token=wrong").status_code == 403
    assert client.get("/dashboard", headers={"x-fleetserve-admin": ADMIN}).status_code == 200
    assert client.get("/dashboard/data", headers={"x-fleetserve-internal": INTERNAL}).status_code == 200


def test_token_login_sets_a_cookie_and_leaves_the_address_bar(client):
    r = client.get(f"/dashboard?token={ADMIN}")
    assert r.status_code == 303 and r.headers["location"] == "/dashboard"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
    assert ADMIN not in cookie and INTERNAL not in cookie  # a signed session, not the secret itself
    page = client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    data = client.get("/dashboard/data").json()
    assert [p["key"] for p in data["panels"]] == [p.key for p in PANELS]
    assert data["fleet"]["backends"] == [] and data["fleet"]["strategy"] == "leastload"


def test_page_is_self_contained(client):
    html = client.get("/dashboard", headers={"x-fleetserve-admin": ADMIN}).text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html and "<script src" not in html
    assert re.findall(r"<link[^>]*>", html) == ['<link rel="icon" href="data:,">']  # no /favicon.ico request
    assert re.findall(r"https?://[^\"' ]+", html) == ["http://www.w3.org/2000/svg"]  # the SVG namespace name
    for p in PANELS:
        assert p.title in html


def test_only_decisions_that_change_the_fleet_are_marked():
    """Every poll counts a decision (steady, idle): marking each put 35 dashed lines over 70 s of panels."""
    from fleetserve.observe.grafana import DECISIONS

    live = LiveData(window_s=30)
    steady = 'fleetserve_autoscaler_decisions_total{{reason="steady"}} {n}\n'
    for t, n, up in ((0, 0, 0), (10, 5, 0), (20, 9, 1)):
        values = parse(SUPERVISOR.format(desired=1, decisions=up) + steady.format(n=n), "supervisor")
        live.add(Sample(t, values))
    assert live.payload()["annotations"] == [{"t": 20, "text": "scaling: scale up"}]
    assert 'reason=~"scale up|scale down|' in DECISIONS and "steady" not in DECISIONS


def test_a_time_nobody_watched_is_a_gap_not_a_line_and_no_rate_spans_it():
    """Reopened after two minutes, every panel drew a straight line across them, and the first point after
    the gap was a rate over 100 s shown as the last window's."""
    live = LiveData(window_s=5)
    live.add(sample(0, engine(calls=0)))
    live.add(sample(5, engine(calls=20)))
    live.add(sample(105, engine(calls=520)))  # nobody watched from 5 s to 105 s
    live.add(sample(110, engine(calls=540)))
    payload = live.payload()
    assert panel(payload, "concurrency")["g5"][2] == [55.0, None]  # the break
    assert panel(payload, "throughput")["2"] == [[5, 4.0], [55.0, None], [110, 4.0]]  # no rate from 5 s to 105 s


def test_a_decision_made_while_nobody_watched_is_not_marked_at_the_gaps_end():
    """The fleet scaled down a minute before the page was opened again: its mark stood at the reopening."""
    live = LiveData(window_s=5)
    live.add(sample(0, decisions=0))
    live.add(sample(5, decisions=0))
    live.add(sample(105, decisions=1))  # the decision came somewhere between 5 s and 105 s
    live.add(sample(110, decisions=2))  # and this one between 105 s and 110 s
    assert live.payload()["annotations"] == [{"t": 110, "text": "scaling: scale up"}]


def test_the_wait_for_a_replica_is_a_panel_of_its_own():
    """A request that woke the fleet took 6.9 s and the latency panels (the engines' figures) showed 50 ms."""
    def held(n_fast, n_slow):
        text = ("# TYPE fleetserve_router_buffer_wait_seconds histogram\n"
                f'fleetserve_router_buffer_wait_seconds_bucket{{le="1.0"}} {n_fast}\n'
                f'fleetserve_router_buffer_wait_seconds_bucket{{le="10.0"}} {n_fast + n_slow}\n'
                f'fleetserve_router_buffer_wait_seconds_bucket{{le="+Inf"}} {n_fast + n_slow}\n'
                f"fleetserve_router_buffer_wait_seconds_count {n_fast + n_slow}\n"
                "fleetserve_router_buffer_wait_seconds_sum 0\n")
        return parse(text, "router")

    live = LiveData(window_s=5)
    live.add(sample(0, engine(calls=0), held(0, 0)))
    live.add(sample(5, engine(calls=2), held(0, 2)))  # two requests held 1-10 s while the fleet woke
    p95 = panel(live.payload(), "held")["p95"][-1][1]
    assert 1000 < p95 <= 10_000


def test_a_login_code_works_until_it_expires_and_a_forged_one_never(client):
    """`dashboard open` prints a code signed with the internal token, never the token (see its test)."""
    from fleetserve.observe.dashboard import signed

    client.cookies.clear()
    assert client.get("/dashboard?login=" + signed(INTERNAL, "login", 300)).status_code == 303
    assert client.get("/dashboard").status_code == 200  # the session cookie it set
    client.cookies.clear()
    assert client.get("/dashboard?login=" + signed(INTERNAL, "login", -1)).status_code == 403  # expired
    assert client.get("/dashboard?login=" + signed("a-guess", "login", 300)).status_code == 403
    assert client.get("/dashboard?login=" + signed(INTERNAL, "session", 300)).status_code == 403  # not a login
    client.cookies.clear()
    client.cookies.set("fleetserve_dashboard", signed(INTERNAL, "login", 300), path="/dashboard")
    assert client.get("/dashboard").status_code == 403  # a login code is no session cookie
    for junk in ("².x", "9" * 5000 + ".x", ".", "abc"):  # "²" passed isdigit(), and int() made it a 500
        assert client.get("/dashboard", params={"login": junk}).status_code == 403


def test_a_login_code_works_once(client):
    """A printed URL seen afterwards (a terminal, a shell history, a proxy log) had been a session for anyone for
    the rest of its five minutes."""
    from fleetserve.observe.dashboard import signed

    client.cookies.clear()
    code = signed(INTERNAL, "login", 300)
    assert client.get("/dashboard?login=" + code).status_code == 303
    client.cookies.clear()
    second = client.get("/dashboard?login=" + code)
    assert second.status_code == 403 and "used already" in second.json()["error"]["message"]
    assert client.get("/dashboard?login=" + signed(INTERNAL, "login", 300)).status_code == 303  # a new one works


def test_router_workers_spend_a_login_code_for_each_other(tmp_path):
    """Each worker checks codes alone: the bus folder they share is what tells one that another took the code."""
    from fleetserve.observe.dashboard import UsedLogins, signed

    code, other = signed(INTERNAL, "login", 300, now=1000), signed(INTERNAL, "login", 300, now=1000)
    first, second = UsedLogins(), UsedLogins()
    assert first.first_use(code, str(tmp_path), now=1000)
    assert not second.first_use(code, str(tmp_path), now=1001)
    assert second.first_use(other, str(tmp_path), now=1001)
    assert len(list((tmp_path / "used-logins").iterdir())) == 2
    assert first.first_use(signed(INTERNAL, "login", 300, now=2000), str(tmp_path), now=2000)
    assert len(list((tmp_path / "used-logins").iterdir())) == 1  # the expired ones are forgotten
    memory = UsedLogins()  # a single-process router
    assert memory.first_use(code, now=1000) and not memory.first_use(code, now=1001)


def test_a_gauge_that_went_down_is_no_restart():
    """Any value that fell marked its source restarted, gauges included: a replica whose in-flight count went from
    1 to 0 had its lifetime's invocations counted as one window's (throughput spikes of 16 and 32/s at 9/s)."""
    from fleetserve.observe.livedata import _delta, comparable

    r0 = (("__source", "r0"),)

    def sample(t: float, invocations: float, in_flight: float) -> Sample:
        return Sample(t, {("model_invocations_total", r0): invocations, ("model_concurrent_requests", r0): in_flight},
                      sources=frozenset({"r0"}), known=frozenset({"r0"}))

    assert _delta(*comparable(sample(15, 1010, 0), sample(0, 1000, 1)), "model_invocations_total") == {"": 10.0}
    # a counter that went down: the process restarted, and counts from 0
    assert _delta(*comparable(sample(15, 7, 0), sample(0, 1000, 1)), "model_invocations_total") == {"": 7.0}
