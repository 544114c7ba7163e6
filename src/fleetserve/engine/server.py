"""The engine's OpenAI-compatible HTTP server (Starlette on uvicorn)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fleetserve.api.disconnect import SSE_HEADERS, ClientGone, WatchedStreamingResponse, until_disconnect
from fleetserve.api.errors import MODEL_NOT_FOUND, APIError, api_app, engine_stopped, model_not_found
from fleetserve.api.internal import TENANT_HEADER, InternalAuth, engine_front_door
from fleetserve.api.limits import STREAM_KEEPALIVE_S, SizeLimits
from fleetserve.api.openapi import openapi_endpoint
from fleetserve.api.protocol import ParsedRequest, parse_chat, parse_completion, parse_json_body
from fleetserve.api.read_timeout import disconnect_status
from fleetserve.engine.budget import token_budget
from fleetserve.engine.instance import CHALLENGE_HEADER, instance_field
from fleetserve.engine.runner import ModelRunner
from fleetserve.engine.scheduler import Job, SerialScheduler
from fleetserve.observe.logs import log_request, prompt_text, tenant_hash
from fleetserve.observe.metrics import EngineMetrics, ModelIdentity, exposition

log = logging.getLogger(__name__)
access_log = logging.getLogger("fleetserve.engine.access")




KEEPALIVE_EVENT = b": keep-alive\n\n"  # an SSE comment: clients skip it, the router relays it as any event


@dataclass(frozen=True)
class EngineSettings:
    served_model_name: str
    identity: ModelIdentity
    max_tokens_default: int = 512
    max_waiting: int = 256
    dtype: str = "float32"
    max_batch: int = 8  # 1: one sequence at a time
    prefill_chunk: int = 256
    size_limits: SizeLimits = field(default_factory=SizeLimits)
    internal_token: str | None = None  # from the fleet: only its router may name a tenant or use the admin API
    tokenizer_threads: int = 2  # tokenizing runs here, never on the event loop
    log_prompts: bool = False  # the request line carries the prompt text (default: never)
    # a stream whose tokens all decode to held-back text (incomplete UTF-8, a possible stop string) sends an SSE
    # comment at least this often: the router's stream idle timeout had cut a stream that was generating
    stream_keepalive_s: float = STREAM_KEEPALIVE_S


class _Outcome:
    """What a finished job reported."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.finish_reason = "stop"
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0


def _usage(prompt: int, completion: int, cached: int = 0) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class Engine:
    def __init__(self, runner: ModelRunner, settings: EngineSettings):
        self.runner = runner
        self.settings = settings
        self.metrics = EngineMetrics(settings.identity)
        count = self.metrics.vllm(self.metrics.generation_tokens).inc
        if settings.max_batch > 1 and runner.sliding_window is not None:
            log.warning("continuous batching is off for this model (one sequence at a time): its sliding-window "
                        "attention layers (a %d-token window, under the %d-token context) keep only the window's "
                        "last positions, which the batch's KV buffer cannot hold", runner.sliding_window,
                        runner.context_length)
            settings = replace(settings, max_batch=1)
            self.settings = settings
        if settings.max_batch > 1:
            from fleetserve.engine.batching import BatchScheduler

            self.scheduler = BatchScheduler(runner, settings.max_waiting, count, settings.max_batch,
                                            settings.prefill_chunk)
        else:
            self.scheduler = SerialScheduler(runner, max_waiting=settings.max_waiting, on_token=count)
        self.created = int(time.time())
        self.auth = InternalAuth(settings.internal_token)
        self._tokenizer_pool = ThreadPoolExecutor(settings.tokenizer_threads, thread_name_prefix="tokenize")
        self._tokenizing = 0
        # accepted and not answered (`stop_answers`); weak, as a job a failed path never discards must not stay
        self.live_jobs: weakref.WeakSet[Job] = weakref.WeakSet()
        self.stopping = False  # the drain time ran out: nothing new is submitted

    def kv_root(self, tenant: str | None, client_salt: str | None = None) -> int:
        from fleetserve.kvcache.blocks import kv_salt, namespace_key

        s = self.settings
        return namespace_key(s.served_model_name, s.identity.model_version, s.dtype, kv_salt(tenant, client_salt))

    # --- request preparation -------------------------------------------------------------------------

    def _check_model(self, parsed: ParsedRequest) -> None:
        if parsed.model is not None and parsed.model != self.settings.served_model_name:
            raise model_not_found(parsed.model, [self.settings.served_model_name])

    def _check_text_size(self, parsed: ParsedRequest) -> None:
        """Refuse a prompt that cannot fit before paying seconds to tokenize it."""
        chars = sum(len(m["content"]) for m in parsed.messages) if parsed.kind == "chat" else (
            len(parsed.prompt) if isinstance(parsed.prompt, str) else 0)
        limit = self.runner.context_length * self.runner.max_token_chars()
        if chars > limit:
            raise APIError(400, f"This model's maximum context length is {self.runner.context_length} tokens; "
                                f"your prompt has {chars} characters, more than any {self.runner.context_length} "
                                "tokens can hold. Shorten the prompt.",
                           param="messages" if parsed.kind == "chat" else "prompt", code="context_length_exceeded")

    async def _tokenize(self, parsed: ParsedRequest, root: int = 0,
                        tenant: str | None = None) -> tuple[list[int], int, object | None]:
        """Prompt ids, the token budget and the prompt's blocks in L2, computed off the event loop (health
        probes stay responsive) and off the generation thread (it never waits for Redis)."""
        self._check_text_size(parsed)
        # each prompt being tokenized goes on to a free batch slot or the queue: a bound of the queue alone
        # refused the third of three requests to an idle engine with --max-batch 2 --max-waiting 2
        if self._tokenizing >= self.settings.max_waiting + self.settings.max_batch:
            raise APIError(503, f"{self._tokenizing} prompts are being tokenized; retry shortly", code="overloaded",
                           headers={"Retry-After": "1"})

        def work() -> tuple[list[int], int, object | None]:
            ids = self._prompt_ids(parsed)
            budget = self._budget(len(ids), parsed.sampling.max_tokens, parsed.kind, parsed.sampling.max_tokens_param)
            full = self.scheduler.full()  # refused at submit: read nothing for it
            return ids, budget, None if full else self.runner.prefetch_l2(ids, root, tenant)

        self._tokenizing += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._tokenizer_pool, work)
        finally:
            self._tokenizing -= 1

    def _prompt_ids(self, parsed: ParsedRequest) -> list[int]:
        if parsed.kind == "chat":
            return self.runner.chat_ids(parsed.messages, parsed.template_kwargs)
        if isinstance(parsed.prompt, list):
            vocab = self.runner.vocab_size()
            bad = next((t for t in parsed.prompt if not 0 <= t < vocab), None)
            if bad is not None:
                raise APIError(400, f"prompt: token id {bad} is outside the vocabulary [0, {vocab})",
                               param="prompt", code="invalid_value")
            return list(parsed.prompt)
        ids = self.runner.encode(parsed.prompt or "")
        if not ids:
            raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
        return ids

    def _budget(self, prompt_len: int, requested: int | None, kind: str = "chat", param: str = "max_tokens") -> int:
        return token_budget(prompt_len, requested, self.runner.context_length, kind, param,
                            self.settings.max_tokens_default)

    # --- handlers ----------------------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, "completion")

    async def _serve(self, request: Request, kind: str) -> Response:
        started = time.monotonic()
        m = self.metrics
        # counted once the request is known to be this model's: another model's name (a 404) is none of its
        # invocations (it fed this model's invocation rate and error panels)
        ctx = {"request_id": request.headers.get("x-request-id"), "kind": kind, "started": started}
        try:
            try:
                raw = await request.body()  # a body past the limit raises its 413 (an APIError) here
            except ClientDisconnect:  # gone while sending its body: no answer to give, and no error of ours (it
                m.model(m.invocations).inc()  # had logged two tracebacks at ERROR)
                self._log_request(ctx, disconnect_status(request.scope))
                return Response(status_code=499)
            body = parse_json_body(raw)
            if self.settings.log_prompts:
                ctx["prompt"] = prompt_text(body)
            parsed = parse_chat(body) if kind == "chat" else parse_completion(body)
            self._check_model(parsed)
            tenant = request.headers.get(TENANT_HEADER)  # EngineGuard lets it through from the router only
            ctx["tenant"] = tenant_hash(tenant)
            root = self.kv_root(tenant, parsed.cache_salt)
            prompt_ids, max_new, prefetched = await self._tokenize(parsed, root, tenant)
            if self.stopping:  # tokenized while the drain time ran out: it would be cut unanswered
                raise engine_stopped()
            job = Job(prompt_ids, parsed.sampling, max_new, asyncio.get_running_loop(), root=root, tenant=tenant,
                      prefetched=prefetched)
            self.scheduler.submit(job)
            self.live_jobs.add(job)
        except APIError as err:
            if err.code != MODEL_NOT_FOUND:
                m.model(m.invocations).inc()
                m.error(err.status)
            self._log_request(ctx, err.status, error=err.code)
            return err.response()
        except Exception:
            m.model(m.invocations).inc()
            self._internal_error(ctx)
            raise
        m.model(m.invocations).inc()
        m.model(m.concurrent).inc()
        m.vllm(m.prompt_tokens).inc(len(prompt_ids))
        request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        ctx["request_id"] = ctx["request_id"] or request_id
        ctx["stream"] = parsed.stream
        job.log_ctx = ctx  # _events logs the request line when the job is done
        if parsed.stream:

            def close() -> None:
                job.cancelled.set()
                self.live_jobs.discard(job)
                m.model(m.concurrent).dec()
                self._log_request(ctx, 499)  # only if _events has not (the client left first)

            return WatchedStreamingResponse(
                self._stream(job, parsed, request_id, started),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
                on_close=close,
            )
        try:
            outcome = await until_disconnect(request, self._collect(job, started))
            body = self._final_body(kind, parsed, request_id, outcome)
        except ClientGone:
            self._log_request(ctx, 499)
            return Response(status_code=499)
        except APIError as err:
            m.error(err.status)
            self._log_request(ctx, err.status, error=err.code)
            return err.response()
        except Exception:
            self._internal_error(ctx)
            raise
        finally:
            job.cancelled.set()
            self.live_jobs.discard(job)
            m.model(m.concurrent).dec()
        return JSONResponse(body)

    def _internal_error(self, ctx: dict | None) -> None:
        """A fault of ours (a broken chat template, a bug) that the app's handler answers 500: counted and logged
        as a request like any error. It was counted as an invocation only, so a fleet failing every request read
        an error ratio of 0 and no alert fired."""
        self.metrics.error(500)
        self._log_request(ctx, 500, error="internal_error")

    def stop_answers(self) -> None:
        """The drain time is up (api/graceful.py): every request still under way ends now with an error the
        client reads (an error event and [DONE] in a stream), and its generation stops."""
        self.stopping = True
        for job in list(self.live_jobs):
            job.cancelled.set()
            job.events.put_nowait(("stopped",))

    def _observe_first_token(self, started: float) -> None:
        waited = time.monotonic() - started
        self.metrics.model(self.metrics.ttfb_ms).observe(waited * 1000)
        self.metrics.vllm(self.metrics.ttft_s).observe(waited)

    def _observe_done(self, started: float) -> None:
        took = time.monotonic() - started
        self.metrics.model(self.metrics.latency_ms).observe(took * 1000)
        self.metrics.vllm(self.metrics.e2e_s).observe(took)

    def _log_request(self, ctx: dict | None, status: int, error: str | None = None, done: tuple | None = None
                     ) -> None:
        """The request line (observe/logs.py), once per request: ids, hashed tenant, tokens, timings; the
        prompt only with log_prompts."""
        if ctx is None or ctx.get("logged") or not access_log.isEnabledFor(logging.INFO):
            return
        ctx["logged"] = True
        fields = {}
        if done is not None:
            _, fields["finish_reason"], fields["prompt_tokens"], fields["completion_tokens"], \
                fields["cached_tokens"] = done
        log_request(access_log, request_id=ctx.get("request_id"), tenant=ctx.get("tenant"), kind=ctx["kind"],
                    stream=ctx.get("stream"), status=status, **fields, ttft_ms=ctx.get("ttft_ms"),
                    latency_ms=round((time.monotonic() - ctx["started"]) * 1000, 2), error=error,
                    prompt=ctx.get("prompt"))

    async def _events(self, job: Job, started: float) -> AsyncIterator[tuple]:
        first = True
        ctx = getattr(job, "log_ctx", None)
        while True:
            event = await job.events.get()
            if event[0] == "token" and first:
                first = False
                self._observe_first_token(started)
                if ctx is not None:
                    ctx["ttft_ms"] = round((time.monotonic() - started) * 1000, 2)
            if event[0] == "error":
                self._log_request(ctx, 500, error="generation_failed")
                raise APIError(500, event[1], code="generation_failed")
            if event[0] == "stopped":
                self._log_request(ctx, 503, error="engine_stopping")
                raise engine_stopped()
            yield event
            if event[0] == "done":
                if first:
                    self._observe_first_token(started)
                self._observe_done(started)
                self._log_request(ctx, 200, done=event)
                return

    async def _collect(self, job: Job, started: float) -> _Outcome:
        outcome = _Outcome()
        async for event in self._events(job, started):
            if event[0] == "token":
                outcome.text.append(event[1])
            else:
                (_, outcome.finish_reason, outcome.prompt_tokens, outcome.completion_tokens,
                 outcome.cached_tokens) = event
        return outcome

    def _final_body(self, kind: str, parsed: ParsedRequest, request_id: str, outcome: _Outcome) -> dict:
        text = "".join(outcome.text)
        base = {"id": request_id, "created": int(time.time()), "model": self.settings.served_model_name}
        usage = _usage(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
        if kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": outcome.finish_reason}
            return {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
        if parsed.echo:
            text = self._echoed(parsed) + text
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": outcome.finish_reason}
        return {**base, "object": "text_completion", "choices": [choice], "usage": usage}

    def _echoed(self, parsed: ParsedRequest) -> str:
        """The prompt `echo` repeats: as sent, or a prompt of token ids decoded to text, as vLLM echoes it (it was
        left out, and the answer read as if echo had not been asked)."""
        return parsed.prompt if isinstance(parsed.prompt, str) else self.runner.decode(list(parsed.prompt or []))

    async def _stream(self, job: Job, parsed: ParsedRequest, request_id: str, started: float):
        chat = parsed.kind == "chat"
        base = {"id": request_id, "created": int(time.time()), "model": self.settings.served_model_name,
                "object": "chat.completion.chunk" if chat else "text_completion"}

        def chunk(delta: str | None, finish: str | None = None, role: bool = False) -> bytes:
            if chat:
                d = {"role": "assistant", "content": ""} if role else ({"content": delta} if delta else {})
                choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            return _sse({**base, "choices": [choice]})

        try:
            # Nothing is sent before the first token: until then the router may still retry elsewhere.
            opened = False
            wrote = None  # when a chunk last went out; None: none yet (a keep-alive never begins an answer)
            async for event in self._events(job, started):
                if not opened:
                    opened = True
                    if chat or parsed.echo:
                        yield chunk(None, role=True) if chat else chunk(self._echoed(parsed))
                        wrote = time.monotonic()
                if event[0] == "token":
                    if event[1]:
                        yield chunk(event[1])
                        wrote = time.monotonic()
                    elif wrote is not None and time.monotonic() - wrote >= self.settings.stream_keepalive_s:
                        yield KEEPALIVE_EVENT  # generating, its text held back: no silence the router cuts
                        wrote = time.monotonic()
                    continue
                _, finish, prompt_tokens, completion_tokens, cached = event
                yield chunk(None, finish=finish)
                if parsed.include_usage:
                    yield _sse({**base, "choices": [], "usage": _usage(prompt_tokens, completion_tokens, cached)})
            yield _sse("[DONE]")
        except APIError as err:
            self.metrics.error(err.status)
            yield _sse(err.body())
            yield _sse("[DONE]")
        except Exception as exc:  # a fault of ours mid-stream: an error event the client reads, counted as a 500
            log.exception("engine error in a stream")  # (it was a cut connection, logged as the client's 499)
            self._internal_error(getattr(job, "log_ctx", None))
            yield _sse(internal_error(exc).body())
            yield _sse("[DONE]")

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{model}: the openai client's `models.retrieve` (it was a plain 404 "Not Found")."""
        name = request.path_params["model"]
        if name != self.settings.served_model_name:
            return model_not_found(name, [self.settings.served_model_name]).response()
        return JSONResponse(self.model_card())

    def model_card(self) -> dict:
        return {
            "id": self.settings.served_model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "fleetserve",
            "root": self.runner.path.name,  # the model's folder name, not where it lies: clients are tenants too
            "max_model_len": self.runner.context_length,
        }

    async def model_info(self, request: Request) -> Response:
        """What routers probe (/get_model_info): the KV layout lets them key prefixes like this engine."""
        cache = self.runner.prefix_cache
        return JSONResponse({
            "model_path": str(self.runner.path), "served_model_name": self.settings.served_model_name,
            "is_generation": True, "max_model_len": self.runner.context_length,
            "block_size": self.runner.block_size if cache else 0,
            "num_gpu_blocks": cache.engine_blocks if cache else 0,
            "kv_model": self.settings.served_model_name, "kv_version": self.settings.identity.model_version,
            "kv_dtype": self.settings.dtype, "kv_events": "/kv/events" if cache else None,
        })

    async def kv_events(self, request: Request) -> Response:
        cache = self.runner.prefix_cache
        if cache is None:
            return APIError(404, "this engine runs without a prefix KV cache", code="not_found").response()
        try:
            since = int(request.query_params.get("since", "0"))
            wait = min(30.0, float(request.query_params.get("wait", "10")))
        except ValueError:
            return APIError(400, "since and wait must be numbers", param="since").response()
        return JSONResponse(await cache.events.wait_since(since, wait))

    async def kv_blocks(self, request: Request) -> Response:
        cache = self.runner.prefix_cache
        if cache is None:
            return APIError(404, "this engine runs without a prefix KV cache", code="not_found").response()
        return JSONResponse(cache.snapshot())

    async def kv_flush(self, request: Request) -> Response:
        """Wait until background writes to L1/L2 are done (benchmarks measure each tier in quiet)."""
        cache = self.runner.prefix_cache
        if cache is None:
            return APIError(404, "this engine runs without a prefix KV cache", code="not_found").response()
        await asyncio.get_running_loop().run_in_executor(None, cache.flush)
        return JSONResponse({"flushed": True})

    async def kv_clear(self, request: Request) -> Response:
        """Drop cache tiers (benchmarks measure each tier alone): ?tiers=engine,l1,l2. Needs the internal token."""
        cache = self.runner.prefix_cache
        if cache is None:
            return APIError(404, "this engine runs without a prefix KV cache", code="not_found").response()
        tiers = {t for t in request.query_params.get("tiers", "").split(",") if t}
        bad = tiers - {"engine", "l1", "l2"}
        if bad or not tiers:
            return APIError(400, f"tiers: got {sorted(bad) or 'nothing'}; allowed values: engine, l1, l2",
                            param="tiers").response()
        def flush_and_clear() -> None:  # waits on the writer and on Redis: never on the event loop (it stalled
            cache.flush()  # every stream and /health for as long)
            cache.clear(tiers)

        await asyncio.get_running_loop().run_in_executor(None, flush_and_clear)
        return JSONResponse({"cleared": sorted(tiers)})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.settings.served_model_name,
                             "running": self.scheduler.running, "waiting": self.scheduler.waiting,
                             **instance_field(request.headers.get(CHALLENGE_HEADER))})

    async def metrics_endpoint(self, request: Request) -> Response:
        m = self.metrics
        m.vllm(m.running).set(self.scheduler.running)
        m.vllm(m.waiting).set(self.scheduler.waiting)
        data, content_type = exposition(m.registry)
        return Response(data, media_type=content_type)


def internal_error(exc: Exception) -> APIError:
    """The 500 of a fault of the engine's own: its kind, never its message (which may quote a prompt)."""
    return APIError(500, f"internal error ({type(exc).__name__}); see the engine log", code="internal_error")


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("engine error on %s", request.url.path)
    return internal_error(exc).response()


def build_app(engine: Engine) -> Starlette:
    routes = [
        Route("/v1/chat/completions", engine.chat_completions, methods=["POST"]),
        Route("/v1/completions", engine.completions, methods=["POST"]),
        Route("/v1/models", engine.models, methods=["GET"]),
        Route("/v1/models/{model:path}", engine.model, methods=["GET"]),
        Route("/health", engine.health, methods=["GET"]),
        Route("/ping", engine.health, methods=["GET"]),
        Route("/openapi.json", openapi_endpoint("engine", [engine.settings.served_model_name]), methods=["GET"]),
        Route("/metrics", engine.metrics_endpoint, methods=["GET"]),
        Route("/get_model_info", engine.model_info, methods=["GET"]),
        Route("/kv/events", engine.kv_events, methods=["GET"]),
        Route("/kv/blocks", engine.kv_blocks, methods=["GET"]),
        Route("/admin/kv/clear", engine.kv_clear, methods=["POST"]),
        Route("/admin/kv/flush", engine.kv_flush, methods=["POST"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.scheduler.start()
        yield
        engine.scheduler.stop()
        if engine.runner.prefix_cache is not None:  # the writes queued for L1/L2 land, within a bound, or are said
            await asyncio.get_running_loop().run_in_executor(None, engine.runner.prefix_cache.close)

    app = api_app(routes, server_error=_server_error, lifespan=lifespan)
    return engine_front_door(app, engine.settings.size_limits, engine.auth)
