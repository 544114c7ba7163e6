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
            "400": await exchange(port, b"GARBAGE\r\n\r\n"),
            "long": await exchange(port, b"GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-request-id: "
                                         + b"a" * 5000 + b"\r\nconnection: close\r\n\r\n"),
            "health": await exchange(port, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
        }
        counted = {(s.labels["path"], s.labels["code"]): s.value for m in gw.metrics.registry.collect()
                   if m.name == "fleetserve_router_requests" for s in m.samples if s.name.endswith("_total")}
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
    assert counted[("other", "413")] == 1 and counted[("other", "400")] == 1
    assert not any(code == "200" for _, code in counted)  # health checks and scrapes are not requests
