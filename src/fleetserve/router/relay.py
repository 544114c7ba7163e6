"""Relay: the replica's answer to the client, as cheaply as its shape allows, and never a silent cut.

A complete answer with a length (every non-streaming completion on loopback) goes out in one write with its
`content-length`: no chunking, no per-chunk work. A stream goes out chunk by chunk as it arrives, waiting
when the client reads slower than the replica writes. An SSE stream is relayed in whole events: the bytes of
an event not yet ended wait for the rest. If the replica fails mid-answer, or the router stops before the
answer ends, an SSE stream ends with an OpenAI error event and `[DONE]` (the partial event is dropped: a
client given half an event and then the error read neither: openai's JSONDecodeError); any other body is cut
by closing the connection (its length or chunking tells the client it is incomplete).

The answer's last bytes are kept when the policy learns from what engines report: `usage` closes a JSON
body and the final SSE chunk, and its `cached_tokens` goes back to the policy (router/feedback.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable

import orjson

from fleetserve.api.errors import APIError
from fleetserve.router.dispatch import Attempt
from fleetserve.router.http1 import Responder
from fleetserve.router.upstream import UpstreamError
from fleetserve.router.usage import EVENT_END, MAX_HELD, WHOLE_EVENTS, UsageStripper

log = logging.getLogger(__name__)

USAGE_TAIL = 1024
DONE_EVENTS = (b"data: [DONE]\n\n", b"data: [DONE]\r\n\r\n", b"data: [DONE]\r\r")  # a stream's last event
CACHED_TOKENS = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
# the replica's framing and connection headers are its own; ours are set by the front door
NOT_RELAYED = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"te", b"trailer",
                         b"upgrade", b"x-request-id"})


def last_int(pattern: re.Pattern, data: bytes) -> int | None:
    found = pattern.findall(data)
    return int(found[-1]) if found else None


async def relay(gw, attempt: Attempt, responder: Responder, extra: list[tuple[bytes, bytes]],
                learn: Callable[[bytes], None] | None, strip_usage: bool = False) -> bool:
    """Write the answer; True when it was relayed whole. `learn` gets the answer's tail (its `usage`);
    `strip_usage`: the router asked for the stream's usage event itself, which the client does not get
    (router/usage.py)."""
    response = attempt.response
    if response.status >= 400 and not (response.header(b"content-type") or b"").startswith(b"application/json"):
        await _send_as_openai_error(attempt, responder, extra)
        return False
    sse = (response.header(b"content-type") or b"").startswith(b"text/event-stream")
    strip = UsageStripper() if strip_usage and sse else None
    headers = [(k, v) for k, v in response.headers if k not in NOT_RELAYED]
    headers += extra
    first = attempt.first
    if response.complete and response.content_length is not None and strip is None:
        rest = await response.read()  # already here: no wait
        body = first + rest if rest else first
        responder.send(response.status, headers, body)
        if learn:
            learn(body[-USAGE_TAIL:])
        return True
    # a stream that loses its usage event loses bytes: its length goes, and it is chunked instead
    responder.start(response.status, headers, None if strip else response.content_length)
    tail = first[-USAGE_TAIL:] if learn else b""
    events = sse and strip is None  # whole events only (the usage stripper holds back partial ones itself)
    held = b""  # an SSE event begun but not ended
    finished = False  # the client got the stream's [DONE]: all it will read
    try:
        data = first
        while data:
            if strip:
                out = strip.feed(data)
            elif events:
                out, held = whole_events(held + data if held else data)
            else:
                out = data
            if out:
                responder.write(out)
                await responder.drain()
            if sse and out.endswith(DONE_EVENTS):
                finished = True  # end now: openai's client hangs up after [DONE], and waiting for the replica's
                break  # end of the body first logged such whole streams as 499s (client gone)
            if responder.client_gone:
                return False
            data = await response.read()
            if learn and data:
                tail = (tail + data)[-USAGE_TAIL:]
    except UpstreamError as exc:
        if exc.kind != "timeout":  # a silent stream's replica is its probes' to judge: a hung one fails them, an
            # overloaded one (preempting under KV pressure) answers them and keeps its other streams
            gw.mark_unreachable(attempt.backend, f"failed mid-response: {exc.kind}")
        gw.request_failed(attempt.backend, "failed mid-response")
        log.warning("backend %s failed mid-response: %s", attempt.backend.url, exc)
        attempt.cut = _cut_error(attempt.backend.draining, exc)  # an error the client got: counted and logged so
        if sse and response.content_length is None:
            _end_with_error(responder, attempt.cut)
        else:
            responder.abort()
        return False
    except asyncio.CancelledError:
        if responder.stopping and sse and response.content_length is None and not responder.ended:
            _end_with_error(responder, APIError(503, "the router stopped (a restart, a scale-in or the fleet's stop) "
                                                     "before this stream finished; the response is incomplete",
                                                code="router_stopping"))
        raise
    if strip:
        rest = strip.flush()
        if rest:
            responder.write(rest)
    elif held:  # the replica ended its stream without ending its last event: it goes as it came
        responder.write(held)
    if finished:  # while the request still owns its connection: a hang-up cancels it, a stop interrupts it
        await _read_to_end(response)
    responder.end()
    if learn:
        learn(tail)
    return True


async def _read_to_end(response) -> None:
    """After [DONE], the replica's end of the body (its chunked terminator), so its connection goes back to the pool;
    the client may hang up meanwhile, which is no failure of a stream it had whole."""
    try:
        async with asyncio.timeout(AFTER_DONE_S):
            while await response.read():
                pass
    except (UpstreamError, asyncio.CancelledError, TimeoutError):
        pass  # the client left after [DONE] (its connection's task is cancelled), the replica did, or it kept its
        # body open: either way done (an unfinished answer's connection is closed, not pooled)


AFTER_DONE_S = 1.0  # at most this long for the replica to end its body after [DONE]
ERROR_BODY_READ = 64 * 1024  # of a replica's non-JSON error page, at most this much is read


async def _send_as_openai_error(attempt: Attempt, responder: Responder, extra: list[tuple[bytes, bytes]]) -> None:
    """A replica's error that is not OpenAI JSON (a proxy's or a crashed server's HTML page) goes to the client as
    OpenAI error JSON with the same status: clients parse `error.message`, and an HTML page passed through whole
    gave them nothing to read."""
    response = attempt.response
    body, size = [attempt.first], len(attempt.first)
    try:
        while size < ERROR_BODY_READ and (data := await response.read()):
            body.append(data)
            size += len(data)
    except UpstreamError:
        pass  # what arrived is enough to quote
    text = re.sub(r"<[^>]*>", " ", b"".join(body)[:ERROR_BODY_READ].decode("utf-8", "replace"))
    text = " ".join(text.split())[:300]
    kind = (response.header(b"content-type") or b"no content-type").decode("latin-1").split(";")[0]
    error = APIError(response.status, f"the model replica answered {response.status} with a {kind} body, not "
                                      f"OpenAI JSON: {text or '(empty)'}", code="upstream_error")
    headers = [(b"content-type", b"application/json")] + [(k.lower().encode(), str(v).encode())
                                                          for k, v in error.headers.items()] + extra
    retry_after = response.header(b"retry-after")
    if retry_after is not None:
        headers.append((b"retry-after", retry_after))
    responder.send(response.status, headers, orjson.dumps(error.body()))


def whole_events(data: bytes) -> tuple[bytes, bytes]:
    """`data` split after its last complete SSE event: (what can go to the client, what waits for more). Event
    ends are the usage stripper's (router/usage.py: any two line ends, mixed); with no end in sight past
    MAX_HELD the bytes go as they came rather than being held to the end of the stream."""
    if data.endswith(WHOLE_EVENTS):  # the usual chunk: whole events
        return data, b""
    end = 0
    for found in EVENT_END.finditer(data):
        end = found.end()
    if not end and len(data) > MAX_HELD:
        return data, b""
    return data[:end], data[end:]


def _end_with_error(responder: Responder, error: APIError) -> None:
    """An OpenAI error event and `[DONE]` end the stream (the client got whole events only)."""
    responder.write(b"data: " + orjson.dumps(error.body()) + b"\n\ndata: [DONE]\n\n")
    responder.end()


def _cut_error(draining: bool, exc: UpstreamError) -> APIError:
    """Why a stream ended early: a replica silent for longer than a stream allows (hung, or too overloaded to go
    on) as a 504; a replica the fleet was draining (scale-down, a spot notice, a move) stopped when its drain
    time was up, which is the spec's choice, not a fault of the replica; else a failure of the replica."""
    if exc.kind == "timeout":
        return APIError(504, f"the model replica sent nothing for {getattr(exc, 'seconds', None) or 0:g}s mid-stream "
                             "(router.streamIdleTimeoutSeconds); the response is incomplete", code="upstream_timeout")
    if draining:
        return APIError(502, "the model replica was draining (scale-down, spot notice or move) and stopped when its "
                             "drain time (engine.drainTimeoutSeconds) ran out before this stream finished; the "
                             "response is incomplete", code="upstream_failed")
    return APIError(502, f"the model replica failed mid-stream ({exc.kind}); the response is incomplete",
                    code="upstream_failed")
