"""Trace writers, the inverse of `load.py`: what `load_trace` reads back is what was written.

- mooncake: {"timestamp": ms, "input_length", "output_length", "hash_ids"} (+ "session" when known; the
  Mooncake files have none, our loader keeps it); a prompt log's text becomes hash ids of 512 stand-in tokens
  (one a word, `model.stand_in_tokens`), equal ids for equal prefixes, and its input length those tokens (it
  was written with none: every prefix was lost, and a simulated hit rate of 0.70 became 0);
- prompts: our prompt log, {"timestamp": s, "messages", "max_tokens"} (+ "session");
- azure: TIMESTAMP,ContextTokens,GeneratedTokens with wall-clock stamps from `start` (lengths only).
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fleetserve.traces.model import MOONCAKE_BLOCK_TOKENS, TraceRequest, stand_in_tokens
from fleetserve.whole_file import write_whole

WRITE_FORMATS = ("mooncake", "prompts", "azure")
STDOUT = "-"  # `-o -`: the trace on standard output, for a pipe (it had written a file named "-")
AZURE_EPOCH = datetime(2023, 11, 16, 18, 0, 0)  # where Azure's own 2023 traces start


def write_trace(requests: list[TraceRequest], path: str | Path, fmt: str, start: datetime | None = None) -> Path:
    """Write `requests` to `path` (STDOUT: standard output); an Azure CSV's stamps count from `start` (naive: UTC;
    default AZURE_EPOCH)."""
    p = Path(path)
    if start is not None and start.tzinfo is not None:
        start = start.astimezone(UTC)  # the stamps are UTC: an aware start elsewhere was written as if it were
    epoch = AZURE_EPOCH if start is None else start.replace(tzinfo=None)
    if fmt not in WRITE_FORMATS:
        raise ValueError(f"unknown output format {fmt!r}; allowed: {', '.join(WRITE_FORMATS)}")
    if fmt == "prompts" and any(r.messages is None and r.prompt is None for r in requests):
        raise ValueError("a prompt log needs prompt text; this trace has lengths or hash ids only "
                         "(write it as mooncake or azure)")
    if str(path) == STDOUT:
        _write(requests, sys.stdout, fmt, epoch)
        sys.stdout.flush()
        return p
    # a file, whole or not at all: a write cut short (Ctrl-C, a full disk) had left a shorter trace that loads as a
    # valid one, over the file it replaced
    write_whole(p, lambda f: _write(requests, f, fmt, epoch), newline="" if fmt == "azure" else None)
    return p


def _write(requests: list[TraceRequest], f, fmt: str, epoch: datetime) -> None:
    if fmt == "azure":
        w = csv.writer(f)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for r in requests:
            stamp = (epoch + timedelta(seconds=r.arrival_s)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
            w.writerow([stamp, r.input_tokens, r.output_tokens])
        return
    ids: dict[tuple, int] = {}  # (parent id, block tokens) -> hash id, over the whole trace
    for r in requests:
        f.write(json.dumps(_mooncake(_text_hashed(r, ids)) if fmt == "mooncake" else _prompt(r)) + "\n")


def _text_hashed(r: TraceRequest, ids: dict[tuple, int]) -> TraceRequest:
    """A text prompt with Mooncake hash ids of its stand-in tokens; other requests as they are."""
    text = None if r.hash_ids else r.text()
    if text is None:
        return r
    tokens = stand_in_tokens(text)
    chain, parent = [], -1
    for start in range(0, len(tokens), MOONCAKE_BLOCK_TOKENS):
        parent = ids.setdefault((parent, tuple(tokens[start:start + MOONCAKE_BLOCK_TOKENS])), len(ids))
        chain.append(parent)
    return replace(r, input_tokens=max(1, len(tokens)), hash_ids=tuple(chain))


def _stamp(value: float, places: int) -> int | float:
    """A time as written: whole when it is, else to `places` decimals. Rounded to whole milliseconds, a trace
    compressed with `trace scale --time 0.0001` had most of its requests at one instant."""
    whole = round(value)
    return whole if abs(value - whole) < 10 ** -(places + 1) else round(value, places)


def _mooncake(r: TraceRequest) -> dict:
    row = {"timestamp": _stamp(r.arrival_s * 1000, 3), "input_length": r.input_tokens,
           "output_length": r.output_tokens, "hash_ids": list(r.hash_ids)}
    if r.session is not None:
        row["session"] = r.session
    return row


def _prompt(r: TraceRequest) -> dict:
    row: dict = {"timestamp": _stamp(r.arrival_s, 6)}
    if r.messages is not None:
        row["messages"] = list(r.messages)
    else:
        row["prompt"] = r.prompt
    row["max_tokens"] = r.output_tokens
    if r.session is not None:
        row["session"] = r.session
    return row
