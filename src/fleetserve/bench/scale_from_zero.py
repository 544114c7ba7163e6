"""`fleetserve bench scale-from-zero`: a fleet at zero replicas gets a burst; how long until answers, lost any?

One run, side by side: the same burst once cold (zero replicas: buffered in the router, activation, cold
start) and once warm (the replica is up), so `ratio.first_response_cold_vs_warm` compares like with like.
The fleet runs in a private FLEETSERVE_HOME and is always stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: bench-zero}}
spec:
  model: {{name: bench, source: "{source}"}}
  engine: {{threads: {threads}}}
  replicas: 0
  routing: {{strategy: leastload}}
  router: {{bufferSize: {buffer}, bufferTimeoutSeconds: 600}}
  autoscaling:
    minReplicaCount: 0
    maxReplicaCount: 1
    pollingInterval: 30
    cooldownPeriod: 300
    initialCooldownPeriod: 0
    triggers: [{{metric: concurrency, target: {target}}}]
"""


def _fleetserve(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetserve", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=timeout)


def _burst(url: str, requests: int, max_tokens: int) -> tuple[list[float], list[int], float]:
    body = {"model": "bench", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens}
    start = time.monotonic()

    def one(_):
        try:
            r = httpx.post(url + "/chat/completions", json=body, timeout=900)
            return time.monotonic() - start, r.status_code
        except httpx.HTTPError:
            return time.monotonic() - start, 0

    with ThreadPoolExecutor(requests) as pool:
        results = list(pool.map(one, range(requests)))
    return [t for t, _ in results], [c for _, c in results], start


def run(model: str = "tiny", requests: int = 8, max_tokens: int = 8) -> dict:
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-") as tmp:
        env = {"FLEETSERVE_HOME": tmp}
        if model == "tiny":
            from fleetserve.engine.tiny import create_tiny_model

            source = str(create_tiny_model(Path(tmp) / "tiny"))
        elif model == "demo":
            source = "builtin:smollm2-135m"
            demo = Path.home() / ".cache" / "fleetserve" / "models" / "smollm2-135m"
            if demo.is_dir():  # reuse an earlier import (not part of the cold start being measured)
                (Path(tmp) / "models").mkdir()
                (Path(tmp) / "models" / "smollm2-135m").symlink_to(demo)
        else:
            source = model
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(SPEC.format(source=source, threads=os.cpu_count() or 1, buffer=max(requests, 1),
                                    target=max(requests, 1)))
        up = _fleetserve(["up", str(spec), "--detach"], env, 900)
        if up.returncode != 0:
            raise RuntimeError(f"fleet did not start: {up.stderr.strip()}")
        try:
            status = json.loads(_fleetserve(["status", "--json"], env, 60).stdout)[0]
            url = status["url"]
            cold_times, cold_codes, _ = _burst(url, requests, max_tokens)
            status = json.loads(_fleetserve(["status", "--json"], env, 60).stdout)[0]
            cold_start = min((r["cold_start_s"] for r in status["replicas"] if r["cold_start_s"] is not None),
                             default=None)
            warm_times, warm_codes, _ = _burst(url, requests, max_tokens)
        finally:
            _fleetserve(["down"], env, 120)
    lost = sum(1 for c in cold_codes + warm_codes if c != 200)
    first_cold, first_warm = min(cold_times), min(warm_times)
    return {
        "benchmark": "scale-from-zero",
        "model": model,
        "requests": requests,
        "lost": lost,
        "cold_start_s": round(cold_start, 3) if cold_start is not None else None,
        "first_response_s": round(first_cold, 3),
        "last_response_s": round(max(cold_times), 3),
        "warm": {"first_response_s": round(first_warm, 3), "last_response_s": round(max(warm_times), 3)},
        "status_codes": sorted(set(cold_codes + warm_codes)),
        "ratio": {"first_response_cold_vs_warm": round(first_cold / first_warm, 2) if first_warm else None},
    }
