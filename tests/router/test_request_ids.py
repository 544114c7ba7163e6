"""Every answer of the router carries an x-request-id and every error is counted, on a real loopback socket: the
router's own refusals (404, 405, 413, a malformed request) had neither."""

from __future__ import annotations

import asyncio

from fleetserve.api.limits import SizeLimits
from fleetserve.router import http1
from fleetserve.router.gateway import Gateway, RouterSettings
from fleetserve.router.pool import BackendPool
from tests.router.test_http1 import exchange


def test_the_routers_own_answers_carry_a_request_id_and_its_errors_are_counted():
    async def main():
        gw = Gateway(BackendPool([]), RouterSettings())
        door = await http1.serve(gw.handle, gw.error, "127.0.0.1", 0, limits=SizeLimits(max_body_bytes=1024))
        port = door.server.sockets[0].getsockname()[1]
        outs = {
            "404": await exchange(port, b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n"
                                        b"connection: close\r\n\r\n{}"),
            "405": await exchange(port, b"GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-request-id: mine-1\r\n"
                                        b"connection: close\r\n\r\n"),
            "413": await exchange(port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5000\r\n"
                                        b"\r\n"),
            "413 elsewhere": await exchange(port, b"POST /random/path HTTP/1.1\r\nhost: x\r\ncontent-length: 5000"
                                                  b"\r\n\r\n"),
            "400": await exchange(port, b"GARBAGE\r\n\r\n"),
            "long": await exchange(port, b"GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-request-id: "
                                         + b"a" * 5000 + b"\r\nconnection: close\r\n\r\n"),
            "health": await exchange(port, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
        }
        for name in ("rand-0", "rand-1"):  # a model card's name is the client's: one label, not one per name
            await exchange(port, b"DELETE /v1/models/" + name.encode() + b" HTTP/1.1\r\nhost: x\r\n"
                                 b"connection: close\r\n\r\n")
        counted = {(s.labels["path"], s.labels["code"]): s.value for m in gw.metrics.registry.collect()
                   if m.name == "fleetserve_router_requests" for s in m.samples
                   if s.name.endswith("_total") and s.value}
        await door.shutdown(1)
        return outs, counted

    outs, counted = asyncio.run(asyncio.wait_for(main(), 30))
    for status in ("404", "405", "413", "400"):
        assert outs[status].startswith(b"HTTP/1.1 " + status.encode()) and b"x-request-id: " in outs[status], status
    assert b"x-request-id: mine-1\r\n" in outs["405"]  # the client's own, when it is a sane one
    long_id = outs["long"].split(b"x-request-id: ")[1].split(b"\r\n")[0]
    assert 0 < len(long_id) <= 128 and b"aaaa" not in long_id  # 5,000 characters: replaced by ours
    assert b"x-request-id: " in outs["health"]
    assert counted[("other", "404")] == 1 and counted[("/v1/chat/completions", "405")] == 2
    # a body too large counts under its API path (it had counted as "other"); another path is the client's: "other"
    assert counted[("/v1/chat/completions", "413")] == 1 and counted[("other", "413")] == 1
    assert counted[("other", "400")] == 1
    # health checks (503 with no replica: SageMaker's /ping every few seconds) and scrapes are not requests
    assert not any(code in ("200", "503") for _, code in counted), counted
    assert counted[("/v1/models/{model}", "405")] == 2 and not any("rand" in path for path, _ in counted)


def test_an_error_answered_after_the_handler_counted_it_is_not_counted_again_and_keeps_its_id():
    """A request cut when the router stops was counted 503 by its handler and again under "other" by the front
    door's answer, which also gave it a new id."""
    from tests.recording_responder import Recorder

    gw = Gateway(BackendPool([]), RouterSettings())
    responder = Recorder()
    responder.request_id, responder.path = b"client-42", "/v1/chat/completions"
    gw._count_request(responder, "/v1/chat/completions", 503)
    gw.error(responder, 503, "the router stopped", "router_stopping")
    assert (b"x-request-id", b"client-42") in responder.headers
    assert (b"retry-after", b"1") in responder.headers  # as every other 503 of ours: it had none
    counted = {(s.labels["path"], s.labels["code"]): s.value for m in gw.metrics.registry.collect()
               if m.name == "fleetserve_router_requests" for s in m.samples if s.name.endswith("_total") and s.value}
    assert counted == {("/v1/chat/completions", "503"): 1}
    failed = Recorder()  # a handler that failed before counting: counted once, under the path it knew
    failed.path = "/v1/completions"
    gw.error(failed, 500, "internal router error", "internal_error")
    counted = {(s.labels["path"], s.labels["code"]): s.value for m in gw.metrics.registry.collect()
               if m.name == "fleetserve_router_requests" for s in m.samples if s.name.endswith("_total") and s.value}
    assert counted[("/v1/completions", "500")] == 1


def test_head_on_the_model_paths_answers_what_get_does_without_a_body():
    """HEAD /v1/models had been a 405 (monitors check an endpoint with HEAD); GET's answer now, with no body."""
    async def main():
        gw = Gateway(BackendPool([]), RouterSettings(served_models=("m",)))
        door = await http1.serve(gw.handle, gw.error, "127.0.0.1", 0, limits=SizeLimits(max_body_bytes=1024))
        port = door.server.sockets[0].getsockname()[1]
        outs = {path: await exchange(port, b"HEAD " + path + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                for path in (b"/v1/models", b"/v1/models/m", b"/v1/models/other")}
        get = await exchange(port, b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        await door.shutdown(1)
        return outs, get

    outs, get = asyncio.run(asyncio.wait_for(main(), 30))
    head, body = outs[b"/v1/models"].split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and body == b""
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert length == len(get.split(b"\r\n\r\n", 1)[1]) > 0  # the length GET's body has
    assert outs[b"/v1/models/m"].startswith(b"HTTP/1.1 200") and outs[b"/v1/models/m"].endswith(b"\r\n\r\n")
    assert outs[b"/v1/models/other"].startswith(b"HTTP/1.1 404") and outs[b"/v1/models/other"].endswith(b"\r\n\r\n")
