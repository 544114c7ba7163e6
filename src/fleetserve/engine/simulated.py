"""`fleetserve engine --simulate PROFILE`: a stand-in engine with the real engine's HTTP surface.

A thin real-time wrapper around the simulator's replica step model (fleetserve.sim.replica): the same object
that advances in virtual time in `fleetserve simulate` advances here with `asyncio.sleep`, so the HTTP
fleet and the simulator share one model of batching, prefix caching and KV memory. Timing comes from a
performance profile (fleetserve.sim.perf); the KV cache holds the chained block keys the router computes,
and every change is published as a KV event.

Probes peer routers use are answered too: /get_load, /v1/loads, /get_model_info, /get_server_info,
/server_info, /model_info, /version, /tokenize, and vLLM-named metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
import weakref
from dataclasses import dataclass, field

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fleetserve.api.disconnect import SSE_HEADERS, ClientGone, WatchedStreamingResponse, until_disconnect
from fleetserve.api.errors import MODEL_NOT_FOUND, APIError, api_app, engine_stopped, model_not_found
from fleetserve.api.internal import TENANT_HEADER, InternalAuth, engine_front_door
from fleetserve.api.limits import KEEP_ALIVE_S, SizeLimits
from fleetserve.api.protocol import ParsedRequest, parse_chat, parse_completion, parse_json_body
from fleetserve.api.read_timeout import disconnect_status
from fleetserve.engine.budget import token_budget
from fleetserve.engine.instance import CHALLENGE_HEADER, instance_field
from fleetserve.kvcache.blocks import chain_keys, kv_salt, namespace_key
from fleetserve.kvcache.events import KVEventLog
from fleetserve.observe.logs import log_request, prompt_text, tenant_hash
from fleetserve.observe.metrics import ModelIdentity, SimEngineMetrics, exposition, start_model_series
from fleetserve.sim.perf import PerfProfile
from fleetserve.sim.replica import ReplicaModel, Seq
from fleetserve.traces.model import stand_in_tokens


def _only(body: dict, key: str) -> dict:
    """/tokenize's body without the fields serving would check and /tokenize does not take."""
    return {key: body[key]} if key in body else {}


def text_tokens(text: str) -> list[int]:
    """The simulated tokenizer: the simulator's stand-in (`traces.model.stand_in_tokens`: a stable id per word,
    a token per character of scripts written without spaces), so a prompt log is as long here as there."""
    return stand_in_tokens(text)


SIM_CONTEXT_LENGTH = 1_000_000  # a simulated engine's context unless --context-length says otherwise
SIM_CHAT_MAX_TOKENS_DEFAULT = 16  # a chat without max_tokens: short, as the simulated engine has always answered


@dataclass(eq=False)  # compared and hashed by identity: one request each (SimulatedEngine.live)
class SimRequest:
    tokens: list[int]
    keys: list[int]
    max_tokens: int
    stream: bool
    arrived: float
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    produced: int = 0
    cached_tokens: int = 0
    prefill_s: float = 0.0
    first_token_at: float | None = None
    cancelled: bool = False
    seq: Seq | None = None


access_log = logging.getLogger("fleetserve.engine.access")


class SimulatedEngine:
    def __init__(self, profile: PerfProfile, model_name: str, model_version: str = "1", max_waiting: int = 4096,
                 identity: ModelIdentity | None = None, log_prompts: bool = False,
                 context_length: int = SIM_CONTEXT_LENGTH):
        self.profile = profile
        self.context_length = context_length
        self.model_name = model_name
        self.model_version = model_version
        self.max_waiting = max_waiting
        self.events = KVEventLog()
        self.model = ReplicaModel(profile, listener=self.events.publish)
        self._work = asyncio.Event()
        m = SimEngineMetrics()  # built from the vocabulary (fleetserve.observe.vocabulary)
        self.registry = m.registry
        self.m_running, self.m_waiting, self.m_usage, self.m_usage_legacy = (m.running, m.waiting, m.usage,
                                                                             m.usage_legacy)
        self.m_queries, self.m_hits, self.m_gpu_queries, self.m_gpu_hits = (m.queries, m.hits, m.gpu_queries,
                                                                             m.gpu_hits)
        self.m_ttft, self.m_busy, self.m_config = m.ttft, m.busy, m.config
        self.m_config.labels(str(profile.block_size), str(profile.cache_blocks)).set(1)
        self._lbl = {"model_name": model_name}
        for counter in (self.m_queries, self.m_hits, self.m_gpu_queries, self.m_gpu_hits):
            counter.labels(**self._lbl)  # at 0 from the start, as the engines' are: exposed before a request
        self.identity = identity or ModelIdentity(model_name=model_name, model_version=model_version)
        self._model_lbl = self.identity.labels()
        start_model_series(m, self._model_lbl)  # as the built-in engine: exposed at 0 before a request
        self._metrics = m
        self.log_prompts = log_prompts
        self.live: weakref.WeakSet[SimRequest] = weakref.WeakSet()  # accepted and not answered: `stop_answers`
        self.stopping = False

    @property
    def cache(self):
        return self.model.cache

    @property
    def waiting(self):
        return self.model.waiting

    @property
    def running(self):
        return self.model.running

    @property
    def busy_s(self) -> float:
        return self.model.busy_s

    def _root(self, salt: str | None) -> int:
        return namespace_key(self.model_name, self.model_version, "sim", salt)

    # --- the step loop: the shared model, in real time -----------------------------------------------------

    async def loop(self) -> None:
        """Steps back to back on an absolute schedule, as in virtual time: a busy engine's step starts when the
        previous one was due to end, not when the event loop got round to it. Sleeping `duration` from the
        moment the loop resumes adds every step's lateness (timer granularity, the HTTP work the same loop
        does between steps) to the next one, so a stream of n decode steps drifted by n x the lateness and
        the queue behind it grew; with the schedule, lateness delays a step's tokens, never the steps after
        it. After idling, the schedule restarts at the wake-up."""
        model = self.model
        clock = asyncio.get_running_loop().time  # monotonic; the event loop's, so a virtual-time loop runs it too
        due: float | None = None  # when the step in progress ends on the model's clock
        while True:
            batch = list(model.running)  # the sequences this step decodes
            duration = model.begin_step()
            if duration is None:
                due = None
                self._work.clear()
                await self._work.wait()
                continue
            self.m_busy.labels(**self._lbl).inc(duration)
            now = clock()
            due = (now if due is None else due) + duration
            # a late loop catches up (no sleep) but still yields, so arrivals and streams are served
            await asyncio.sleep(max(0.0, due - now))
            firsts, _ = model.end_step(clock())
            for seq in batch:
                if not seq.cancelled:
                    self._emit(seq)
            for seq in firsts:
                self._first(seq)

    def _first(self, seq: Seq) -> None:
        req: SimRequest = seq.payload
        req.cached_tokens = seq.cached
        req.prefill_s = self.profile.prefill_base_s + seq.prefill_s + seq.load_s
        req.first_token_at = seq.first_at
        for m in (self.m_queries, self.m_gpu_queries):
            m.labels(**self._lbl).inc(seq.prompt)
        for m in (self.m_hits, self.m_gpu_hits):
            m.labels(**self._lbl).inc(seq.cached)
        self.m_ttft.labels(**self._lbl).observe(req.first_token_at - req.arrived)
        self._metrics.ttfb_ms.labels(**self._model_lbl).observe((req.first_token_at - req.arrived) * 1000)
        self._emit(seq)

    def _emit(self, seq: Seq) -> None:
        req: SimRequest = seq.payload
        req.produced += 1
        done = req.produced >= req.max_tokens
        req.events.put_nowait(("token", " x", done))

    def _cancel(self, req: SimRequest) -> None:
        req.cancelled = True
        if req.seq is not None:
            self.model.cancel(req.seq)

    # --- HTTP ----------------------------------------------------------------------------------------------

    def _tokens(self, parsed: ParsedRequest) -> list[int]:
        if parsed.kind == "chat":
            return text_tokens("".join(f"{m['role']}: {m['content']}\n" for m in parsed.messages))
        if isinstance(parsed.prompt, list):
            return list(parsed.prompt)
        if not parsed.prompt:  # as the built-in engine: nothing to prefill had been answered with 0 prompt tokens
            raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
        return text_tokens(parsed.prompt) or [0]  # only whitespace: still a token to a real tokenizer

    async def serve(self, request: Request, kind: str) -> Response:
        m, labels, started = self._metrics, self._model_lbl, time.monotonic()  # an invocation once it is this model's
        ctx = {"request_id": request.headers.get("x-request-id"), "kind": kind,
               "tenant": tenant_hash(request.headers.get(TENANT_HEADER))}
        body: dict = {}
        try:
            try:
                raw = await request.body()  # a body past the limit raises its 413 (an APIError) here
            except ClientDisconnect:  # gone while sending its body: a 499 (408 when the read bound cut it), as the
                m.invocations.labels(**labels).inc()  # built-in engine
                self._log_request(ctx, disconnect_status(request.scope), started, None, body)
                return Response(status_code=499)
            body = parse_json_body(raw)
            parsed = parse_chat(body) if kind == "chat" else parse_completion(body)
            if parsed.model is not None and parsed.model != self.model_name:
                raise model_not_found(parsed.model, [self.model_name])
            _refuse_what_placeholder_text_cannot_honour(parsed)
            tokens = self._tokens(parsed)
            budget = token_budget(len(tokens), parsed.sampling.max_tokens, self.context_length, kind,
                                  parsed.sampling.max_tokens_param, chat_default=SIM_CHAT_MAX_TOKENS_DEFAULT)
            if len(self.waiting) >= self.max_waiting:
                raise APIError(503, "engine queue is full; retry later", code="overloaded",
                               headers={"Retry-After": "1"})
        except APIError as err:
            if err.code != MODEL_NOT_FOUND:  # another model's request is none of this one's (as the built-in engine)
                m.invocations.labels(**labels).inc()
                m.errors.labels(**labels, status=str(err.status)).inc()
            self._log_request(ctx, err.status, started, None, body, error=err.code)
            return err.response()
        except Exception:  # a fault of ours, answered 500 by the app: counted as the built-in engine counts it
            m.invocations.labels(**labels).inc()
            m.errors.labels(**labels, status="500").inc()
            raise
        m.invocations.labels(**labels).inc()
        salt = kv_salt(request.headers.get(TENANT_HEADER), parsed.cache_salt)  # tenant: from the router only
        keys = chain_keys(tokens, self.profile.block_size, self._root(salt))
        req = SimRequest(tokens, keys, budget, parsed.stream,
                         asyncio.get_running_loop().time())  # the step loop's clock: first tokens are stamped on it
        req.seq = Seq(len(tokens), req.max_tokens, keys, req)
        self.model.add(req.seq)
        self.live.add(req)
        self._work.set()
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        base = {"id": rid, "created": int(time.time()), "model": self.model_name}
        ctx["request_id"], ctx["stream"] = ctx["request_id"] or rid, parsed.stream
        m.concurrent.labels(**labels).inc()

        def finished(status: int) -> None:
            self.live.discard(req)
            m.concurrent.labels(**labels).dec()
            if status == 200:
                m.latency_ms.labels(**labels).observe((time.monotonic() - started) * 1000)
            self._log_request(ctx, status, started, req, body)

        if parsed.stream:
            def cancel() -> None:
                self._cancel(req)  # ended early: the client left (499), or the drain time ran out (503)
                finished(200 if req.produced >= req.max_tokens else 503 if self.stopping else 499)

            return WatchedStreamingResponse(self._sse(req, kind, base, parsed.include_usage),
                                            media_type="text/event-stream", headers=SSE_HEADERS, on_close=cancel)
        try:
            await until_disconnect(request, self._finish(req))
        except ClientGone:
            self._cancel(req)
            finished(499)
            return Response(status_code=499)
        except APIError as err:  # stopped: the drain time ran out
            finished(err.status)
            return err.response()
        finished(200)
        text = " x" * req.produced
        usage = self._usage(req)
        if kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": "length"}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            obj = "text_completion"
        return JSONResponse({**base, "object": obj, "choices": [choice], "usage": usage,
                             "fleetserve_timing": self._timing(req)})

    def _log_request(self, ctx: dict, status: int, started: float, req: SimRequest | None, body: dict,
                     error: str | None = None) -> None:
        """The request line, as the built-in engine's (observe/logs.py); the prompt only with log_prompts."""
        if not access_log.isEnabledFor(logging.INFO):
            return
        done = {}
        if req is not None:
            ttft = (req.first_token_at - req.arrived) * 1000 if req.first_token_at else None
            done = {"prompt_tokens": len(req.tokens), "completion_tokens": req.produced,
                    "cached_tokens": req.cached_tokens, "ttft_ms": round(ttft, 2) if ttft is not None else None}
        log_request(access_log, request_id=ctx.get("request_id"), tenant=ctx.get("tenant"), kind=ctx["kind"],
                    stream=ctx.get("stream"), status=status, **done,
                    latency_ms=round((time.monotonic() - started) * 1000, 2), error=error,
                    prompt=prompt_text(body) if self.log_prompts and body else None)

    def stop_answers(self) -> None:
        """The drain time is up (api/graceful.py): what still runs ends now with an error the client reads."""
        self.stopping = True
        for req in list(self.live):
            self._cancel(req)
            req.events.put_nowait(("stopped", "", True))

    async def _finish(self, req: SimRequest) -> None:
        while True:
            kind, _, done = await req.events.get()
            if kind == "stopped":
                raise engine_stopped()
            if done:
                return

    def _usage(self, req: SimRequest) -> dict:
        return {"prompt_tokens": len(req.tokens), "completion_tokens": req.produced,
                "total_tokens": len(req.tokens) + req.produced,
                "prompt_tokens_details": {"cached_tokens": req.cached_tokens}}

    def _timing(self, req: SimRequest) -> dict:
        ttft = (req.first_token_at - req.arrived) * 1000 if req.first_token_at else None
        return {"ttft_ms": ttft, "prefill_ms": req.prefill_s * 1000, "cached_tokens": req.cached_tokens}

    async def _sse(self, req: SimRequest, kind: str, base: dict, include_usage: bool):
        chat = kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        first = True
        while True:
            kind_, text, done = await req.events.get()
            if kind_ == "stopped":  # an error event and [DONE], where the stream had been cut mid-answer
                yield f"data: {json.dumps(engine_stopped().body())}\n\n".encode()
                break
            if chat:
                delta = {"role": "assistant", "content": text} if first else {"content": text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": "length" if done else None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length" if done else None}
            first = False
            yield f"data: {json.dumps({**base, 'object': obj, 'choices': [choice]})}\n\n".encode()
            if done:
                break
        if include_usage and kind_ != "stopped":
            yield f"data: {json.dumps({**base, 'object': obj, 'choices': [], 'usage': self._usage(req)})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    def load(self) -> dict:
        m = self.model
        return {"num_requests_running": m.num_running, "num_requests_waiting": m.num_waiting,
                "num_waiting_prefill_tokens": m.waiting_tokens, "kv_cache_usage_perc": m.kv_usage(),
                "busy_seconds": m.busy_s}

    def model_info(self) -> dict:
        return {"model_path": "", "served_model_name": self.model_name, "is_generation": True,
                "block_size": self.profile.block_size, "num_gpu_blocks": self.profile.cache_blocks,
                "kv_model": self.model_name, "kv_version": self.model_version, "kv_dtype": "sim",
                "kv_events": "/kv/events", "max_model_len": self.context_length, "profile": self.profile.name}

    async def kv_events(self, request: Request) -> Response:
        """Long poll: events after `since` (wait up to `wait` s for new ones); `resync` when `since` is too old."""
        try:
            since = int(request.query_params.get("since", "0"))
            wait = min(30.0, float(request.query_params.get("wait", "10")))
        except ValueError:
            return APIError(400, "since and wait must be numbers", param="since").response()
        return JSONResponse(await self.events.wait_since(since, wait))

    async def kv_blocks(self, request: Request) -> Response:
        return JSONResponse({"seq": self.events.seq, "tier": "engine", "keys": list(self.cache.keys())})

    def metrics_text(self) -> tuple[bytes, str]:
        self.m_running.labels(**self._lbl).set(self.model.num_running)
        self.m_waiting.labels(**self._lbl).set(self.model.num_waiting)
        usage = self.model.kv_usage()
        self.m_usage.labels(**self._lbl).set(usage)
        self.m_usage_legacy.labels(**self._lbl).set(usage)
        return exposition(self.registry)


def _refuse_what_placeholder_text_cannot_honour(parsed: ParsedRequest) -> None:
    """A simulated engine writes placeholder text: a stop sequence or an echoed prompt cannot be honoured, and
    were ignored without a word (`stop: ["x"]` answered " x x x x x"); refused as the built-in engine refuses
    what it cannot honour."""
    if parsed.sampling.stop:
        raise APIError(400, "stop: a simulated engine generates placeholder text and cannot honour stop sequences",
                       param="stop", code="unsupported_value")
    if parsed.echo:
        raise APIError(400, "echo: a simulated engine does not echo the prompt", param="echo",
                       code="unsupported_value")


def build_simulated_app(engine: SimulatedEngine, limits: SizeLimits | None = None,
                        auth: InternalAuth | None = None):
    async def chat(request):
        return await engine.serve(request, "chat")

    async def completions(request):
        return await engine.serve(request, "completion")

    created = int(time.time())

    def card() -> dict:  # OpenAI's Model object requires `created` (the openai client read None)
        return {"id": engine.model_name, "object": "model", "created": created, "owned_by": "fleetserve", "root": "",
                "max_model_len": engine.context_length}

    async def models(request):
        return JSONResponse({"object": "list", "data": [card()]})

    async def model(request):
        """GET /v1/models/{model}, as the built-in engine answers the openai client's `models.retrieve`."""
        name = request.path_params["model"]
        if name != engine.model_name:
            return model_not_found(name, [engine.model_name]).response()
        return JSONResponse(card())

    async def health(request):
        return JSONResponse({"status": "ok", "model": engine.model_name, "running": engine.model.num_running,
                             "waiting": engine.model.num_waiting,
                             **instance_field(request.headers.get(CHALLENGE_HEADER))})

    async def load(request):
        return JSONResponse(engine.load())

    async def loads(request):
        return JSONResponse({"loads": [engine.load()]})

    async def model_info(request):
        return JSONResponse(engine.model_info())

    async def version(request):
        from fleetserve import __version__

        return JSONResponse({"version": __version__, "engine": "fleetserve-sim"})

    async def tokenize(request):
        try:
            body = parse_json_body(await request.body())
        except APIError as err:
            return err.response()
        except ClientDisconnect:
            return Response(status_code=499)
        try:  # the prompt as serving it would count it (chat: `role: content` lines, list content's text)
            parsed = parse_chat(_only(body, "messages")) if "messages" in body else parse_completion(
                _only(body, "prompt"))
        except APIError as err:
            return err.response()
        tokens = engine._tokens(parsed)
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": engine.context_length})

    async def metrics(request):
        data, content_type = engine.metrics_text()
        return Response(data, media_type=content_type)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(engine.loop())
        yield
        task.cancel()

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/health", health), Route("/ping", health),
        Route("/get_load", load), Route("/v1/loads", loads),
        Route("/get_model_info", model_info), Route("/model_info", model_info),
        Route("/get_server_info", model_info), Route("/server_info", model_info),
        Route("/version", version), Route("/tokenize", tokenize, methods=["POST"]),
        Route("/kv/events", engine.kv_events), Route("/kv/blocks", engine.kv_blocks),
        Route("/metrics", metrics),
    ]
    app = api_app(routes, lifespan=lifespan)
    return engine_front_door(app, limits or SizeLimits(), auth or InternalAuth(None))


def run_simulated_engine(profile: PerfProfile, host: str, port: int, model_name: str,
                         internal_token: str | None = None, limits: SizeLimits | None = None,
                         log_format: str = "text", identity: ModelIdentity | None = None,
                         log_prompts: bool = False, drain_timeout: float = 2.0,
                         context_length: int = SIM_CONTEXT_LENGTH) -> None:
    from fleetserve.api.graceful import bind_port, serve
    from fleetserve.observe.logs import configure_logging

    configure_logging(log_format, "engine", identity.replica if identity else None)
    sock = bind_port(host, port)

    engine = SimulatedEngine(profile, model_name, identity.model_version if identity else "1", identity=identity,
                             log_prompts=log_prompts, context_length=context_length)
    app = build_simulated_app(engine, limits, InternalAuth(internal_token))
    serve(app, engine.stop_answers, sock=sock, host=host, port=port, log_level="warning",
          timeout_graceful_shutdown=drain_timeout,
          timeout_keep_alive=KEEP_ALIVE_S)
