"""Trace loaders. Formats:

- Mooncake JSONL: {"timestamp": ms, "input_length", "output_length", "hash_ids": [...]} (512 tokens per id);
- Azure CSV: TIMESTAMP,ContextTokens,GeneratedTokens (wall-clock timestamps; no prefixes);
- prompt logs (ours): JSONL {"timestamp": s, "messages": [...] | "prompt": "...", "max_tokens", "session"};
- ServeGen rate files (arrivals only): a per-client chunk CSV, the aggregate CSV, a folder or the .tar.gz
  (see `servegen.py`; options `model`, `seed`, `start_s`, `duration_s`, `input_tokens`, `output_tokens`).
"""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path

from fleetserve.traces.model import TraceRequest
from fleetserve.traces.servegen import ServeGenError, is_servegen, load_servegen

FORMATS = ("mooncake", "azure", "prompts", "servegen")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the line."""


def detect_format(path: Path) -> str:
    if is_servegen(path):
        return "servegen"
    if path.suffix == ".csv":
        return "azure"
    with open(path) as f:
        first = json.loads(f.readline() or "{}")
    if "hash_ids" in first or "input_length" in first:
        return "mooncake"
    if "messages" in first or "prompt" in first:
        return "prompts"
    raise TraceError(f"{path}: cannot tell the trace format from its first line")


def load_trace(path: str | Path, limit: int | None = None, fmt: str | None = None, **options) -> list[TraceRequest]:
    """Requests in arrival order. `options` go to the ServeGen loader (the other formats take none)."""
    p = Path(path)
    if not p.is_file() and not (p.is_dir() and fmt in (None, "servegen")):
        raise TraceError(f"trace file {p} does not exist")
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; allowed: {', '.join(FORMATS)}")
    fmt = fmt or detect_format(p)
    if fmt == "servegen":
        try:
            out = load_servegen(p, limit=limit, **options)
        except ServeGenError as exc:
            raise TraceError(str(exc)) from None
    else:
        if options:
            raise TraceError(f"options {', '.join(sorted(options))} apply to ServeGen rate files only")
        out = {"mooncake": _mooncake, "azure": _azure, "prompts": _prompts}[fmt](p, limit)
    if not out:
        raise TraceError(f"{p}: no requests")
    return out


def _lines(p: Path, limit: int | None):
    with open(p) as f:
        for n, line in enumerate(f, 1):
            if limit is not None and n > limit:
                return
            if line.strip():
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{p}:{n}: not JSON ({exc})") from None


def _mooncake(p: Path, limit: int | None) -> list[TraceRequest]:
    out = []
    for n, row in _lines(p, limit):
        try:
            out.append(TraceRequest(row["timestamp"] / 1000.0, int(row["input_length"]), int(row["output_length"]),
                                    tuple(int(h) for h in row.get("hash_ids", ())), session=row.get("session")))
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{p}:{n}: missing or bad field ({exc})") from None
    return out


def _azure(p: Path, limit: int | None) -> list[TraceRequest]:
    out = []
    start = None
    with open(p, newline="") as f:
        for n, row in enumerate(csv.DictReader(f), 2):
            if limit is not None and len(out) >= limit:
                break
            try:
                t = datetime.fromisoformat(row["TIMESTAMP"][:26])
                start = start or t
                out.append(TraceRequest((t - start).total_seconds(), int(row["ContextTokens"]),
                                        int(row["GeneratedTokens"])))
            except (KeyError, ValueError) as exc:
                raise TraceError(f"{p}:{n}: missing or bad field ({exc})") from None
    return out


def _prompts(p: Path, limit: int | None) -> list[TraceRequest]:
    out = []
    for n, row in _lines(p, limit):
        messages = row.get("messages")
        prompt = row.get("prompt")
        if messages is None and prompt is None:
            raise TraceError(f"{p}:{n}: needs messages or prompt")
        text = prompt or "".join(str(m.get("content", "")) for m in messages)
        out.append(TraceRequest(float(row.get("timestamp", 0.0)), max(1, len(text) // 4),
                                int(row.get("max_tokens", 64)), session=row.get("session"),
                                messages=tuple(messages) if messages else None, prompt=prompt))
    return out
