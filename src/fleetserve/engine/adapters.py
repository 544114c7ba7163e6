"""Command lines for GPU engines (vLLM, SGLang): what a replica runs when `engine.kind` is not builtin.

The same spec drives them: served model name, context length, port, extra args and environment; for vLLM
the KV tiers map onto LMCache (L1: CPU offload of `l1.maxBytes`, L2: its Redis remote backend, chunk size =
`kvCache.blockSize`), and PYTHONHASHSEED is pinned so every replica derives the same cache keys. Health
and metrics: both serve /health and Prometheus /metrics (vLLM's `vllm:*` names, SGLang's `sglang:*`).

Both report the cached prompt tokens of each answer (`usage.prompt_tokens_details.cached_tokens`; vLLM with
`--enable-prompt-tokens-details`, SGLang with `--enable-cache-report`, off by default in both): without them the
blind router learns nothing of the engines' caches (`router/feedback.py`) and its cached-token counters stay at 0.

`kvCache.l1.maxBytes` is the replica's host memory for L1: LMCache and SGLang allocate their buffer per GPU rank,
so each of `engine.gpus` ranks gets its share (a TP-4 replica told 64 GiB pinned 256). SGLang takes whole GB (1e9
bytes) per rank and refuses to start with a host pool not larger than its GPU KV pool (spec/effects.py warns),
so its L1 is on only where the spec asks for it (spec/endpoint.py). LMCache under vLLM keeps a CPU staging
buffer even with L2 only: it is sized (`LMCACHE_STAGING_BYTES` per rank, its default is 5 GiB) and the pod requests
it (`capacity/placement.py`).

Both require an API key of their own (the `engine-token` of the fleet's Secret) as a bearer token on their
OpenAI API (`--api-key`; /health and /metrics stay open to probes and scrapers), which the router sends
(`router --engine-token-file`): not the internal token, since SGLang prints its arguments in its log.
`EngineLaunch.token_env` names the environment variable the deployer fills from the Secret (vLLM reads
`VLLM_API_KEY` itself; SGLang gets `--api-key $(VAR)`, which Kubernetes expands). Tenants reach them as
`cache_salt` (`router/salting.py`): they ignore the tenant header.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

LMCACHE_CONNECTOR = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}


@dataclass(frozen=True)
class EngineLaunch:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    token_env: str = ""  # the variable that must hold the engine's API key (the Secret's engine-token)


ENGINE_TOKEN_ENV = "FLEETSERVE_ENGINE_TOKEN"
VLLM_TOKEN_ENV = "VLLM_API_KEY"  # vLLM's --api-key default


LMCACHE_STAGING_BYTES = 1 << 30  # per rank: LMCache's CPU buffer when L1 is off (L2 only)


def _gib(n: int) -> str:
    return f"{max(n / (1 << 30), 0.001):g}"


def ranks(spec) -> int:
    """The GPU ranks of one replica (tensor parallelism): each allocates its own host KV buffer."""
    return max(spec.engine.gpus, 1)


def sglang_hicache_gb(spec) -> int:
    """SGLang's --hicache-size: whole GB (1e9 bytes) per rank, an integer flag."""
    return spec.kv_cache.l1.max_bytes // ranks(spec) // 10**9


def lmcache_url(url: str) -> str:
    """LMCache's remote URL: redis:// or rediss:// with a port (its parser asserts one; Redis's default here)."""
    from urllib.parse import urlsplit, urlunsplit

    url = url if url.startswith(("redis://", "rediss://")) else f"redis://{url}"
    parts = urlsplit(url)  # the host ends at the first / ? or # (redis://h?ssl=1 became redis://h?ssl=1:6379)
    hostport = parts.netloc.rsplit("@", 1)[-1]
    if ":" not in hostport.rsplit("]", 1)[-1]:  # after an IPv6 literal's bracket, or in a name
        parts = parts._replace(netloc=parts.netloc + ":6379")
    return urlunsplit(parts)


def _given(args, *flags: str) -> bool:
    """Whether the user's engine args hold one of `flags` (`--flag value` or `--flag=value`)."""
    from fleetserve.spec.context import flag_in_args

    return any(flag_in_args(args, flag) for flag in flags)


def vllm_launch(spec, model_path: str, port: int, host: str = "0.0.0.0", l2_url: str | None = None) -> EngineLaunch:
    """`vllm serve` for the spec, with prefix caching on and LMCache wired to the spec's KV tiers."""
    argv = ["vllm", "serve", model_path, "--host", host, "--port", str(port),
            "--served-model-name", spec.model.name or model_path, "--enable-prefix-caching",
            "--enable-prompt-tokens-details"]
    if spec.model.context_length:
        argv += ["--max-model-len", str(spec.model.context_length)]
    if spec.engine.gpus > 1 and not _given(spec.engine.args, "--tensor-parallel-size", "-tp"):
        argv += ["--tensor-parallel-size", str(spec.engine.gpus)]  # a user's own (checked to agree) stands alone
    if spec.model.dtype != "auto":
        argv += ["--dtype", spec.model.dtype]
    env = dict(spec.engine.env)
    kv = spec.kv_cache
    url = l2_url or kv.l2.url
    if lmcache_wanted(spec, url):
        argv += ["--kv-transfer-config", json.dumps(LMCACHE_CONNECTOR, separators=(",", ":"))]
        env.update({"LMCACHE_CHUNK_SIZE": str(kv.block_size), "PYTHONHASHSEED": "0"})
        env["LMCACHE_LOCAL_CPU"] = "True" if kv.l1.enabled else "False"
        per_rank = kv.l1.max_bytes // ranks(spec) if kv.l1.enabled else LMCACHE_STAGING_BYTES
        env["LMCACHE_MAX_LOCAL_CPU_SIZE"] = _gib(per_rank)
        if kv.l2.enabled and url:
            env["LMCACHE_REMOTE_URL"] = lmcache_url(url)
            env["LMCACHE_REMOTE_SERDE"] = "naive"
    return EngineLaunch(argv + list(spec.engine.args), env, spec.engine.health_path, token_env=VLLM_TOKEN_ENV)


def sglang_launch(spec, model_path: str, port: int, host: str = "0.0.0.0") -> EngineLaunch:
    """`python -m sglang.launch_server` for the spec; L1 maps onto SGLang's hierarchical (host memory) cache."""
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", model_path, "--host", host,
            "--port", str(port), "--served-model-name", spec.model.name or model_path, "--enable-metrics",
            "--enable-cache-report"]
    if spec.model.context_length:
        argv += ["--context-length", str(spec.model.context_length)]
    if spec.engine.gpus > 1 and not _given(spec.engine.args, "--tp-size", "--tensor-parallel-size", "--tp"):
        argv += ["--tp-size", str(spec.engine.gpus)]
    if spec.model.dtype != "auto":
        argv += ["--dtype", spec.model.dtype]
    if spec.kv_cache.l1.enabled:
        argv += ["--enable-hierarchical-cache", "--hicache-size", str(sglang_hicache_gb(spec))]
    argv += ["--api-key", f"$({ENGINE_TOKEN_ENV})"]
    return EngineLaunch(argv + list(spec.engine.args), dict(spec.engine.env), spec.engine.health_path,
                        token_env=ENGINE_TOKEN_ENV)


def args_after(kind: str, argv: list[str], command: list[str]) -> list[str]:
    """The arguments to give after `command`, an entrypoint that replaces the launcher (HyperPod's worker.command):
    our launcher words dropped, what the command leaves out kept. `vllm serve MODEL` after `vllm serve` repeated
    `serve`, and after `python3 -m vllm.entrypoints.openai.api_server` the model needs its flag; every such pod
    exited at start."""
    words = [str(w) for w in command]
    base = words[-1].rsplit("/", 1)[-1] if words else ""
    if kind == "vllm":  # argv: vllm serve MODEL ...
        model, rest = argv[2], argv[3:]
        if base == "serve":
            return [model, *rest]
        if base == "vllm":
            return ["serve", model, *rest]
        return ["--model", model, *rest]  # the API server module, or a wrapper of it
    if kind == "sglang":  # argv: python3 -m sglang.launch_server --model-path MODEL ...
        rest = argv[3:]
        if base.startswith("python") and not any("sglang" in w for w in words):
            return ["-m", "sglang.launch_server", *rest]
        return rest
    raise ValueError(f"no GPU engine adapter for engine.kind {kind!r}; allowed: vllm, sglang")


def lmcache_wanted(spec, l2_url: str | None = None) -> bool:
    kv = spec.kv_cache
    return kv.l1.enabled or (kv.l2.enabled and bool(l2_url or kv.l2.url))


#: the LMCache environment the vLLM adapter writes, and the setting each comes from: a user's value for one is
#: replaced (the router keys blocks of kvCache.blockSize; every replica must hash chunks alike)
LMCACHE_OWNED_ENV = {"LMCACHE_CHUNK_SIZE": "from kvCache.blockSize",
                     "PYTHONHASHSEED": "to 0: every replica must hash LMCache's chunks alike",
                     "LMCACHE_LOCAL_CPU": "from kvCache.l1.enabled", "LMCACHE_MAX_LOCAL_CPU_SIZE": "from "
                     "kvCache.l1.maxBytes", "LMCACHE_REMOTE_URL": "from kvCache.l2.url", "LMCACHE_REMOTE_SERDE":
                     "to naive, as fleetserve's Redis tier reads it"}


def replaced_env(spec, l2_url: str | None = None) -> dict[str, str]:
    """The user's engine.env names the vLLM adapter writes over, each with the setting to use instead."""
    if spec.engine.kind != "vllm" or not lmcache_wanted(spec, l2_url):
        return {}
    kv = spec.kv_cache
    remote = kv.l2.enabled and bool(l2_url or kv.l2.url)
    return {name: LMCACHE_OWNED_ENV[name] for name in spec.engine.env if name in LMCACHE_OWNED_ENV
            and (remote or name not in ("LMCACHE_REMOTE_URL", "LMCACHE_REMOTE_SERDE"))}


def launch_for(spec, model_path: str, port: int, l2_url: str | None = None) -> EngineLaunch:
    kind = spec.engine.kind
    if kind == "vllm":
        return vllm_launch(spec, model_path, port, l2_url=l2_url)
    if kind == "sglang":
        return sglang_launch(spec, model_path, port)
    raise ValueError(f"no GPU engine adapter for engine.kind {kind!r}; allowed: vllm, sglang")
