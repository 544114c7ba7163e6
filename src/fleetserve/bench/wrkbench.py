"""The harness shared by `bench router-overhead` and `bench router-stacks`: wrk, core pinning, router CPU time.

Why wrk: a Python load generator saturates before a fast router does, so its numbers measure itself. wrk runs
pinned to core 0; routers and the zero backends run on the other cores, so neither steals the other's CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from fleetserve.bench.routing import _wait_ready
from fleetserve.fleet.process import Child, free_port

INSTALL_HINT = "wrk is not installed: apt-get install wrk (or run scripts/setup.sh as root)"
CHAT_PATH = "/v1/chat/completions"
# zero-work backends answer in microseconds: a request still open after this is stuck, and wrk counts it as an
# error (once per 2 s check); without it a stalled connection only lowers rps and hides from the percentiles
TIMEOUT_S = 2
# a done() hook: wrk's own summary and latency histogram as one JSON line (microseconds)
DONE_HOOK = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('\\nWRKJSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,'
    .. '"mean_us":%d,"errors":%d,"status_errors":%d}\\n', summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), latency.mean, e.connect + e.read + e.write + e.timeout, e.status))
end
"""


NOTES = {
    "rps, p50_ms, p99_ms, mean_ms": "32 connections, wrk -t1, after a 1 s warm-up",
    "added_p50_ms": "p50 of a wrk -c1 run through the router minus the same run straight to a backend",
    "router_cpu_us_per_request": "router user+system CPU (with its child processes) over the 32-connection run, "
                                 "per completed request",
    "busy_connections": "rps x mean latency (an estimate; wrk's mean runs a little high, so a healthy row reads "
                        "about 32 or more): far below 32 means connections stalled, and the percentiles then "
                        "cover only the requests that were answered",
}


class WrkMissing(RuntimeError):
    """wrk is not on PATH."""


def find_wrk() -> str:
    path = shutil.which("wrk")
    if not path:
        raise WrkMissing(INSTALL_HINT)
    return path


def chat_body(size: int) -> bytes:
    """A chat request whose JSON is about `size` bytes (one user message of filler words)."""
    base = {"model": "zero", "messages": [{"role": "user", "content": ""}], "max_tokens": 1}
    filler = max(0, size - len(json.dumps(base)))
    words = ("lorem ipsum dolor sit amet " * (filler // 27 + 1))[:filler]
    base["messages"][0]["content"] = words
    return json.dumps(base).encode()


def lua_script(folder: Path, name: str, body: bytes) -> Path:
    """A wrk script that POSTs `body` as JSON and prints the summary as JSON."""
    path = folder / f"{name}.lua"
    text = body.decode()
    if "]==]" in text:
        raise ValueError("the body must not contain ]==] (it is a Lua long string)")
    path.write_text(f'wrk.method = "POST"\nwrk.body = [==[{text}]==]\n'
                    f'wrk.headers["Content-Type"] = "application/json"\n{DONE_HOOK}')
    return path


@dataclass(frozen=True)
class Cores:
    generator: set[int] | None  # None: one core, nothing is pinned
    servers: set[int] | None


def split_cores() -> Cores:
    """wrk on the first core this process may use, everything else on the rest (needs >= 2 cores)."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return Cores(None, None)
    return Cores({allowed[0]}, set(allowed[1:]))


def pinned(cmd: list[str], cores: set[int] | None) -> list[str]:
    """`cmd` under taskset (it execs, so the child's pid is the server's own)."""
    if not cores or not shutil.which("taskset"):
        return cmd
    return ["taskset", "-c", ",".join(map(str, sorted(cores))), *cmd]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live descendants (multi-worker routers)."""
    total = 0.0
    proc = psutil.Process(pid)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def run_wrk(url: str, script: Path, connections: int, seconds: float, cores: Cores) -> dict:
    """One wrk run; requests/s, p50/p99 (ms), completed requests and errors."""
    cmd = pinned([find_wrk(), "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", f"{TIMEOUT_S}s",
                  "-s", str(script), url], cores.generator)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    s = json.loads(line[len("WRKJSON "):])
    return {"rps": s["requests"] / (s["duration_us"] / 1e6), "p50_ms": s["p50_us"] / 1000,
            "p99_ms": s["p99_us"] / 1000,
            "mean_ms": s["mean_us"] / 1000, "requests": s["requests"], "errors": s["errors"] + s["status_errors"]}


def measure(via: str, direct: str, script: Path, pid: int, seconds: float, cores: Cores,
            connections: int = 32) -> dict:
    """The row of one router: warm-up, `connections` throughput with its CPU time, then -c1 direct vs via."""
    run_wrk(via, script, connections, 1, cores)  # warm-up: pools, JIT-less caches, accept queues
    before = cpu_seconds(pid)
    load = run_wrk(via, script, connections, seconds, cores)
    used = cpu_seconds(pid) - before
    one_direct = run_wrk(direct, script, 1, seconds, cores)
    one_via = run_wrk(via, script, 1, seconds, cores)
    return {
        "rps": round(load["rps"], 1),
        "p50_ms": round(load["p50_ms"], 3),
        "p99_ms": round(load["p99_ms"], 3),
        "mean_ms": round(load["mean_ms"], 3),
        # Little's law: connections actually busy; well below `connections` means some stalled
        "busy_connections": round(load["rps"] * load["mean_ms"] / 1000, 1),
        "added_p50_ms": round(one_via["p50_ms"] - one_direct["p50_ms"], 3),
        "router_cpu_us_per_request": round(used * 1e6 / load["requests"], 1) if load["requests"] else None,
        "requests": load["requests"],
        "errors": load["errors"] + one_via["errors"],
        "connections": connections,
    }


def start(name: str, cmd: list[str], port: int, tmp: str, cores: Cores, ready_path: str = "/health",
          env: dict[str, str] | None = None) -> tuple[Child, str]:
    """A pinned child server, waited for; its base URL."""
    child = Child(name, pinned(cmd, cores.servers), Path(tmp) / f"{name}.log", env=env)
    child.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, child, path=ready_path)
    except RuntimeError:
        child.stop(timeout=5)
        raise
    return child, url


def zero_backends(tmp: str, cores: Cores, n: int = 2) -> tuple[list[Child], list[str]]:
    """`n` zero-work backends (`python -m fleetserve.bench.zero_backend`) on the server cores."""
    import sys

    children, urls = [], []
    try:
        for i in range(n):
            port = free_port()
            child, url = start(f"zero{i}", [sys.executable, "-m", "fleetserve.bench.zero_backend", "--port",
                                            str(port)], port, tmp, cores)
            children.append(child)
            urls.append(url)
    except BaseException:
        for c in children:
            c.stop(timeout=5)
        raise
    return children, urls


def settle(seconds: float = 0.5) -> None:
    """A pause between runs, so one router's shutdown does not overlap the next one's warm-up."""
    time.sleep(seconds)
