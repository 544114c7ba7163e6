"""The gateway's front door: HTTP/1.1 on a raw asyncio protocol with the httptools parser (on uvloop).

Why not an ASGI server: the gateway's hot path is parse, choose, forward, relay. Measured side by side
(docs/gateway-stacks.md), Starlette + httpx spent about 1.5 ms of CPU per request, most of it in the ASGI
plumbing (scope dicts, receive/send message dicts, middleware layers) and httpx's request machinery. Here a
request is one parser pass and one call to the handler; the response is written with `transport.write`.

What a production front door owes its clients, kept here:
- bounded input: header bytes counted as they are parsed (431), the body counted as it arrives and a
  declared `content-length` checked before reading it (413); OpenAI error JSON for both, then close;
- keep-alive with an idle timeout longer than any client pool's expiry (api/limits.py `KEEP_ALIVE_S`), and a
  request that takes longer than `REQUEST_READ_S` to arrive whole (headers and body) answered 408 and closed;
  pipelined requests are answered in order, one at a time;
- `Expect: 100-continue` answered before the body is read;
- a client that goes away cancels its request's task, so the upstream request is aborted too;
- back-pressure: when the client's socket buffer is full, writers wait (`Responder.drain`), for at most
  `SEND_S` without the client taking a byte: then the connection is cut, as a client that left.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import logging
import sys
import termios
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import httptools

from fleetserve.api.limits import KEEP_ALIVE_S, REQUEST_READ_S, SEND_S, SizeLimits

log = logging.getLogger(__name__)

REASONS = {
    100: "Continue", 200: "OK", 201: "Created", 204: "No Content", 301: "Moved Permanently", 302: "Found",
    304: "Not Modified", 307: "Temporary Redirect", 400: "Bad Request", 401: "Unauthorized",
    403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
    413: "Content Too Large", 422: "Unprocessable Content", 429: "Too Many Requests",
    431: "Request Header Fields Too Large", 499: "Client Closed Request", 500: "Internal Server Error",
    502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
}
# parsed requests waiting behind the one being answered, per connection: past it the socket is not read (what one
# read already brought, at most the loop's read buffer, is still parsed)
MAX_PIPELINED = 16
REFUSED_SAID_EVERY_S = 10.0
REFUSED_LINGER_S = 1.0  # a refused connection is closed this long after its 503 (its request read meanwhile)
_refused_said_at = -REFUSED_SAID_EVERY_S
_STATUS_LINES = {code: f"HTTP/1.1 {code} {reason}\r\n".encode() for code, reason in REASONS.items()}


def _unsent(transport) -> int:
    """Bytes written to the client that it has not taken yet: the transport's buffer and the kernel's send queue
    (SIOCOUTQ; the transport's buffer alone does not move while a slow reader takes a little at a time, since the
    socket reads writable again only once a third of its send buffer is free)."""
    if transport is None:
        return 0
    queued = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (AttributeError, OSError, ValueError):
        return queued
    return queued + int.from_bytes(raw, sys.byteorder, signed=True)


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is not None:
        return line
    try:  # the codes answered rarely (303 to the dashboard, an upstream's 418): the standard phrase
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    return f"HTTP/1.1 {status} {reason}\r\n".encode()


class Request:
    """One parsed request. `headers` keep the client's order; names are lower-case bytes."""

    __slots__ = ("method", "path", "query", "headers", "body", "client", "http_version", "keep_alive", "_map")

    def __init__(self, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
                 client: tuple[str, int] | None, http_version: str, keep_alive: bool):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.client = client
        self.http_version = http_version
        self.keep_alive = keep_alive
        self._map: dict[str, str] | None = None

    def header(self, name: str, default: str | None = None) -> str | None:
        """A header by lower-case name (the last one wins, as dict(headers) would have it)."""
        return self.header_map().get(name, default)

    def header_map(self) -> dict[str, str]:
        if self._map is None:
            self._map = {k.decode("latin-1"): v.decode("latin-1") for k, v in self.headers}
        return self._map


class Responder:
    """Writes one response: `start` then `write`* then `end`, or `send` for a whole body at once."""

    __slots__ = ("_conn", "_chunked", "started", "ended", "status", "_head_only", "request_id", "path", "counted",
                 "rejected_path")

    def __init__(self, conn: HTTPConnection, head_only: bool):
        self._conn = conn
        self._chunked = False
        self._head_only = head_only
        self.started = False
        self.ended = False
        self.status = 0
        # what the handler knew of the request, for an error answered after it (router stopping, a bug): its id,
        # its path, and whether it was counted already (it was counted twice, and answered with a new id)
        self.request_id: bytes | None = None
        self.path: str | None = None
        self.counted = False
        self.rejected_path: str | None = None  # a request refused while parsing: its path, when the URL came whole

    def send(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A complete response with its content-length: one write."""
        self.started = True
        self.status = status
        head = [status_line(status)]
        for k, v in headers:
            head.append(k + b": " + v + b"\r\n")
        head.append(b"content-length: %d\r\n" % len(body))
        head.append(self._conn.connection_header())
        self._conn.write(b"".join(head) + (b"" if self._head_only else body))
        self._finish()

    def start(self, status: int, headers: list[tuple[bytes, bytes]], content_length: int | None = None) -> None:
        """Headers of a response whose body follows; without a length the body is chunked."""
        self.started = True
        self.status = status
        head = [status_line(status)]
        for k, v in headers:
            head.append(k + b": " + v + b"\r\n")
        if content_length is not None:
            head.append(b"content-length: %d\r\n" % content_length)
        elif self._conn.http10:
            self._conn.keep_alive_off()  # HTTP/1.0 has no chunking: the body ends when the connection closes
        elif not self._head_only:
            self._chunked = True
            head.append(b"transfer-encoding: chunked\r\n")
        head.append(self._conn.connection_header())
        self._conn.write(b"".join(head))

    def write(self, data: bytes) -> None:
        if not data or self._head_only:
            return
        if self._chunked:
            self._conn.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self._conn.write(data)

    def end(self) -> None:
        if self._chunked and not self._head_only:
            self._conn.write(b"0\r\n\r\n")
        self._finish()

    def abort(self) -> None:
        """The body cannot be completed: close the connection so the client sees a cut, not a hang."""
        self.ended = True
        self._conn.close()

    async def drain(self) -> None:
        await self._conn.drain()

    @property
    def client_gone(self) -> bool:
        return self._conn.closed

    @property
    def stopping(self) -> bool:
        """The server is stopping and its grace ran out: the request is being cut, and should say so."""
        return self._conn.stopping

    def disconnected(self) -> asyncio.Future:
        """Resolves when the client's connection is gone."""
        return self._conn.wait_closed()

    def _finish(self) -> None:
        self.ended = True
        self._conn.response_done()


Handler = Callable[[Request, Responder], Awaitable[None]]
OnError = Callable[[Responder, int, str, str], None]  # (responder, status, message, code)


class HTTPConnection(asyncio.Protocol):
    """One client connection: parse, hand each request to `handler`, one at a time."""

    def __init__(self, handler: Handler, limits: SizeLimits, on_error: OnError, keep_alive_s: float,
                 registry: set | None = None, read_timeout_s: float = REQUEST_READ_S, send_timeout_s: float = SEND_S,
                 max_connections: int | None = None):
        self.handler = handler
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.send_timeout_s = send_timeout_s
        self._reading: asyncio.TimerHandle | None = None  # a request has begun arriving: it must end in time
        self.registry = registry if registry is not None else set()
        self.limits = limits
        self.on_error = on_error
        self.keep_alive_s = keep_alive_s
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.client: tuple[str, int] | None = None
        self.closed = False
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._rejected = False
        self._deferred: tuple[int, str, str] | None = None  # a parse error after requests still to answer
        self._queue: collections.deque[Request] = collections.deque()
        self._task: asyncio.Task | None = None
        self._keep_alive = True
        self._idle: asyncio.TimerHandle | None = None
        self._paused = False
        self._drained: asyncio.Future | None = None
        self._gone: asyncio.Future | None = None
        self.http10 = False  # the request being answered is HTTP/1.0
        self._reading_paused = False
        self.stopping = False  # the server's grace ran out: the request under way is cut (`interrupt`)

    # --- asyncio.Protocol ----------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No request under way or waiting: safe to close."""
        return self._task is None and not self._queue

    def interrupt(self) -> asyncio.Task | None:
        """The server stops and the grace is over: cancel the request under way so that it answers its client
        (503 `router_stopping` before the answer began, an error event in an SSE stream) rather than being cut
        silently; returns its task, to wait for those last writes."""
        self.stopping = True
        self._queue.clear()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            return task
        return None

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.max_connections is not None and len(self.registry) >= self.max_connections:
            self._refuse_connection()
            return
        self.registry.add(self)
        peer = transport.get_extra_info("peername")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None
        self._arm_idle()

    def _refuse_connection(self) -> None:
        """Over `max_connections`: a 503 and a close, before anything is read. Without a bound, connections that
        idle or dribble took every file descriptor, and then the router could open none to its replicas either;
        the clients got a reset and the log said nothing."""
        global _refused_said_at
        self._rejected = True
        self.closed = True
        body = (b'{"error":{"message":"the router holds its maximum of open connections; retry shortly",'
                b'"type":"overloaded","param":null,"code":"too_many_connections"}}')
        self.transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                             b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%b"
                             % (len(body), body))
        # the answer, then our end of the stream: closed at once with the request still unread, the kernel sent a
        # reset that could arrive before the answer; what the client sends meanwhile is read and dropped
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(REFUSED_LINGER_S, self.transport.close)
        now = self.loop.time()
        if now - _refused_said_at >= REFUSED_SAID_EVERY_S:
            _refused_said_at = now
            log.warning("%d connections open, the most this router takes (--max-connections): new ones are "
                        "answered 503 and closed (said at most every %.0f s)", len(self.registry),
                        REFUSED_SAID_EVERY_S)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self.parser.get_method() == b"CONNECT":
                self._reject(501, "CONNECT is not supported: this is an OpenAI API endpoint, not a proxy",
                             "not_implemented")
            else:
                upgrade = next((v.decode("latin-1") for k, v in self._headers if k == b"upgrade"), "")
                self._reject(400, f"protocol upgrades are not supported (Upgrade: {upgrade}): send the request "
                                  "as HTTP/1.1 without Upgrade and Connection: upgrade", "bad_request")
        except httptools.HttpParserError as exc:
            if not self._rejected:
                self._reject(400, f"malformed HTTP request: {exc}", "bad_request")

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.registry.discard(self)
        self._cancel_idle()
        self._stop_reading_timer()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client went away: its request (and the upstream one) stop
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # --- httptools callbacks -------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._header_bytes = 0
        self._body = []
        self._body_bytes = 0
        self._cancel_idle()
        self._reading = self.loop.call_later(self.read_timeout_s, self._read_too_slow)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.limits.max_header_bytes:
            self._reject(431, f"request headers are over {self.limits.max_header_bytes} bytes "
                              "(spec.requestLimits.maxHeaderBytes)", "headers_too_large")
            raise httptools.HttpParserError("headers too large")
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        length = None
        expect = False
        for k, v in self._headers:
            if k == b"content-length":
                try:
                    length = int(v)
                except ValueError:
                    length = None
            elif k == b"expect" and v.lower() == b"100-continue":
                expect = True
            elif k == b"transfer-encoding":  # the parser undoes chunked only: a gzip body was read as bad JSON
                other = [c for c in (c.strip().lower() for c in v.split(b",")) if c and c != b"chunked"]
                if other:
                    self._reject(501, f"transfer coding {other[0].decode('latin-1')!r} is not supported: send the "
                                      "body as is, with Content-Length or chunked", "not_implemented")
                    raise httptools.HttpParserError("transfer coding")
        if length is not None and length > self.limits.max_body_bytes:
            self._reject(413, _body_message(length, self.limits.max_body_bytes), "request_too_large")
            raise httptools.HttpParserError("body too large")
        if expect and not self._queue and self._task is None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_body_bytes:
            self._reject(413, _body_message(self._body_bytes, self.limits.max_body_bytes), "request_too_large")
            raise httptools.HttpParserError("body too large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._stop_reading_timer()
        if self.parser.should_upgrade():  # an Upgrade (h2c, websocket) or a CONNECT: refused once, in
            return  # data_received. It had been served too, its body unread: two answers to one request
        url = httptools.parse_url(self._url)
        path = url.path.decode("latin-1")
        request = Request(self.parser.get_method().decode("latin-1"), path, url.query or b"", self._headers,
                          b"".join(self._body), self.client, self.parser.get_http_version(),
                          self.parser.should_keep_alive())
        self._queue.append(request)
        if len(self._queue) >= MAX_PIPELINED and not self._reading_paused:
            self._reading_paused = True  # a client that pipelines without end waits in its socket, not our memory
            self.transport.pause_reading()
        if self._task is None:
            self._next()

    # --- serving -------------------------------------------------------------------------------------------

    def _next(self) -> None:
        if self.closed or not self._queue:
            self._task = None
            if not self.closed:
                self._arm_idle()
            return
        request = self._queue.popleft()
        if self._reading_paused and len(self._queue) < MAX_PIPELINED:
            self._reading_paused = False
            self.transport.resume_reading()
        self._keep_alive = request.keep_alive
        self.http10 = request.http_version == "1.0"
        self._task = self.loop.create_task(self._serve(request))

    async def _serve(self, request: Request) -> None:
        responder = Responder(self, request.method == "HEAD")
        try:
            await self.handler(request, responder)
        except asyncio.CancelledError:
            if not self.closed:  # cancelled while the client is still there: shutting down
                if not responder.started:
                    self.keep_alive_off()
                    self.on_error(responder, 503, "the router stopped (a restart, a scale-in or the fleet's stop) "
                                                  "before this request was answered; retry", "router_stopping")
                elif not responder.ended:
                    responder.abort()
                self.close()
            return
        except Exception:
            log.exception("error answering %s %s", request.method, request.path)
            if not responder.started:
                self.on_error(responder, 500, "internal router error", "internal_error")
            else:
                responder.abort()
            return
        if not responder.ended and not self.closed:
            if responder.started:
                responder.end()
            else:
                self.on_error(responder, 500, "the router produced no answer", "internal_error")

    def response_done(self) -> None:
        """The response was written: keep the connection for the next request, or close it."""
        if self._deferred is not None and self._keep_alive:  # a request after these was malformed
            if self._queue:
                self.loop.call_soon(self._next)
            else:
                self._task = None
                deferred, self._deferred = self._deferred, None
                self.loop.call_soon(self._answer_rejection, *deferred)
            return
        if self._rejected:
            if self._deferred is not None:  # the client asked to close after that answer: nothing more to say
                self.close()
            return  # _reject closes, after letting the client read the answer
        if not self._keep_alive:
            self.close()
            return
        self.loop.call_soon(self._next)

    def keep_alive_off(self) -> None:
        self._keep_alive = False

    def connection_header(self) -> bytes:
        return b"\r\n" if self._keep_alive else b"connection: close\r\n\r\n"

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the client's socket buffer is full; a client that takes no byte for `send_timeout_s` is cut
        (its buffered bytes dropped: a graceful close would wait on them for ever). One that reads slowly but
        reads is waited for, as nginx's send_timeout judges it: between two of its reads."""
        while self._paused and not self.closed:
            before = _unsent(self.transport)
            self._drained = self.loop.create_future()
            try:
                await asyncio.wait_for(self._drained, self.send_timeout_s)
                return
            except TimeoutError:
                if _unsent(self.transport) < before:
                    continue  # it took bytes meanwhile: slow, not gone
                log.info("client %s took no byte of its answer for %gs: connection cut", self.client,
                         self.send_timeout_s)
                if self.transport is not None:  # connection_lost follows and cancels the request's task, here:
                    self.transport.abort()  # the request ends as one whose client left, by the same path
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.wait_closed()), 5)
                self.closed = True

    def wait_closed(self) -> asyncio.Future:
        if self._gone is None:
            self._gone = self.loop.create_future()
            if self.closed:
                self._gone.set_result(None)
        return self._gone

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._cancel_idle()
            if self.transport is not None:
                self.transport.close()

    def _reject(self, status: int, message: str, code: str) -> None:
        """An input error found while parsing: answer it and close. Requests read whole before it (pipelined in
        the same packet) are answered first, in order (RFC 9112 9.3.2): they got no answer at all, the stream
        shut under the request being served."""
        self._rejected = True
        if (self._task is not None or self._queue) and not self.closed:
            self._deferred = (status, message, code)  # answered by response_done once those are
            return
        self._answer_rejection(status, message, code)

    def _answer_rejection(self, status: int, message: str, code: str) -> None:
        self._keep_alive = False
        if not self.closed:
            responder = Responder(self, False)
            try:  # the path, where the request line came whole (a body too large): its answer is counted there
                responder.rejected_path = httptools.parse_url(self._url).path.decode("latin-1") if self._url else None
            except httptools.HttpParserError:
                responder.rejected_path = None
            self.on_error(responder, status, message, code)
        # Stop writing but keep reading (and discarding) briefly: closing a socket with unread client data makes
        # the kernel send a reset, which can destroy the error answer before the client reads it.
        if not self.closed and self.transport is not None and self.transport.can_write_eof():
            self.transport.write_eof()
            self._cancel_idle()
            self._idle = self.loop.call_later(2.0, self.close)
        else:
            self.close()

    def _arm_idle(self) -> None:
        self._cancel_idle()
        self._idle = self.loop.call_later(self.keep_alive_s, self.close)

    def _read_too_slow(self) -> None:
        """A request still arriving after `read_timeout_s`: 408 and close (after the answer under way, if any)."""
        self._reading = None
        if self.closed or self._rejected:
            return
        if self._task is None and not self._queue:
            self._reject(408, f"the request did not arrive whole within {self.read_timeout_s:g}s; send its headers "
                              "and body without pauses", "request_timeout")
        else:  # requests before it are still answered (and reading may be paused by us): its time starts again
            self._reading = self.loop.call_later(self.read_timeout_s, self._read_too_slow)

    def _stop_reading_timer(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None


def _body_message(size: int, limit: int) -> str:
    return f"request body is at least {size} bytes; the limit is {limit} (spec.requestLimits.maxBodyBytes)"


LINGER_S = 0.5  # how long a stopping router keeps idle keep-alive connections open for a request already sent


class FrontDoor:
    """The listening server and its open connections, for a graceful stop."""

    def __init__(self) -> None:
        self.server: asyncio.base_events.Server | None = None
        self.connections: set[HTTPConnection] = set()

    async def shutdown(self, grace_s: float, last_words_s: float = 1.0, linger_s: float = LINGER_S) -> None:
        """Stop accepting, let requests under way finish for `grace_s`, then interrupt them (each tells its client
        it was cut: `HTTPConnection.interrupt`), give those `last_words_s` to be written, and close.

        Every answer from now on says `connection: close`. Idle keep-alive connections stay open for `linger_s`
        (within the grace) before they close: a client that had just written its next request on one got no
        answer at all when it was closed at once (3 of 49 requests at a `down` under load); now that request is
        read and answered (503 `router_stopping`, the gateway's gate being closed) and the connection closes after
        it. A request written in the instant of the close itself can still meet it."""
        if self.server is not None:
            self.server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        quiet_from = loop.time() + min(linger_s, grace_s)
        while True:
            for conn in list(self.connections):
                conn.keep_alive_off()  # what it answers now says `connection: close`
                if conn.idle and loop.time() >= quiet_from:
                    conn.close()
            busy = [c for c in self.connections if not c.idle]
            if (not busy and loop.time() >= quiet_from) or loop.time() >= deadline:
                break
            await asyncio.sleep(0.05)
        cut = [task for conn in list(self.connections) if (task := conn.interrupt()) is not None]
        if cut:
            await asyncio.wait(cut, timeout=last_words_s)
        for conn in list(self.connections):
            conn.close()


async def serve(handler: Handler, on_error: OnError, host: str, port: int, *, limits: SizeLimits = SizeLimits(),
                ssl=None, reuse_port: bool = False, sock=None, keep_alive_s: float = KEEP_ALIVE_S,
                backlog: int = 2048, read_timeout_s: float = REQUEST_READ_S,
                send_timeout_s: float = SEND_S, max_connections: int | None = None) -> FrontDoor:
    """Listen (or use `sock`, a socket bound by a parent) and serve `handler`."""
    loop = asyncio.get_running_loop()
    door = FrontDoor()

    def factory() -> HTTPConnection:
        return HTTPConnection(handler, limits, on_error, keep_alive_s, door.connections, read_timeout_s,
                              send_timeout_s, max_connections)

    if sock is not None:
        door.server = await loop.create_server(factory, sock=sock, ssl=ssl, backlog=backlog)
    else:
        door.server = await loop.create_server(factory, host, port, ssl=ssl, reuse_port=reuse_port or None,
                                               backlog=backlog)
    return door
