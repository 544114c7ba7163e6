"""`fleetserve engine --simulate PROFILE`: a stand-in engine with the real engine's HTTP surface.

Timing comes from a performance model (fleetserve.sim.perf): prefill time grows with the *uncached* prompt
tokens, a decode step with batch size and context; the KV cache is a bounded LRU of chained block keys, the
same keys the router computes, and every change is published as a KV event. Continuous batching in
miniature: one loop alternates a prefill (the oldest waiting request joins the batch) with a decode step
(every running sequence gains a token). Many of these fit on a couple of cores.

Probes peer routers use are answered too: /get_load, /v1/loads, /get_model_info, /get_server_info,
/server_info, /model_info, /version, /tokenize, and vLLM-named metrics.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
import uuid
import zlib
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fleetserve.api.disconnect import ClientGone, WatchedStreamingResponse, until_disconnect
from fleetserve.api.errors import APIError
from fleetserve.api.protocol import ParsedRequest, parse_chat, parse_completion, parse_json_body
from fleetserve.kvcache.blocks import chain_keys, namespace_key
from fleetserve.kvcache.events import KVEventLog
from fleetserve.observe.metrics import SECONDS_BUCKETS, exposition
from fleetserve.sim.perf import PerfProfile


def text_tokens(text: str) -> list[int]:
    """The simulated tokenizer: one token per whitespace-separated word, a stable id per word."""
    return [zlib.crc32(word.encode()) % 32000 for word in text.split()]


@dataclass
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


class SimulatedEngine:
    def __init__(self, profile: PerfProfile, model_name: str, model_version: str = "1", max_waiting: int = 4096):
        self.profile = profile
        self.model_name = model_name
        self.model_version = model_version
        self.max_waiting = max_waiting
        self.cache: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.running: list[SimRequest] = []
        self.busy_s = 0.0
        self.prefill_tokens_waiting = 0
        self.events = KVEventLog()
        self._work = asyncio.Event()
        self._task: asyncio.Task | None = None
        r = self.registry = CollectorRegistry()
        lbl = ["model_name"]
        self.m_running = Gauge("vllm:num_requests_running", "Running", lbl, registry=r)
        self.m_waiting = Gauge("vllm:num_requests_waiting", "Waiting", lbl, registry=r)
        self.m_usage = Gauge("vllm:kv_cache_usage_perc", "KV cache usage (0-1)", lbl, registry=r)
        self.m_usage_legacy = Gauge("vllm:gpu_cache_usage_perc", "KV cache usage (legacy name)", lbl, registry=r)
        self.m_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up", lbl, registry=r)
        self.m_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found cached", lbl, registry=r)
        self.m_gpu_queries = Counter("vllm:gpu_prefix_cache_queries", "Legacy name", lbl, registry=r)
        self.m_gpu_hits = Counter("vllm:gpu_prefix_cache_hits", "Legacy name", lbl, registry=r)
        self.m_ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", lbl, buckets=SECONDS_BUCKETS,
                                registry=r)
        self.m_busy = Counter("fleetserve_sim_busy_seconds", "Time spent computing", lbl, registry=r)
        self.m_config = Gauge("vllm:cache_config_info", "Cache configuration", ["block_size", "num_gpu_blocks"],
                              registry=r)
        self.m_config.labels(str(profile.block_size), str(profile.cache_blocks)).set(1)
        self._lbl = {"model_name": model_name}

    # --- cache and events ----------------------------------------------------------------------------------

    def _root(self, salt: str | None) -> int:
        return namespace_key(self.model_name, self.model_version, "sim", salt)

    def _publish(self, kind: str, keys: list[int]) -> None:
        self.events.publish(kind, keys, "engine")

    def _lookup(self, keys: list[int]) -> int:
        n = 0
        for key in keys:
            if key not in self.cache:
                break
            n += 1
        return n

    def _insert(self, keys: list[int]) -> None:
        stored = []
        for key in keys:
            if key in self.cache:
                self.cache.move_to_end(key)
            else:
                self.cache[key] = None
                stored.append(key)
        self._publish("stored", stored)
        removed = []
        while len(self.cache) > self.profile.cache_blocks:
            key, _ = self.cache.popitem(last=False)
            removed.append(key)
        self._publish("removed", removed)

    # --- the batch loop ------------------------------------------------------------------------------------

    async def _sleep_busy(self, seconds: float) -> None:
        self.busy_s += seconds
        self.m_busy.labels(**self._lbl).inc(seconds)
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def loop(self) -> None:
        prefill_turn = True
        while True:
            self.running = [r for r in self.running if not r.cancelled]
            while self.waiting and self.waiting[0].cancelled:
                self.prefill_tokens_waiting -= len(self.waiting.popleft().tokens)
            can_prefill = bool(self.waiting) and len(self.running) < self.profile.max_batch
            if can_prefill and (prefill_turn or not self.running):
                await self._prefill(self.waiting.popleft())
            elif self.running:
                await self._decode()
            else:
                self._work.clear()
                await self._work.wait()
            prefill_turn = not prefill_turn

    async def _prefill(self, req: SimRequest) -> None:
        self.prefill_tokens_waiting -= len(req.tokens)
        matched = self._lookup(req.keys)
        req.cached_tokens = matched * self.profile.block_size
        uncached = len(req.tokens) - req.cached_tokens
        self.m_queries.labels(**self._lbl).inc(len(req.tokens))
        self.m_hits.labels(**self._lbl).inc(req.cached_tokens)
        self.m_gpu_queries.labels(**self._lbl).inc(len(req.tokens))
        self.m_gpu_hits.labels(**self._lbl).inc(req.cached_tokens)
        req.prefill_s = self.profile.prefill_time(uncached)
        await self._sleep_busy(req.prefill_s)
        self._insert(req.keys)
        if req.cancelled:
            return
        req.first_token_at = time.monotonic()
        self.m_ttft.labels(**self._lbl).observe(req.first_token_at - req.arrived)
        self._emit(req)
        if req.produced < req.max_tokens:
            self.running.append(req)

    async def _decode(self) -> None:
        batch = self.running
        context = sum(len(r.tokens) + r.produced for r in batch)
        await self._sleep_busy(self.profile.decode_time(len(batch), context))
        for r in list(batch):
            if r.cancelled:
                continue
            self._emit(r)
        self.running = [r for r in self.running if r.produced < r.max_tokens and not r.cancelled]

    def _emit(self, req: SimRequest) -> None:
        req.produced += 1
        done = req.produced >= req.max_tokens
        req.events.put_nowait(("token", " x", done))

    # --- HTTP ----------------------------------------------------------------------------------------------

    def _tokens(self, parsed: ParsedRequest) -> list[int]:
        if parsed.kind == "chat":
            return text_tokens("".join(f"{m['role']}: {m['content']}\n" for m in parsed.messages))
        if isinstance(parsed.prompt, list):
            return list(parsed.prompt)
        return text_tokens(parsed.prompt or "")

    async def serve(self, request: Request, kind: str) -> Response:
        try:
            body = parse_json_body(await request.body())
            parsed = parse_chat(body) if kind == "chat" else parse_completion(body)
            if parsed.model is not None and parsed.model != self.model_name:
                raise APIError(404, f"model {parsed.model!r} does not exist; this endpoint serves "
                                    f"{self.model_name!r}", param="model", code="model_not_found")
            if len(self.waiting) >= self.max_waiting:
                raise APIError(503, "engine queue is full; retry later", code="overloaded",
                               headers={"Retry-After": "1"})
        except APIError as err:
            return err.response()
        tokens = self._tokens(parsed)
        salt = request.headers.get("x-fleetserve-tenant") or parsed.cache_salt
        keys = chain_keys(tokens, self.profile.block_size, self._root(salt))
        req = SimRequest(tokens, keys, parsed.sampling.max_tokens or 16, parsed.stream, time.monotonic())
        self.waiting.append(req)
        self.prefill_tokens_waiting += len(tokens)
        self._work.set()
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        base = {"id": rid, "created": int(time.time()), "model": self.model_name}
        if parsed.stream:
            def cancel() -> None:
                req.cancelled = True

            return WatchedStreamingResponse(self._sse(req, kind, base, parsed.include_usage),
                                            media_type="text/event-stream", on_close=cancel)
        try:
            await until_disconnect(request, self._finish(req))
        except ClientGone:
            req.cancelled = True
            return Response(status_code=499)
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

    async def _finish(self, req: SimRequest) -> None:
        while True:
            _, _, done = await req.events.get()
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
            _, text, done = await req.events.get()
            if chat:
                delta = {"role": "assistant", "content": text} if first else {"content": text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": "length" if done else None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length" if done else None}
            first = False
            yield f"data: {json.dumps({**base, 'object': obj, 'choices': [choice]})}\n\n".encode()
            if done:
                break
        if include_usage:
            yield f"data: {json.dumps({**base, 'object': obj, 'choices': [], 'usage': self._usage(req)})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    def load(self) -> dict:
        return {"num_requests_running": len(self.running), "num_requests_waiting": len(self.waiting),
                "num_waiting_prefill_tokens": self.prefill_tokens_waiting,
                "kv_cache_usage_perc": len(self.cache) / self.profile.cache_blocks, "busy_seconds": self.busy_s}

    def model_info(self) -> dict:
        return {"model_path": "", "served_model_name": self.model_name, "is_generation": True,
                "block_size": self.profile.block_size, "num_gpu_blocks": self.profile.cache_blocks,
                "kv_model": self.model_name, "kv_version": self.model_version, "kv_dtype": "sim",
                "kv_events": "/kv/events", "max_model_len": 1_000_000, "profile": self.profile.name}

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
        self.m_running.labels(**self._lbl).set(len(self.running))
        self.m_waiting.labels(**self._lbl).set(len(self.waiting))
        usage = len(self.cache) / self.profile.cache_blocks
        self.m_usage.labels(**self._lbl).set(usage)
        self.m_usage_legacy.labels(**self._lbl).set(usage)
        return exposition(self.registry)


def build_simulated_app(engine: SimulatedEngine) -> Starlette:
    async def chat(request):
        return await engine.serve(request, "chat")

    async def completions(request):
        return await engine.serve(request, "completion")

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": engine.model_name, "object": "model",
                                                         "owned_by": "fleetserve", "root": "",
                                                         "max_model_len": 1_000_000}]})

    async def health(request):
        return JSONResponse({"status": "ok", "model": engine.model_name, "running": len(engine.running),
                             "waiting": len(engine.waiting)})

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
        text = body.get("prompt") or "".join(m.get("content", "") for m in body.get("messages", []))
        tokens = text_tokens(str(text))
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": 1_000_000})

    async def metrics(request):
        data, content_type = engine.metrics_text()
        return Response(data, media_type=content_type)

    async def not_found(request, exc):
        return APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").response()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(engine.loop())
        yield
        task.cancel()

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models),
        Route("/health", health), Route("/ping", health),
        Route("/get_load", load), Route("/v1/loads", loads),
        Route("/get_model_info", model_info), Route("/model_info", model_info),
        Route("/get_server_info", model_info), Route("/server_info", model_info),
        Route("/version", version), Route("/tokenize", tokenize, methods=["POST"]),
        Route("/kv/events", engine.kv_events), Route("/kv/blocks", engine.kv_blocks),
        Route("/metrics", metrics),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: not_found})


def run_simulated_engine(profile: PerfProfile, host: str, port: int, model_name: str) -> None:
    import uvicorn

    engine = SimulatedEngine(profile, model_name)
    uvicorn.run(build_simulated_app(engine), host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
