"""The OpenAI-compatible gateway: one request's path from the front door to the relayed answer.

    front door (http1.py) -> auth and tenancy (auth.py) -> body parsed once (orjson)
      -> prefix keys, only for a policy that needs them (features.py)
      -> admission (gate.py over admission.py, the simulator's) -> dispatch (dispatch.py: policy, retries)
      -> relay (relay.py) -> metrics, access line

Everything that is not an OpenAI route (health, admin API, metrics, dashboard, OpenAPI) goes to the control
app (admin.py) through a small ASGI bridge (asgi.py). The replica watcher (watcher.py) keeps health, the KV
layout and KV events current. The upstream client (upstream.py) is injected, so dispatch and retry tests
run without a subprocess.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import time
import uuid
from dataclasses import dataclass
from urllib.parse import unquote

import orjson

from fleetserve.api.browser import BROWSER_HEADERS, FORWARDED_HOST, post_refusal
from fleetserve.api.errors import APIError, model_not_found
from fleetserve.api.internal import INTERNAL_HEADER, NO_TENANT, TENANT_HEADER, InternalAuth
from fleetserve.api.limits import SEND_S, SizeLimits
from fleetserve.api.protocol import GENERATION_PATHS, parse_generation, parse_json_body
from fleetserve.api.request_id import REQUEST_ID_HEADER, sane_request_id
from fleetserve.clock import Clock
from fleetserve.kvcache.blocks import kv_salt
from fleetserve.observe.logs import AccessLog, prompt_text, tenant_hash
from fleetserve.observe.metrics import EJECTION_REASONS, ModelIdentity, RouterMetrics, child, clear, forget
from fleetserve.router import feedback
from fleetserve.router.admin import admin_allowed, build_control_app
from fleetserve.router.admission import AdmissionSettings
from fleetserve.router.asgi import call_asgi
from fleetserve.router.auth import KeyRing
from fleetserve.router.departed import Departures
from fleetserve.router.discovery import DnsBackends
from fleetserve.router.dispatch import Attempt, Dispatcher, Outgoing
from fleetserve.router.features import KVLayout, prompt_tokens_estimate, request_features
from fleetserve.router.gate import AdmissionGate, Refused
from fleetserve.router.http1 import Request, Responder
from fleetserve.router.invocations import INVOCATIONS_PATH, openai_path
from fleetserve.router.model_metrics import ROUTER_REPLICA, ModelMetrics
from fleetserve.router.policies import FleetSnapshot, RouteRequest, RoutingPolicy, create_policy, needs_of
from fleetserve.router.pool import Backend, BackendPool
from fleetserve.router.relay import CACHED_TOKENS, PROMPT_TOKENS, last_int, relay
from fleetserve.router.salting import TenantSalt
from fleetserve.router.served import context_refusal, read_model_cards
from fleetserve.router.upstream import Upstream
from fleetserve.router.usage import asking_usage
from fleetserve.router.watcher import ReplicaWatcher

log = logging.getLogger(__name__)
access_log = logging.getLogger("fleetserve.router.access")

# The OpenAI routes the gateway proxies, and their method; everything else is the control app's.
PROXIED = {**dict.fromkeys(GENERATION_PATHS, "POST"), INVOCATIONS_PATH: "POST", "/v1/models": "GET"}
MODEL_PATH = "/v1/models/"  # GET /v1/models/{model} (the openai client's models.retrieve) is proxied too
# Never forwarded: framing and connection headers, the client's credentials (the key stays at the gateway),
# and what the gateway sets itself (the tenant and the internal token are ours to set, never a client's), and the
# router's own admin token (a client that sent it had it reach every replica, an external engine's included).
# Headers a client's `Connection` names are hop-by-hop too (RFC 9110 7.6.1), and stay here.
NOT_FORWARDED = frozenset({
    b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
    b"proxy-authorization", b"proxy-authenticate", b"accept-encoding", b"expect", b"authorization", REQUEST_ID_HEADER,
    TENANT_HEADER.encode(), INTERNAL_HEADER.encode(), b"x-fleetserve-admin",
})
JSON = (b"content-type", b"application/json")
ACTIVITY_PATHS = GENERATION_PATHS | {INVOCATIONS_PATH}  # what a request routed there keeps a fleet from zero
MODEL_PATH_LABEL = "/v1/models/{model}"  # the request counter's label for any model card's path
COUNTED_CONTROL = frozenset({401, 403, 404, 405})  # the control app's answers that are counted as requests
LOGGED_PATH_CHARS = 200  # a path the client chose (a 404's) is cut here in its request line


def logged_path(path: str) -> str:
    return path if len(path) <= LOGGED_PATH_CHARS else path[:LOGGED_PATH_CHARS] + "..."


@dataclass(frozen=True)
class RouterSettings:
    strategy: str = "leastload"
    session_key: str | None = None  # header or body key for session routing
    max_attempts: int = 3
    upstream_read_timeout: float = 1800.0  # a replica's longest silence (spec.router.upstreamTimeoutSeconds)
    stream_idle_timeout: float = 60.0  # ... once its answer began (spec.router.streamIdleTimeoutSeconds)
    client_send_timeout: float = SEND_S  # a client's longest refusal of its answer's bytes (router/http1.py)
    max_connections: int | None = None  # client connections per process (None: server.connection_limit's default)
    health_interval: float = 1.0
    buffer_size: int = 256  # requests held while no replica is ready (scale from zero)
    buffer_timeout: float = 600.0  # longer than a cold start; then 503 with Retry-After
    admin_token: str | None = None  # required on /admin/* when set (else: admin.py says who)
    max_concurrent_per_replica: int | None = None  # HyperPod requestLimits.maxConcurrentRequests
    max_queue: int | None = None  # requests waiting for a free slot (HyperPod maxQueueSize)
    overflow_status: int = 429
    keyring: KeyRing | None = None  # API keys -> tenants; None: no auth
    internal_token: str | None = None  # sent to the engines: they trust a tenant header only with it
    send_internal_token: bool = True  # False for engines outside the fleet: the token also opens our admin API
    engine_token: str | None = None  # vLLM/SGLang's API key, sent instead of the internal token
    tenant_cache_salt: bool = False  # write each tenant's cache_salt (vLLM, SGLang: router/salting.py)
    size_limits: SizeLimits = dataclasses.field(default_factory=SizeLimits)
    backend_dns: tuple[DnsBackends, ...] = ()  # names whose addresses are replicas (a headless Service)
    # a file holding the fleet's reason no replica can start (empty: none), re-read every health round: on
    # Kubernetes the operator writes it into a ConfigMap the router pods mount (k8s/failing.py)
    failing_file: str | None = None
    log_prompts: bool = False  # the request line carries the prompt text (default: never)
    access_log: bool = True  # one line per request (observe/logs.py)
    model_identity: ModelIdentity | None = None  # export HyperPod's model_* per replica (router/model_metrics.py)
    model_metrics_scope: str = "all"  # or "router": only the router's own errors (the engines count the rest)
    queue_metrics: str | None = None  # engines' queue from their /metrics gauges: vllm, sglang (engine_queue.py)
    # the model name(s) clients use: while no replica is ready the router answers /v1/models itself and refuses
    # other names (404) instead of holding them, so neither wakes a fleet at zero (empty: everything is held)
    served_models: tuple[str, ...] = ()
    # the path the replicas serve chat and completions on, when not OpenAI's (a SageMaker-style container's
    # /invocations, which reads the body's shape): engine.invocationPath
    invocation_path: str | None = None
    # the engines read bodies as api/protocol does (the built-in kind): a request held for want of a replica is
    # checked here first, and a bad one answered 400 at once (router/served.py)
    check_bodies: bool = False
    # where the cards a replica gave are kept, so a restarted router has them at zero (router/served.py)
    model_cards_file: str | None = None


def upstream_credentials(settings: RouterSettings) -> dict[str, str]:
    """What every request to the backends carries: GPU engines' own API key (their logs may print it, so it is
    not the internal token, which opens our admin API and keys the tenant salts), else the internal token, or
    nothing for engines outside the fleet."""
    if settings.engine_token:
        return {"authorization": f"Bearer {settings.engine_token}"}
    return InternalAuth(settings.internal_token).headers() if settings.send_internal_token else {}



def _engine_waiting(backend) -> int:
    """A replica's own queue: its gauge where the router reads one (--queue-metrics), else its health body's (the
    built-in engine exports vLLM's gauge too: adding both counted its queue twice)."""
    return backend.waiting if backend.engine_waiting is None else backend.engine_waiting

class Gateway:
    def __init__(self, pool: BackendPool, settings: RouterSettings, upstream: Upstream | None = None):
        self.pool = pool
        self.settings = settings
        self.clock: Clock = pool.clock  # one clock for the pool's breaker, decisions and latency windows
        self.policy: RoutingPolicy = create_policy(settings.strategy, session_key=settings.session_key)
        pool.on_restart.append(self.replica_restarted)
        self.needs = needs_of(self.policy)
        self.layout = KVLayout()
        self.kv_index = None  # router/kvindex.py, once an engine publishes KV events
        self.metrics = RouterMetrics()
        self._exported: set[str] = set()  # backends whose per-backend gauges this process has written
        self._ejections_made: set[str] = set()  # backends whose ejection counters exist (at 0 or more)
        self._ejected: set[str] = set()  # backends ejected at least once (their counters are history, for a while)
        self.departures = Departures()  # replicas that left, whose series go after a while (router/departed.py)
        self.model_metrics = ModelMetrics(settings.model_identity, self.metrics.registry,
                                          settings.model_metrics_scope) \
            if settings.model_identity is not None else None
        self._start_model_series()
        self.internal = InternalAuth(settings.internal_token)
        self.upstream = upstream or Upstream(read_timeout=settings.upstream_read_timeout,
                                             stream_idle_timeout=settings.stream_idle_timeout,
                                             headers=upstream_credentials(settings))
        self.salter = TenantSalt(settings.internal_token) if settings.tenant_cache_salt else None
        if upstream is None:
            pool.client = self.upstream  # one pooled client: requests, health probes, layout, KV events
        self.gate = AdmissionGate(AdmissionSettings(settings.buffer_size, settings.buffer_timeout,
                                                    settings.max_concurrent_per_replica, settings.max_queue,
                                                    settings.overflow_status), pool, self.metrics)
        self.dispatcher = Dispatcher(self)
        self.watcher = ReplicaWatcher(self)
        self.control = build_control_app(self)
        self.scheme = "http"
        self.server_address: tuple[str, int] = ("127.0.0.1", 0)
        self.requests_total = 0
        self.routed_total = 0  # requests sent to a replica (retries too): activity that holds off scale-to-zero
        self.access = AccessLog(access_log)  # the request lines, buffered (observe/logs.py)
        self.peers = None  # router/workers.py: the other worker processes on this port
        self._ttfb: collections.deque[tuple[float, float]] = collections.deque(maxlen=4096)
        # request ids: a random per-process prefix and a counter (unique, and far cheaper than uuid4 per request)
        self._id_prefix = uuid.uuid4().hex[:24]
        self._created = int(time.time())  # the model cards' `created`, as the engines give theirs
        # the served models' cards as a replica listed them (watcher.py), or as this router's predecessor had
        self.model_cards: dict[str, dict] = read_model_cards(settings.model_cards_file, settings.served_models)
        self._ids = itertools.count()

    # --- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.watcher.start()

    async def stop(self) -> None:
        self.access.close()
        await self.watcher.stop()
        await self.upstream.aclose()
        await self.pool.aclose()

    @property
    def pending(self) -> int:
        return self.gate.pending

    # --- the front door ------------------------------------------------------------------------------------

    async def handle(self, request: Request, responder: Responder) -> None:
        method = PROXIED.get(request.path) or ("GET" if request.path.startswith(MODEL_PATH) else None)
        if method is None:  # the control app: health, metrics, admin, or a path nobody serves (404)
            rid = [(REQUEST_ID_HEADER, self.request_id(request.headers))]
            status = await call_asgi(self.control, request, responder, scheme=self.scheme,
                                     server=self.server_address, extra_headers=rid)
            if status in COUNTED_CONTROL:  # a 404 was neither counted nor traceable; health checks (503 at zero
                self._count_request(responder, "other", status)  # replicas, SageMaker's /ping) and scrapes are not
                self._unknown_tenant(status)
                self._log(rid[0][1].decode("latin-1"), None, logged_path(request.path), status, self.clock())
        elif request.method == "HEAD" and method == "GET":  # what GET answers, without its body (RFC 9110): the
            request.method = "GET"  # responder of a HEAD sends no body; a 405 had answered monitors' HEAD checks
            if not self.settings.served_models and not self.pool.any_eligible():  # held, it would wake the fleet
                # (the router answers the model paths itself at zero only when it knows the served names)
                self.error(responder, 503, "no model replica is ready, and a HEAD request does not wake the fleet; "
                                           "send GET to wait for one", "no_replica", [(b"retry-after", b"5")],
                           path=request.path, request_id=self.request_id(request.headers))
                return
            await self.proxy(request, responder)
        elif request.method != method:
            self.error(responder, 405, f"{request.method} {request.path}: method not allowed; use {method}",
                       "method_not_allowed", [(b"allow", method.encode())], path=request.path,
                       request_id=self.request_id(request.headers))
        else:
            await self.proxy(request, responder)

    def request_id(self, headers: list[tuple[bytes, bytes]] = ()) -> bytes:
        """The client's x-request-id when it is a sane one, else ours."""
        return self._own_or_ours(next((v for k, v in headers if k == REQUEST_ID_HEADER), None))

    def _own_or_ours(self, given: bytes | None) -> bytes:
        """A client's id of 1-128 visible ASCII characters is kept; any other is replaced by ours (a 50,000-
        character id was echoed in the answer and written into every router and engine log line)."""
        return sane_request_id(given) or f"{self._id_prefix}{next(self._ids):08x}".encode("latin-1")

    def _count_request(self, responder: Responder, path: str, status: int | str) -> None:
        """One count per answer, under a bounded path label (a model card's name is the client's to choose)."""
        self._count(self.metrics.requests, MODEL_PATH_LABEL if path.startswith(MODEL_PATH) else path, str(status))
        responder.counted = True

    def error(self, responder: Responder, status: int, message: str, code: str | None = None,
              headers: list[tuple[bytes, bytes]] | None = None, path: str | None = None,
              request_id: bytes | None = None) -> None:
        """An OpenAI error answer, also the front door's: input refused while parsing (counted under path "other",
        with an id of ours, as every answer carries one), or a request the router stops under or fails on (with
        the id and path its handler knew, counted once)."""
        rid = request_id or responder.request_id or self.request_id()
        if not responder.counted:
            # a request refused while parsing (413, 431) counts under its API path when it has one (a 413 to the
            # chat path had counted as "other"); any other path is the client's to choose: "other"
            rejected = responder.rejected_path
            known = rejected if rejected in PROXIED or (rejected or "").startswith(MODEL_PATH) else None
            self._count_request(responder, path or responder.path or known or "other", status)
            self._unknown_tenant(status)  # refused before its key was read: a 413, 431, 405 had no request line
            self._log(rid.decode("latin-1"), None, logged_path(path or responder.path or rejected or "?"), status,
                      self.clock(), error=code)
        headers = list(headers or [])
        if status == 503 and not any(k == b"retry-after" for k, _ in headers):
            # a request cut by the router's stop had none, where every other 503 of ours says when to come back
            headers.append((b"retry-after", b"1"))
        self.send_error(responder, APIError(status, message, code=code), [*headers, (REQUEST_ID_HEADER, rid)])

    def send_error(self, responder: Responder, err: APIError, extra: list[tuple[bytes, bytes]]) -> None:
        headers = [JSON] + [(k.lower().encode(), str(v).encode()) for k, v in err.headers.items()] + extra
        responder.send(err.status, headers, orjson.dumps(err.body()))

    async def proxy(self, request: Request, responder: Responder) -> None:
        started = self.clock()
        forwarded: list[tuple[bytes, bytes]] = []
        authorization = given_id = None
        authorizations = 0
        content_type = host = encoding = None
        browser: dict[bytes, bytes] = {}
        hop_by_hop: set[bytes] = set()
        for k, v in request.headers:
            if k in NOT_FORWARDED:
                if k == b"authorization":
                    authorization = v
                    authorizations += 1
                elif k == REQUEST_ID_HEADER:
                    given_id = v
                elif k == b"host":
                    host = v
                elif k == b"connection":
                    hop_by_hop.update(t.strip().lower() for t in v.split(b","))
                continue
            if k == b"content-type":
                content_type = v
            elif k == b"content-encoding":
                encoding = v
            elif k in BROWSER_HEADERS:  # judged here, and not forwarded: an engine on its own judges them against
                browser[k] = v  # its own Host, which is not the one the browser called
                continue
            elif k == FORWARDED_HOST:
                browser[k] = v
            forwarded.append((k, v))
        if hop_by_hop:
            forwarded = [(k, v) for k, v in forwarded if k not in hop_by_hop]
        rid = self._own_or_ours(given_id)
        request_id = rid.decode("latin-1")
        responder.request_id, responder.path = rid, request.path
        post = request.method == "POST"
        tenant = None
        body: dict | None = None
        if self.settings.served_models and not self.pool.any_eligible() and \
                (authorizations <= 1 or self.settings.keyring is None) and \
                self._answered_at_zero(request, responder, authorization, rid, started):
            return
        try:
            if self.settings.keyring is not None:
                if authorizations > 1:  # which one is the client's? The last had won, whatever the first said
                    raise APIError(400, f"the request carries {authorizations} Authorization headers; send one",
                                   param="authorization", code="invalid_request_error")
                tenant = self.settings.keyring.tenant(authorization.decode("latin-1") if authorization else None)
            if post:  # the request_rate scaling signal: a client without a valid key had moved it too
                self.requests_total += 1
                self._count(self.metrics.received, request.path)
            if post and (refused := post_refusal(browser, host, content_type, encoding,
                                                 any_but_forms=request.path == INVOCATIONS_PATH)) is not None:
                raise refused
            body = parse_json_body(request.body) if post else {}
            if request.path == INVOCATIONS_PATH:  # SageMaker's path: the body says which OpenAI route it is
                request.path = openai_path(body)
                # read as JSON here, whatever type the SDK named (application/octet-stream by default): sent as such
                forwarded = [(k, v) for k, v in forwarded if k != b"content-type"]
                forwarded.append((b"content-type", b"application/json"))
            route = self._route(request, body, tenant)
            sent = request.body
            if self.salter is not None and post:
                sent = self.salter.salted(request.path, body, request.body, tenant) or sent
            asked_usage = False
            if post and self.needs.prefix_keys:  # a learning policy: the stream must report its cached tokens
                with_usage = asking_usage(request.path, body, sent)
                if with_usage is not None:
                    sent, asked_usage = with_usage, True
            if self.gate.fast_go():
                held = 0.0
            else:
                if self.settings.check_bodies and post and request.path in GENERATION_PATHS and \
                        not self.pool.any_eligible():  # a 400 now, not after a cold start (router/served.py)
                    parsed = parse_generation(request.path, body)
                    context_refusal(parsed, self.model_cards.get(parsed.model or self._only_model()))
                held = await self.gate.admit()
            forwarded.append((REQUEST_ID_HEADER, rid))
            if tenant:
                forwarded.append((TENANT_HEADER.encode(), tenant.encode()))
            if request.client:
                forwarded.append((b"x-forwarded-for", request.client[0].encode()))
            wire = self.settings.invocation_path if post and request.path in GENERATION_PATHS else None
            attempt = await self.dispatcher.dispatch(Outgoing(request.method, request.path, forwarded, sent, wire),
                                                     route)
        except Refused as refused:
            r = refused.rejection
            err = APIError(r.status, r.message, code=r.code, headers={"Retry-After": r.retry_after})
            err.after_attempts = getattr(refused, "after_attempts", False)  # held again after replicas died
            self._refuse(responder, err, rid, request.path, tenant, started, body)
            return
        except APIError as err:
            self._refuse(responder, err, rid, request.path, tenant, started, body)
            return
        except asyncio.CancelledError:  # the client left, or the router stops (the front door answers it 503)
            status = "503" if responder.stopping else "499"
            self._count_request(responder, request.path, status)
            self._count(self.metrics.tenant_requests, tenant or NO_TENANT, status)
            self._log(request_id, tenant, request.path, int(status), started, body=body)
            raise
        status = attempt.response.status
        ttfb_ms = (self.clock() - started) * 1000
        # less a cold start (held before dispatch, or again when its replicas died): the scaling signal (ttft_p95)
        served_ms = max(0.0, ttfb_ms - (held + attempt.held) * 1000)
        self.metrics.ttfb_ms.observe(ttfb_ms)
        if status == 200 and body.get("stream") is True:
            # a first token the client saw: the scaling signal (ttft_p95). A non-streamed answer's first byte is its
            # last (the whole generation: one 512-token chat read as a 3.2 s TTFT scaled an idle fleet up), and an
            # error's is no token at all
            self.metrics.served_ttfb_ms.observe(served_ms)
            self._ttfb.append((started, served_ms))
        responder.counted = True  # counted at the end, with the status the client really got (a stream cut after
        # its 200 status line, or left by its client, had counted as a 200 in both request series)
        learn = None
        if status == 200 and self.needs.prefix_keys:
            def learn(tail: bytes, choice=attempt.choice, routed=route.prompt_tokens) -> None:
                self.learn(choice, tail, routed)
        logged, error = status, None
        try:
            extra = [(REQUEST_ID_HEADER, rid)]
            if self.settings.keyring is None:  # with API keys the clients are tenants: a replica's address is
                # the operator's business, as in /health (the access log names it)
                extra.append((b"x-fleetserve-replica", attempt.backend.id.encode()))
            whole = await relay(self, attempt, responder, extra, learn, strip_usage=asked_usage and status == 200)
            if not whole and attempt.cut is not None:
                # broken off after it began: the client got an error (an SSE error event, or a cut body) under a
                # 200 status line, which the access line and the error series had counted as a success
                logged, error = attempt.cut.status, attempt.cut.code
                if self.model_metrics is not None and request.path in GENERATION_PATHS:
                    self.model_metrics.cut(attempt.backend.label, attempt.cut.status)
            elif not whole and responder.client_gone:
                logged = 499  # the client left mid-answer: the access line says so, as the engine's does
        except asyncio.CancelledError:  # the front door cancels a request whose client left, or at a stop
            logged = 503 if responder.stopping else 499
            raise
        finally:
            attempt.release()
            self._count_request(responder, request.path, logged)
            self._count(self.metrics.tenant_requests, tenant or NO_TENANT, str(logged))
            self.metrics.latency_ms.observe((self.clock() - started) * 1000)
            self._log(request_id, tenant, request.path, logged, started, attempt, ttfb_ms, body, error=error)

    def _answered_at_zero(self, request: Request, responder: Responder, authorization: bytes | None, rid: bytes,
                          started: float) -> bool:
        """No replica is ready: what the router can answer from the served names alone, without holding it in the
        buffer, whose waiting requests wake the fleet (a client listing models every few seconds cold-started a
        replica every other time; a wrong model name waited for one, then got its 404)."""
        names = self.settings.served_models
        tenant = None
        if self.settings.keyring is not None:
            try:
                tenant = self.settings.keyring.tenant(authorization.decode("latin-1") if authorization else None)
            except APIError:
                return False  # the request path answers it 401, as always

        def answer(card: dict) -> None:  # with its id, counted and logged as every answer is
            responder.send(200, [JSON, (REQUEST_ID_HEADER, rid)], orjson.dumps(card))
            self._count_request(responder, request.path, 200)
            self._count(self.metrics.tenant_requests, tenant or NO_TENANT, "200")
            self._log(rid.decode("latin-1"), tenant, request.path, 200, started)

        if request.method == "GET" and request.path == "/v1/models":
            answer({"object": "list", "data": [self._model_card(n) for n in names]})
            return True
        if request.method == "GET" and request.path.startswith(MODEL_PATH):
            name = unquote(request.path[len(MODEL_PATH):])
            if name in names:
                answer(self._model_card(name))
            else:
                self._refuse(responder, model_not_found(name, names), rid, request.path, tenant, started, None)
            return True
        if request.method == "POST":
            try:
                model = parse_json_body(request.body).get("model")
            except APIError:
                return False  # the request path says what is wrong with it
            if isinstance(model, str) and model not in names:
                self._refuse(responder, model_not_found(model, names), rid, request.path, tenant, started, None)
                return True
        return False

    def _only_model(self) -> str:
        """The name a request without `model` is served by: the one served model (or none known)."""
        names = self.settings.served_models
        return names[0] if len(names) == 1 else ""

    def _model_card(self, name: str) -> dict:
        """A replica's card for the model when one was read (`max_model_len` and all), else a bare one."""
        return self.model_cards.get(name) or {"id": name, "object": "model", "created": self._created,
                                              "owned_by": "fleetserve"}

    def _route(self, request: Request, body: dict, tenant: str | None) -> RouteRequest:
        """What the policy may use; the prompt's prefix keys only when it needs them (hashing costs)."""
        headers = request.header_map()
        if not self.needs.prefix_keys:
            return RouteRequest(request.path, body, headers, tenant, prompt_tokens=prompt_tokens_estimate(body),
                                block_tokens=self.layout.block_size)
        client_salt = body.get("cache_salt")
        salt = kv_salt(tenant, client_salt if isinstance(client_salt, str) else None)  # as the engines key it
        blocks, prompt_tokens, block_tokens, exact = request_features(body, self.layout, salt)
        return RouteRequest(request.path, body, headers, salt, frozenset(), blocks, block_tokens, prompt_tokens, exact)

    def _refuse(self, responder: Responder, err: APIError, rid: bytes, path: str, tenant: str | None, started: float,
                body: dict | None) -> None:
        self._count_request(responder, path, err.status)
        self._count(self.metrics.tenant_requests, tenant or NO_TENANT, str(err.status))
        if self.model_metrics is not None and path in GENERATION_PATHS:
            if err.after_attempts:  # once, on the last replica tried (router/model_metrics.py)
                self.model_metrics.gave_up(err.after_attempts, err.status)
            else:
                self.model_metrics.refused(err.status)
        self.send_error(responder, err, [(REQUEST_ID_HEADER, rid)])
        self._log(rid.decode("latin-1"), tenant, path, err.status, started, body=body, error=err.code)

    # --- what dispatch and relay report ------------------------------------------------------------------

    def snapshot(self) -> FleetSnapshot:
        return FleetSnapshot(self.gate.views(), self.clock(), self.kv_index)

    def count_decision(self, branch: str, path: str = "") -> None:
        """A routing decision; one for a model request (not a listing of models, which monitors poll) is activity
        for the autoscaler too (`routed_total`)."""
        if path in ACTIVITY_PATHS:
            self.routed_total += 1
            self.metrics.routed.inc()
        self._count(self.metrics.decisions, self.policy.name, branch)

    def _start_model_series(self) -> None:
        """Every replica's model_* series at 0 from the moment it is a backend (router/model_metrics.py `start`)."""
        if self.model_metrics is not None:
            for backend in self.pool.backends.values():
                self.model_metrics.start(backend.label)

    def request_failed(self, backend: Backend, error: str, server_error: bool = False) -> None:
        was = backend.breaker
        self.pool.request_failed(backend, error, server_error)
        if was != "open" and backend.breaker == "open":
            self.metrics.ejections.labels(backend.id, "breaker").inc()
            self._ejected.add(backend.id)

    def mark_unreachable(self, backend: Backend, error: str, refused: bool = False) -> None:
        if backend.healthy:
            self.metrics.ejections.labels(backend.id, "unreachable").inc()
            self._ejected.add(backend.id)
        self.pool.mark_unreachable(backend, error, refused)

    def replica_restarted(self, replica: str) -> None:
        """A replica is back after refusing connections: a new process with an empty cache. A policy that keeps an
        index of what it sent there forgets it (it predicted hits for the old prefixes: a cold prefill each, and
        misses that read as a small cache)."""
        forget = getattr(self.policy, "replica_restarted", None)
        if forget is not None:
            forget(replica)
        if self.kv_index is not None:
            self.kv_index.forget(replica)  # its events resync it; until then it is empty, as the engine is

    def learn(self, choice, tail: bytes, routed_prompt_tokens: int) -> None:
        """Feed the engine's reported cached tokens back to the policy and the predicted-against-reported
        metrics (router/feedback.py, as the simulator does), read from the answer's tail without parsing the
        body: the gateway relays bytes (a stream asks for its usage: router/usage.py). No `usage`: nothing to
        learn."""
        feedback.record(self.metrics, self.policy, choice, last_int(CACHED_TOKENS, tail),
                        last_int(PROMPT_TOKENS, tail), routed_prompt_tokens)

    # --- control -------------------------------------------------------------------------------------------

    def set_backends(self, urls: list[str], ready: set[str] | None = None, draining: set[str] | None = None,
                     from_peer: bool = True, failing: str | None = None, names: dict[str, str] | None = None,
                     instances: dict[str, str] | None = None) -> None:
        """Replace the backend set (the supervisor's PUT /admin/backends, DNS discovery); every worker follows.
        `failing`: the fleet's reason no replica can start now (held requests are refused with it); `names`: the
        replicas' names by URL (the `replica` label of the model_* series counted here); `instances`: the secret of
        the process that must answer each one's /health probes (engine/instance.py)."""
        self.pool.set_backends(urls, ready=ready, draining=draining, names=names, instances=instances)
        self._start_model_series()
        self.gate.set_failing(failing)
        if self.peers is not None and not from_peer:
            self.peers.backends(urls, ready or set(), draining or set(), failing, names, instances)

    def _admin_allowed(self, request) -> bool:
        return admin_allowed(self, request)

    def load_report(self) -> dict:
        pool = list(self.pool.backends.values())
        # in flight: every request a replica serves, those of replicas taken out of the set since included (their
        # streams run on: a removed backend's three were missing from the total)
        report = {"pending": self.gate.pending, "in_flight": sum(self.pool.book.in_flight.values()),
                  # the engines' queues as their health bodies (or, --queue-metrics, their gauges) say, and the
                  # requests queued here for a slot
                  "waiting": sum(_engine_waiting(b) for b in pool) + self.gate.queued,
                  "queued": self.gate.queued,
                  "requests_total": self.requests_total,
                  "routed_total": self.routed_total,
                  "ttft_p95_ms": self.ttft_p95_ms(),
                  "model_cards": sorted(self.model_cards),  # served names whose card a replica gave (for zero)
                  "backends": [{"url": b.url, "healthy": b.takes_traffic, "breaker": b.breaker,
                                "silent_s": round(b.silent_s, 1),
                                "draining": b.draining, "in_flight": b.in_flight,
                                "running": b.running if b.engine_running is None else b.engine_running,
                                "waiting": _engine_waiting(b)} for b in pool]}
        if self.peers is not None:
            report = self.peers.merged_load(report)
        return report

    def ttft_p95_ms(self, window: float = 60.0) -> float:
        cutoff = self.clock() - window
        recent = sorted(v for t, v in self._ttfb if t >= cutoff)
        if not recent:
            return 0.0  # no traffic is no latency problem: zero load, not missing data
        return recent[min(len(recent) - 1, int(0.95 * len(recent)))]

    def metrics_registry(self):
        """What /metrics exposes: this process's metrics, or every worker's (router/workers.py)."""
        if self.peers is not None:
            from fleetserve.router.workers import metrics_registry

            kept, labels = self.departures.kept()
            shown = {g._name: ("backend", frozenset(self.pool.backends)) for g in self._per_backend_gauges()}
            shown |= {c._name: ("backend", kept) for c in self._per_backend_counters()}
            if self.model_metrics is not None:
                shown |= {f._name: ("replica", labels | {ROUTER_REPLICA}) for f in self.model_metrics.families()}
            return metrics_registry(shown)
        return self.metrics.registry

    def _per_backend_gauges(self) -> tuple:
        """The gauges with a series per live replica (a replica that left leaves none behind)."""
        m = self.metrics
        return m.healthy, m.in_flight, m.backend_cache_horizon, m.backend_engine_hit_rate

    def _per_backend_counters(self) -> tuple:
        """The counters with a series per replica, kept a while after it left (router/departed.py)."""
        m = self.metrics
        return m.backend_cached_tokens, m.backend_prompt_tokens, m.ejections

    def forget_departed(self) -> None:
        """The series of replicas that left RETAIN_S ago go (with workers, the scrape leaves them out)."""
        expired, labels = self.departures.update({b.id: b.label for b in self.pool.backends.values()}, self.clock())
        if self.peers is not None or not (expired or labels):
            return
        m = self.metrics
        forget(m.backend_cached_tokens, 0, expired)
        forget(m.backend_prompt_tokens, 0, expired)
        for gone in expired:
            for reason in EJECTION_REASONS:
                with contextlib.suppress(KeyError):
                    m.ejections.remove(gone, reason)
            self._ejections_made.discard(gone)
            self._ejected.discard(gone)
        if self.model_metrics is not None:
            self.model_metrics.forget(labels)

    def refresh_gauges(self) -> None:
        self.metrics.kv_subscriptions.set(len(self.watcher.subscribed))
        index_size = getattr(self.policy, "index_size", None)
        self.metrics.index_blocks.set(self.kv_index.size() if self.kv_index else (index_size() if index_size else 0))
        m = self.metrics
        learner = feedback.learner_of(self.policy)
        engine_rates = self.watcher.engine_hit_rate
        gauges = self._per_backend_gauges()
        current = set(self.pool.backends)
        if self.peers is None:
            for gauge in gauges:
                clear(gauge)  # a replica that left the fleet leaves no series behind (its counters: for a while)
        else:  # workers share metrics through files, from which prometheus_client cannot remove a series: a
            for gone in self._exported - current:  # replica that left reads 0, not its last value
                for gauge in gauges:
                    gauge.labels(gone).set(0)
        self._exported = current
        self.forget_departed()
        for gone in self._ejections_made - current:  # made at 0 for a replica that left, never ejected: removed
            if self.peers is None and gone not in self._ejected:  # (pod churn had added two series per pod ever
                for reason in EJECTION_REASONS:  # seen); one ejected keeps its count for RETAIN_S (router/departed.py)
                    with contextlib.suppress(KeyError):
                        m.ejections.remove(gone, reason)
                self._ejections_made.discard(gone)
        for b in self.pool.backends.values():
            if b.id not in self._ejections_made:  # each replica's at 0 from its start, as the retry reasons
                for reason in EJECTION_REASONS:
                    m.ejections.labels(b.id, reason)
                self._ejections_made.add(b.id)
            m.healthy.labels(b.id).set(1 if b.takes_traffic else 0)
            m.in_flight.labels(b.id).set(b.in_flight)
            if learner is not None and b.id in learner.estimates:
                m.backend_cache_horizon.labels(b.id).set(learner.horizon(b.id))
            if b.id in engine_rates:
                m.backend_engine_hit_rate.labels(b.id).set(engine_rates[b.id])

    # --- helpers -------------------------------------------------------------------------------------------

    def _count(self, metric, *labels: str) -> None:
        child(metric, *labels).inc()

    def _unknown_tenant(self, status: int | str) -> None:
        """An answer given before the request's key was read counts under tenant "-", as one without auth."""
        self._count(self.metrics.tenant_requests, NO_TENANT, str(status))

    def _log(self, request_id: str, tenant: str | None, path: str, status: int, started: float,
             attempt: Attempt | None = None, ttfb_ms: float | None = None, body: dict | None = None,
             error: str | None = None) -> None:
        """The request line (observe/logs.py): ids, hashed tenant, replica, policy and branch, timings; the
        prompt only with log_prompts."""
        if not self.settings.access_log or not self.access.enabled:
            return
        choice = attempt.choice if attempt is not None else None
        backend = attempt.backend if attempt is not None else None
        # the replica as its model_* series and its engine's lines name it (r0 under `up`), and its address
        self.access.write(request_id=request_id, tenant=tenant_hash(tenant), path=path, status=status,
                    replica=backend.label if backend is not None else None,
                    backend=backend.id if backend is not None and backend.label != backend.id else None,
                    policy=self.policy.name,
                    branch=getattr(choice, "branch", None), attempts=attempt.tries if attempt is not None else None,
                    retried=",".join(attempt.retried) if attempt is not None and attempt.retried else None,
                    ttfb_ms=round(ttfb_ms, 2) if ttfb_ms is not None else None,
                    latency_ms=round((self.clock() - started) * 1000, 2), error=error,
                    prompt=prompt_text(body) if self.settings.log_prompts and body else None)

