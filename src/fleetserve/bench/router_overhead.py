"""`fleetserve bench router-overhead`: what our router adds over calling a zero-delay backend directly.

Side by side in one run: the same sequential requests straight to the backend and through the router
(added latency p50/p99), then requests/s through the router at a fixed concurrency.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from fleetserve.bench.routing import _wait_ready
from fleetserve.fleet.process import Child, fleetserve_command, free_port

BODY = {"model": "zero", "prompt": "hello", "max_tokens": 1}


async def _latencies(url: str, n: int, body: dict = BODY) -> list[float]:
    out = []
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        for _ in range(10):  # warm the connections
            await client.post(url + "/v1/completions", json=body)
        for _ in range(n):
            start = time.perf_counter()
            r = await client.post(url + "/v1/completions", json=body)
            out.append((time.perf_counter() - start) * 1000)
            r.raise_for_status()
    return out


async def _throughput(url: str, concurrency: int, seconds: float, body: dict = BODY) -> tuple[float, int]:
    done = errors = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(trust_env=False, timeout=30, limits=limits) as client:
        async def worker():
            nonlocal done, errors
            while time.perf_counter() < deadline:
                r = await client.post(url + "/v1/completions", json=body)
                done += 1
                errors += r.status_code != 200
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - start), errors


def run(requests: int = 500, concurrency: int = 32, seconds: float = 5.0, sglang_python: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-overhead-") as tmp:
        children = []
        try:
            port = free_port()
            backend = Child("zero", fleetserve_command("engine", "--simulate", "fast", "--speedup", "1000000",
                                                       "--port", str(port), "--served-model-name", "zero"),
                            Path(tmp) / "zero.log")
            backend.start()
            children.append(backend)
            direct = f"http://127.0.0.1:{port}"
            _wait_ready(direct, backend)
            rport = free_port()
            router = Child("router", fleetserve_command("router", "--backend", direct, "--port", str(rport),
                                                        "--strategy", "leastload"), Path(tmp) / "router.log")
            router.start()
            children.append(router)
            via = f"http://127.0.0.1:{rport}"
            _wait_ready(via, router)
            direct_ms = asyncio.run(_latencies(direct, requests))
            via_ms = asyncio.run(_latencies(via, requests))
            direct_rps, _ = asyncio.run(_throughput(direct, concurrency, seconds))
            rps, errors = asyncio.run(_throughput(via, concurrency, seconds))
            sglang = None
            if sglang_python:
                from fleetserve.bench.routing import _router_child

                sport = free_port()
                sgl = _router_child("sglang_cache_aware", [direct], sport, tmp, sglang_python)
                sgl.cmd[sgl.cmd.index("cache_aware")] = "round_robin"
                sgl.start()
                children.append(sgl)
                sgl_url = f"http://127.0.0.1:{sport}"
                _wait_ready(sgl_url, sgl)
                body_text = {**BODY}
                sgl_ms = asyncio.run(_latencies(sgl_url, requests, body_text))
                sgl_rps, sgl_errors = asyncio.run(_throughput(sgl_url, concurrency, seconds, body_text))
                s50, s99 = np.percentile(sgl_ms, [50, 99])
                sglang = {"added_ms": {"p50": round(float(s50 - np.percentile(direct_ms, 50)), 3),
                                       "p99": round(float(s99 - np.percentile(direct_ms, 99)), 3)},
                          "throughput_rps": round(sgl_rps, 1), "errors": sgl_errors, "policy": "round_robin"}
        finally:
            for c in children:
                c.stop(timeout=5)
    d50, d99 = np.percentile(direct_ms, [50, 99])
    v50, v99 = np.percentile(via_ms, [50, 99])
    result = {
        "benchmark": "router-overhead",
        "requests": requests,
        "direct_ms": {"p50": round(float(d50), 3), "p99": round(float(d99), 3)},
        "via_router_ms": {"p50": round(float(v50), 3), "p99": round(float(v99), 3)},
        "added_ms": {"p50": round(float(v50 - d50), 3), "p99": round(float(v99 - d99), 3)},
        "throughput_rps": {"router": round(rps, 1), "direct": round(direct_rps, 1), "errors": errors,
                           "concurrency": concurrency},
        "ratio": {"router_vs_direct_throughput": round(rps / direct_rps, 3) if direct_rps else None},
        "sglang_router": sglang or "not measured in this run (sglang-router is not installed)",
        "note": "the load generator is Python on the same cores: throughput figures are bounded by it",
    }
    if sglang:
        result["ratio"]["router_vs_sglang_throughput"] = round(rps / sglang["throughput_rps"], 3)
    return result
