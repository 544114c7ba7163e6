"""`fleetserve bench routing`: every strategy on the same trace, the same simulated engines, in one run.

Per strategy: a fresh set of simulated engines (their caches sized so that together they hold
`cache_fraction` of the trace's unique blocks) behind a fresh router; the trace is replayed time-compressed;
the engines' speed is calibrated so that roundrobin keeps them about `target_utilization` busy. Reported per
strategy: hit_rate, ttft_ms (p50/p95/p99), e2e_ms, load_skew (max/mean busy time), utilization, lost; and
once: oracle_hit_rate (one LRU with the fleet's total capacity, fed the trace in order).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx

from fleetserve.bench.replay import replay, summarize
from fleetserve.bench.routing_sim import (
    LOAD_TOLERANCE,
    cache_floor_warning,
    calibrate,
    oracle_warnings,
    replica_cache_blocks,
    target_checks,
)
from fleetserve.fleet.process import Child, fleetserve_command, free_port
from fleetserve.kvcache.blocks import chain_keys, namespace_key, reusable_blocks
from fleetserve.kvcache.prefix_match import KeyLRU
from fleetserve.sim.perf import profile as perf_profile
from fleetserve.sim.workload import build_workload, cannot_act
from fleetserve.traces.load import read_trace
from fleetserve.traces.model import TraceRequest, stand_in_tokens

MODEL = "bench-sim"
SGLANG = "sglang_cache_aware"
MIN_ENGINE_SPEEDUP = 0.001  # the slowest a simulated engine runs (`engine --speedup`)


def find_sglang_python(explicit: str | None = None) -> str | None:
    """A Python that can run sglang_router (FLEETSERVE_SGLANG_PYTHON, or this one if it has it)."""
    import importlib.util
    import os
    import sys

    candidate = explicit or os.environ.get("FLEETSERVE_SGLANG_PYTHON")
    if candidate:
        return candidate
    return sys.executable if importlib.util.find_spec("sglang_router") else None


def _engine_tokens(r: TraceRequest, i: int) -> list[int]:
    """The prompt as the simulated engines tokenize it: a prompt log's text (the replay sends the text) through
    their stand-in tokenizer, else the trace's token ids. Keying prompt logs by `token_ids` gave every request
    tokens of its own, so the oracle and the calibration saw no shared prefix where the engines found them."""
    text = r.text()
    return stand_in_tokens(text) if text is not None else r.token_ids(unique_seed=i)


def _keys(requests, block_size: int, tokens: list[list[int]] | None = None) -> list[list[int]]:
    """Each request's block keys as the engines chain them (`tokens`: its `_engine_tokens`, when at hand)."""
    root = namespace_key(MODEL, "1", "sim", None)
    tokens = tokens if tokens is not None else [_engine_tokens(r, i) for i, r in enumerate(requests)]
    return [chain_keys(t, block_size, root) for t in tokens]


def lru_hits(key_lists: list[list[int]], capacity: int, assign=None, caches: int = 1) -> list[int]:
    """Matched (prefix-contiguous) blocks per request for `caches` LRU caches; `assign(i)` picks the cache."""
    lrus = [KeyLRU(capacity) for _ in range(caches)]
    hits = []
    for i, keys in enumerate(key_lists):
        lru = lrus[assign(i) if assign else 0]
        hits.append(lru.match(keys))
        lru.put(keys)
        lru.trim()
    return hits


def _wait_ready(url: str, child: Child, timeout: float = 60.0, path: str = "/health") -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0, trust_env=False) as client:  # one for every poll (`httpx.get`: ~36 ms of CPU each)
        while time.monotonic() < deadline:
            if child.exit_code() is not None:
                raise RuntimeError(f"{child.name} exited: {child.log_tail()}")
            try:
                if client.get(url + path).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"{child.name} not ready after {timeout}s")


def run(trace: str, replicas: int = 4, strategies: tuple[str, ...] = ("roundrobin", "leastload", "session",
        "prefixaware", "kvaware"), limit: int | None = 600, duration: float = 60.0, cache_fraction: float = 1 / 3,
        target_utilization: float = 0.65, profile_name: str = "h100-8b", max_output: int | None = 256,
        progress=None, prompt_format: str = "tokens", sglang_python: str | None = None) -> dict:
    requests, _, notes = read_trace(trace, limit)
    base = perf_profile(profile_name)
    block = base.block_size
    tokens = [_engine_tokens(r, i) for i, r in enumerate(requests)]  # tokenized once: the keys and the sizes
    key_lists = _keys(requests, block, tokens)
    prompt_tokens = [min(r.input_tokens, len(t)) for r, t in zip(requests, tokens, strict=True)]
    unique = len({k for keys in key_lists for k in keys})
    outputs_of = [min(r.output_tokens, max_output or r.output_tokens) for r in requests]
    biggest = max((p + o + block - 1) // block for p, o in zip(prompt_tokens, outputs_of, strict=True))
    asked = round(unique * cache_fraction / replicas)
    cap = replica_cache_blocks(asked, biggest)
    total_prompt = sum(prompt_tokens)
    # as the simulator bench's oracle (routing_sim.lru_token_hits): no engine reuses the block of a prompt's last
    # token, so counting it had put the bar above any engine's reach (0.9 where 0.45 was the most possible)
    oracle = sum(min(h, reusable_blocks(p, block)) * block
                 for h, p in zip(lru_hits(key_lists, cap * replicas), prompt_tokens, strict=True)) / total_prompt
    span = max(r.arrival_s for r in requests) or 1.0
    trace_speedup = max(1.0, span / duration)
    # calibrate the engines as the simulator bench calibrates its arrivals (roundrobin simulations of the same
    # engine model until it keeps them target_utilization busy): a one-shot estimate ran the live fleet at 0.90
    # for 0.65. Engines e times faster under arrivals compressed t times are the simulator's arrivals x e / t.
    workload = build_workload([replace(r, output_tokens=o) for r, o in zip(requests, outputs_of, strict=True)],
                              block, informed=True)
    scale = calibrate(workload, replace(base, cache_blocks=cap), cap, replicas, target_utilization)
    engine_speedup = scale * trace_speedup
    if engine_speedup < MIN_ENGINE_SPEEDUP:  # the engine refused it at its start, a traceback after it started
        raise ValueError(f"the trace is too sparse for --target-utilization {target_utilization:g} in --duration "
                         f"{duration:g}: {len(requests)} requests over {span:.0f} s would need engines "
                         f"{1 / engine_speedup:,.0f} x slower than the {profile_name} profile (at most "
                         f"{1 / MIN_ENGINE_SPEEDUP:,.0f} x); raise --limit, or lower --duration or "
                         "--target-utilization")
    result = {
        "benchmark": "routing", "trace": Path(trace).name, "requests": len(requests), "replicas": replicas,
        "profile": profile_name, "block_size": block, "unique_blocks": unique, "cache_blocks_per_replica": cap,
        "trace_speedup": round(trace_speedup, 2), "engine_speedup": round(engine_speedup, 3),
        "oracle_hit_rate": round(oracle, 4), "prompt_format": prompt_format,
        "note": "ttft_ms is measured by the engines (queue + prefill)", "strategies": {}, "warnings": list(notes),
    }
    if cap > asked:
        result["warnings"].append(cache_floor_warning(cap, asked, cache_fraction, biggest))
    # the engines publish KV events (informed); the router keys text prompts by estimate only
    has_sessions = any(r.session for r in requests)
    exact = prompt_format == "tokens" and all(r.text() is None for r in requests)
    for strategy in strategies:
        reason = None if strategy == SGLANG else cannot_act(strategy, "informed", has_sessions, exact)
        if reason:  # as the simulator bench: not another policy's figures under its name
            result["strategies"][strategy] = {"hit_rate": None, "reason": reason}
            continue
        if progress:
            progress(f"{strategy} ...")
        result["strategies"][strategy] = _run_strategy(strategy, requests, replicas, cap, engine_speedup,
                                                       trace_speedup, profile_name, max_output, prompt_format,
                                                       sglang_python)
    rows = {name: row for name, row in result["strategies"].items() if row["hit_rate"] is not None}
    if "roundrobin" in rows:
        rr_p95 = rows["roundrobin"]["ttft_ms"]["p95"]
        cache_aware = [s for s in ("prefixaware", "kvaware") if s in rows]
        for row in rows.values():  # the simulator bench's per-row ratios, whence its checks and warnings
            row["hit_vs_oracle"] = round(row["hit_rate"] / oracle, 3) if oracle else None
            p95 = row["ttft_ms"]["p95"]
            row["ttft_p95_vs_roundrobin"] = round(p95 / rr_p95, 3) if rr_p95 and p95 is not None else None
        result["warnings"] += oracle_warnings({"modes": {"live": rows}})
        if cache_aware and rr_p95:
            # as the simulator bench chooses: the most targets met, then the highest hit rate
            checks = {s: target_checks(rows[s]) for s in cache_aware}
            best = max(cache_aware, key=lambda s: (sum(c["met"] for k, c in checks[s].items() if k != "met"),
                                                   rows[s]["hit_rate"]))
            result["ratio"] = {
                "best_cache_aware": best,
                "hit_rate_vs_oracle": round(rows[best]["hit_rate"] / oracle, 3) if oracle else None,
                "ttft_p95_vs_roundrobin": round(rows[best]["ttft_ms"]["p95"] / rr_p95, 3),
                "load_skew": rows[best]["load_skew"],
            }
            if SGLANG in rows and rows[SGLANG]["ttft_ms"]["p95"]:
                result["ratio"]["ttft_p95_vs_sglang_cache_aware"] = round(
                    rows[best]["ttft_ms"]["p95"] / rows[SGLANG]["ttft_ms"]["p95"], 3)
                result["ratio"]["sglang_ttft_p95_vs_roundrobin"] = round(rows[SGLANG]["ttft_ms"]["p95"] / rr_p95, 3)
    said = live_load_warning((rows.get("roundrobin") or {}).get("utilization"), target_utilization)
    if said:
        result["warnings"].append(said)
    return result


def live_load_warning(got: float | None, target: float) -> str | None:
    """The load the live fleet ran at, when it is not the one asked for (as the simulator bench says of its)."""
    if got is None or abs(got - target) <= LOAD_TOLERANCE * target:
        return None
    return (f"roundrobin kept the engines {got:.2f} busy against the target utilization {target:g} (real time: the "
            f"machine's own load moves it): the figures are at a load of {got:.2f}")


def start_simulated_engines(children: list[Child], folder: Path | str, count: int, *args: str,
                            model: str = MODEL) -> list[str]:
    """`count` real-time simulated engine processes (`fleetserve engine --simulate ... ARGS`), ready; each is
    appended to `children` as soon as it starts, so the caller's cleanup stops it whatever happens next."""
    urls = []
    for i in range(count):
        port = free_port()
        child = Child(f"sim{i}", fleetserve_command("engine", "--simulate", *args, "--port", str(port),
                                                    "--served-model-name", model), Path(folder) / f"sim{i}.log")
        child.start()
        children.append(child)
        urls.append(f"http://127.0.0.1:{port}")
    for url, child in zip(urls, children[-count:], strict=True):
        _wait_ready(url, child)
    return urls


def start_router(children: list[Child], folder: Path | str, engines: list[str], *args: str) -> str:
    """`fleetserve router ARGS` in front of `engines` on a free port, ready; appended to `children`."""
    port = free_port()
    cmd = fleetserve_command("router", "--port", str(port), *args)
    for url in engines:
        cmd += ["--backend", url]
    router = Child("router", cmd, Path(folder) / "router.log")
    router.start()
    children.append(router)
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, router)
    return url


def _router_child(strategy: str, engines: list[str], port: int, tmp: str, sglang_python: str | None) -> Child:
    if strategy == SGLANG:
        if not sglang_python:
            raise ValueError("sglang_cache_aware needs sglang-router: pip install sglang-router==0.3.2 (or set "
                             "FLEETSERVE_SGLANG_PYTHON to a Python that has it)")
        # no model path is advertised and the hub is off: it must not try to download a tokenizer
        cmd = [sglang_python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
               "--policy", "cache_aware", "--worker-urls", *engines]
        return Child("sglang-router", cmd, Path(tmp) / "sglang.log",
                     env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "*"})
    cmd = fleetserve_command("router", "--port", str(port), "--strategy", strategy, "--health-interval", "0.5")
    for url in engines:
        cmd += ["--backend", url]
    return Child("router", cmd, Path(tmp) / "router.log")


def _run_strategy(strategy: str, requests, replicas: int, cap: int, engine_speedup: float, trace_speedup: float,
                  profile_name: str, max_output: int | None, prompt_format: str = "tokens",
                  sglang_python: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-routing-") as tmp:
        engines = []
        children: list[Child] = []
        try:
            engines = start_simulated_engines(children, tmp, replicas, profile_name, "--cache-blocks", str(cap),
                                              "--speedup", str(engine_speedup))
            port = free_port()
            router = _router_child(strategy, engines, port, tmp, sglang_python)
            router.start()
            children.append(router)
            gateway = f"http://127.0.0.1:{port}"
            _wait_ready(gateway, router)
            time.sleep(1.0)  # let kvaware subscribe to every engine's events
            started = time.monotonic()
            records = asyncio.run(replay(gateway, requests, model=MODEL, speedup=trace_speedup,
                                         max_output=max_output, prompt_format=prompt_format))
            wall = time.monotonic() - started
            busy = [httpx.get(u + "/get_load", timeout=5).json()["busy_seconds"] for u in engines]
            branches = _branches(gateway, strategy) if strategy != SGLANG else {}
        finally:
            for child in children:
                child.stop(timeout=5)
    summary = summarize(records)
    mean_busy = sum(busy) / len(busy)
    return {
        "hit_rate": summary["hit_rate"],
        "ttft_ms": summary["ttft_ms"],
        "e2e_ms": summary["e2e_ms"],
        "load_skew": round(max(busy) / mean_busy, 3) if mean_busy else None,
        "utilization": round(mean_busy / wall, 3),
        "answered": summary["answered"],
        "failed": summary["failed"],  # answered with an error status
        "lost": summary["lost"] + summary["refused"],  # its own router refused: lost to it
        "errors": summary["errors"],
        "per_replica_hit_rate": {k: v["hit_rate"] for k, v in sorted(summary["per_replica"].items())},
        "busy_seconds": [round(b, 3) for b in busy],  # what load_skew is computed from
        "wall_s": round(wall, 3),
        "generator": summary["generator"],  # did the sends keep to the trace's schedule
        "decisions": branches,
    }


def _branches(gateway: str, strategy: str) -> dict[str, int]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    text = httpx.get(gateway + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fleetserve_router_routing_decisions_total" and sample.labels["policy"] == strategy:
                out[sample.labels["branch"]] = int(sample.value)
    return out
