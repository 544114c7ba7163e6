"""The gateway's client to its replicas: pooled keep-alive HTTP/1.1 connections on raw asyncio protocols.

Why not httpx or aiohttp: the gateway sends every request once to a handful of known hosts and relays the
answer; it needs a connection pool, one parser pass (httptools) and the body as it arrives, nothing else.
Measured beside both (docs/gateway-stacks.md), this is several times cheaper per request.

The one object is injectable (`Gateway(..., client=...)`): dispatch and retry tests hand it a fake that
answers from a script, with no subprocess. Errors are four kinds the dispatcher decides on:
`Unreachable` (no connection: another replica may take the request, and this one is out until a probe passes),
`Dropped` (connected, the request written, then closed with no answer: the replica may have read it; another
replica may take it, but the request itself may be what kills replicas), `Timeout` (the replica took it and
went silent: never retried elsewhere) and `Broken` (cut mid-answer). A pooled connection that closes at once
under a request is retried once on a fresh one, transparently: the replica closed it as idle just as the
request went out (the idle expiry, under the replicas' keep-alive, makes that rare); on a fresh connection a
drop is the replica's answer.

A fresh connection to a replica whose process must prove itself (`identity`, given by the backend pool: the
secret of the start its supervisor made last, engine/instance.py) carries first a challenge to its health path,
and no request, token included, goes on it unless the HMAC answers: the router's probes proved the port's owner
only once a second, and a process that bound a crashed replica's port in between got what was routed there.
"""

from __future__ import annotations

import asyncio
import collections
import json
import ssl as ssl_module
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

from fleetserve.engine.instance import CHALLENGE_HEADER, answered_by, new_challenge

RESUME_BELOW = 64 * 1024  # buffered body bytes under which a paused upstream is read again
PAUSE_ABOVE = 256 * 1024  # a slow client: stop reading the replica past this much unread body


class UpstreamError(Exception):
    """A request to a replica failed; `kind` is what the dispatcher decides on."""

    kind = "error"


class Unreachable(UpstreamError):
    kind = "unreachable"
    refused = False  # the host refused the connection: nothing listens there (a process gone), not a slow network


class Impostor(Unreachable):
    """What answers the replica's port did not prove the start its supervisor made (another process bound the port
    after a crash): nothing was sent to it but the challenge."""


class Unproven(Unreachable):
    """The challenge on a fresh connection went unanswered in time (a replica busy with a burst answers its health
    path late): nothing was sent, and another replica may take the request, but this one is not taken out for it
    (its probes judge it)."""


class Dropped(UpstreamError):
    kind = "dropped"


class Timeout(UpstreamError):
    kind = "timeout"

    def __init__(self, message: str, seconds: float | None = None):
        super().__init__(message)
        self.seconds = seconds  # the silence it waited out


class Broken(UpstreamError):
    kind = "broken"


class Stalled(UpstreamError):
    """The replica was taken out (its health probes failed) before any of this answer's body came: nothing
    reached the client, so the request goes to another replica instead of waiting out the read timeout."""

    kind = "stalled"


def backend_url_problem(url: object, allow_path: bool = False) -> str | None:
    """Why `url` is no replica base URL (http(s)://host[:port]), or None: the one check of `--backend`, the
    admin API's backend set and the connection pool (`http://` passed the admin API, and every request after it
    was a 500 while the health checks had stopped for good). A path is refused unless `allow_path`: requests go
    with their own path, so only the health probe used it (an OpenAI base URL's /v1 probed /v1/health, the
    replica never became healthy, and every request waited out the buffer)."""
    if not isinstance(url, str):
        return f"expected a string, got {type(url).__name__}"
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError: not a number, or out of 0..65535
    except ValueError as exc:
        return f"{url!r}: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r}: expected http://host:port or https://host:port"
    if port == 0:
        return f"{url!r}: port 0 is no port to connect to"
    if not allow_path and parts.path not in ("", "/"):
        return (f"{url!r}: expected http://host:port without a path (requests keep their own, /v1/...); got the "
                f"path {parts.path!r}")
    return None


class _Origin:
    """Where one base URL points, and its idle connections."""

    __slots__ = ("host", "port", "ssl", "host_header", "idle", "busy")

    def __init__(self, base_url: str):
        problem = backend_url_problem(base_url)
        if problem:
            raise ValueError(f"backend URL {problem}")
        parts = urlsplit(base_url)
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = parts.scheme == "https"
        self.host_header = parts.netloc.encode("latin-1")
        self.idle: collections.deque[_Connection] = collections.deque()
        self.busy: set[_Connection] = set()  # connections with a request under way


class UpstreamResponse:
    """Status and headers of an answer, and its body as it arrives (`read`, b"" at the end).

    Until the body's first byte the replica may stay silent `timeout` seconds (a non-streamed answer is silent
    for its whole generation); after it, `between` seconds between two arrivals (a stream's chunks come every
    decode step: a silence that long is a hung replica, or one so overloaded that the stream is better ended
    with an error than held)."""

    __slots__ = ("status", "headers", "content_length", "_conn", "_chunks", "_buffered", "_complete", "_error",
                 "_waiter", "_timeout", "_between", "_started", "_loop")

    def __init__(self, conn: _Connection, timeout: float | None, between: float | None = None):
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self._conn = conn
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._complete = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future | None = None
        self._timeout = timeout
        self._between = between if between is not None else timeout
        self._started = False
        self._loop = conn.loop

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    @property
    def chunked(self) -> bool:
        return (self.header(b"transfer-encoding") or b"").lower().endswith(b"chunked")

    @property
    def complete(self) -> bool:
        """The whole body has arrived (it may not all have been read)."""
        return self._complete

    async def read(self) -> bytes:
        """The next body bytes; b"" once the body is complete. Raises Timeout or Broken."""
        while True:
            if self._chunks:
                data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._drain())
                self._buffered -= len(data)
                if self._buffered < RESUME_BELOW and not self._complete:
                    self._conn.resume()
                return data
            if self._complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()

    async def body(self) -> bytes:
        parts = []
        while data := await self.read():
            parts.append(data)
        return b"".join(parts)

    def close(self) -> None:
        """Done with this answer: an unfinished one closes its connection (the replica sees the cut)."""
        if not self._complete:
            self._conn.abort()

    def _drain(self):
        while self._chunks:
            yield self._chunks.popleft()

    async def _wait(self) -> None:
        self._waiter = waiter = self._loop.create_future()
        timeout = self._between if self._started else self._timeout
        timer = self._loop.call_later(timeout, _expire, waiter, timeout, self._started) if timeout else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # called by the connection
    def _data(self, data: bytes) -> None:
        self._started = True
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > PAUSE_ABOVE:
            self._conn.pause()
        self._wake()

    def _done(self) -> None:
        self._complete = True
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if not self._complete:
            self._error = error
            self._wake()


def _expire(waiter: asyncio.Future, seconds: float, started: bool = False) -> None:
    if not waiter.done():
        waiter.set_exception(Timeout(f"silent mid-answer for {seconds:g}s" if started else "no answer in time",
                                     seconds))


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time."""

    def __init__(self, client: Upstream, origin: _Origin):
        self.client = client
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.headers_ready: asyncio.Future | None = None
        self.closed = False
        self.received = False  # any byte of the current answer
        self.sent = False  # a request was written on this connection
        self.body_seen = False  # any body byte of the current answer (what the client may have been sent)
        self.abandoned: str | None = None  # why `Upstream.abandon` cut it
        self.idle_since = 0.0
        self.proving = False  # its identity challenge is under way: kept for the request it was opened for
        self._paused = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._lost(Broken(f"malformed answer: {exc}"))
            self.abort()

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        self.closed = True
        response = self.response
        if not self.abandoned and exc is None and response is not None and response.status \
                and response.content_length is None \
                and not response.chunked and (self.headers_ready is None or self.headers_ready.done()):
            # an answer with neither a length nor chunking ends when the server closes (HTTP/1.1 allows it; the
            # parser waits for an EOF it cannot be told of): a clean close completes it, a reset does not
            self.response = None
            response._done()
            self._forget()
            return
        with_bytes = self.received
        self._lost(Stalled(self.abandoned) if self.abandoned else
                   Broken("connection closed mid-answer") if with_bytes else
                   Dropped("connection closed without an answer") if self.sent else Unreachable("connection closed"))
        self._forget()

    def _forget(self) -> None:
        self.origin.busy.discard(self)
        try:
            self.origin.idle.remove(self)
        except ValueError:
            pass

    def _lost(self, error: UpstreamError) -> None:
        if self.headers_ready is not None and not self.headers_ready.done():
            self.headers_ready.set_exception(error)
        if self.response is not None:
            self.response._fail(error)

    # httptools
    def on_header(self, name: bytes, value: bytes) -> None:
        self.response.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        response = self.response
        response.status = self.parser.get_status_code()
        length = response.header(b"content-length")
        if length is not None:
            try:
                response.content_length = int(length)
            except ValueError:
                response.content_length = None
        if self.headers_ready is not None and not self.headers_ready.done():
            self.headers_ready.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.body_seen = True
        self.response._data(body)

    def on_message_complete(self) -> None:
        response, keep = self.response, self.parser.should_keep_alive()
        self.response = None
        self.origin.busy.discard(self)
        response._done()
        if keep and not self.closed:
            if not self.proving:
                self.client._release(self)
        else:
            self.abort()

    # flow control of the body toward a slow reader
    def pause(self) -> None:
        if not self._paused and not self.closed:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.abort()


class Upstream:
    """A connection pool per replica URL; `request` returns once the answer's headers arrived."""

    def __init__(self, *, connect_timeout: float = 3.0, read_timeout: float = 300.0,
                 stream_idle_timeout: float | None = None, max_idle: int = 256, idle_expiry_s: float = 30.0,
                 headers: dict[str, str] | None = None):
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        # the silence allowed once an answer's body began: never more than before it
        self.between = read_timeout if stream_idle_timeout is None else min(read_timeout, stream_idle_timeout)
        self.max_idle = max_idle
        self.idle_expiry_s = idle_expiry_s  # under the replicas' own keep-alive (75 s), so they never close first
        self._extra = b"".join(k.lower().encode("latin-1") + b": " + v.encode("latin-1") + b"\r\n"
                               for k, v in (headers or {}).items())
        self._origins: dict[str, _Origin] = {}
        self._ssl: ssl_module.SSLContext | None = None
        # base URL -> (secret, health path) of the process that must answer there, or None (any process): set by
        # the backend pool (BackendPool.expected_identity)
        self.identity: Callable[[str], tuple[str, str] | None] | None = None
        self.proof_timeout = connect_timeout  # the pool makes it at least its probes' timeout

    def origin(self, base_url: str) -> _Origin:
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = _Origin(base_url)
        return origin

    async def request(self, base_url: str, method: str, path: str, headers: list[tuple[bytes, bytes]] = (),
                      body: bytes = b"", read_timeout: float | None = None, credentials: bool = True
                      ) -> UpstreamResponse:
        """Send one request; the answer's status and headers are there when this returns. `credentials`: with the
        headers every request to the backends carries (the internal token), or without (a health probe)."""
        origin = self.origin(base_url)
        head = self._head(origin, method, path, headers, body, credentials)
        timeout = self.read_timeout if read_timeout is None else read_timeout
        between = self.between if read_timeout is None else min(timeout, self.between)
        conn = self._idle(origin)
        if conn is not None:
            try:
                return await self._exchange(conn, head, body, timeout, between)
            except (Unreachable, Dropped):
                pass  # most likely closed as idle just as the request went out: once more, on a fresh connection
        # looked up before connecting: a backend the set dropped meanwhile is still proved as the one it was
        expected = self.identity(base_url) if self.identity is not None else None
        conn = await self._connect(origin)
        if expected is not None:
            await self._prove(conn, *expected)
        return await self._exchange(conn, head, body, timeout, between)

    def forget_idle(self, base_url: str) -> None:
        """Close the idle connections to `base_url` (another start of the replica there: what they reach is not it)."""
        origin = self._origins.get(base_url)
        while origin is not None and origin.idle:
            origin.idle.popleft().abort()

    def abandon(self, base_url: str, why: str) -> int:
        """Cut the requests under way to a replica that have had no body byte yet (its probes took it out: it
        answers nothing, and they waited out the read timeout, 30 minutes by default); each fails `Stalled`, which
        the dispatcher retries elsewhere. Streams already under way are left to run or fail. Returns how many."""
        origin = self._origins.get(base_url)
        if origin is None:
            return 0
        cut = [c for c in origin.busy if not c.body_seen and not c.closed]
        for conn in cut:
            conn.abandoned = why
            conn.abort()
        return len(cut)

    async def get(self, url: str, timeout: float, credentials: bool = True,
                  headers: list[tuple[bytes, bytes]] = ()) -> tuple[int, bytes]:
        """A small control-plane GET (layout, KV events, a replica's metrics): status and whole body."""
        parts = urlsplit(url)
        base = f"{parts.scheme}://{parts.netloc}"
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        response = await self.request(base, "GET", path or "/", headers=headers, read_timeout=timeout,
                                      credentials=credentials)
        try:
            return response.status, await response.body()
        finally:
            response.close()

    async def get_json(self, url: str, timeout: float) -> tuple[int, object]:
        """`get`, with the body parsed as JSON (None if it is not JSON)."""
        import json

        status, raw = await self.get(url, timeout)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, None

    async def aclose(self) -> None:
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.popleft().abort()

    # --- internals -----------------------------------------------------------------------------------------

    def _head(self, origin: _Origin, method: str, path: str, headers, body: bytes, credentials: bool = True) -> bytes:
        parts = [method.encode("latin-1"), b" ", path.encode("latin-1"), b" HTTP/1.1\r\nhost: ", origin.host_header,
                 b"\r\n", self._extra if credentials else b""]
        for k, v in headers:
            parts += (k, b": ", v, b"\r\n")
        if body or method in ("POST", "PUT", "PATCH"):
            parts.append(b"content-length: %d\r\n" % len(body))
        parts.append(b"\r\n")
        return b"".join(parts)

    def _idle(self, origin: _Origin) -> _Connection | None:
        now = asyncio.get_running_loop().time()
        while origin.idle:
            conn = origin.idle.pop()  # the most recently used: the least likely to have been closed
            if not conn.closed and now - conn.idle_since < self.idle_expiry_s:
                return conn
            conn.abort()
        return None

    async def _connect(self, origin: _Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        ssl = None
        if origin.ssl:
            if self._ssl is None:
                self._ssl = ssl_module.create_default_context()
            ssl = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(self, origin), origin.host, origin.port,
                                                       ssl=ssl)
        except TimeoutError:
            raise Unreachable(f"connect to {origin.host}:{origin.port} timed out") from None
        except OSError as exc:
            error = Unreachable(f"connect to {origin.host}:{origin.port}: {exc.strerror or exc}")
            error.refused = isinstance(exc, ConnectionRefusedError)
            raise error from None
        return conn

    async def _exchange(self, conn: _Connection, head: bytes, body: bytes, timeout: float,
                        between: float) -> UpstreamResponse:
        response = UpstreamResponse(conn, timeout, between)
        conn.response = response
        conn.received = conn.body_seen = False
        conn.sent = True
        conn.origin.busy.add(conn)
        conn.headers_ready = ready = conn.loop.create_future()
        conn.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            conn.transport.write(body)
        timer = conn.loop.call_later(timeout, _expire, ready, timeout) if timeout else None
        try:
            await ready
        except BaseException:
            conn.abort()  # a timeout or a cancelled request: the replica must see the connection go
            raise
        finally:
            if timer is not None:
                timer.cancel()
            # A short answer may have completed, and the connection gone back to the pool and on to another
            # request, before this coroutine resumed: clear only what is still ours.
            if conn.headers_ready is ready:
                conn.headers_ready = None
        return response

    async def _prove(self, conn: _Connection, secret: str, path: str) -> None:
        """Send a fresh connection's first request: a challenge to the health path, without credentials; raise
        `Impostor` unless the answer proves `secret`. The connection then carries the request it was opened for."""
        origin = conn.origin
        challenge = new_challenge()
        head = self._head(origin, "GET", path, [(CHALLENGE_HEADER.encode(), challenge.encode())], b"",
                          credentials=False)
        conn.proving = True
        try:
            response = await self._exchange(conn, head, b"", self.proof_timeout, self.proof_timeout)
            raw = await response.body()
        except Timeout as exc:  # late, not wrong: a replica busy with a burst answers its health path late
            conn.abort()
            raise Unproven(f"{origin.host}:{origin.port} did not answer its identity challenge in time: {exc}") \
                from None
        except UpstreamError as exc:  # cut or malformed: whatever is there is out of reach, as a refused connect
            conn.abort()
            raise Unreachable(f"{origin.host}:{origin.port} failed its identity challenge: {exc}") from None
        except BaseException:  # cancelled (the client left): the answer must never land in the pool unchecked
            conn.abort()
            raise
        finally:
            conn.proving = False
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if not answered_by(data, secret, challenge):  # closed after its answer or not, it is not the replica
            conn.abort()
            raise Impostor(f"{origin.host}:{origin.port} is answered by another process than the replica's "
                           "(another program bound its port)")
        if conn.closed:  # the replica, closing the connection after its proof: the request needs another
            raise Unproven(f"{origin.host}:{origin.port} closed the connection after its identity challenge")

    def _release(self, conn: _Connection) -> None:
        origin = conn.origin
        if len(origin.idle) >= self.max_idle:
            conn.abort()
            return
        conn.idle_since = conn.loop.time()
        origin.idle.append(conn)
