"""A zero-work OpenAI-ish backend for router benchmarks: raw asyncio Protocol + httptools + uvloop.

Why not the simulated engine: a router bench must measure the router, so its backends answer from canned
bytes with no framework in between (HTTP/1.1 keep-alive; completions, chat, SSE streams, health, model info).
Run as a child: `python -m fleetserve.bench.zero_backend --port P`.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import httptools

USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
         "prompt_tokens_details": {"cached_tokens": 0}}
MODEL_INFO = {"block_size": 16, "kv_model": "zero", "kv_version": "1", "kv_dtype": "", "num_gpu_blocks": 1000}


def _dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _response(status: str, body: bytes, content_type: str = "application/json", keep_alive: bool = True) -> bytes:
    head = (f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            f"connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
    return head.encode() + body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else _dumps(obj)) + b"\n\n"


CHAT = _dumps({"id": "chatcmpl-zero", "object": "chat.completion", "created": 0, "model": "zero",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
               "usage": USAGE})
TEXT = _dumps({"id": "cmpl-zero", "object": "text_completion", "created": 0, "model": "zero",
               "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}], "usage": USAGE})


def _stream(chat: bool) -> bytes:
    kind = "chat.completion.chunk" if chat else "text_completion"
    first = {"delta": {"role": "assistant", "content": "ok"}} if chat else {"text": "ok"}
    last = {"delta": {}} if chat else {"text": ""}
    events = [
        {"id": "zero", "object": kind, "created": 0, "model": "zero",
         "choices": [{"index": 0, **first, "finish_reason": None}]},
        {"id": "zero", "object": kind, "created": 0, "model": "zero",
         "choices": [{"index": 0, **last, "finish_reason": "stop"}], "usage": USAGE},
    ]
    return b"".join(_chunk(_sse(e)) for e in events) + _chunk(_sse(b"[DONE]")) + b"0\r\n\r\n"


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
               b"transfer-encoding: chunked\r\n")
STREAMS = {True: _stream(True), False: _stream(False)}
GETS = {
    "/health": _dumps({"status": "ok"}),
    "/ping": _dumps({"status": "ok"}),
    "/v1/models": _dumps({"object": "list", "data": [{"id": "zero", "object": "model", "owned_by": "fleetserve"}]}),
    "/get_model_info": _dumps(MODEL_INFO),
}
POSTS = {"/v1/chat/completions": (True, CHAT), "/v1/completions": (False, TEXT)}
NOT_FOUND = _dumps({"error": {"message": "not found", "type": "not_found"}})


def _wants_stream(body: bytes) -> bool:
    if b'"stream"' not in body:  # the common case skips the JSON parse
        return False
    try:
        return json.loads(body).get("stream") is True
    except (ValueError, AttributeError):
        return False


class ZeroProtocol(asyncio.Protocol):
    """One connection: parse with httptools, answer each request at once from canned bytes."""

    def __init__(self):
        self.parser = httptools.HttpRequestParser(self)
        self.transport = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data: bytes):
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(_response("400 Bad Request", b"{}", keep_alive=False))
            self.transport.close()

    def on_message_begin(self):
        self.url = b""
        self.body = []

    def on_url(self, url: bytes):
        self.url += url

    def on_body(self, body: bytes):
        self.body.append(body)

    def on_message_complete(self):
        path = httptools.parse_url(self.url).path.decode()
        method = self.parser.get_method()
        keep = self.parser.should_keep_alive()
        if method == b"POST" and path in POSTS:
            chat, canned = POSTS[path]
            if _wants_stream(b"".join(self.body)):
                conn = b"connection: keep-alive\r\n\r\n" if keep else b"connection: close\r\n\r\n"
                self.transport.write(STREAM_HEAD + conn + STREAMS[chat])
            else:
                self.transport.write(_response("200 OK", canned, keep_alive=keep))
        elif method == b"GET" and path in GETS:
            self.transport.write(_response("200 OK", GETS[path], keep_alive=keep))
        else:
            self.transport.write(_response("404 Not Found", NOT_FOUND, keep_alive=keep))
        if not keep:
            self.transport.close()


async def serve(port: int, host: str = "127.0.0.1") -> None:
    server = await asyncio.get_running_loop().create_server(ZeroProtocol, host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(serve(args.port, args.host))


if __name__ == "__main__":
    main()
