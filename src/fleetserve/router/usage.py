"""Streams that report their usage, for a router that learns from it, and clients that never see the difference.

A blind cache-aware policy learns each engine's cache from `usage.prompt_tokens_details.cached_tokens`
(router/feedback.py). vLLM, SGLang and the built-in engine put `usage` in a stream only when the request asks,
with `stream_options: {"include_usage": true}`; most streaming clients do not ask, so the router learned nothing
from streamed traffic, which is most of a chat service's. So the router asks on the client's behalf
(`asking_usage`), and when the client had not asked it drops the usage-only event (`choices: []`) from the
stream it relays (`UsageStripper`): a client that reads `chunk.choices[0]` of every chunk, as many do, would
fail on it. The event still reaches the policy through the relay's tail.
"""

from __future__ import annotations

import re

import orjson

from fleetserve.api.protocol import GENERATION_PATHS
from fleetserve.router.rewrite import encoded, reencodable, spliced

_ASK = b'"stream_options":{"include_usage":true}'
# an event ends at a blank line: two line ends in a row, each CRLF, LF or CR (SSE allows all three, mixed); a CR
# followed by LF is one line end, never two
_LINE_END = rb"(?:\r\n|\n|\r(?!\n))"
EVENT_END = re.compile(_LINE_END + _LINE_END)
WHOLE_EVENTS = (b"\n\n", b"\r\n\r\n", b"\r\r")  # a read that ends so holds whole events only
MAX_HELD = 1 << 20  # the most of one unfinished event held back (a usage chunk is a few hundred bytes)


def asking_usage(path: str, body: dict, raw: bytes) -> bytes | None:
    """`raw` (the body to send) with usage asked for, or None to send it unchanged: not a stream of a completions
    path, the client already asked, or a `stream_options` or `include_usage` the engine refuses (naming it): not an
    object (null is none), not a boolean.

    The field is spliced in, or the body re-encoded, exactly (router/rewrite.py); a body that re-encoding would
    change is left as it is."""
    if path not in GENERATION_PATHS or body.get("stream") is not True:
        return None
    if "stream_options" not in body:
        return spliced(raw, _ASK)
    options = body["stream_options"]
    if options is not None and not isinstance(options, dict):
        return None
    asked = (options or {}).get("include_usage")
    if asked is True or asked not in (None, False):  # asked already, or a value the engine refuses, naming it
        return None
    out = reencodable(raw)
    if out is None:
        return None
    out["stream_options"] = {**(out["stream_options"] or {}), "include_usage": True}
    return encoded(out)


def _maybe_usage_only(data: bytes) -> bool:
    """Cheap: could `data` hold the usage-only chunk? (SGLang writes `"usage":null` into every chunk, so the usage
    key alone says nothing; engines write `"choices":[]` with or without a space.)"""
    return b'"usage"' in data and (b'"choices":[]' in data or b'"choices": []' in data)


def _usage_only(event: bytes) -> bool:
    """An SSE event whose data is a chunk with no choices and a usage object: the one asked for."""
    if not _maybe_usage_only(event):
        return False
    data = b"".join(line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:"))
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(chunk, dict) and chunk.get("choices") == [] and isinstance(chunk.get("usage"), dict)


class UsageStripper:
    """Relays an SSE stream event by event less the usage-only event: whole events pass as they arrive, a partial
    one waits for its end (engines write whole events, so nothing waits in practice)."""

    def __init__(self) -> None:
        self._carry = b""

    def feed(self, data: bytes) -> bytes:
        if not self._carry and data.endswith(WHOLE_EVENTS) and not _maybe_usage_only(data):
            return data  # whole events and none the one asked for: the usual read, at the cost of two scans
        buf = self._carry + data if self._carry else data
        ends = [m.end() for m in EVENT_END.finditer(buf)]
        if not ends:
            if len(buf) > MAX_HELD:  # no event ends in sight: not the framing it looked for, so relayed as it
                self._carry = b""  # came rather than held in memory to the end of the stream
                return buf
            self._carry = buf
            return b""
        complete, self._carry = buf[:ends[-1]], buf[ends[-1]:]
        if not _maybe_usage_only(complete):
            return complete
        out, start = [], 0
        for end in ends:
            event = complete[start:end]
            if not _usage_only(event):
                out.append(event)
            start = end
        return b"".join(out)

    def flush(self) -> bytes:
        """What is left of an unterminated last event (a stream cut short): relayed as it came."""
        rest, self._carry = self._carry, b""
        return rest
