"""Cache-aware routing through the real router to real simulated engines, and failures during a replay."""

import asyncio
import signal
import time

import httpx
import pytest

from fleetserve.bench.replay import replay
from fleetserve.traces.model import TraceRequest
from tests.helpers import Server, wait_until
from tests.metrics_text import sample


def sims(logs, n, *extra):
    return [Server(["engine", "--simulate", "fast", "--served-model-name", "sim", "--block-size", "16", *extra],
                   logs / f"sim{i}.log").start() for i in range(n)]


def gateway(logs, engines, strategy):
    args = ["router", "--strategy", strategy, "--health-interval", "0.2"]
    for e in engines:
        args += ["--backend", e.url]
    return Server(args, logs / f"router-{strategy}.log").start()


@pytest.mark.parametrize("strategy", ["prefixaware", "kvaware"])
def test_shared_prefixes_land_where_they_are_cached(tmp_path, strategy):
    engines = sims(tmp_path, 3)
    gw = gateway(tmp_path, engines, strategy)
    try:
        if strategy == "kvaware":
            wait_until(lambda: sample(gw.url, "fleetserve_router_kv_subscriptions") == 3, 30,
                       what="router subscribed to every engine's KV events")
        docs = [list(range(k * 10_000, k * 10_000 + 16 * 12)) for k in range(6)]
        homes = {}
        for k, doc in enumerate(docs):
            r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": doc + [1], "max_tokens": 2},
                           timeout=30)
            homes[k] = r.headers["x-fleetserve-replica"]
        assert len(set(homes.values())) >= 2  # cold documents spread
        time.sleep(0.3)  # KV events arrive asynchronously (speculation bridges the gap meanwhile)
        for k, doc in enumerate(docs):
            r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": doc + [2, 3],
                                                              "max_tokens": 2}, timeout=30)
            assert r.headers["x-fleetserve-replica"] == homes[k]
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 16 * 12
        assert sample(gw.url, "fleetserve_router_routing_decisions_total", policy=strategy, branch="hit") >= 6
        # the engines' own prefix-cache counters, read by the router beside what responses reported
        httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": docs[0] + [9], "max_tokens": 2},
                   timeout=30)

        def engine_hit_rate() -> float:
            try:
                return sample(gw.url, "fleetserve_router_backend_engine_hit_rate", backend=homes[0])
            except KeyError:
                return 0.0  # not read yet (every 10 health rounds)

        wait_until(lambda: engine_hit_rate() > 0, 30, what="the engine's hit rate from its own counters")
    finally:
        gw.stop()
        for e in engines:
            e.stop()


def test_replica_killed_during_replay_loses_no_unstarted_request(tmp_path):
    # slow decode (speedup 0.02: 25 ms steps) so that streams are in progress when the replica dies
    engines = sims(tmp_path, 3, "--speedup", "0.02")
    gw = gateway(tmp_path, engines, "leastload")
    requests = [TraceRequest(arrival_s=i * 0.05, input_tokens=64, output_tokens=30) for i in range(60)]

    async def run():
        task = asyncio.create_task(replay(gw.url, requests, model="sim", stream=True, timeout=60))
        await asyncio.sleep(1.2)

        def streaming_on_the_victim() -> bool:  # a slow machine may not have got there yet: wait, not guess
            backends = httpx.get(gw.url + "/health", timeout=5).json()["backends"]
            return any(b["url"] == engines[0].url and b["in_flight"] >= 2 for b in backends)

        await asyncio.to_thread(wait_until, streaming_on_the_victim, 30, what="streams in flight on the replica")
        await asyncio.sleep(0.2)  # their first tokens (25 ms steps)
        engines[0].kill(signal.SIGKILL)
        return await task

    try:
        records = asyncio.run(run())
    finally:
        gw.stop()
        for e in engines:
            e.stop()
    failed = [r for r in records if r.status != 200 or r.error]
    assert failed, "the kill should have interrupted some streams"
    for r in failed:
        # only streams that had started may fail, and they end with the router's clean error event
        assert r.streamed and "mid-stream" in r.error, (r.status, r.error)
    assert len(records) == 60  # every request got an answer: complete, or cut with the router's error event


@pytest.mark.parametrize("stream", [False, True])
def test_the_gateway_feeds_reported_cached_tokens_back_to_the_policy(tmp_path, stream):
    """What the engines report (usage.prompt_tokens_details.cached_tokens) reaches the policy and the
    predicted-vs-reported counters, for JSON bodies and for streams with include_usage."""
    engines = sims(tmp_path, 2)
    gw = gateway(tmp_path, engines, "prefixaware")
    try:
        doc = list(range(50_000, 50_000 + 16 * 8))
        body = {"model": "sim", "prompt": doc, "max_tokens": 2, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        for suffix in range(4):
            r = httpx.post(gw.url + "/v1/completions", json={**body, "prompt": doc + [suffix]}, timeout=30)
            assert r.status_code == 200
        reported = sample(gw.url, "fleetserve_router_cached_tokens_total", policy="prefixaware", source="reported")
        predicted = sample(gw.url, "fleetserve_router_cached_tokens_total", policy="prefixaware",
                           source="predicted")
        assert reported == 3 * 16 * 8  # the three repeats found the whole document cached
        assert predicted > 0
    finally:
        gw.stop()
        for e in engines:
            e.stop()


def test_a_stream_the_client_did_not_ask_usage_of_still_teaches_the_policy_and_shows_no_usage(tmp_path):
    """Engines report usage in a stream only when asked, and most streaming clients do not ask: the blind
    router learned nothing from streamed traffic. It asks on the client's behalf and drops the usage-only
    chunk from the relayed stream (a client reading chunk.choices[0] of every chunk would fail on it); a
    client that asked gets it as before."""
    import openai

    engines = sims(tmp_path, 2)
    gw = gateway(tmp_path, engines, "prefixaware")
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        system = "You answer questions about the fleet. " * 30
        for turn in range(4):
            chunks = list(client.chat.completions.create(
                model="sim", max_tokens=3, stream=True,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": f"question {turn}"}]))
            assert chunks and all(c.choices for c in chunks)  # no usage-only chunk reached this client
            assert all(c.usage is None for c in chunks)
        reported = sample(gw.url, "fleetserve_router_cached_tokens_total", policy="prefixaware", source="reported")
        assert reported > 0  # the repeats found the system prompt cached, and the router heard it
        asked = list(client.chat.completions.create(
            model="sim", max_tokens=3, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "question 9"}]))
        assert asked[-1].choices == [] and asked[-1].usage.prompt_tokens_details.cached_tokens > 0
    finally:
        gw.stop()
        for e in engines:
            e.stop()


def test_usage_is_read_from_the_tail_of_json_and_sse_bodies():
    from fleetserve.router.relay import CACHED_TOKENS, PROMPT_TOKENS
    from fleetserve.router.relay import last_int as _last_int

    body = b'{"usage": {"prompt_tokens": 129, "prompt_tokens_details": {"cached_tokens": 128}}}'
    assert _last_int(CACHED_TOKENS, body) == 128 and _last_int(PROMPT_TOKENS, body) == 129
    sse = (b'data: {"choices": [{"text": "\\"cached_tokens\\": 9"}]}\n\n'
           b'data: {"choices": [], "usage": {"prompt_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}}\n\n'
           b"data: [DONE]\n\n")
    assert _last_int(CACHED_TOKENS, sse) == 0  # the usage chunk, not text that looks like it
    assert _last_int(CACHED_TOKENS, b'data: {"choices": []}\n\ndata: [DONE]\n\n') is None


def test_the_router_exports_hyperpods_model_metrics_for_engines_that_do_not(tmp_path):
    """vLLM and SGLang export no model_* series (HyperPod's reverse-proxy sidecar does, per pod): its example
    trigger, the rules, burn alerts and dashboard panels read nothing in front of them. With --model-metrics the
    router counts what it proxies per replica, with the endpoint's labels."""
    engines = sims(tmp_path, 2)
    args = ["router", "--strategy", "roundrobin", "--health-interval", "0.2", "--model-metrics",
            "--namespace", "team-a", "--served-model-name", "sim", "--model-version", "3", "--instance-type", "g5"]
    for e in engines:
        args += ["--backend", e.url]
    gw = Server(args, tmp_path / "router-model.log").start()
    try:
        for i in range(4):
            r = httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": [i] * 20, "max_tokens": 2,
                                                              "stream": i % 2 == 1}, timeout=30)
            assert r.status_code == 200
        bad = httpx.post(gw.url + "/v1/completions", json={"model": "other", "prompt": "x"}, timeout=30)
        refused = httpx.post(gw.url + "/v1/completions", content=b"{not json", timeout=30)
        assert bad.status_code >= 400 and refused.status_code == 400
        labels = {"namespace": "team-a", "model_name": "sim", "model_version": "3", "instance_type": "g5"}
        per_replica = [sample(gw.url, "model_invocations_total", **labels, replica=e.url.split("//")[1])
                       for e in engines]
        # four answered; the engine's refusal of another model is no invocation of this one
        assert sum(per_replica) == 4 and min(per_replica) >= 1
        assert sample(gw.url, "model_invocations_total", **labels, replica="router") == 1  # refused here
        assert sample(gw.url, "model_errors_total", **labels, replica="router", status="400") == 1
        assert sum(sample(gw.url, "model_concurrent_requests", **labels, replica=e.url.split("//")[1])
                   for e in engines) == 0  # every answer ended
        assert sum(sample(gw.url, "model_latency_milliseconds_count", **labels, replica=e.url.split("//")[1])
                   for e in engines) == 5  # every answer's latency, the 404's too
        # in flight from the moment a request is sent, streamed or not (a non-streamed answer's headers come only
        # at its end: the gauge read 0 while ten of them ran)
        import concurrent.futures

        def slow(_):
            # ~4 s each: at 1,500 tokens (under a second) a loaded machine's scrapes saw them all end first
            return httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": [7] * 20,
                                                                 "max_tokens": 8000}, timeout=120).status_code

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            running = pool.map(slow, range(6))
            wait_until(lambda: sum(sample(gw.url, "model_concurrent_requests", **labels,
                                          replica=e.url.split("//")[1]) for e in engines) >= 3, 30,
                       what="non-streamed requests counted while they run")
            assert list(running) == [200] * 6
        assert sum(sample(gw.url, "model_concurrent_requests", **labels, replica=e.url.split("//")[1])
                   for e in engines) == 0
    finally:
        gw.stop()
        for e in engines:
            e.stop()


def test_in_front_of_engines_that_count_themselves_the_router_adds_only_its_own_errors(tmp_path):
    """The built-in engine counts its invocations; the router's own refusals (a full queue's 429, 503 at zero,
    its 504s) reached no engine, so the error ratio, its burn alerts and the error panels read 0 % while the
    router refused most requests. Scope `router` counts those, and nothing an engine counts; every series of a
    preset status exists at 0 from the start (rate() loses a new series' first burst)."""
    engines = sims(tmp_path, 1)
    args = ["router", "--strategy", "roundrobin", "--health-interval", "0.2", "--model-metrics",
            "--model-metrics-scope", "router", "--namespace", "team-a", "--served-model-name", "sim",
            "--instance-type", "g5", "--max-concurrent-per-replica", "1", "--max-queue", "0",
            "--backend", engines[0].url]
    gw = Server(args, tmp_path / "router-scope.log").start()
    labels = {"namespace": "team-a", "model_name": "sim", "model_version": "1", "instance_type": "g5"}
    try:
        assert sample(gw.url, "model_errors_total", **labels, replica="router", status="429") == 0  # preset
        import concurrent.futures

        def ask(_):
            return httpx.post(gw.url + "/v1/completions", json={"model": "sim", "prompt": [7] * 20,
                                                                 "max_tokens": 400}, timeout=60).status_code

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(ask, range(6)))
        refused = codes.count(429)
        assert refused >= 1 and codes.count(200) >= 1
        assert sample(gw.url, "model_errors_total", **labels, replica="router", status="429") == refused
        assert sample(gw.url, "model_invocations_total", **labels, replica="router") == refused
        bad = httpx.post(gw.url + "/v1/completions", content=b"{not json", timeout=30)
        assert bad.status_code == 400  # a client's bad body is none of the model's invocations here
        assert sample(gw.url, "model_invocations_total", **labels, replica="router") == refused
        replica = engines[0].url.split("//")[1]  # what the engine counts itself is not counted again (its
        # series are at 0 from its start, for the errors only the router produces: its 502s and 504s)
        assert sample(gw.url, "model_invocations_total", **labels, replica=replica) == 0
        assert sample(gw.url, "model_errors_total", **labels, replica=replica, status="502") == 0
    finally:
        gw.stop()
        for e in engines:
            e.stop()


def test_the_error_ratio_is_per_endpoint_so_router_refusals_join_the_engines_answers():
    """Grouped by instance type too, the router's refusals (before any replica) made a series of their own
    that read 100 % at one refusal among thousands of answers."""
    from fleetserve.observe.rules import RuleTarget, recording_rules

    rules = {r["record"]: r["expr"] for r in recording_rules(RuleTarget("team-a", "sim", "g", 'job="router"'))}
    ratio = rules["fleetserve:model_error_ratio:rate5m"]
    assert "sum by (namespace, model_name, model_version) (" in ratio and "instance_type" not in ratio


def test_each_failed_request_is_counted_once_and_where_the_engine_did_not():
    """A timed-out request read as two invocations and two errors (the attempt, then the final 504), and in front
    of the built-in engine a request the replica had seen (dropped, broken) added an invocation to its own."""
    from prometheus_client import CollectorRegistry

    from fleetserve.api.errors import APIError
    from fleetserve.observe.metrics import ModelIdentity
    from fleetserve.router.model_metrics import FailedAttempts, ModelMetrics

    registry = CollectorRegistry()
    m = ModelMetrics(ModelIdentity("ns", "m", "1", "g5", ""), registry, scope="router")

    def ended_on(replica, saw, counted_error, status):
        tried = FailedAttempts()
        tried.add(replica, saw, counted_error)
        m.gave_up(tried, status)

    ended_on("r0", True, False, 504)  # timed out: the engine counted the invocation
    ended_on("r1", True, False, 502)  # dropped under the request: the engine saw it
    ended_on("r2", False, False, 502)  # unreachable: it never did
    ended_on("r3", True, True, 503)  # its own full queue: the engine counted the invocation and the error
    m.refused(400)  # a client's bad body: not counted beside engines that count their own
    m.refused(429)

    def value(name, **labels):
        return registry.get_sample_value(name, {"namespace": "ns", "model_name": "m", "model_version": "1",
                                                "instance_type": "g5", **labels})

    assert value("model_invocations_total", replica="r0") is None and value("model_invocations_total", replica="r1") \
        is None
    assert value("model_invocations_total", replica="r2") == 1
    assert value("model_errors_total", replica="r0", status="504") == 1
    assert value("model_invocations_total", replica="r3") is None and value("model_errors_total", replica="r3",
                                                                            status="503") is None
    assert value("model_invocations_total", replica="router") == 1
    assert value("model_errors_total", replica="router", status="429") == 1
    assert value("model_errors_total", replica="router", status="400") is None
    assert APIError(504, "x").after_attempts is False  # dispatch sets it when a replica was tried
