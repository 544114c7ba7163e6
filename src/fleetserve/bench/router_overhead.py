"""`fleetserve bench router-overhead`: what each router costs, measured with wrk against zero-work backends.

Per configuration (a router, a strategy, a body size), in one run: requests/s and p50/p99 at 32 connections,
the p50 it adds at one connection (the same wrk -c1 run straight to a backend and through the router), and
the router's CPU time per request. sglang-router and vllm-router are measured beside ours when importable.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fleetserve.bench import wrkbench
from fleetserve.bench.routing import SGLANG, _router_child, find_sglang_python
from fleetserve.fleet.process import fleetserve_command, free_port

SMALL, LARGE = 1024, 8192


@dataclass(frozen=True)
class Config:
    name: str
    kind: str  # fleetserve, sglang or vllm
    policy: str
    body_bytes: int
    workers: int = 1


CONFIGS = (
    Config("leastload", "fleetserve", "leastload", SMALL),
    Config("kvaware", "fleetserve", "kvaware", LARGE),
    Config("prefixaware", "fleetserve", "prefixaware", LARGE),
    Config("leastload_workers2", "fleetserve", "leastload", SMALL, workers=2),
    Config("sglang_round_robin", "sglang", "round_robin", SMALL),
    Config("sglang_cache_aware", "sglang", "cache_aware", LARGE),
    Config("vllm_round_robin", "vllm", "round_robin", SMALL),
    Config("vllm_cache_aware", "vllm", "cache_aware", LARGE),
)
# ours -> the sglang-router configuration doing comparable work on the same body
PEERS = {"leastload": "sglang_round_robin", "leastload_workers2": "sglang_round_robin",
         "kvaware": "sglang_cache_aware", "prefixaware": "sglang_cache_aware"}
NAMES = tuple(c.name for c in CONFIGS)


def router_supports_workers() -> bool:
    """The gateway grows a --workers option; until it has one, that configuration is skipped."""
    out = subprocess.run(fleetserve_command("router", "--help"), capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "300", "NO_COLOR": "1", "TERM": "dumb"})
    return "--workers" in out.stdout


def find_vllm_router_python(explicit: str | None = None) -> str | None:
    """A Python that can run vllm_router (FLEETSERVE_VLLM_ROUTER_PYTHON, or this one if it has it), as
    `find_sglang_python`: a peer installed in a venv of its own was not measured."""
    candidate = explicit or os.environ.get("FLEETSERVE_VLLM_ROUTER_PYTHON")
    if candidate:
        return candidate
    return sys.executable if importlib.util.find_spec("vllm_router") else None


def router_command(config: Config, backends: list[str], port: int, tmp: str, pythons: dict) -> tuple[list, dict]:
    """The command line (and extra environment) that starts `config`'s router on `port`."""
    if config.kind == "fleetserve":
        cmd = fleetserve_command("router", "--port", str(port), "--strategy", config.policy)
        if config.workers > 1:
            cmd += ["--workers", str(config.workers)]
        for url in backends:
            cmd += ["--backend", url]
        return cmd, {}
    if config.kind == "sglang":
        child = _router_child(SGLANG, backends, port, tmp, pythons["sglang"])
        cmd = list(child.cmd)
        cmd[cmd.index("cache_aware")] = config.policy
        return cmd, dict(child.env or {})
    cmd = [pythons["vllm"], "-m", "vllm_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--policy", config.policy, "--worker-urls", *backends]
    return cmd, {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "*"}


def unavailable(config: Config, pythons: dict, workers_ok: bool) -> str | None:
    if config.kind == "sglang" and not pythons["sglang"]:
        return "sglang-router is not installed: pip install sglang-router==0.3.2 (or --sglang-python)"
    if config.kind == "vllm" and not pythons["vllm"]:
        return "vllm-router is not installed: pip install vllm-router==0.1.17 (or --vllm-python)"
    if config.workers > 1 and not workers_ok:
        return "`fleetserve router` has no --workers option yet"
    return None


def failure(exc: Exception) -> str:
    """The last line of a start or wrk failure (a traceback's last line names the error)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return "failed: " + (lines[-1] if lines else type(exc).__name__)


def measure_router(name: str, cmd: list[str], env: dict, backends: list[str], script, seconds: float,
                   cores: wrkbench.Cores, tmp: str, port: int) -> dict:
    """Start one router in front of `backends`, measure it with wrk, stop it."""
    child, url = wrkbench.start(name, cmd, port, tmp, cores, env=env)
    try:
        return wrkbench.measure(url + wrkbench.CHAT_PATH, backends[0] + wrkbench.CHAT_PATH, script, child.pid,
                                seconds, cores)
    finally:
        child.stop(timeout=5)
        wrkbench.settle()


def run(seconds: float = 5.0, configs: tuple[str, ...] = NAMES, sglang_python: str | None = None,
        progress=None, vllm_python: str | None = None) -> dict:
    wrkbench.find_wrk()
    cores = wrkbench.split_cores()
    pythons = {"sglang": find_sglang_python(sglang_python), "vllm": find_vllm_router_python(vllm_python)}
    workers_ok = any(c.workers > 1 for c in CONFIGS if c.name in configs) and router_supports_workers()
    rows, skipped = {}, {}
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-overhead-") as tmp:
        scripts = {size: wrkbench.lua_script(Path(tmp), f"chat{size}", wrkbench.chat_body(size))
                   for size in (SMALL, LARGE)}
        children, backends = wrkbench.zero_backends(tmp, cores)
        try:
            for config in (c for c in CONFIGS if c.name in configs):
                reason = unavailable(config, pythons, workers_ok)
                if reason:
                    skipped[config.name] = reason
                    continue
                if progress:
                    progress(f"{config.name} ...")
                port = free_port()
                cmd, env = router_command(config, backends, port, tmp, pythons)
                try:
                    row = measure_router(config.name, cmd, env, backends, scripts[config.body_bytes], seconds,
                                         cores, tmp, port)
                except RuntimeError as exc:  # a router that does not start is reported, not fatal
                    skipped[config.name] = failure(exc)
                    continue
                rows[config.name] = {"router": config.kind, "policy": config.policy,
                                     "body_bytes": config.body_bytes, "workers": config.workers, **row}
        finally:
            for c in children:
                c.stop(timeout=5)
    return {
        "benchmark": "router-overhead",
        "generator": "wrk -t1, pinned to core 0" if cores.generator else "wrk -t1 (one core: nothing pinned)",
        "cores": {"generator": sorted(cores.generator or []), "routers_and_backends": sorted(cores.servers or [])},
        "backends": "2 x fleetserve.bench.zero_backend (canned answers)",
        "seconds": seconds,
        "notes": wrkbench.NOTES,
        "configs": rows,
        "ratio": ratios(rows),
        "not_measured": skipped,
    }


def ratios(rows: dict) -> dict:
    out = {}
    for ours, peer in PEERS.items():
        if ours in rows and peer in rows and rows[peer]["rps"]:
            value = round(rows[ours]["rps"] / rows[peer]["rps"], 3)
            rows[ours]["rps_vs_sglang"] = value
            out["rps_vs_sglang" if ours == "leastload" else f"{ours}_rps_vs_{peer}"] = value
    return out
