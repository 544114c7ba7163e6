"""`fleetserve router --failing-file`: the fleet's reason no replica can start, from a file (on Kubernetes the
operator writes it into a ConfigMap the router pods mount: k8s/failing.py). A real router process."""

from __future__ import annotations

import concurrent.futures

import httpx

from tests.helpers import Server, wait_until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
REASON = "every replica fails to start (the fleet's status and its replica logs say why)"


def test_the_reason_in_the_file_refuses_held_and_new_requests_and_an_empty_file_holds_them_again(tmp_path):
    state = tmp_path / "failing"
    state.write_text(REASON + "\n")
    # localhost:9 resolves and refuses: a replica that DNS lists and that does not serve (the pods of a crash loop)
    gw = Server(["router", "--backend-dns", "localhost:9", "--failing-file", str(state), "--health-interval", "0.1",
                 "--buffer-timeout", "300"], tmp_path / "router.log").start(ready_path="/livez")
    try:
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "replicas_failing"
        assert REASON in r.json()["error"]["message"]
        state.write_text("")  # the pods are on their way again: requests wait for them
        wait_until(lambda: "can start again" in (tmp_path / "router.log").read_text(), 30, what="the file re-read")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(httpx.post, gw.url + "/v1/chat/completions", json=CHAT, timeout=120)
            wait_until(lambda: httpx.get(gw.url + "/admin/load", timeout=5).json()["pending"] == 1, 30,
                       what="the request held")
            state.write_text(REASON)  # the operator's next word: it hears it at once, not at the buffer timeout
            answer = held.result(timeout=60)
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "replicas_failing"
    finally:
        gw.stop()


def test_a_file_that_is_absent_refuses_nothing(tmp_path):
    """The ConfigMap is mounted optional: a router without it holds requests as it always did."""
    gw = Server(["router", "--backend-dns", "localhost:9", "--failing-file", str(tmp_path / "absent"),
                 "--buffer-timeout", "0.5"], tmp_path / "router.log").start(ready_path="/livez")
    try:
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] != "replicas_failing"  # the buffer timeout's
    finally:
        gw.stop()
