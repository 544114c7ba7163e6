"""`fleetserve bench router-stacks`: choose the gateway's HTTP stack by numbers.

The same minimal proxy (read, json-parse, least-loaded pick, pooled keep-alive forward, relay) on each
candidate stack, and the real `fleetserve router` (leastload), each in front of the same two zero-work
backends and measured by the router-overhead harness (wrk pinned to core 0, 1 KB chat body).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

from fleetserve.bench import wrkbench
from fleetserve.bench.router_overhead import SMALL, failure, measure_router
from fleetserve.fleet.process import fleetserve_command, free_port

GATEWAY = "fleetserve router"
# row -> (module under fleetserve.bench.stacks, the package it needs beyond the base install)
STACKS = {
    "starlette_httpx": ("starlette_httpx", "starlette"),
    "uvicorn_asgi_aiohttp": ("uvicorn_aiohttp", "aiohttp"),
    "aiohttp_aiohttp": ("aiohttp_aiohttp", "aiohttp"),
    "granian_asgi_aiohttp": ("granian_aiohttp", "granian"),
}
NAMES = (*STACKS, GATEWAY)
DESCRIPTIONS = {
    "starlette_httpx": "Starlette on uvicorn (uvloop, httptools), httpx streaming client: today's stack",
    "uvicorn_asgi_aiohttp": "raw ASGI app on uvicorn (uvloop, httptools), aiohttp client",
    "aiohttp_aiohttp": "aiohttp server (uvloop), aiohttp client",
    "granian_asgi_aiohttp": "raw ASGI app on granian (1 worker, uvloop, HTTP/1), aiohttp client",
    GATEWAY: "the real gateway as installed now: fleetserve router --strategy leastload",
}


def command(name: str, backends: list[str], port: int) -> list[str] | None:
    """The command that starts row `name` on `port`; None when its package is not installed."""
    if name == GATEWAY:
        cmd = fleetserve_command("router", "--port", str(port), "--strategy", "leastload")
    else:
        module, needs = STACKS[name]
        if importlib.util.find_spec(needs) is None:
            return None
        cmd = [sys.executable, "-m", f"fleetserve.bench.stacks.{module}", "--port", str(port)]
    for url in backends:
        cmd += ["--backend", url]
    return cmd


def run(seconds: float = 5.0, names: tuple[str, ...] = NAMES, progress=None) -> dict:
    wrkbench.find_wrk()
    cores = wrkbench.split_cores()
    rows: dict[str, dict | str] = {}
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-stacks-") as tmp:
        script = wrkbench.lua_script(Path(tmp), "chat", wrkbench.chat_body(SMALL))
        children, backends = wrkbench.zero_backends(tmp, cores)
        try:
            for name in names:
                port = free_port()
                cmd = command(name, backends, port)
                if cmd is None:
                    rows[name] = f"not installed (pip install {STACKS[name][1]})"
                    continue
                if progress:
                    progress(f"{name} ...")
                try:
                    row = measure_router(name.replace(" ", "-"), cmd, {}, backends, script, seconds, cores, tmp,
                                         port)
                except RuntimeError as exc:
                    rows[name] = failure(exc)
                    continue
                rows[name] = {"stack": DESCRIPTIONS[name], **row}
        finally:
            for c in children:
                c.stop(timeout=5)
    return {
        "benchmark": "router-stacks",
        "generator": "wrk -t1, pinned to core 0" if cores.generator else "wrk -t1 (one core: nothing pinned)",
        "cores": {"generator": sorted(cores.generator or []), "routers_and_backends": sorted(cores.servers or [])},
        "backends": "2 x fleetserve.bench.zero_backend (canned answers)",
        "body_bytes": SMALL,
        "seconds": seconds,
        "notes": wrkbench.NOTES,
        "stacks": rows,
    }
