"""The router's own probes (Kubernetes): live while it answers, ready until it stops, whatever its replicas do."""

from starlette.testclient import TestClient

from fleetserve.router.admin import build_control_app
from fleetserve.router.gateway import Gateway, RouterSettings
from fleetserve.router.pool import BackendPool


def test_readyz_turns_503_when_the_router_stops_and_livez_stays_200():
    gateway = Gateway(BackendPool([]), RouterSettings())  # no replica at all
    client = TestClient(build_control_app(gateway))
    assert client.get("/health").status_code == 503
    assert client.get("/readyz").status_code == 200 and client.get("/livez").status_code == 200
    gateway.gate.close()  # the stop begins: what waits is answered 503, and the Service should send no more
    assert client.get("/readyz").json() == {"status": "stopping"} and client.get("/readyz").status_code == 503
    assert client.get("/livez").status_code == 200


def test_one_backend_whose_probe_fails_unexpectedly_leaves_the_others_probed():
    """A URL the connection pool refuses raised out of the probe round, and the health loop ended for good."""
    import asyncio

    async def main():
        pool = BackendPool(["http://", "http://127.0.0.1:1"], timeout=0.5)
        await pool.probe_all()  # no exception
        await pool.probe_all()
        (refused,) = [b for b in pool.backends.values() if b.url.endswith(":1")]
        result = refused.failures, refused.healthy
        await pool.aclose()
        return result

    failures, healthy = asyncio.run(main())
    assert failures == 2 and healthy is False


def test_a_replica_back_after_refusing_connections_is_a_restart_and_prefixaware_forgets_what_it_held():
    """A restarted engine has an empty cache; the router's index still predicted its old prefixes there (a cold
    prefill each, and misses that read as a small cache). A slow or paused replica (timeouts) keeps its index."""
    import asyncio

    from fleetserve.kvcache.blocks import chain_keys
    from fleetserve.router.policies import RouteRequest
    from tests.helpers import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"

    async def health(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async def main():
        pool = BackendPool([url], timeout=1.0)
        gateway = Gateway(pool, RouterSettings(strategy="prefixaware"))
        backend = pool.backends[f"127.0.0.1:{port}"]
        server = await asyncio.start_server(health, "127.0.0.1", port)
        await pool.probe_all()
        tokens = list(range(64))
        request = RouteRequest("/v1/completions", blocks=tuple(chain_keys(tokens, 16)), block_tokens=16,
                               prompt_tokens=len(tokens))
        assert gateway.policy.choose(request, gateway.snapshot()).replica.id == backend.id
        assert gateway.policy.index_size() == 4
        restarts = []
        pool.on_restart.append(restarts.append)
        server.close()
        await server.wait_closed()
        await pool.probe_all()  # refused: the process is gone
        assert backend.refused and gateway.policy.index_size() == 4
        server = await asyncio.start_server(health, "127.0.0.1", port)  # a new process on the same address
        await pool.probe_all()
        server.close()
        await pool.aclose()
        await gateway.upstream.aclose()
        return restarts, gateway.policy.index_size(), backend

    restarts, size, backend = asyncio.run(main())
    assert restarts == [backend.id] and size == 0 and not backend.refused and backend.last_error == ""


def test_the_supervisors_ready_word_after_a_refusal_is_the_restart():
    """The fleet's `ready` push marked the new process healthy without a word: the next probe then took it for a
    restart and wiped what the router had sent to the new process meanwhile."""
    import asyncio

    async def main():
        pool = BackendPool(["http://127.0.0.1:1"], timeout=0.5)
        backend = next(iter(pool.backends.values()))
        restarts = []
        pool.on_restart.append(restarts.append)
        await pool.probe_all()  # refused: nothing listens on port 1
        pool.set_backends(["http://127.0.0.1:1"], ready={"http://127.0.0.1:1"})
        await pool.aclose()
        return restarts, backend

    restarts, backend = asyncio.run(main())
    assert restarts == [backend.id] and not backend.refused and backend.healthy
