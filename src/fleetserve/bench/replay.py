"""Trace replay: send a trace's requests at their (time-scaled) arrival times and measure what comes back.

Streaming mode measures TTFT, ITL and TPOT at the client. Non-streaming mode (cheaper for large replays)
takes TTFT from the engine's `fleetserve_timing.ttft_ms` when the engine reports it (the simulated engine
does) and measures E2E at the client. Every request ends in a record: answered, or failed with its error.

The client is the router's own pooled HTTP/1.1 client (`router.upstream.Upstream`: raw asyncio protocols,
one httptools pass) with a byte-level SSE reader and orjson, not httpx: a load generator that is itself busy
makes first tokens wait in the client, and its own cost is then measured as the server's. Replaying the
fidelity trace (240 streams of 8-48 tokens) through the router to two simulated engines, httpx cost 10.4 ms
of client CPU per streamed request and 3.0 ms (p95 5.6 ms) lay between the router's ttfb (its access log)
and the client's first token; with this client 3.2 ms and 0.7 ms (p95 1.7 ms) (docs/simulator.md, "Fidelity").
`_one` (httpx) stays for callers that bring their own httpx client.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson

from fleetserve.router.upstream import Upstream, UpstreamError
from fleetserve.traces.model import TraceRequest


@dataclass
class Record:
    index: int
    arrival_s: float
    status: int = 0
    error: str = ""
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    replica: str = ""
    streamed: bool = False  # a chunk with output reached the client
    done: bool = False  # a stream's [DONE] arrived (a stream that ends without it was cut: lost, as chaos counts it)
    refused: bool = False  # the connection was refused: nothing listened, so the request was never accepted
    unresolved: bool = False  # refused as its host name does not resolve
    sent_s: float | None = None  # when the generator sent it, on the arrivals' clock (scaled by the speedup)
    scheduled_s: float | None = None  # when the trace (scaled) said to send it


def _body(req: TraceRequest, i: int, model: str, max_output: int | None, stream: bool,
          prompt_format: str = "tokens", vocab: int | None = None) -> dict:
    out = min(req.output_tokens, max_output) if max_output else req.output_tokens
    body: dict = {"model": model, "max_tokens": max(1, out), "temperature": 0, "ignore_eos": True,
                  "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if req.messages is not None:
        body["messages"] = list(req.messages)
    elif req.prompt is not None:
        body["prompt"] = req.prompt
    elif prompt_format == "text":  # one word per token, for routers that only take text prompts
        body["prompt"] = " ".join(f"w{t}" for t in req.token_ids(unique_seed=i))
    else:
        ids = req.token_ids(unique_seed=i)
        body["prompt"] = [t % vocab for t in ids] if vocab else ids  # a small model's vocabulary
    return body



def _engine_ttft(rec: Record, data: dict) -> None:
    """A non-streamed answer's TTFT, as its engine reports it (`fleetserve_timing.ttft_ms`), at most the E2E the
    client measured: the engine's clock is not the client's (the simulated engine reports its model's time), and
    a TTFT of 4.000 ms beside an E2E of 3.984 ms had given a negative TPOT."""
    reported = (data.get("fleetserve_timing") or {}).get("ttft_ms")
    rec.ttft_ms = None if reported is None else min(float(reported), rec.e2e_ms)
    if rec.ttft_ms is not None and rec.output_tokens > 1:
        rec.tpot_ms = (rec.e2e_ms - rec.ttft_ms) / (rec.output_tokens - 1)

async def _one(client: httpx.AsyncClient, url: str, path: str, body: dict, rec: Record, headers: dict) -> None:
    start = time.monotonic()
    try:
        if not body["stream"]:
            r = await client.post(url + path, json=body, headers=headers)
            rec.status = r.status_code
            rec.e2e_ms = (time.monotonic() - start) * 1000
            rec.replica = r.headers.get("x-fleetserve-replica", "")
            data = r.json()
            if r.status_code != 200:
                rec.error = data.get("error", {}).get("message", r.text[:200])
                return
            _usage(rec, data.get("usage") or {})
            _engine_ttft(rec, data)
            return
        async with client.stream("POST", url + path, json=body, headers=headers) as r:
            rec.status = r.status_code
            rec.replica = r.headers.get("x-fleetserve-replica", "")
            if r.status_code != 200:
                rec.error = _error_message(await r.aread())
                return
            last = None
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()  # "data:" with or without its space, as the lean reader takes it
                if data == "[DONE]":
                    rec.done = True
                    continue
                if not data:
                    continue
                chunk = json.loads(data)
                if isinstance(chunk, dict):
                    last, failed = _chunk(rec, chunk, time.monotonic(), start, last)
                    if failed:
                        return
            rec.e2e_ms = (time.monotonic() - start) * 1000
            if not rec.done:
                rec.error = "the stream ended without [DONE] or an error event: cut"
                return
            _stream_tpot(rec)
    except httpx.HTTPError as exc:
        rec.status = 0
        rec.error = f"{type(exc).__name__}: {exc}"
        rec.refused = isinstance(exc, httpx.ConnectError) and (_refused(exc) or _tls_failed(exc))
        rec.unresolved = _unresolved(exc)


def _tls_failed(exc: BaseException) -> bool:
    """An ssl.SSLError anywhere in the chain, or its words in the message (a wrapped one)."""
    import ssl

    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ssl.SSLError) or "WRONG_VERSION_NUMBER" in str(exc) or "SSL:" in str(exc):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _refused(exc: BaseException) -> bool:
    """A ConnectionRefusedError anywhere in the exception's chain (httpx wraps the socket's error), or a host name
    that does not resolve: either way the request reached no endpoint, which `lost` (dropped by the endpoint) had
    claimed for a mistyped host."""
    return _in_chain(exc, ConnectionRefusedError) or _unresolved(exc)


def _unresolved(exc: BaseException) -> bool:
    import socket

    return _in_chain(exc, socket.gaierror)


def _in_chain(exc: BaseException | None, kind: type) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _usage(rec: Record, usage: dict) -> None:
    rec.prompt_tokens = usage.get("prompt_tokens", 0)
    rec.output_tokens = usage.get("completion_tokens", 0)
    rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0


def _error_message(raw: bytes) -> str:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict) and "message" in data["error"]:
        return str(data["error"]["message"])
    return raw.decode(errors="replace")[:200]


def _sse(rec: Record, lines: list[bytes], now: float, start: float, last: float | None) -> tuple[float | None, bool]:
    """One read's complete SSE lines into `rec` (all stamped `now`, when the bytes reached the client); the time
    of the last content chunk, and whether the stream carried an error event (the record is then failed)."""
    for line in lines:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            rec.done = True
            continue
        if not data:
            continue
        chunk = orjson.loads(data)
        if not isinstance(chunk, dict):
            continue
        last, failed = _chunk(rec, chunk, now, start, last)
        if failed:
            return last, True
    return last, False


def _carries_output(choice) -> bool:
    """A streamed choice with generated output in it: text, content, reasoning or a tool call. A chat stream's
    role-only first chunk (vLLM sends it before the prefill) and the empty finish chunk carry none: counted as
    tokens, they had made TTFT the time to the role and added an ITL of ~0 per request (a 4-token answer's
    TPOT read 0.0)."""
    if not isinstance(choice, dict):
        return False
    if "text" in choice:
        return bool(choice["text"])
    delta = choice.get("delta")
    return isinstance(delta, dict) and any(delta.get(k) for k in ("content", "reasoning_content", "reasoning",
                                                                  "tool_calls", "function_call"))


def _stream_tpot(rec: Record) -> None:
    """Time per output token after the first, (E2E - TTFT) / (tokens - 1) as vLLM's benchmark has it, from the
    usage the stream reported; the mean inter-chunk gap when it reported none (a chunk may hold several tokens)."""
    if rec.ttft_ms is not None and rec.output_tokens > 1:
        rec.tpot_ms = max(0.0, rec.e2e_ms - rec.ttft_ms) / (rec.output_tokens - 1)
    elif rec.itl_ms and not rec.output_tokens:
        rec.tpot_ms = sum(rec.itl_ms) / len(rec.itl_ms)


def _chunk(rec: Record, chunk: dict, now: float, start: float, last: float | None) -> tuple[float | None, bool]:
    """One parsed SSE chunk into `rec`: an error event fails the record; a content chunk stamps TTFT or an
    inter-token latency at `now`; usage fills the token counts. Returns the last content time and the failure."""
    if "error" in chunk:
        error = chunk["error"]
        rec.error = error.get("message", "stream error") if isinstance(error, dict) else str(error)
        rec.status = 502
        return last, True
    if any(_carries_output(c) for c in chunk.get("choices") or ()):
        rec.streamed = True
        if last is None:
            rec.ttft_ms = (now - start) * 1000
        else:
            rec.itl_ms.append((now - last) * 1000)
        last = now
    if chunk.get("usage"):
        _usage(rec, chunk["usage"])
    return last, False


async def _one_lean(client: Upstream, base: str, path: str, body: dict, rec: Record,
                    headers: list[tuple[bytes, bytes]]) -> None:
    """`_one` on the pooled client: one request, its SSE read line by line as bytes arrive (or its JSON body)."""
    start = time.monotonic()
    response = None
    try:
        response = await client.request(base, "POST", path, headers,
                                         orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))
        rec.status = response.status
        rec.replica = (response.header(b"x-fleetserve-replica") or b"").decode("latin-1")
        if not body["stream"]:
            raw = await response.body()
            rec.e2e_ms = (time.monotonic() - start) * 1000
            if response.status != 200:
                rec.error = _error_message(raw)
                return
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                data = None
            if not isinstance(data, dict):
                rec.error = f"the answer is not a JSON object: {raw[:120].decode(errors='replace')}"
                return
            _usage(rec, data.get("usage") or {})
            _engine_ttft(rec, data)
            return
        if response.status != 200:
            rec.error = _error_message(await response.body())
            return
        last = None
        pending = b""
        while data := await response.read():
            now = time.monotonic()
            lines = (pending + data).split(b"\n")
            pending = lines.pop()  # an incomplete line waits for the next bytes
            last, failed = _sse(rec, lines, now, start, last)
            if failed:
                return
        if pending:
            last, failed = _sse(rec, [pending], time.monotonic(), start, last)
            if failed:
                return
        rec.e2e_ms = (time.monotonic() - start) * 1000
        if not rec.done:
            rec.error = "the stream ended without [DONE] or an error event: cut"
            return
        _stream_tpot(rec)
    except UpstreamError as exc:
        rec.status = 0
        rec.error = f"{type(exc).__name__}: {exc}"
        # a TLS handshake that failed (https to a plain-HTTP gateway, or the reverse) accepted nothing either: it
        # had counted as lost, a request the endpoint dropped
        rec.refused = getattr(exc, "refused", False) or _tls_failed(exc) or _refused(exc)
        rec.unresolved = _unresolved(exc)
    except orjson.JSONDecodeError as exc:
        rec.status = 0
        rec.error = f"malformed stream event: {exc}"
    finally:
        if response is not None:
            response.close()  # an unfinished answer closes its connection: the server sees the request end


def _origin(url: str) -> tuple[str, str]:
    """A base URL as (scheme://host:port, path prefix)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")


async def replay(url: str, requests: list[TraceRequest], *, model: str, speedup: float = 1.0,
                 stream: bool = False, max_output: int | None = None, timeout: float = 600.0,
                 prompt_format: str = "tokens", vocab: int | None = None, api_key: str | None = None
                 ) -> list[Record]:
    """Replay `requests` against an OpenAI endpoint (base URL without /v1); `vocab` folds token-id prompts
    into a small model's vocabulary. `timeout`: seconds to connect, and of silence while waiting for the answer
    (between its bytes), as httpx's timeout was."""
    records = [Record(i, r.arrival_s) for i, r in enumerate(requests)]
    base, prefix = _origin(url)
    client = Upstream(connect_timeout=timeout, read_timeout=timeout, max_idle=512)
    common = [(b"content-type", b"application/json")]
    if stream:
        common.append((b"accept", b"text/event-stream"))
    if api_key:  # a fleet with API keys: without it every request was a 401, counted as failed
        common.append((b"authorization", f"Bearer {api_key}".encode()))
    try:
        start = time.monotonic()
        tasks = []
        for i, req in enumerate(requests):
            delay = req.arrival_s / speedup - (time.monotonic() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            path = prefix + ("/v1/chat/completions" if req.messages is not None else "/v1/completions")
            headers = common + [(b"x-session-id", req.session.encode())] if req.session else common
            body = _body(req, i, model, max_output, stream, prompt_format, vocab)
            # lateness of the send (its body built) against the schedule: a generator that cannot keep up shows
            # here, not as the system's latency (summarize: `generator`)
            records[i].scheduled_s, records[i].sent_s = req.arrival_s / speedup, time.monotonic() - start
            tasks.append(asyncio.create_task(_one_lean(client, base, path, body, records[i], headers)))
        await asyncio.gather(*tasks)
    finally:
        await client.aclose()
    return records


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    a = np.asarray(values, dtype=float)
    return {"p50": round(float(np.percentile(a, 50)), 3), "p95": round(float(np.percentile(a, 95)), 3),
            "p99": round(float(np.percentile(a, 99)), 3), "mean": round(float(a.mean()), 3)}


def summarize(records: list[Record]) -> dict:
    ok = [r for r in records if r.status == 200 and not r.error]
    prompt = sum(r.prompt_tokens for r in ok)
    per_replica: dict[str, dict] = {}
    for r in ok:
        s = per_replica.setdefault(r.replica, {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0})
        s["requests"] += 1
        s["prompt_tokens"] += r.prompt_tokens
        s["cached_tokens"] += r.cached_tokens
    for s in per_replica.values():
        s["hit_rate"] = round(s["cached_tokens"] / s["prompt_tokens"], 4) if s["prompt_tokens"] else 0.0
    return {
        "requests": len(records),
        "answered": len(ok),
        # answered with an error status (a 404 or a 429 is an answer) apart from what got no answer at all (both
        # were "lost"), and, as the chaos bench counts them, connections refused (never accepted: nothing listened;
        # they had counted as lost, so a fleet that was down read as one that dropped requests)
        "failed": sum(1 for r in records if r.status and r.status != 200),
        "refused": sum(1 for r in records if r.refused),
        "lost": sum(1 for r in records if not r.refused and (not r.status or (r.status == 200 and r.error))),
        "errors": sorted({r.error[:120] for r in records if r.error})[:5],
        "hit_rate": round(sum(r.cached_tokens for r in ok) / prompt, 4) if prompt else 0.0,
        "ttft_ms": percentiles([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        "tpot_ms": percentiles([r.tpot_ms for r in ok if r.tpot_ms is not None]),
        "itl_ms": percentiles([x for r in ok for x in r.itl_ms]),
        "e2e_ms": percentiles([r.e2e_ms for r in ok if r.e2e_ms is not None]),
        "per_replica": per_replica,
        "generator": generator(records),
    }


def generator(records: list[Record]) -> dict:
    """Whether the load generator kept to the trace: the rate it was to send at and the rate it sent at (first
    to last send), and how late each send was against its schedule (ms). A late generator spreads the load
    thinner than the trace, and every figure beside it is then of a lighter load."""
    sent = [(r.scheduled_s, r.sent_s) for r in records if r.sent_s is not None and r.scheduled_s is not None]
    if len(sent) < 2:
        return {"requests_sent": len(sent), "scheduled_rps": None, "achieved_rps": None,
                "lag_ms": percentiles([max(0.0, b - a) * 1000 for a, b in sent])}
    span_scheduled = sent[-1][0] - sent[0][0]
    span_sent = sent[-1][1] - sent[0][1]
    return {
        "requests_sent": len(sent),
        "scheduled_rps": round((len(sent) - 1) / span_scheduled, 3) if span_scheduled > 0 else None,
        "achieved_rps": round((len(sent) - 1) / span_sent, 3) if span_sent > 0 else None,
        "lag_ms": percentiles([max(0.0, b - a) * 1000 for a, b in sent]),
    }


def records_json(records: list[Record]) -> list[dict]:
    return [asdict(r) for r in records]
