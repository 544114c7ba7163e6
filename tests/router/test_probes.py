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
