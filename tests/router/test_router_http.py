"""The router in front of real engine processes: distribution, streaming, failures, disconnects."""

import json
import os
import signal
from collections import Counter

import httpx
import openai
import pytest

from tests.helpers import Server, http_ok, wait_until
from tests.metrics_text import sample

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def engine(model, logs, name="tiny", port=None):
    return Server(["engine", "--model", str(model), "--served-model-name", name, "--threads", "1"],
                  logs / f"engine-{name}-{port or 'x'}.log", port=port)


def router(backends, logs, strategy="roundrobin", *extra):
    args = ["router", "--strategy", strategy, "--health-interval", "0.2", *extra]
    for b in backends:
        args += ["--backend", b.url]
    return Server(args, logs / f"router-{strategy}.log")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("router-logs")


@pytest.fixture(scope="module")
def pair(tiny_model, logs):
    engines = [engine(tiny_model, logs, port=None).start() for _ in range(2)]
    gw = router(engines, logs).start()
    yield gw, engines
    gw.stop()
    for e in engines:
        e.stop()


def replica_of(response: httpx.Response) -> str:
    return response.headers["x-fleetserve-replica"]


def test_roundrobin_spreads_and_openai_client_works(pair):
    gw, engines = pair
    picks = Counter(replica_of(httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30))
                    for _ in range(6))
    assert set(picks) == {e.url.split("://")[1] for e in engines} and set(picks.values()) == {3}
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    assert client.models.list().data[0].id == "tiny"
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=6,
                                                 stream=True, stream_options={"include_usage": True}))
    assert len(chunks) >= 3 and chunks[-1].usage.completion_tokens <= 6


def test_the_openai_client_retrieves_the_served_model_through_the_router(pair):
    """`client.models.retrieve(name)` (GET /v1/models/{model}) was a plain 404 "Not Found" for the model served."""
    gw, engines = pair
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and card.object == "model"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("other")
    assert missing.value.body["code"] == "model_not_found" and missing.value.body["param"] == "model"
    r = httpx.post(gw.url + "/v1/models/tiny", json={}, timeout=30)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    head = httpx.head(gw.url + "/v1/models/tiny", timeout=30)  # a replica's GET answer, without its body
    assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) > 0


def test_sagemaker_invocations_are_answered_as_the_openai_route_the_body_names(pair):
    """HyperPod's default invocationEndpoint: SageMaker posts every request to /invocations; the body's shape picks
    chat or completions (as vLLM's server does), streamed or not; other bodies are a 400 naming what is served."""
    gw, _ = pair
    chat = httpx.post(gw.url + "/invocations", json=CHAT, timeout=30)
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion", chat.text
    text = httpx.post(gw.url + "/invocations", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
    assert text.status_code == 200 and text.json()["object"] == "text_completion", text.text
    with httpx.stream("POST", gw.url + "/invocations", json={**CHAT, "stream": True}, timeout=30) as streamed:
        events = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert streamed.headers["content-type"].startswith("text/event-stream") and events[-1] == "data: [DONE]"
    sdk = httpx.post(gw.url + "/invocations", content=json.dumps(CHAT),  # the SageMaker SDK Predictor's default
                     headers={"content-type": "application/octet-stream"}, timeout=30)
    assert sdk.status_code == 200 and sdk.json()["object"] == "chat.completion", sdk.text
    client = openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0)  # a SageMaker-style client's raw call
    answer = client.post("/invocations", body=CHAT, cast_to=httpx.Response)
    assert answer.json()["choices"][0]["message"]["role"] == "assistant"
    for body, param in (({"inputs": "hi", "parameters": {"max_new_tokens": 4}}, "inputs"),
                        ({"model": "tiny"}, "messages"), ({**CHAT, "prompt": "hi"}, "prompt")):
        refused = httpx.post(gw.url + "/invocations", json=body, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
        assert "messages" in refused.json()["error"]["message"] and "prompt" in refused.json()["error"]["message"]
    assert httpx.get(gw.url + "/invocations", timeout=30).status_code == 405
    missing = httpx.post(gw.url + "/invocations", json={**CHAT, "model": "other"}, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_request_id_propagates(pair):
    gw, _ = pair
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "abc-123"}, timeout=30)
    assert r.status_code == 200 and r.headers["x-request-id"] == "abc-123"
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30).headers["x-request-id"]


def test_errors_pass_through_in_openai_shape(pair):
    gw, _ = pair
    r = httpx.post(gw.url + "/v1/chat/completions", content=b"{oops", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "model": "other"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "tiny"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"

    # a web page may POST these to another origin without a CORS preflight: a fleet on localhost without keys had
    # answered them, so any page a user opened could drive it; JSON, or no content-type, is read as JSON
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                 "image/png", "application/xml"):  # and any other type that is not JSON (they were read as JSON)
        r = httpx.post(gw.url + "/v1/chat/completions", content=json.dumps(CHAT), headers={"content-type": kind},
                       timeout=30)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", (kind, r.text)
    import gzip  # a compressed body read as JSON had been a 400 "'utf-8' codec can't decode byte 0x8b"

    r = httpx.post(gw.url + "/v1/chat/completions", content=gzip.compress(json.dumps(CHAT).encode()),
                   headers={"content-type": "application/json", "content-encoding": "gzip"}, timeout=30)
    assert r.status_code == 415 and "content-encoding 'gzip'" in r.json()["error"]["message"]
    r = httpx.post(gw.url + "/v1/chat/completions", content=json.dumps(CHAT),
                   headers={"content-type": "application/json", "content-encoding": "identity"}, timeout=30)
    assert r.status_code == 200
    for kind in ("application/json; charset=utf-8", None):
        headers = {"content-type": kind} if kind else {}
        r = httpx.post(gw.url + "/v1/chat/completions", content=json.dumps(CHAT), headers=headers, timeout=30)
        assert r.status_code == 200, (kind, r.text)
    # nor a body with no content type (fetch's no-cors mode, sendBeacon), known by what the browser says of the page
    own = gw.url.removeprefix("http://")
    for headers, status in (({"sec-fetch-site": "cross-site"}, 403), ({"sec-fetch-site": "same-site"}, 403),
                            ({"origin": "http://evil.example:8000"}, 403), ({"origin": "null"}, 403),
                            ({"sec-fetch-site": "same-origin", "origin": f"http://{own}"}, 200),
                            ({"origin": f"http://{own}"}, 200), ({"sec-fetch-site": "none"}, 200)):
        r = httpx.post(gw.url + "/v1/chat/completions", content=json.dumps(CHAT), headers=headers, timeout=30)
        assert r.status_code == status, (headers, r.text)
        assert status == 200 or r.json()["error"]["code"] == "cross_site_request"


def test_a_router_without_secrets_is_admin_to_loopback_named_as_loopback_only(pair):
    """With no secret, loopback is admin: a page whose name a DNS rebinding pointed at 127.0.0.1 came from loopback
    too, with its own name as Host, and could PUT its own backends."""
    gw, _ = pair
    port = gw.url.rsplit(":", 1)[1]
    assert httpx.get(gw.url + "/admin/load", timeout=5).status_code == 200
    assert httpx.get(gw.url + "/admin/load", headers={"host": f"localhost:{port}"}, timeout=5).status_code == 200
    rebound = httpx.get(gw.url + "/admin/load", headers={"host": f"evil.example:{port}"}, timeout=5)
    assert rebound.status_code == 403


def test_a_trailing_slash_on_the_routers_own_paths_is_a_404_not_a_redirect_to_the_clients_host(pair):
    """The control app redirected `/health/` (and /metrics/, /livez/, /admin/load/, /dashboard/) with a 307 to
    whatever Host the client sent, where the engines and the API paths answer 404."""
    gw, _ = pair
    for path in ("/health/", "/livez/", "/metrics/", "/admin/load/", "/dashboard/"):
        r = httpx.get(gw.url + path, headers={"host": "evil.example"}, timeout=5)
        assert r.status_code == 404 and "location" not in r.headers, (path, r.status_code, r.headers)
        assert r.json()["error"]["code"] == "not_found", path


def test_router_metrics(pair):
    gw, _ = pair
    httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert sample(gw.url, "fleetserve_router_requests_total", path="/v1/chat/completions", code="200") >= 1
    assert sample(gw.url, "fleetserve_router_routing_decisions_total", policy="roundrobin") >= 1
    assert sample(gw.url, "fleetserve_router_backend_healthy") == 2


def test_dead_backend_is_ejected_retried_and_readmitted(tiny_model, logs):
    engines = [engine(tiny_model, logs, name="tiny").start() for _ in range(2)]
    gw = router(engines, logs, strategy="roundrobin").start()
    try:
        victim = engines[0]
        victim.kill(signal.SIGKILL)
        # every request is answered: before the router notices, a refused connection moves it to the other one
        for _ in range(6):
            r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
            assert r.status_code == 200 and replica_of(r) == engines[1].url.split("://")[1]
        health = httpx.get(gw.url + "/health", timeout=5).json()
        assert [b["healthy"] for b in health["backends"]] == [False, True]
        # the replica comes back on the same port and gets traffic again
        engines.append(engine(tiny_model, logs, name="tiny", port=victim.port).start())
        wait_until(lambda: all(b["healthy"] for b in httpx.get(gw.url + "/health", timeout=5).json()["backends"]),
                   30, what="backend readmitted")
        picks = {replica_of(httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)) for _ in range(4)}
        assert victim.url.split("://")[1] in picks
    finally:
        gw.stop()
        for e in engines:
            e.stop()


def test_no_replica_holds_requests_then_503_with_retry_after(tiny_model, logs):
    e = engine(tiny_model, logs).start()
    gw = router([e], logs, "leastload", "--buffer-timeout", "0.5").start()
    full = router([e], logs, "leastload", "--buffer-size", "0").start()
    try:
        e.kill()
        for g in (gw, full):
            wait_until(lambda g=g: not http_ok(g.url + "/health"), 30, what="router to see no healthy backend")
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "cold_start_timeout"
        r = httpx.post(full.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "buffer_full" and r.headers["retry-after"]
    finally:
        gw.stop()
        full.stop()


def test_at_zero_replicas_the_router_is_live_and_ready_for_kubernetes_probes(tiny_model, logs):
    """Kubernetes probed /health, which is 503 at zero replicas: the routers left the Service and were restarted,
    so no request reached the buffer whose size wakes the fleet. /livez and /readyz ask the router of itself."""
    future_engine = engine(tiny_model, logs)  # never started: zero replicas
    gw = router([future_engine], logs, "leastload").start(ready_path="/livez")
    try:
        assert httpx.get(gw.url + "/health", timeout=5).status_code == 503
        assert httpx.get(gw.url + "/livez", timeout=5).status_code == 200
        ready = httpx.get(gw.url + "/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json() == {"status": "ok"}
    finally:
        gw.stop()


def held_at_zero(gw, pool, count: int, timeout: float) -> list:
    """`count` chats sent from `pool` to a router with no replica ready, once it holds them all."""
    calls = [pool.submit(httpx.post, gw.url + "/v1/chat/completions", json=CHAT, timeout=timeout)
             for _ in range(count)]
    wait_until(lambda: httpx.get(gw.url + "/admin/load", timeout=5).json()["pending"] == count, 30,
               what="all requests held")
    return calls


def test_at_zero_the_router_answers_models_and_wrong_names_itself_and_holds_only_work(tiny_model, logs):
    """GET /v1/models and a request for a model the fleet does not serve were held in the buffer, whose waiting
    requests wake a fleet at zero: a client listing models every few seconds cold-started a replica every other
    time, and a wrong name waited for one before its 404."""
    from concurrent.futures import ThreadPoolExecutor

    future_engine = engine(tiny_model, logs)  # never started: the fleet is at zero
    gw = router([future_engine], logs, "leastload", "--model", "tiny").start(ready_path="/metrics")
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=10)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        assert client.models.retrieve("tiny").id == "tiny"
        with pytest.raises(openai.NotFoundError) as wrong:
            client.chat.completions.create(model="other", messages=CHAT["messages"], max_tokens=2)
        assert wrong.value.body["code"] == "model_not_found" and "'tiny'" in wrong.value.body["message"]
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("other")
        # answered like every other answer: with the client's id (or ours), counted (they had neither)
        listed = httpx.get(gw.url + "/v1/models", headers={"x-request-id": "mine-1"}, timeout=5)
        assert listed.headers["x-request-id"] == "mine-1"
        refused = httpx.post(gw.url + "/v1/completions", json={"model": "other", "prompt": "x"}, timeout=5)
        assert refused.status_code == 404 and refused.headers["x-request-id"]
        nowhere = httpx.get(gw.url + "/v1/nowhere", timeout=5)  # the control app's: coded as the engines' are
        assert (nowhere.status_code, nowhere.json()["error"]["code"]) == (404, "not_found")
        assert sample(gw.url, "fleetserve_router_requests_total", path="/v1/models", code="200") == 2
        assert sample(gw.url, "fleetserve_router_requests_total", path="/v1/models/{model}", code="404") == 1
        assert sample(gw.url, "fleetserve_router_requests_total", path="/v1/completions", code="404") == 1
        assert httpx.get(gw.url + "/admin/load", timeout=5).json()["pending"] == 0  # nothing held, nothing woken
        with ThreadPoolExecutor(1) as pool:
            held_at_zero(gw, pool, 1, timeout=3)  # the served name is held for a replica, as before
    finally:
        gw.stop()


def test_at_zero_a_bad_body_is_a_400_at_once_in_front_of_built_in_engines(tiny_model, logs):
    """A malformed request was held, woke the fleet, and got its 400 after the cold start (minutes on a GPU, paid
    for); with --check-bodies (what `up` and `render k8s` pass for built-in engines) the router answers it."""
    future_engine = engine(tiny_model, logs)  # never started: the fleet is at zero
    gw = router([future_engine], logs, "leastload", "--model", "tiny", "--check-bodies").start(ready_path="/metrics")
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=10)
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=2, temperature=7)
        assert bad.value.body["param"] == "temperature"
        with pytest.raises(openai.BadRequestError) as empty:
            client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
        assert empty.value.body["param"] == "messages"
        assert httpx.get(gw.url + "/admin/load", timeout=5).json()["pending"] == 0  # nothing held, nothing woken
    finally:
        gw.stop()


def test_at_zero_the_router_lists_the_card_a_replica_gave_with_its_context_length(tiny_model, logs, tmp_path):
    """A fleet scaled to zero listed a bare card without `max_model_len`, which clients size prompts by: the router
    now answers with the card a replica listed. A router restarted at zero had lost it (held, and woke the fleet
    for, what the context cannot hold): it keeps the card in --model-cards-file."""
    cards = tmp_path / "cards.json"
    one = engine(tiny_model, logs, port=None).start()
    gw = router([one], logs, "leastload", "--model", "tiny", "--check-bodies", "--model-cards-file", str(cards)).start()
    try:
        served = httpx.get(one.url + "/v1/models", timeout=5).json()["data"][0]
        assert served["max_model_len"] > 0
        wait_until(lambda: "tiny" in gw_cards(gw), 30, what="the replica's card read")
        one.stop()
        wait_until(lambda: not any(b["healthy"] for b in httpx.get(gw.url + "/admin/load", timeout=5).json()[
            "backends"]), 30, what="no replica ready")
        listed = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=10).models.list()
        assert [m.model_dump(exclude_none=True) for m in listed.data] == [served]  # as the engine gave it
        # and what that context cannot hold is refused at once, without waking the fleet (the client's timeout is
        # far below the router's buffer, which would hold it)
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=10)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="tiny", messages=CHAT["messages"],
                                           max_tokens=served["max_model_len"])
        assert refused.value.body["code"] == "context_length_exceeded" and refused.value.body["param"] == "max_tokens"
        assert httpx.get(gw.url + "/admin/load", timeout=5).json()["pending"] == 0
        gw.stop()  # restarted with no replica ready: the card it had learnt is read back
        assert json.loads(cards.read_text()) == {"tiny": served}
        gw = router([], logs, "leastload", "--model", "tiny", "--check-bodies", "--model-cards-file",
                    str(cards)).start(ready_path="/livez")
        listed = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=10).models.list()
        assert [m.model_dump(exclude_none=True) for m in listed.data] == [served]
        with pytest.raises(openai.BadRequestError):
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=10)
            client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=served["max_model_len"])
    finally:
        gw.stop()
        one.stop()


def gw_cards(gw) -> list:
    """The served names whose card the router has read from a replica (its load report lists them)."""
    return httpx.get(gw.url + "/admin/load", timeout=5).json()["model_cards"]


def test_held_requests_are_released_when_a_replica_comes_up(tiny_model, logs):
    from concurrent.futures import ThreadPoolExecutor

    future_engine = engine(tiny_model, logs)  # not started yet: the fleet is at zero
    gw = router([future_engine], logs, "leastload").start(ready_path="/metrics")
    try:
        with ThreadPoolExecutor(6) as pool:
            calls = held_at_zero(gw, pool, 6, timeout=120)
            future_engine.start()
            statuses = [c.result().status_code for c in calls]
        assert statuses == [200] * 6
        assert sample(gw.url, "fleetserve_router_buffer_wait_seconds_count") >= 6
    finally:
        gw.stop()
        future_engine.stop()


def test_a_stopping_router_answers_held_requests_503_and_they_are_not_cut(tiny_model, logs):
    """At a stop, requests held at zero replicas waited out the drain timeout and were then cut (a connection
    reset): now they are answered 503 router_stopping with Retry-After at once."""
    from concurrent.futures import ThreadPoolExecutor

    future_engine = engine(tiny_model, logs)  # never started: the fleet is at zero
    gw = router([future_engine], logs, "leastload", "--drain-timeout", "60").start(ready_path="/metrics")
    try:
        with ThreadPoolExecutor(3) as pool:
            calls = held_at_zero(gw, pool, 3, timeout=45)
            os.killpg(gw.proc.pid, signal.SIGTERM)
            answers = [c.result() for c in calls]  # within the drain timeout: a cut would come at 60 s
        for r in answers:
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "router_stopping"
        assert gw.proc.wait(timeout=30) == 0
    finally:
        gw.stop()


def test_a_stopping_router_lets_the_stream_under_way_finish_and_refuses_the_queued(slow_pair_limited):
    """A request queued for a slot (every replica at its limit) is answered 503 at the stop; the stream a
    replica is serving runs to its end."""
    from concurrent.futures import ThreadPoolExecutor

    gw, e = slow_pair_limited
    body = {**SLOW, "max_tokens": 400}
    with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=60) as r, \
            ThreadPoolExecutor(1) as pool:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
        queued = pool.submit(httpx.post, gw.url + "/v1/completions", json={**body, "stream": False}, timeout=45)
        wait_until(lambda: httpx.get(gw.url + "/admin/load", timeout=5).json()["queued"] == 1, 30,
                   what="the second request queued for the only slot")
        os.killpg(gw.proc.pid, signal.SIGTERM)
        refused = queued.result()
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "router_stopping"
        rest = list(lines)
    assert rest[-1] == "data: [DONE]" or "data: [DONE]" in rest
    chunks = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_requests_still_running_when_the_stop_grace_ends_are_told_so_not_cut_silently(slow_model, logs):
    """At the end of the drain timeout the front door closed the connections: a stream ended with no error event
    and no [DONE], a request waiting for its first byte got no answer at all, and neither had an access line."""
    from concurrent.futures import ThreadPoolExecutor

    e = engine(slow_model, logs, name="slow").start()
    gw = router([e], logs, "leastload", "--drain-timeout", "1").start()
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=60)
    before = len(gw.log_path.read_text())  # the module's router log: earlier tests wrote to it too
    try:
        stream = client.completions.create(model="slow", prompt="a", max_tokens=3000, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        got = [next(iter(stream))]  # the stream is under way
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.post, gw.url + "/v1/completions", json={**SLOW, "stream": False}, timeout=60)
            wait_until(lambda: httpx.get(gw.url + "/admin/load", timeout=5).json()["in_flight"] == 2, 30,
                       what="both requests at the replica")
            os.killpg(gw.proc.pid, signal.SIGTERM)
            with pytest.raises(openai.APIError) as cut:  # an error event the client parses, not a JSONDecodeError
                got += list(stream)
            answer = waiting.result()
        assert "the router stopped" in str(cut.value) and len(got) >= 1
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "router_stopping"
        assert answer.headers["retry-after"] == "1"  # cut at the drain's end: it had no Retry-After
        assert gw.proc.wait(timeout=30) == 0
        log = gw.log_path.read_text()[before:]
        assert log.count("path=/v1/completions status=503") == 2, log
    finally:
        gw.stop()
        e.stop()


def test_a_non_streamed_answer_longer_than_the_upstream_timeout_is_a_504_naming_it(slow_model, logs):
    """The replica's silence allowed was a fixed 300 s: a long non-streamed generation (its whole time passes
    before the first byte) was cut after the work. It is spec.router.upstreamTimeoutSeconds now (default 1800)."""
    e = engine(slow_model, logs, name="slow").start()
    gw = router([e], logs, "leastload", "--upstream-timeout", "0.5").start()
    try:
        body = {**SLOW, "stream": False, "max_tokens": 3000}
        r = httpx.post(gw.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 504 and "0.5s" in r.json()["error"]["message"], r.text
    finally:
        gw.stop()
        e.stop()


def test_a_stream_whose_replica_hangs_ends_with_an_error_after_the_stream_idle_timeout(slow_model, logs):
    """A replica stopped mid-stream (SIGSTOP, a hung GPU) kept its streams open until upstreamTimeoutSeconds (30
    minutes by default): health probes take it out, but a stream under way cannot move. A silence longer than
    spec.router.streamIdleTimeoutSeconds once the answer began ends it with a 504 error event and [DONE]; the
    first token's wait stays the upstream timeout's."""
    e = engine(slow_model, logs, name="slow").start()
    gw = router([e], logs, "leastload", "--stream-idle-timeout", "2")
    stopped = False
    try:  # a router that fails to start must not leave the engine behind
        gw.start()
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=60)
        stream = client.completions.create(model="slow", prompt="a", max_tokens=3000, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        got = [next(stream)]
        os.kill(e.proc.pid, signal.SIGSTOP)
        stopped = True
        with pytest.raises(openai.APIError) as cut:
            for chunk in stream:
                got.append(chunk)
        assert "sent nothing for 2s mid-stream" in str(cut.value) and "streamIdleTimeoutSeconds" in str(cut.value)
        assert cut.value.body["code"] == "upstream_timeout"
        os.kill(e.proc.pid, signal.SIGCONT)
        stopped = False
        # the replica is back: a stream whose chunks come every decode step is not cut
        wait_until(lambda: http_ok(gw.url + "/health"), timeout=30)
        whole = list(client.completions.create(model="slow", prompt="a", max_tokens=8, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True}))
        assert whole[-1].choices[0].finish_reason == "length"
    finally:
        if stopped:
            os.kill(e.proc.pid, signal.SIGCONT)
        gw.stop()
        e.stop()


@pytest.fixture()
def slow_pair_limited(slow_model, logs):
    e = engine(slow_model, logs, name="slow").start()
    gw = router([e], logs, "leastload", "--max-concurrent-per-replica", "1", "--drain-timeout", "60").start()
    yield gw, e
    gw.stop()
    e.stop()


def test_admin_backends_replaces_and_drains(pair, tiny_model, logs):
    gw, engines = pair
    urls = [e.url for e in engines]
    body = {"backends": [{"url": urls[0], "state": "ready"}, {"url": urls[1], "state": "draining"}]}
    assert httpx.put(gw.url + "/admin/backends", json=body, timeout=5).status_code == 200
    picks = {replica_of(httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)) for _ in range(4)}
    assert picks == {urls[0].split("://")[1]}  # nothing new goes to the draining one
    bad = httpx.put(gw.url + "/admin/backends", json={"backends": [{"url": urls[0], "state": "gone"}]}, timeout=5)
    assert bad.status_code == 400 and "allowed values" in bad.json()["error"]["message"]
    # a URL without a host or with a port that is no number passed, and every request after it was a 500 while
    # the health checks had stopped for good
    # ... and an OpenAI base URL (a path: the health probe went to /v1/health, the replica never became healthy,
    # and every request waited out the buffer)
    for url in ("http://", "http://127.0.0.1:abc", "http://[::1", urls[0] + "/v1"):
        bad = httpx.put(gw.url + "/admin/backends", json={"backends": [{"url": url, "state": "ready"}]}, timeout=5)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "backends[].url", (url, bad.text)
    for name in ("", "r 0", 7, "x" * 64):  # the replica's name is a label value of the model_* series
        bad = httpx.put(gw.url + "/admin/backends", json={"backends": [{"url": urls[0], "name": name}]}, timeout=5)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "backends[].name", (name, bad.text)
    # the same replica twice, in two states: kept once, draining, and answered 200 ("backends": 2)
    twice = {"backends": [{"url": urls[0], "state": "ready"}, {"url": urls[0] + "/", "state": "draining"}]}
    bad = httpx.put(gw.url + "/admin/backends", json=twice, timeout=5)
    assert bad.status_code == 400 and "listed twice" in bad.json()["error"]["message"], bad.text
    body = {"backends": [{"url": u, "state": "ready", "name": f"r{i}"} for i, u in enumerate(urls)]}
    assert httpx.put(gw.url + "/admin/backends", json=body, timeout=5).status_code == 200


@pytest.fixture()
def slow_pair(slow_model, logs):
    e = engine(slow_model, logs, name="slow").start()
    gw = router([e], logs, strategy="leastload").start()
    yield gw, e
    gw.stop()
    e.stop()


SLOW = {"model": "slow", "prompt": "a", "max_tokens": 3000, "stream": True, "temperature": 0, "ignore_eos": True}


def test_stream_is_relayed_chunk_by_chunk_and_disconnect_cancels_upstream(slow_pair):
    gw, e = slow_pair
    with httpx.stream("POST", gw.url + "/v1/completions", json=SLOW, timeout=60,
                      headers={"x-request-id": "left-early"}) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: {"))
        assert json.loads(first[6:])["object"] == "text_completion"
        # the first chunk arrived while the engine is still generating: nothing was buffered
        assert sample(e.url, "vllm:num_requests_running", model_name="slow") == 1
    wait_until(lambda: sample(e.url, "vllm:num_requests_running", model_name="slow") == 0, 60,
               what="upstream generation to stop after the client left")
    assert sample(e.url, "vllm:generation_tokens_total", model_name="slow") < 3000
    wait_until(lambda: httpx.get(gw.url + "/health", timeout=5).json()["backends"][0]["in_flight"] == 0, 30,
               what="router to release the slot")
    # the access line says the client left (it said 200, where the engine's said 499)
    wait_until(lambda: "request_id=left-early" in gw.log(), 20, what="the request's access line")
    line = next(x for x in gw.log().splitlines() if "request_id=left-early" in x)
    assert "status=499" in line, line


def test_backend_dying_mid_stream_gives_a_clean_error(slow_pair):
    gw, e = slow_pair
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    stream = client.completions.create(**{k: v for k, v in SLOW.items() if k != "ignore_eos"},
                                       extra_body={"ignore_eos": True})
    assert next(iter(stream)).choices
    e.kill(signal.SIGKILL)
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        for _ in stream:
            pass


def test_the_router_knows_the_served_name_unless_the_replicas_may_serve_others():
    from fleetserve.router.served import served_model_args

    assert served_model_args("m", "builtin", []) == ["--model", "m"]
    assert served_model_args("m", "vllm", ["--max-model-len", "8192"]) == ["--model", "m"]
    assert served_model_args("m", "vllm", ["--enable-lora", "--lora-modules", "a=/x"]) == []  # adapters' names
    assert served_model_args("m", "vllm", ["--lora-modules=a=/x"]) == []
    assert served_model_args("m", "external", []) == []
