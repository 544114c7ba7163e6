"""Running the gateway: one process on uvloop, or `--workers N` processes sharing the port.

A stop (SIGTERM, SIGINT) stops accepting, answers the requests still waiting for a replica (held at zero
replicas or queued for a slot) 503 `router_stopping` with Retry-After, lets requests under way finish for the
drain timeout (their answers are not cut by a rolling restart), then closes the replicas' connections and exits.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import ssl as ssl_module

from fleetserve.observe.logs import configure_logging
from fleetserve.router import http1
from fleetserve.router.gateway import Gateway, RouterSettings
from fleetserve.router.pool import BackendPool

log = logging.getLogger(__name__)

GRACE_S = 5.0  # requests under way at a stop get this long to finish
GC_YOUNG_THRESHOLD = 20_000  # allocations between young-generation collections (Python's default: 700)

__all__ = ["Gateway", "RouterSettings", "run_router", "serve_gateway"]


FD_RESERVE = 1024  # descriptors kept for what is not a client (replica connections, scrapes, logs), at most
DEFAULT_MAX_CONNECTIONS = 10_000
UNLIMITED_NOFILE = 1 << 20  # the soft limit asked for when the hard one is unlimited


def connection_limit(asked: int | None = None) -> int:
    """The client connections one router process takes: `asked`, or 10,000, within its file descriptors less a
    reserve for everything else (a quarter of them, at most 1,024; each request in flight holds a replica
    connection too). The soft limit is raised to the hard one first, as servers do. Connections that idle or
    dribble had taken every descriptor, and then no replica could be reached either. A limit below what was asked
    (or the default) is said in the log."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, UNLIMITED_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    goal = asked or DEFAULT_MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return goal
    limit = max(16, min(goal, soft - min(FD_RESERVE, soft // 4)))
    if limit < goal:
        log.warning("this router takes at most %d client connections (its file descriptors: %d, `ulimit -n`; "
                    "asked: %d): raise the limit for more", limit, soft, goal)
    return limit


def server_tls(tls: tuple[str, str] | None) -> ssl_module.SSLContext | None:
    if not tls:
        return None
    context = ssl_module.SSLContext(ssl_module.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls[0], tls[1])
    # ALPN: a client that offers h2 and http/1.1 is told which one this is (without it, clients that ask got
    # "server did not agree on a protocol" and fell back on their own)
    context.set_alpn_protocols(["http/1.1"])
    return context


async def serve_gateway(backends: list[str], host: str, port: int, settings: RouterSettings, *,
                        health_path: str = "/health", unhealthy_after: int = 2, healthy_after: int = 1,
                        tls: tuple[str, str] | None = None, reuse_port: bool = False, sock=None, peers=None,
                        stop: asyncio.Event | None = None, grace_s: float = GRACE_S) -> None:
    """Serve until `stop` is set (or SIGTERM/SIGINT in the main thread); requests under way then get `grace_s`."""
    pool = BackendPool(backends, health_path=health_path, interval=settings.health_interval,
                       unhealthy_after=unhealthy_after, healthy_after=healthy_after,
                       queue_metrics=settings.queue_metrics)
    gateway = Gateway(pool, settings)
    if peers is not None:
        peers.attach(gateway)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (RuntimeError, ValueError):
            pass  # not the main thread (tests): the caller sets `stop`
    await gateway.start()  # backends probed before the first request is accepted
    settle_garbage_collector()
    context = server_tls(tls)
    gateway.scheme = "https" if context else "http"
    door = await http1.serve(gateway.handle, gateway.error, host, port, limits=settings.size_limits, ssl=context,
                             reuse_port=reuse_port, sock=sock, send_timeout_s=settings.client_send_timeout,
                             max_connections=connection_limit(settings.max_connections))
    bound = door.server.sockets[0].getsockname()
    gateway.server_address = (str(bound[0]), int(bound[1]))
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address, bracketed as in a URL
    log.info("router on %s://%s:%d, strategy %s, backends %s", gateway.scheme, shown, bound[1], settings.strategy,
             [b.url for b in gateway.pool.backends.values()] or "none yet")  # as the pool holds them
    try:
        await stop.wait()
    finally:
        gateway.gate.close()  # what waits at the door is answered 503 now; what a replica has runs on
        await door.shutdown(grace_s)
        if peers is not None:
            peers.close()
        await gateway.stop()


def settle_garbage_collector() -> None:
    """Everything loaded at start-up (modules, the app, the metrics) moves out of the collector's sight, and
    young collections run less often: a full collection walking those objects paused every request in
    flight for tens of milliseconds (the gateway's p99). Requests' own objects die by reference counting."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run_router(backends: list[str], host: str, port: int, settings: RouterSettings,
               health_path: str = "/health", unhealthy_after: int = 2, healthy_after: int = 1,
               tls: tuple[str, str] | None = None, log_format: str = "text", workers: int = 1,
               grace_s: float = GRACE_S) -> None:
    configure_logging(log_format, "router")
    options = {"health_path": health_path, "unhealthy_after": unhealthy_after, "healthy_after": healthy_after,
               "tls": tls, "grace_s": grace_s}
    if workers > 1:
        from fleetserve.router.workers import run_workers

        run_workers(workers, backends, host, port, settings, options)
        return
    run_loop(serve_gateway(backends, host, port, settings, **options))


def run_loop(main) -> None:
    """uvloop when present (it is a dependency), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)
