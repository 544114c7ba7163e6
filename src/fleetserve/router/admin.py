"""The gateway's control routes: health, the admin API the supervisor drives, metrics, the dashboard.

They are few requests a second, so they stay a Starlette app (served on the same port through router/asgi.py);
the OpenAI routes never pass through it. Who may call what: /health's status is public, its backend details,
/admin/* and the dashboard need the admin token or the fleet's internal token (with no secret configured at
all, loopback clients); /metrics names tenants, so with API keys on it needs the same.
"""

from __future__ import annotations

import logging
import re

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fleetserve.api.errors import APIError, api_app
from fleetserve.api.internal import header_has_secret
from fleetserve.api.openapi import openapi_endpoint
from fleetserve.api.protocol import parse_json_body
from fleetserve.observe.metrics import exposition
from fleetserve.router.upstream import backend_url_problem

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "::1", "localhost")
REPLICA_NAME = re.compile(r"[A-Za-z0-9._-]{1,63}")  # a label value: the replica of the model_* series


def admin_allowed(gateway, request: Request) -> bool:
    """The admin token (or the fleet's internal token, which Prometheus may send as a bearer token). Loopback
    clients only on a router with no secret at all (no admin token, internal token or API keys): with API keys on
    and no admin token, any local process (and, behind a TLS proxy on the host, every client) was admin, could
    PUT its own backend and read the tenants' prompts and the internal token the router sends it."""
    token = gateway.settings.admin_token
    if gateway.internal.trusted(request.headers):
        return True
    if token:
        return header_has_secret(request.headers.get("x-fleetserve-admin", ""), token)
    if gateway.internal.enabled or gateway.settings.keyring is not None:
        return False
    # and named as loopback: a page whose name a DNS rebinding pointed at 127.0.0.1 sends its own name as Host
    return request.client is not None and request.client.host in LOOPBACK and \
        _host_name(request.headers.get("host", "")) in LOOPBACK


def admin_write_allowed(gateway, request: Request) -> bool:
    """Changing the backend set: the admin token alone where the router has one. The internal token is sent to
    every replica, and a process that took a crashed replica's port in the moment before the router knew had
    read it and PUT itself as the only backend (every tenant's requests went to it for minutes); it reads the
    admin API (load, metrics), never writes it."""
    token = gateway.settings.admin_token
    if token:
        return header_has_secret(request.headers.get("x-fleetserve-admin", ""), token)
    if gateway.internal.enabled or gateway.settings.keyring is not None:
        return False  # without an admin token (FLEETSERVE_ADMIN_TOKEN) the internal token wrote it: nobody may
    return admin_allowed(gateway, request)


def _host_name(host: str) -> str:
    """A Host header's name without its port (`[::1]:8000` is `::1`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _write_forbidden(gateway) -> Response:
    if gateway.settings.admin_token:
        return _forbidden()
    return APIError(403, "admin API: changing the backend set needs the router's admin token, and this router has "
                         "none: start it with FLEETSERVE_ADMIN_TOKEN set and send that token as x-fleetserve-admin "
                         "(the internal token reaches every replica, so it reads the admin API and never writes it)"
                    ).response()


def _forbidden() -> Response:
    return APIError(403, "admin API: wrong or missing x-fleetserve-admin token (a fleet of `fleetserve up` also "
                         "takes `Authorization: Bearer` with its internal token: run/NAME/internal.token under "
                         "FLEETSERVE_HOME, ~/.cache/fleetserve by default)").response()


def build_control_app(gateway) -> Starlette:
    async def health(request: Request) -> Response:
        """Status for anyone; the backends (URLs, errors) only for the admin."""
        ok = gateway.pool.any_eligible()
        body: dict = {"status": "ok" if ok else "no healthy replica", "strategy": gateway.policy.name}
        if admin_allowed(gateway, request):
            body["backends"] = [
                {"id": b.id, "url": b.url, "healthy": b.healthy, "draining": b.draining, "in_flight": b.in_flight,
                 "breaker": b.breaker, "error": b.last_error}
                for b in gateway.pool.backends.values()
            ]
        return JSONResponse(body, status_code=200 if ok else 503)

    async def livez(request: Request) -> Response:
        """The router process answers (Kubernetes' liveness): whatever its replicas do. /health is 503 at zero
        replicas, and a probe of it restarted the routers holding requests for a scale from zero."""
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        """The router takes requests (Kubernetes' readiness): at zero replicas too, since it holds them in its
        buffer until one is ready (the activation signal); 503 once it is stopping."""
        if gateway.gate.closed:
            return JSONResponse({"status": "stopping"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def admin_load(request: Request) -> Response:
        """What the autoscaler reads each poll: buffered and in-flight requests, per-backend load, TTFT p95."""
        if not admin_allowed(gateway, request):
            return _forbidden()
        return JSONResponse(gateway.load_report())

    async def admin_backends(request: Request) -> Response:
        """Replace the backend set: {"backends": [{"url": ..., "state": "ready" | "starting" | "draining",
        "name": the replica's name, optional, "instance": the secret its process proves in /health, optional}],
        "failing": why no replica can start now, or null}."""
        if not admin_write_allowed(gateway, request):
            return _write_forbidden(gateway)
        try:
            document = parse_json_body(await request.body())
            entries = document["backends"]
            failing = document.get("failing")
            urls = [e["url"] for e in entries]
            states = [e.get("state", "starting") for e in entries]
            names = {e["url"].rstrip("/"): e["name"] for e in entries if e.get("name") is not None}
            given = {e["url"].rstrip("/"): e["instance"] for e in entries if e.get("instance") is not None}
        except (KeyError, TypeError, AttributeError):
            return APIError(400, 'backends: expected {"backends": [{"url": "http://...", "state": "ready"}]}',
                            param="backends").response()
        except APIError as err:
            return err.response()
        problem = next((p for u in urls if (p := backend_url_problem(u))), None)
        if problem:
            return APIError(400, f"backends[].url: {problem}", param="backends[].url").response()
        seen: set[str] = set()
        twice = next((u for u in urls if u.rstrip("/") in seen or seen.add(u.rstrip("/"))), None)
        if twice is not None:  # kept once, in one of its states: a typo had drained the whole fleet, answered 200
            return APIError(400, f"backends[].url: {twice} is listed twice (a trailing / names the same replica); "
                                 "list each replica once, with one state", param="backends[].url").response()
        bad = [st for st in states if st not in ("ready", "starting", "draining")]
        if bad:
            return APIError(400, f"backends[].state: got {bad[0]!r}; allowed values: ready, starting, draining",
                            param="backends[].state").response()
        if any(not (isinstance(n, str) and REPLICA_NAME.fullmatch(n)) for n in names.values()):
            return APIError(400, "backends[].name: a replica name of 1-63 letters, digits, '.', '_' or '-' (a label "
                                 "value of the model_* series)", param="backends[].name").response()
        if any(not (isinstance(i, str) and 0 < len(i) <= 128) for i in given.values()):
            return APIError(400, "backends[].instance: the secret its process proves in /health (1-128 characters)",
                            param="backends[].instance").response()
        if failing is not None and not isinstance(failing, str):
            return APIError(400, "failing: a string (why no replica can start) or null", param="failing").response()
        gateway.set_backends(urls, ready={u.rstrip("/") for u, st in zip(urls, states, strict=True) if st == "ready"},
                             draining={u.rstrip("/") for u, st in zip(urls, states, strict=True) if st == "draining"},
                             from_peer=False, failing=failing, names=names,
                             instances={u.rstrip("/"): given.get(u.rstrip("/")) for u in urls} if given else None)
        return JSONResponse({"backends": len(urls)})

    async def metrics(request: Request) -> Response:
        """Tenant names are in these series: with API keys on, only the admin (or Prometheus with the internal
        token) may read them."""
        if gateway.settings.keyring is not None and not admin_allowed(gateway, request):
            return APIError(401, "router metrics name tenants: send x-fleetserve-admin or the internal bearer token",
                            code="invalid_api_key").response()
        gateway.refresh_gauges()
        data, content_type = exposition(gateway.metrics_registry())
        return Response(data, media_type=content_type)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET"]),
        Route("/livez", livez, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/openapi.json", openapi_endpoint("router"), methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/load", admin_load, methods=["GET"]),
        Route("/admin/backends", admin_backends, methods=["PUT"]),
    ]
    from fleetserve.observe.dashboard import dashboard_routes  # /dashboard, /dashboard/data (admin only)

    routes += dashboard_routes(gateway)
    return api_app(routes, server_error=_server_error)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("router error")
    return APIError(500, f"internal router error: {type(exc).__name__}", code="internal_error").response()
