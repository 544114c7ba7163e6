"""The OpenAI-compatible gateway: choose a replica, proxy, retry before the first byte, stream through.

A request is committed to a replica only once that replica has produced its first body bytes; until then a
connection failure or an overloaded answer (502/503/504) sends it to another replica. After the first byte,
a failure ends an SSE stream with an OpenAI error event, never with a silent cut.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hmac
import json
import logging
import random
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fleetserve.api.disconnect import ClientGone, WatchedStreamingResponse, until_disconnect
from fleetserve.api.errors import APIError
from fleetserve.api.internal import INTERNAL_HEADER, InternalAuth
from fleetserve.api.limits import KEEP_ALIVE_S, RequestSizeLimit, SizeLimits
from fleetserve.api.openapi import openapi_endpoint
from fleetserve.api.protocol import parse_json_body
from fleetserve.kvcache.blocks import kv_salt
from fleetserve.observe.logs import configure_logging, log_request, prompt_text, tenant_hash, uvicorn_log_config
from fleetserve.observe.metrics import RouterMetrics, exposition  # the vocabulary's router metrics
from fleetserve.router import feedback
from fleetserve.router.admission import (
    BUFFER,
    GO,
    AdmissionSettings,
    Rejection,
    admit,
    buffer_timeout,
    limit_views,
    overflow,
)
from fleetserve.router.auth import TENANT_HEADER, KeyRing
from fleetserve.router.backlog import LoadBook
from fleetserve.router.discovery import DnsBackends, system_resolver
from fleetserve.router.features import KVLayout, request_features
from fleetserve.router.kvindex import KVIndex
from fleetserve.router.policies import Choice, FleetSnapshot, RouteRequest, RoutingPolicy, create_policy
from fleetserve.router.pool import Backend, BackendPool
from fleetserve.router.retry import backoff, exclude, retryable

log = logging.getLogger(__name__)
access_log = logging.getLogger("fleetserve.router.access")

HOP_BY_HOP = {
    "host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
    "proxy-authorization", "proxy-authenticate", "accept-encoding",
    # the key stays at the gateway; the tenant and the internal token are ours to set, never a client's
    "authorization", TENANT_HEADER, INTERNAL_HEADER,
}


@dataclass(frozen=True)
class RouterSettings:
    strategy: str = "leastload"
    session_key: str | None = None  # header or body key for session routing
    max_attempts: int = 3
    upstream_read_timeout: float = 300.0
    health_interval: float = 1.0
    buffer_size: int = 256  # requests held while no replica is ready (scale from zero)
    buffer_timeout: float = 600.0  # longer than a cold start; then 503 with Retry-After
    admin_token: str | None = None  # required on /admin/* when set; else loopback clients only
    max_concurrent_per_replica: int | None = None  # HyperPod requestLimits.maxConcurrentRequests
    max_queue: int | None = None  # requests waiting for a free slot (HyperPod maxQueueSize)
    overflow_status: int = 429
    keyring: KeyRing | None = None  # API keys -> tenants; None: no auth
    internal_token: str | None = None  # sent to the engines: they trust a tenant header only with it
    size_limits: SizeLimits = dataclasses.field(default_factory=SizeLimits)
    backend_dns: tuple[DnsBackends, ...] = ()  # names whose addresses are replicas (a headless Service)
    log_prompts: bool = False  # the request line carries the prompt text (default: never)


class _Attempt:
    """One upstream response whose first chunk has arrived; owns the backend's in-flight slot."""

    def __init__(self, backend: Backend, response: httpx.Response, first: bytes, iterator: AsyncIterator[bytes],
                 book: LoadBook, freed):
        self.choice: Choice | None = None  # the decision that sent it here (its prediction is learned from)
        self.tries = 1  # replicas tried, this one included
        self.backend = backend
        self.response = response
        self.first = first
        self.iterator = iterator
        self._book = book
        self._freed = freed
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._book.finished(self.backend.id)
            self._freed()

    async def aclose(self) -> None:
        self.release()
        await self.response.aclose()


class Gateway:
    def __init__(self, pool: BackendPool, settings: RouterSettings):
        self.pool = pool
        self.settings = settings
        self.policy: RoutingPolicy = create_policy(settings.strategy, session_key=settings.session_key)
        self.layout = KVLayout()
        self._layout_known = False
        self.kv_index: KVIndex | None = None
        self._kv_tasks: dict[str, asyncio.Task] = {}
        self._subscribed: set[str] = set()
        self.metrics = RouterMetrics()
        self.admission = AdmissionSettings(settings.buffer_size, settings.buffer_timeout,
                                           settings.max_concurrent_per_replica, settings.max_queue,
                                           settings.overflow_status)
        self.internal = InternalAuth(settings.internal_token)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=3.0, read=settings.upstream_read_timeout, write=30.0, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            headers=self.internal.headers(),  # every upstream call: requests, /get_model_info, KV events
            trust_env=False,
        )
        self._health_task: asyncio.Task | None = None
        self.static_backends = [b.url for b in pool.backends.values()]
        self.resolver = system_resolver  # injectable: discovery tests resolve names they make up
        self.pending = 0
        self.queued = 0
        self._slot_free = asyncio.Event()
        self.requests_total = 0
        self._ttfb: collections.deque[tuple[float, float]] = collections.deque(maxlen=4096)

    # --- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.settings.backend_dns:
            await self._discover()
        await self.pool.probe_all()
        self._health_task = asyncio.create_task(self._maintain())

    async def _discover(self) -> None:
        """Replace the backends with what the DNS names resolve to now (plus the static ones)."""
        loop = asyncio.get_running_loop()
        urls = list(self.static_backends)
        for name in self.settings.backend_dns:
            try:
                urls += await loop.run_in_executor(None, name.urls, self.resolver)
            except OSError as exc:
                log.warning("could not resolve %s (%s); keeping the last backends", name.host, exc)
                return
        known = {b.url for b in self.pool.backends.values()}
        if set(urls) != known:
            log.info("backends from DNS: %s", ", ".join(urls) or "none")
            self.pool.set_backends(urls)

    async def _maintain(self) -> None:
        """Health probes, the engines' KV layout, and (kvaware) one KV event subscription per backend."""
        rounds = 0
        while True:
            if self.settings.backend_dns and rounds % DISCOVERY_EVERY == 0:
                await self._discover()
            rounds += 1
            await self.pool.probe_all()
            if not self._layout_known:
                await self._learn_layout()
            if self.policy.name == "kvaware":
                for b in self.pool.backends.values():
                    task = self._kv_tasks.get(b.id)
                    if b.healthy and (task is None or task.done()):
                        self._kv_tasks[b.id] = asyncio.create_task(self._follow_kv_events(b))
                for gone in [bid for bid in self._kv_tasks if bid not in self.pool.backends]:
                    self._kv_tasks.pop(gone).cancel()
                    if self.kv_index is not None:
                        self.kv_index.forget(gone)
            await asyncio.sleep(self.pool.interval)

    async def _learn_layout(self) -> None:
        for b in self.pool.healthy():
            try:
                r = await self.client.get(b.url + "/get_model_info", timeout=2.0)
                if r.status_code != 200:
                    continue
                info = r.json()
                self.layout = KVLayout(int(info.get("block_size", 256)), str(info.get("kv_model", "")),
                                       str(info.get("kv_version", "1")), str(info.get("kv_dtype", "")))
                for other in self.pool.backends.values():
                    other.cache_blocks = other.cache_blocks or int(info.get("num_gpu_blocks", 0))
                self._layout_known = True
                return
            except (httpx.HTTPError, ValueError, TypeError):
                continue

    async def _follow_kv_events(self, backend: Backend) -> None:
        """Long-poll the backend's KV events into the index; resynchronise from /kv/blocks when behind."""
        seq = -1
        try:
            while True:
                if seq < 0:
                    r = await self.client.get(backend.url + "/kv/blocks", timeout=10.0)
                    if r.status_code == 404:
                        return  # this engine publishes no events
                    data = r.json()
                    if self.kv_index is None:
                        self.kv_index = KVIndex()
                    if "blocks" in data:  # the built-in engine: every tier
                        entries = {int(b["key"]): b["tier"] for b in data["blocks"]}
                    else:  # the simulated engine: one tier
                        entries = {int(k): data.get("tier", "engine") for k in data["keys"]}
                    self.kv_index.replace(backend.id, entries)
                    seq = int(data["seq"])
                    self._subscribed.add(backend.id)
                    continue
                r = await self.client.get(backend.url + "/kv/events", params={"since": seq, "wait": 10},
                                          timeout=15.0)
                data = r.json()
                if data.get("resync"):
                    seq = -1
                    continue
                for event in data.get("events", []):
                    keys = [int(k) for k in event.get("keys", [])]
                    if event.get("type") == "stored":
                        self.kv_index.stored(backend.id, keys, event.get("tier", "engine"))
                    elif event.get("type") == "removed":
                        self.kv_index.removed(backend.id, keys, event.get("tier"))
                seq = int(data.get("seq", seq))
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.info("KV events of %s interrupted (%s); will resubscribe", backend.url, type(exc).__name__)
        finally:
            self._subscribed.discard(backend.id)

    async def stop(self) -> None:
        for task in self._kv_tasks.values():
            task.cancel()
        if self._health_task:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await self.client.aclose()
        await self.pool.aclose()

    # --- proxying ------------------------------------------------------------------------------------------

    def _forward_headers(self, request: Request, request_id: str, tenant: str | None) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["x-request-id"] = request_id
        if tenant:
            headers[TENANT_HEADER] = tenant
        if request.client:
            headers["x-forwarded-for"] = request.client.host
        return headers

    async def _try(self, backend: Backend, method: str, path: str, raw: bytes, headers: dict,
                   prefill: int = 0) -> _Attempt | str:
        """Send to one backend; an _Attempt once its first bytes arrived, else the reason to try another.

        The shared LoadBook (router/backlog.py, also the simulator's) counts the request in flight from now
        and its `prefill` tokens as the backend's prefill backlog until its first byte (or failure).
        """
        book = self.pool.book
        book.sent(backend.id, prefill)
        try:
            outcome = await self._send(backend, method, path, raw, headers)
        except BaseException:
            book.failed(backend.id, prefill)
            self._notify_slot()
            raise
        if isinstance(outcome, _Attempt):
            book.first_byte(backend.id, prefill)
        else:
            book.failed(backend.id, prefill)
            self._notify_slot()
        return outcome

    async def _send(self, backend: Backend, method: str, path: str, raw: bytes, headers: dict) -> _Attempt | str:
        response = None
        try:
            upstream = self.client.build_request(method, backend.url + path, content=raw, headers=headers)
            response = await self.client.send(upstream, stream=True)
            if retryable(response.status_code):
                await response.aclose()
                self._request_failed(backend, f"status {response.status_code}")
                return f"status_{response.status_code}"
            iterator = response.aiter_raw()
            try:
                first = await anext(iterator)
            except StopAsyncIteration:
                first = b""
            if response.status_code < 500:
                self.pool.request_succeeded(backend)
            return _Attempt(backend, response, first, iterator, self.pool.book, self._notify_slot)
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            # The replica took the request and went silent: sending it elsewhere could poison the next replica
            # too (the request may be what stalls it). Answer 504; health probes judge the replica.
            if response is not None:
                await response.aclose()
            self._request_failed(backend, type(exc).__name__)
            return "timeout"
        except httpx.TransportError as exc:
            if response is not None:
                await response.aclose()
            self._mark_unreachable(backend, f"{type(exc).__name__}: {exc}")
            self._request_failed(backend, type(exc).__name__)
            return "unreachable"
        except BaseException:
            if response is not None:
                await response.aclose()
            raise

    def _request_failed(self, backend: Backend, error: str) -> None:
        was = backend.breaker
        self.pool.request_failed(backend, error)
        if was != "open" and backend.breaker == "open":
            self.metrics.ejections.labels(backend.id, "breaker").inc()

    def _mark_unreachable(self, backend: Backend, error: str) -> None:
        if backend.healthy:
            self.metrics.ejections.labels(backend.id, "unreachable").inc()
        self.pool.mark_unreachable(backend, error)

    def _notify_slot(self) -> None:
        self._slot_free.set()
        self._slot_free = asyncio.Event()

    def _snapshot(self) -> FleetSnapshot:
        views = limit_views(self.pool.snapshot().replicas, self.admission.max_concurrent_per_replica)
        return FleetSnapshot(views, time.monotonic(), self.kv_index)

    async def _admit(self) -> None:
        """Admission as the simulator does it (router/admission.py): go, hold while no replica is ready (scale
        from zero), wait in the bounded queue while every replica is at its limit, or refuse with Retry-After."""
        while True:
            views = self._snapshot().replicas
            verdict = admit(self.admission, bool(self.pool.healthy()), any(v.healthy for v in views),
                            self.pending, self.queued)
            if verdict == GO:
                return
            if isinstance(verdict, Rejection):
                raise _rejected(verdict)
            if verdict == BUFFER:
                await self._hold_until_ready()
            else:
                await self._queue_for_slot()

    async def _queue_for_slot(self) -> None:
        self.queued += 1
        self.metrics.queued.set(self.queued)
        deadline = time.monotonic() + self.admission.buffer_timeout
        try:
            while not any(v.healthy for v in self._snapshot().replicas) and self.pool.healthy():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _rejected(overflow(self.admission, "no slot became free in time"))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_free.wait(), remaining)
        finally:
            self.queued -= 1
            self.metrics.queued.set(self.queued)

    async def _hold_until_ready(self) -> None:
        """Hold the request while no replica can take it (scale from zero); bounded in count and time."""
        self.pending += 1
        self.metrics.pending.set(self.pending)
        started = time.monotonic()
        try:
            ready = await self.pool.wait_eligible(self.admission.buffer_timeout)
        finally:
            self.pending -= 1
            self.metrics.pending.set(self.pending)
            self.metrics.buffer_wait_s.observe(time.monotonic() - started)
        if not ready:
            raise _rejected(buffer_timeout(self.admission))

    async def _dispatch(self, request: Request, path: str, raw: bytes, body: dict, request_id: str,
                        tenant: str | None) -> _Attempt:
        await self._admit()
        headers = self._forward_headers(request, request_id, tenant)
        client_salt = body.get("cache_salt")
        salt = kv_salt(tenant, client_salt if isinstance(client_salt, str) else None)  # as the engines key it
        blocks, prompt_tokens, block_tokens, exact = request_features(body, self.layout, salt)
        excluded: frozenset[str] = frozenset()
        last_reason = ""
        for attempt in range(self.settings.max_attempts):
            if attempt:
                await asyncio.sleep(backoff(attempt, random.random()))
            route = RouteRequest(path, body, dict(request.headers), salt, excluded, blocks,
                                 block_tokens, prompt_tokens, exact)
            snapshot = self._snapshot()
            choice: Choice | None = self.policy.choose(route, snapshot)
            if choice is None and not excluded and self.pool.healthy() and self.admission.max_concurrent_per_replica:
                await self._admit()  # another request took the slot we waited for: wait again
                choice = self.policy.choose(route, self._snapshot())
            if choice is None:
                break
            replica = choice.replica
            self.metrics.decisions.labels(self.policy.name, choice.branch if not excluded else "retry").inc()
            outcome = await self._try(self.pool.get(replica.id), request.method, path, raw, headers,
                                      choice.prefill_tokens)
            if isinstance(outcome, _Attempt):
                outcome.choice, outcome.tries = choice, attempt + 1
                return outcome
            if outcome == "timeout":
                self.metrics.retries.labels("timeout_not_retried").inc()
                waited = self.settings.upstream_read_timeout
                raise APIError(504, f"the model replica did not answer within {waited:g}s; the request was not "
                                    "retried elsewhere", code="upstream_timeout")
            last_reason = outcome
            excluded = exclude(excluded, replica.id)
            self.metrics.retries.labels(outcome).inc()
        if not self.pool.healthy():
            raise APIError(503, "no healthy model replica is available; retry shortly", code="no_replica",
                           headers={"Retry-After": "2"})
        raise APIError(502, f"all attempts failed (last: {last_reason or 'no eligible replica'})",
                       code="upstream_failed", headers={"Retry-After": "1"})

    async def proxy(self, request: Request) -> Response:
        started = time.monotonic()
        path = request.url.path
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        if request.method == "POST":
            self.requests_total += 1
        tenant = None
        body: dict | None = None
        try:
            if self.settings.keyring is not None:
                tenant = self.settings.keyring.tenant(request.headers.get("authorization"))
            raw = await request.body()
            body = parse_json_body(raw) if request.method == "POST" else {}
            attempt = await until_disconnect(request, self._dispatch(request, path, raw, body, request_id, tenant))
        except ClientGone:
            self.metrics.requests.labels(path, "499").inc()
            self._log_request(request_id, tenant, path, 499, started, body=body)
            return Response(status_code=499)
        except APIError as err:
            self.metrics.requests.labels(path, str(err.status)).inc()
            self.metrics.tenant_requests.labels(tenant or "-", str(err.status)).inc()
            err.headers["x-request-id"] = request_id
            self._log_request(request_id, tenant, path, err.status, started, body=body, error=err.code)
            return err.response()
        self.metrics.tenant_requests.labels(tenant or "-", str(attempt.response.status_code)).inc()
        ttfb_ms = (time.monotonic() - started) * 1000
        self.metrics.ttfb_ms.observe(ttfb_ms)
        self._ttfb.append((time.monotonic(), ttfb_ms))
        self.metrics.requests.labels(path, str(attempt.response.status_code)).inc()
        headers = {k: v for k, v in attempt.response.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["x-request-id"] = request_id
        headers["x-fleetserve-replica"] = attempt.backend.id
        sse = attempt.response.headers.get("content-type", "").startswith("text/event-stream")

        def done() -> None:
            attempt.release()
            self.metrics.latency_ms.observe((time.monotonic() - started) * 1000)
            self._log_request(request_id, tenant, path, attempt.response.status_code, started, attempt, ttfb_ms, body)

        return WatchedStreamingResponse(
            self._relay(attempt, sse), status_code=attempt.response.status_code, headers=headers, on_close=done
        )

    def _log_request(self, request_id: str, tenant: str | None, path: str, status: int, started: float,
                     attempt: _Attempt | None = None, ttfb_ms: float | None = None, body: dict | None = None,
                     error: str | None = None) -> None:
        """The request line (observe/logs.py): ids, hashed tenant, replica, policy and branch, timings; the
        prompt only with log_prompts."""
        if not access_log.isEnabledFor(logging.INFO):
            return
        choice = attempt.choice if attempt is not None else None
        log_request(access_log, request_id=request_id, tenant=tenant_hash(tenant), path=path, status=status,
                    replica=attempt.backend.id if attempt is not None else None, policy=self.policy.name,
                    branch=getattr(choice, "branch", None), attempts=attempt.tries if attempt is not None else None,
                    ttfb_ms=round(ttfb_ms, 2) if ttfb_ms is not None else None,
                    latency_ms=round((time.monotonic() - started) * 1000, 2), error=error,
                    prompt=prompt_text(body) if self.settings.log_prompts and body else None)

    async def _relay(self, attempt: _Attempt, sse: bool) -> AsyncIterator[bytes]:
        learn = attempt.response.status_code == 200 and getattr(attempt.choice, "prediction", None) is not None
        tail = b""  # the last bytes relayed: `usage` closes a JSON body and the final SSE chunk
        try:
            if attempt.first:
                yield attempt.first
                tail = attempt.first[-USAGE_TAIL:]
            async for chunk in attempt.iterator:
                yield chunk
                if learn:
                    tail = (tail + chunk)[-USAGE_TAIL:]
            if learn:
                self._learn(attempt.choice, tail)
        except httpx.HTTPError as exc:
            self._mark_unreachable(attempt.backend, f"failed mid-response: {type(exc).__name__}")
            self._request_failed(attempt.backend, "failed mid-response")
            log.warning("backend %s failed mid-response: %s", attempt.backend.url, exc)
            if sse:
                error = APIError(502, f"the model replica failed mid-stream ({type(exc).__name__}); "
                                      "the response is incomplete", code="upstream_failed")
                yield f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n".encode()
        finally:
            await attempt.aclose()

    def _learn(self, choice: Choice, tail: bytes) -> None:
        """Feed the engine's reported cached tokens back to the policy (router/feedback.py, as the simulator
        does), read from the response's tail without parsing the body: the gateway relays bytes."""
        cached = _last_int(CACHED_TOKENS, tail)
        if cached is None:
            return  # no usage in the response (a stream without include_usage): nothing to learn
        prompt = _last_int(PROMPT_TOKENS, tail)
        feedback.report(self.policy, choice, cached, prompt)
        predicted = getattr(choice.prediction, "predicted_tokens", 0)
        self.metrics.cached_tokens.labels(self.policy.name, "predicted").inc(predicted)
        self.metrics.cached_tokens.labels(self.policy.name, "reported").inc(cached)

    # --- other endpoints -----------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        """Status for anyone; the backends (URLs, errors) only for the admin."""
        ok = bool(self.pool.healthy())
        body: dict = {"status": "ok" if ok else "no healthy replica", "strategy": self.policy.name}
        if self._admin_allowed(request):
            body["backends"] = [
                {"id": b.id, "url": b.url, "healthy": b.healthy, "draining": b.draining, "in_flight": b.in_flight,
                 "error": b.last_error}
                for b in self.pool.backends.values()
            ]
        return JSONResponse(body, status_code=200 if ok else 503)

    def _admin_allowed(self, request: Request) -> bool:
        """The admin token (or the fleet's internal token, which Prometheus may send as a bearer token); with
        neither configured, loopback clients."""
        token = self.settings.admin_token
        if self.internal.trusted(request.headers):
            return True
        if token:
            return hmac.compare_digest(request.headers.get("x-fleetserve-admin", ""), token)
        return request.client is not None and request.client.host in ("127.0.0.1", "::1", "localhost")

    def ttft_p95_ms(self, window: float = 60.0) -> float:
        cutoff = time.monotonic() - window
        recent = sorted(v for t, v in self._ttfb if t >= cutoff)
        if not recent:
            return 0.0  # no traffic is no latency problem: zero load, not missing data
        return recent[min(len(recent) - 1, int(0.95 * len(recent)))]

    async def admin_load(self, request: Request) -> Response:
        """What the autoscaler reads each poll: buffered and in-flight requests, per-backend load, TTFT p95."""
        if not self._admin_allowed(request):
            return APIError(403, "admin API: wrong or missing x-fleetserve-admin token").response()
        backends = [{"url": b.url, "healthy": b.healthy, "draining": b.draining, "in_flight": b.in_flight,
                     "running": b.running, "waiting": b.waiting} for b in self.pool.backends.values()]
        pool = list(self.pool.backends.values())
        return JSONResponse({"pending": self.pending, "in_flight": sum(b.in_flight for b in pool),
                             "waiting": sum(b.waiting for b in pool),
                             "requests_total": self.requests_total, "ttft_p95_ms": self.ttft_p95_ms(),
                             "backends": backends})

    async def admin_backends(self, request: Request) -> Response:
        """Replace the backend set: {"backends": [{"url": ..., "state": "ready" | "starting" | "draining"}]}."""
        if not self._admin_allowed(request):
            return APIError(403, "admin API: wrong or missing x-fleetserve-admin token").response()
        try:
            body = parse_json_body(await request.body())
            entries = body["backends"]
            urls = [e["url"] for e in entries]
            states = [e.get("state", "starting") for e in entries]
            if not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
                return APIError(400, "backends[].url: each must be a string starting with http:// or https://",
                                param="backends[].url").response()
        except (KeyError, TypeError, AttributeError):
            return APIError(400, 'backends: expected {"backends": [{"url": "http://...", "state": "ready"}]}',
                            param="backends").response()
        except APIError as err:
            return err.response()
        bad = [st for st in states if st not in ("ready", "starting", "draining")]
        if bad:
            return APIError(400, f"backends[].state: got {bad[0]!r}; allowed values: ready, starting, draining",
                            param="backends[].state").response()
        self.pool.set_backends(urls, ready={u.rstrip("/") for u, st in zip(urls, states, strict=True) if st == "ready"},
                               draining={u.rstrip("/") for u, st in zip(urls, states, strict=True)
                                         if st == "draining"})
        return JSONResponse({"backends": len(urls)})

    async def metrics_endpoint(self, request: Request) -> Response:
        """Tenant names are in these series: with API keys on, only the admin (or Prometheus with the internal
        token) may read them."""
        if self.settings.keyring is not None and not self._admin_allowed(request):
            return APIError(401, "router metrics name tenants: send x-fleetserve-admin or the internal bearer token",
                            code="invalid_api_key").response()
        self.metrics.kv_subscriptions.set(len(self._subscribed))
        index_size = getattr(self.policy, "index_size", None)
        self.metrics.index_blocks.set(self.kv_index.size() if self.kv_index else (index_size() if index_size else 0))
        for b in self.pool.backends.values():
            self.metrics.healthy.labels(b.id).set(1 if b.healthy else 0)
            self.metrics.in_flight.labels(b.id).set(b.in_flight)
        data, content_type = exposition(self.metrics.registry)
        return Response(data, media_type=content_type)


USAGE_TAIL = 1024
DISCOVERY_EVERY = 5  # health rounds between DNS resolutions of backend names
CACHED_TOKENS = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


def _last_int(pattern: re.Pattern, data: bytes) -> int | None:
    found = pattern.findall(data)
    return int(found[-1]) if found else None


def _rejected(r: Rejection) -> APIError:
    return APIError(r.status, r.message, code=r.code, headers={"Retry-After": r.retry_after})


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").response()


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("router error")
    return APIError(500, f"internal router error: {type(exc).__name__}", code="internal_error").response()


def build_app(gateway: Gateway) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        await gateway.start()
        yield
        await gateway.stop()

    routes = [
        Route("/v1/chat/completions", gateway.proxy, methods=["POST"]),
        Route("/v1/completions", gateway.proxy, methods=["POST"]),
        Route("/v1/models", gateway.proxy, methods=["GET"]),
        Route("/health", gateway.health, methods=["GET"]),
        Route("/ping", gateway.health, methods=["GET"]),
        Route("/openapi.json", openapi_endpoint("router"), methods=["GET"]),
        Route("/metrics", gateway.metrics_endpoint, methods=["GET"]),
        Route("/admin/load", gateway.admin_load, methods=["GET"]),
        Route("/admin/backends", gateway.admin_backends, methods=["PUT"]),
    ]
    from fleetserve.observe.dashboard import dashboard_routes  # /dashboard, /dashboard/data (admin only)

    routes += dashboard_routes(gateway)
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _server_error})
    return RequestSizeLimit(app, gateway.settings.size_limits)


def run_router(backends: list[str], host: str, port: int, settings: RouterSettings,
               health_path: str = "/health", unhealthy_after: int = 2, healthy_after: int = 1,
               tls: tuple[str, str] | None = None, log_format: str = "text") -> None:
    import uvicorn

    configure_logging(log_format, "router")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    pool = BackendPool(backends, health_path=health_path, interval=settings.health_interval,
                       unhealthy_after=unhealthy_after, healthy_after=healthy_after)
    gateway = Gateway(pool, settings)
    log.info("router on http://%s:%d, strategy %s, backends %s", host, port, settings.strategy, backends)
    ssl = {"ssl_certfile": tls[0], "ssl_keyfile": tls[1]} if tls else {}
    uvicorn.run(build_app(gateway), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5,
                log_config=uvicorn_log_config(log_format), timeout_keep_alive=KEEP_ALIVE_S, **ssl)
