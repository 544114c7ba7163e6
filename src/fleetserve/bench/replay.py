"""Trace replay: send a trace's requests at their (time-scaled) arrival times and measure what comes back.

Streaming mode measures TTFT, ITL and TPOT at the client. Non-streaming mode (cheaper for large replays)
takes TTFT from the engine's `fleetserve_timing.ttft_ms` when the engine reports it (the simulated engine
does) and measures E2E at the client. Every request ends in a record: answered, or failed with its error.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import httpx
import numpy as np

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
    streamed: bool = False  # the first byte reached the client


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
            usage = data.get("usage") or {}
            rec.prompt_tokens = usage.get("prompt_tokens", 0)
            rec.output_tokens = usage.get("completion_tokens", 0)
            rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
            timing = data.get("fleetserve_timing") or {}
            rec.ttft_ms = timing.get("ttft_ms")
            if rec.ttft_ms is not None and rec.output_tokens > 1:
                rec.tpot_ms = (rec.e2e_ms - rec.ttft_ms) / (rec.output_tokens - 1)
            return
        async with client.stream("POST", url + path, json=body, headers=headers) as r:
            rec.status = r.status_code
            rec.replica = r.headers.get("x-fleetserve-replica", "")
            if r.status_code != 200:
                rec.error = (await r.aread()).decode(errors="replace")[:200]
                return
            last = None
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    rec.error = chunk["error"].get("message", "stream error")
                    rec.status = 502
                    return
                now = time.monotonic()
                if chunk.get("choices"):
                    rec.streamed = True
                    if last is None:
                        rec.ttft_ms = (now - start) * 1000
                    else:
                        rec.itl_ms.append((now - last) * 1000)
                    last = now
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    rec.prompt_tokens = usage.get("prompt_tokens", 0)
                    rec.output_tokens = usage.get("completion_tokens", 0)
                    rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
            rec.e2e_ms = (time.monotonic() - start) * 1000
            if rec.itl_ms:
                rec.tpot_ms = sum(rec.itl_ms) / len(rec.itl_ms)
    except httpx.HTTPError as exc:
        rec.status = 0
        rec.error = f"{type(exc).__name__}: {exc}"


async def replay(url: str, requests: list[TraceRequest], *, model: str, speedup: float = 1.0,
                 stream: bool = False, max_output: int | None = None, timeout: float = 600.0,
                 prompt_format: str = "tokens", vocab: int | None = None) -> list[Record]:
    """Replay `requests` against an OpenAI endpoint (base URL without /v1); `vocab` folds token-id prompts
    into a small model's vocabulary."""
    records = [Record(i, r.arrival_s) for i, r in enumerate(requests)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        start = time.monotonic()
        tasks = []
        for i, req in enumerate(requests):
            delay = req.arrival_s / speedup - (time.monotonic() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            path = "/v1/chat/completions" if req.messages is not None else "/v1/completions"
            headers = {"x-session-id": req.session} if req.session else {}
            body = _body(req, i, model, max_output, stream, prompt_format, vocab)
            tasks.append(asyncio.create_task(_one(client, url, path, body, records[i], headers)))
        await asyncio.gather(*tasks)
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
        "lost": len(records) - len(ok),
        "errors": sorted({r.error[:120] for r in records if r.error})[:5],
        "hit_rate": round(sum(r.cached_tokens for r in ok) / prompt, 4) if prompt else 0.0,
        "ttft_ms": percentiles([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        "tpot_ms": percentiles([r.tpot_ms for r in ok if r.tpot_ms is not None]),
        "itl_ms": percentiles([x for r in ok for x in r.itl_ms]),
        "e2e_ms": percentiles([r.e2e_ms for r in ok if r.e2e_ms is not None]),
        "per_replica": per_replica,
    }


def records_json(records: list[Record]) -> list[dict]:
    return [asdict(r) for r in records]
