"""`fleetserve bench scale-from-zero`: a fleet at zero replicas gets a burst; how long until answers, lost any?

One run, side by side: the same burst once cold (zero replicas: buffered in the router, activation, cold
start) and once warm (the replica is up), so `ratio.first_response_cold_vs_warm` compares like with like.
The burst is ten times the router's wait buffer, so the buffer's overflow path (503 + Retry-After) is part
of what is measured: `lost = 0` does not hold by construction. The fleet runs in a private FLEETSERVE_HOME
and is always stopped.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fleetserve.bench.localfleet import LocalFleet
from fleetserve.bench.outcomes import KINDS, Load, Outcome, rounded, tally

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


def _burst(url: str, requests: int, max_tokens: int) -> list[Outcome]:
    """`requests` at once; clients honour Retry-After (as the openai client does), up to 30 tries each."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens}
    load = Load(url + "/chat/completions", lambda _: body, rate_per_s=10_000, max_requests=requests, retries=30,
                timeout_s=900)
    return load.finish()


def _responses(burst: list[Outcome]) -> tuple[float | None, float | None]:
    """The first and the last answer of a burst, both from its first send: the first had been timed from before
    the load generator started and the last from its own request's send, so the first could read later than the
    last, and the cold-vs-warm ratio carried the generator's start. None where nothing was answered (a fleet that
    never started had read "first response 0.0 s")."""
    if not burst:
        return None, None
    origin = min(o.started_at for o in burst)
    ends = [o.started_at + o.latency_s - origin for o in burst if o.kind == "answered" and o.status < 300]
    return min(ends, default=None), max(ends, default=None)


def run(model: str = "tiny", requests: int | None = None, max_tokens: int = 8, buffer: int = 8) -> dict:
    """A burst of `requests` (default ten times the router's wait buffer) at a fleet at zero replicas."""
    requests = requests or 10 * buffer
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-") as tmp:
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
        spec = SPEC.format(source=source, threads=os.cpu_count() or 1, buffer=buffer, target=max(requests, 1))
        with LocalFleet(Path(tmp), "bench-zero", spec) as fleet:
            url = fleet.up()["url"]
            cold = _burst(url, requests, max_tokens)
            status = fleet.status()
            cold_start = min((r["cold_start_s"] for r in status["replicas"] if r["cold_start_s"] is not None),
                             default=None)
            warm = _burst(url, requests, max_tokens)
    answered = [o for o in cold if o.kind == "answered" and o.status < 300]
    first_cold, last_cold = _responses(cold)
    first_warm, last_warm = _responses(warm)
    figures = tally(cold + warm)
    return {
        "benchmark": "scale-from-zero",
        "model": model,
        "requests": requests,  # per burst; the counts below are of both bursts, cold and warm
        "buffer": buffer,
        **{k: figures[k] for k in ("sent", *KINDS)},  # every outcome: they add up to `sent`
        "cold": {k: v for k, v in tally(cold).items() if k != "lost_examples"},
        "shed_then_answered": sum(1 for o in answered if o.attempts > 1),
        "cold_start_s": round(cold_start, 3) if cold_start is not None else None,
        "first_response_s": rounded(first_cold),
        "last_response_s": rounded(last_cold),  # of the answered requests, as warm's
        "warm": {"first_response_s": rounded(first_warm), "last_response_s": rounded(last_warm)},
        # requests of either burst that did not end answered (after their retries): a failed run
        "unanswered": sum(1 for o in cold + warm if not (o.kind == "answered" and o.status < 300)),
        "fleet_error": status.get("error") or None,  # why no replica served, as `status` says it
        "status_codes": sorted({o.status for o in cold + warm}),  # each request's last answer (after retries)
        "ratio": {"first_response_cold_vs_warm": round(first_cold / first_warm, 2)
                  if first_cold is not None and first_warm else None},
        "note": f"the burst is {requests / buffer:g} times the router's wait buffer: what it cannot hold is shed "
                "with 503 + Retry-After and answered when the client comes back (shed_then_answered); sent and "
                "the outcome counts are of both bursts (cold, then warm), `cold` of the cold one alone; lost "
                "counts requests that got no answer at all",
    }
