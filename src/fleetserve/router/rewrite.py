"""How the router changes a request body it forwards (a tenant's cache_salt, a stream's include_usage): exactly.

A field the body lacks is spliced into its bytes, so everything else goes out as the client wrote it (the parsed
body may have lost what orjson cannot hold). A body that must change inside is re-encoded only when that gives
back every value: integers of any size, text as UTF-8 (escaping it took up to 6 bytes a character, and a body
under the size limit grew past it), and no number literal past a float's range (1e400), which the stdlib would
write back as Infinity.
"""

from __future__ import annotations

import json
import math


def spliced(raw: bytes, member: bytes) -> bytes:
    """`raw`, a JSON object's text, with `member` (`"key":value`) added as its last member."""
    inner = raw.rstrip()[:-1].rstrip()  # a JSON object's text ends with its closing brace
    return inner + (b"" if inner.endswith(b"{") else b",") + member + b"}"


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def reencodable(raw: bytes) -> dict | None:
    """`raw` parsed for `encoded`, or None when re-encoding it would change a value: a number literal past a
    float's range (the client's own NaN and Infinity literals, which Python's JSON reads, are written back)."""
    try:
        return json.loads(raw, parse_float=_finite)
    except ValueError:
        return None


def encoded(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
