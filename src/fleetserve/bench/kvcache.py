"""`fleetserve bench kvcache`: TTFT with a 2,048-token shared prefix from each tier, and decode throughput.

One run, one engine process (with L1 and, when redis-server is installed, L2): the same prompt family is
measured cold (a fresh tenant salt), with the prefix in the engine, in L1 only (engine set cleared) and in
L2 only (engine and L1 cleared); then decode throughput at batch 1 and with 8 concurrent requests.
TTFT is the time to the first streamed token at the client. Each figure is the median of `repeats`.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from fleetserve.api.internal import InternalAuth, read_token_file, write_token_file
from fleetserve.bench.routing import _wait_ready
from fleetserve.fleet.process import Child, fleetserve_command, free_port

PREFIX_TOKENS = 2048
BLOCK_TOKENS = 256  # the engine's --block-size here
NEEDED_CONTEXT = PREFIX_TOKENS + 64  # the warm-up's prompt (prefix + 32) and its few generated tokens
ADMIN: dict[str, str] = {}  # the engine's internal token header (its admin API needs it), set by run()


def _ttft(url: str, prompt: list[int], salt: str) -> tuple[float, int]:
    """(ms to the first streamed token, prompt tokens the engine reports cached): the cached count says which
    figure this is (a tier that failed serves nothing, and its "hit" had been published as measured)."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": 2, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "cache_salt": salt, "ignore_eos": True}
    start = time.perf_counter()
    first, cached = None, None
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=ADMIN, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                if first is None:
                    first = (time.perf_counter() - start) * 1000
                usage = json.loads(line[6:]).get("usage") or {}
                if usage:
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    if first is None or cached is None:
        raise RuntimeError("no token streamed" if first is None else "the stream carried no usage")
    return first, cached


def _tier_hits(url: str) -> dict[str, float]:
    """Blocks each tier has served so far (the engine's fleetserve_kv_tier_hits_total)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", headers=ADMIN, timeout=30).text
    return {s.labels["tier"]: s.value for family in text_string_to_metric_families(text)
            if family.name == "fleetserve_kv_tier_hits" for s in family.samples if s.name.endswith("_total")}


def _decode(url: str, prompt: list[int], tokens: int) -> tuple[float, float]:
    """(seconds, ms to the first token) for one request generating exactly `tokens` tokens."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    start = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=ADMIN, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and first is None:
                first = time.perf_counter()
    return time.perf_counter() - start, ((first or start) - start) * 1000


def _flush(url: str) -> None:
    httpx.post(url + "/admin/kv/flush", headers=ADMIN, timeout=120).raise_for_status()


def _clear(url: str, tiers: str) -> None:
    httpx.post(url + "/admin/kv/clear", params={"tiers": tiers}, headers=ADMIN, timeout=60).raise_for_status()


class ModelUnfit(ValueError):
    """A --model the bench cannot measure (its context too short for the prefix)."""


def _model(kind: str, folder: Path) -> tuple[str, int]:
    """(model source, vocabulary size) for `tiny`, `demo` or a path."""
    if kind == "tiny":
        from fleetserve.engine.tiny import create_tiny_model

        path = create_tiny_model(folder / "bench-tiny", hidden_size=256, layers=4, heads=4, kv_heads=2,
                                 context_length=4096)
        return str(path), 250
    if kind == "demo":
        return "builtin:smollm2-135m", 49152
    config = Path(kind).expanduser() / "config.json"
    if config.is_file():  # a model folder: its own vocabulary and context (a tiny test model has 259 tokens)
        try:
            data = json.loads(config.read_text())
        except (OSError, ValueError) as exc:
            raise ModelUnfit(f"--model: {config} is not readable JSON ({exc})") from None
        context = data.get("max_position_embeddings") or 2048  # the engine's own default (engine/runner.py)
        if isinstance(context, int) and context < NEEDED_CONTEXT:
            raise ModelUnfit(f"--model: {kind} holds {context} tokens; the bench needs a context of at least "
                             f"{NEEDED_CONTEXT} (its {PREFIX_TOKENS}-token prefix and the decode run), as tiny and "
                             "demo have")
        vocab = data.get("vocab_size")
        if isinstance(vocab, int) and vocab > 3:
            return kind, vocab
    return kind, 1000


def run(model: str = "tiny", repeats: int = 3, decode_tokens: int = 32, dtype: str = "auto",
        progress=None) -> dict:
    """The figures; `progress(line)` hears each stage (the engine's start alone takes a minute for the demo)."""
    say = progress or (lambda _line: None)
    with tempfile.TemporaryDirectory(prefix="fleetserve-bench-kv-") as tmp:
        children: list[Child] = []
        redis_url = None
        source, vocab = _model(model, Path(tmp))  # before anything starts: a model it cannot measure is refused
        try:
            if shutil.which("redis-server"):
                rport = free_port()
                redis = Child("redis", ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                        "--appendonly", "no", "--maxmemory", "2gb",
                                        "--maxmemory-policy", "allkeys-lru"], Path(tmp) / "redis.log")
                redis.start()
                children.append(redis)
                redis_url = f"redis://127.0.0.1:{rport}/0"
            port = free_port()
            token_file = write_token_file(Path(tmp) / "internal.token")
            ADMIN.update(InternalAuth(read_token_file(token_file)).headers())
            cmd = fleetserve_command("engine", "--model", source, "--port", str(port), "--served-model-name",
                                     "bench", "--block-size", str(BLOCK_TOKENS), "--l1-bytes", str(2 << 30),
                                     "--engine-cache-bytes", str(1 << 30), "--dtype", dtype,
                                     "--internal-token-file", str(token_file))
            if redis_url:
                cmd += ["--l2-url", redis_url]
            l2 = "Redis as L2" if redis_url else "no L2: redis-server is missing"
            say(f"starting the engine ({model}, {l2})")
            engine = Child("engine", cmd, Path(tmp) / "engine.log")
            engine.start()
            children.append(engine)
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, engine, timeout=600)
            # warm-up (not measured): the batch KV buffer grows to this length once, as on a running server
            _decode(url, [(5 * j) % (vocab - 3) + 1 for j in range(PREFIX_TOKENS + 32)], 2)
            _clear(url, "engine,l1" + (",l2" if redis_url else ""))
            ttft: dict[str, list[float]] = {"cold": [], "engine": [], "l1": [], "l2": []}
            cached: dict[str, list[int]] = {k: [] for k in ttft}
            served: dict[str, list[int]] = {k: [] for k in ttft}  # prefix blocks the measured tier itself served

            def measure(tier: str, prompt: list[int], salt: str) -> None:
                before = _tier_hits(url)
                ms, hit = _ttft(url, prompt, salt)
                after = _tier_hits(url)
                ttft[tier].append(ms)
                cached[tier].append(hit)
                served[tier].append(int(after.get(tier, 0) - before.get(tier, 0)))

            for i in range(repeats):
                say(f"TTFT cold / engine / L1{' / L2' if redis_url else ''}: round {i + 1} of {repeats}")
                prefix = [(7 * j + 13 * i) % (vocab - 3) + 1 for j in range(PREFIX_TOKENS)]
                salt = f"bench-{i}-{time.time_ns()}"

                def prompt(k: int, prefix=prefix) -> list[int]:
                    return prefix + [(k * 31 + 5) % (vocab - 3) + 1 for _ in range(16)]

                measure("cold", prompt(1), salt)
                _flush(url)  # background writes to L1/L2 would compete for the cores
                measure("engine", prompt(2), salt)
                _flush(url)
                _clear(url, "engine")
                measure("l1", prompt(3), salt)
                if redis_url:
                    _clear(url, "engine,l1")
                    measure("l2", prompt(4), salt)
            say("decode throughput: one request, then 8 at once")
            short = [1, 2, 3, 4, 5, 6, 7, 8]
            b1_seconds, b1_first_ms = _decode(url, short, decode_tokens)
            with ThreadPoolExecutor(8) as pool:
                started = time.perf_counter()
                list(pool.map(lambda k: _decode(url, [k + 1] + short, decode_tokens), range(8)))
                b8_seconds = time.perf_counter() - started
            long_prefill_ms, _ = _ttft(url, [(11 * j) % (vocab - 3) + 1 for j in range(PREFIX_TOKENS)],
                                       f"prefill-{time.time_ns()}")
        finally:
            for child in children:
                child.stop(timeout=10)
    # a figure is what it says only when the prefix came from where it says: all of it cached from the tier, none
    # cold; a tier that served nothing (Redis down, a broken L1) is not measured, whatever its TTFT read
    errors = []
    blocks = PREFIX_TOKENS // BLOCK_TOKENS
    for tier, hits in cached.items():
        wrong = [h for h in hits if (h != 0 if tier == "cold" else h < PREFIX_TOKENS)]
        if wrong:
            errors.append(f"{tier}: {len(wrong)} of {len(hits)} measurement(s) found {wrong[0]} of the "
                          f"{PREFIX_TOKENS} prefix tokens cached, not {0 if tier == 'cold' else PREFIX_TOKENS}")
            ttft[tier] = []
        elif tier != "cold" and any(n < blocks for n in served[tier]):  # cached, but by another tier (L2 for L1)
            errors.append(f"{tier}: the prefix was cached but the {tier} tier served {min(served[tier])} of its "
                          f"{blocks} blocks")
            ttft[tier] = []
    med = {k: round(statistics.median(v), 2) if v else None for k, v in ttft.items()}
    b1 = decode_tokens / b1_seconds
    b8 = 8 * decode_tokens / b8_seconds
    result = {
        "benchmark": "kvcache",
        "model": model,
        "dtype": dtype,
        "prefix_tokens": PREFIX_TOKENS,
        "ttft_ms": med,
        "cached_tokens": {k: v for k, v in cached.items() if v},  # per measurement: what the engine reported
        "tier_blocks_served": {k: v for k, v in served.items() if v and k != "cold"},  # its tier-hit counter's rise
        "ratio": {
            "l1_vs_cold": _ratio(med["l1"], med["cold"]),
            "l2_vs_cold": _ratio(med["l2"], med["cold"]),
            "engine_vs_cold": _ratio(med["engine"], med["cold"]),
            "batch8_vs_batch1": round(b8 / b1, 3),
        },
        "throughput": {"b1": round(b1, 2), "b8": round(b8, 2), "unit": "tokens/s"},
        # time between tokens after the first one, as seen by a streaming client
        "decode_ms_per_token": {"b1": round((1000 * b1_seconds - b1_first_ms) / (decode_tokens - 1), 2)},
        "prefill_ms": {"2048": round(long_prefill_ms, 1)},
        "l2": ("redis" if med["l2"] is not None else "not measured: the L2 measurements found the prefix not "
               "cached (see errors)") if redis_url else "not measured: redis-server is not installed",
        "errors": errors,
        "note": "throughput: one request alone vs 8 concurrent requests (continuous batching, max batch 8)",
    }
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None

