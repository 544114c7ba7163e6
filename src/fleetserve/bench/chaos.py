"""`fleetserve bench chaos`: one fault at a time against a real local fleet; nothing accepted may be lost.

Every scenario starts its own fleet (a small random model slow enough that streams are in flight when the
fault hits, real engine, router and Redis processes on loopback), drives load from a thread pool, injects
one fault, and reports what became of each request (`bench/outcomes.py`: answered,
rejected_with_retry_after, cut_with_error_event, failed_with_error, refused, lost) and `recovery_s`, the
time from the fault until the fleet served normally again, measured while the scenario's load still runs
(`recovery_from` says from what, to what: measured after the load had drained, the figures were the rest of
the load's schedule). `lost` must be 0 everywhere, the fault's own requests included, and a poisoned request
must be refused with a 4xx; the command exits 1 otherwise. Each scenario is bounded in requests and in time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from fleetserve.bench.localfleet import LocalFleet
from fleetserve.bench.outcomes import Load, percentile, rounded, send, tally

SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: {name}}}
spec:
  model: {{name: chaos, source: "{source}"}}
  engine: {{threads: 1}}
  replicas: {replicas}
  routing: {{strategy: leastload}}
{extra}"""

TOKENS = 40  # generated per request: long enough that streams are in flight when a fault hits


def _chat(i: int, stream: bool = True, tokens: int = TOKENS) -> dict:
    return {"model": "chaos", "messages": [{"role": "user", "content": f"request {i}: tell a story"}],
            "max_tokens": tokens, "ignore_eos": True, "stream": stream}


class Scenario:
    """One fault: `run(fleet)` returns its figures; the fleet it needs is described by `replicas`/`extra`."""

    name = ""
    replicas = 2
    extra = ""

    def run(self, fleet: LocalFleet, url: str) -> dict:
        raise NotImplementedError


def _serves(url: str) -> bool:
    with httpx.Client(timeout=30, trust_env=False) as client:
        return send(client, url + "/chat/completions", _chat(0, stream=False, tokens=2)).kind == "answered"


def _until(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return round(time.monotonic() - start, 2)
        time.sleep(interval)
    return None


class ReplicaKill(Scenario):
    name = "replica_sigkill"

    def run(self, fleet, url):
        load = Load(url + "/chat/completions", _chat, rate_per_s=6, max_requests=60)
        time.sleep(3)
        victim = fleet.status()["replicas"][0]
        os.kill(victim["pid"], signal.SIGKILL)
        killed = time.monotonic()
        back = fleet.wait(lambda s: s.get("ready") == 2 and s["replicas"][0].get("restarts", 0) >= 1, 120,
                          interval=0.1)
        recovery = None if back is None else round(time.monotonic() - killed, 2)
        outcomes = load.finish()
        return {**tally(outcomes), "recovery_s": recovery,
                "recovery_from": "SIGKILL of a replica to both replicas ready, the killed one restarted",
                "load": "6 req/s streaming, 2 replicas"}


class RedisKill(Scenario):
    name = "redis_sigkill"
    replicas = 1
    extra = "  kvCache: {blockSize: 16, l1: {enabled: true, maxBytes: 33554432}, l2: {enabled: true, " \
            "maxBytes: 67108864}}\n"

    def run(self, fleet, url):
        shared = "A long shared system prompt that every request of this scenario starts with. " * 4

        def body(i):
            return {"model": "chaos", "max_tokens": 4, "stream": i % 2 == 0,
                    "messages": [{"role": "system", "content": shared}, {"role": "user", "content": f"q {i}"}]}

        load = Load(url + "/chat/completions", body, rate_per_s=5, max_requests=40)
        time.sleep(2)
        before = fleet.status()
        os.kill(before["redis_pid"], signal.SIGKILL)
        killed = time.monotonic()
        back = fleet.wait(lambda s: s.get("l2_status") == "up" and s.get("redis_pid") not in (None,
                                                                                            before["redis_pid"]), 60,
                          interval=0.1)
        recovery = None if back is None else round(time.monotonic() - killed, 2)
        outcomes = load.finish()
        return {**tally(outcomes), "recovery_s": recovery,
                "recovery_from": "SIGKILL of Redis to L2 up again under a new process",
                "load": "5 req/s, shared prefix, L1 + L2"}


class Overload(Scenario):
    name = "overload_10x"
    replicas = 1
    extra = "  requestLimits: {maxConcurrentRequests: 2, maxQueueSize: 4}\n"

    def run(self, fleet, url):
        capacity = 2 + 4
        load = Load(url + "/chat/completions", _chat, rate_per_s=500, max_requests=10 * capacity)
        load.sent()  # the burst is out (its requests still run): from here, until a new request is served
        recovery = _until(lambda: _serves(url), 60)
        outcomes = load.finish()
        return {**tally(outcomes), "recovery_s": recovery,
                "recovery_from": "the 10x burst sent to a new request answered (200)",
                "load": f"{10 * capacity} at once against 2 in flight + 4 queued"}


class SlowReplica(Scenario):
    name = "slow_replica"

    def run(self, fleet, url):
        load = Load(url + "/chat/completions", lambda i: _chat(i, stream=False, tokens=8), rate_per_s=6,
                    max_requests=72)
        time.sleep(2)
        victim = fleet.status()["replicas"][0]
        os.kill(victim["pid"], signal.SIGSTOP)  # a replica that stalls (GC pause, swapping, a stuck GPU)
        stalled = time.monotonic()
        time.sleep(6)
        os.kill(victim["pid"], signal.SIGCONT)
        back = _until(lambda: fleet.status().get("ready") == 2, 60, interval=0.1)
        outcomes = load.finish()
        before = [o.latency_s for o in outcomes if o.started_at < stalled and o.kind == "answered"]
        during = [o.latency_s for o in outcomes if o.started_at >= stalled and o.kind == "answered"]
        return {**tally(outcomes), "recovery_s": None if back is None else round(back, 2),
                "recovery_from": "SIGCONT of the stalled replica to both replicas ready",
                "p95_s": {"before_stall": rounded(percentile(before, 0.95)),
                          "during_and_after": rounded(percentile(during, 0.95))},
                "load": "6 req/s, one of 2 replicas SIGSTOPped for 6 s"}


class PoisonedRequests(Scenario):
    name = "poisoned_request"

    def run(self, fleet, url):
        load = Load(url + "/chat/completions", _chat, rate_per_s=4, max_requests=32)
        time.sleep(1)
        poison = [
            {"model": "chaos", "messages": [{"role": "user", "content": "x"}], "seed": 2**64},
            {"model": "chaos", "messages": [{"role": "user", "content": "x"}], "seed": -(2**63) - 1},
            {"model": "chaos", "prompt": [1, 2, 10**9]},  # a token id no tokenizer has
            {"model": "chaos", "messages": [{"role": "user", "content": "bad \ud800 text"}]},
            {"model": "chaos", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        ]
        answers = []
        with httpx.Client(timeout=60, trust_env=False) as client:
            for body in poison * 2:
                path = "/completions" if "prompt" in body else "/chat/completions"
                answers.append(send(client, url + path, body))
        recovery = _until(lambda: _serves(url), 30)
        outcomes = load.finish()
        statuses = [o.status if o.kind == "answered" else o.kind for o in answers]
        # each must be refused as bad input, clearly: a 200 or a 5xx is a check that failed, a lost one is lost
        refused = sum(1 for o in answers if o.kind == "answered" and 400 <= o.status < 500)
        return {**tally(outcomes), "recovery_s": recovery,
                "recovery_from": "the last poisoned request's answer to a new request answered (200)",
                "poison_answers": sorted(set(map(str, statuses))), "poison_sent": len(answers),
                "poison_refused_4xx": refused, "fault_lost": sum(1 for o in answers if o.kind == "lost"),
                "checks_failed": [] if refused == len(answers) else [
                    f"{len(answers) - refused} of {len(answers)} poisoned requests were not refused with a 4xx"],
                "load": "4 req/s streaming; 10 poisoned requests in between"}


class HugePrompts(Scenario):
    name = "huge_prompts"

    def run(self, fleet, url):
        load = Load(url + "/chat/completions", lambda i: _chat(i, stream=False, tokens=4), rate_per_s=4,
                    max_requests=40)
        time.sleep(1)
        huge = {"model": "chaos", "max_tokens": 2, "messages": [{"role": "user", "content": "lorem ipsum " * 250_000}]}
        too_big = {"model": "chaos", "messages": [{"role": "user", "content": "x" * (10 << 20)}]}
        burst = Load(url + "/chat/completions", lambda i: too_big if i == 6 else huge, rate_per_s=100,
                     max_requests=7)
        big = burst.finish()
        recovery = _until(lambda: _serves(url), 30)
        outcomes = load.finish()
        small = [o.latency_s for o in outcomes if o.kind == "answered"]
        return {**tally(outcomes), "recovery_s": recovery,
                "recovery_from": "the huge requests' answers to a new small request answered (200)",
                "huge": tally(big), "fault_lost": tally(big)["lost"],
                "huge_statuses": sorted({o.status for o in big}),
                "small_p95_s": rounded(percentile(small, 0.95)),
                "load": "4 small req/s; six 3 MB prompts and one 10 MB body at once"}


class ScaleFromZeroBurst(Scenario):
    name = "scale_from_zero_burst"
    replicas = 0
    buffer = 4
    extra = f"""  router: {{bufferSize: {buffer}, bufferTimeoutSeconds: 300}}
  autoscaling:
    minReplicaCount: 0
    maxReplicaCount: 1
    pollingInterval: 5
    cooldownPeriod: 300
    initialCooldownPeriod: 0
    triggers: [{{metric: concurrency, target: 8}}]
"""

    def run(self, fleet, url):
        burst = 10 * self.buffer
        started = time.monotonic()
        load = Load(url + "/chat/completions", lambda i: _chat(i, stream=False, tokens=4), rate_per_s=1000,
                    max_requests=burst, retries=30)
        outcomes = load.finish()
        first = min((o.started_at + o.latency_s for o in outcomes if o.kind == "answered"), default=None)
        return {**tally(outcomes), "recovery_s": None if first is None else round(first - started, 2),
                "recovery_from": "the burst at zero replicas to its first answer",
                "rejected_first_attempt": sum(1 for o in outcomes if o.attempts > 1),
                "load": f"{burst} at once against a buffer of {self.buffer}; clients honour Retry-After"}


class SupervisorKill(Scenario):
    name = "supervisor_sigkill_then_up"
    replicas = 1

    def run(self, fleet, url):
        load = Load(url + "/chat/completions", _chat, rate_per_s=4, max_requests=24)
        time.sleep(2)
        os.kill(fleet.status()["supervisor_pid"], signal.SIGKILL)
        killed = time.monotonic()
        outcomes = load.finish()
        fleet.up()
        new_url = fleet.status()["url"]
        recovery = _until(lambda: _serves(new_url), 120)
        recovery = None if recovery is None else round(time.monotonic() - killed, 2)
        return {**tally(outcomes), "recovery_s": recovery,
                "recovery_from": "SIGKILL of the supervisor to a request answered by the fleet started again with "
                                 "up, after the load sent before it drained",
                "load": "4 req/s streaming; SIGKILL, then up again"}


SCENARIOS: dict[str, type[Scenario]] = {s.name: s for s in (
    ReplicaKill, RedisKill, Overload, SlowReplica, PoisonedRequests, HugePrompts, ScaleFromZeroBurst,
    SupervisorKill)}


def _model(folder: Path) -> str:
    from fleetserve.engine.tiny import create_tiny_model

    return str(create_tiny_model(folder / "chaos-model", hidden_size=256, layers=4, heads=4, kv_heads=4,
                                 context_length=4096))


def run(names: list[str] | None = None, progress: Callable[[str], None] = lambda _: None) -> dict:
    """`names`: the scenarios to run, in order (None: all); each once."""
    names = list(SCENARIOS) if names is None else list(dict.fromkeys(names))
    if not names:
        raise ValueError(f"no scenario named; allowed values: {', '.join(SCENARIOS)}")
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}; allowed values: {', '.join(SCENARIOS)}")
    results, not_started = {}, {}
    with tempfile.TemporaryDirectory(prefix="fleetserve-chaos-") as tmp:
        source = _model(Path(tmp))
        for name in names:
            scenario = SCENARIOS[name]()
            progress(name)
            spec = SPEC.format(name=name.replace("_", "-"), source=source, replicas=scenario.replicas,
                               extra=scenario.extra)
            with LocalFleet(Path(tmp), name.replace("_", "-"), spec) as fleet:
                started = time.monotonic()
                try:
                    state = fleet.up()
                except (RuntimeError, subprocess.TimeoutExpired) as exc:  # its fleet never started (no
                    # redis-server, a port, a start past 15 minutes): the other scenarios run
                    not_started[name] = str(exc)
                    continue
                results[name] = scenario.run(fleet, state["url"])
                results[name]["seconds"] = round(time.monotonic() - started, 1)
    return {"benchmark": "chaos", "scenarios": results, "not_started": not_started,
            # the load's losses and the fault's own requests' (a huge or a poisoned request that got no answer)
            "lost_total": sum(r["lost"] + r.get("fault_lost", 0) for r in results.values()),
            "checks_failed": [f"{name}: {c}" for name, r in results.items() for c in r.get("checks_failed", [])]
            + [f"{name}: the fleet did not start: {why}" for name, why in not_started.items()],
            "note": "real processes on loopback (random 4-layer model); lost = accepted without any answer"}
