"""`fleetserve engine`: resolve the model, load it, then serve (so /health answers only when ready)."""

from __future__ import annotations

import logging
import sys

from fleetserve.api.graceful import bind_port, serve
from fleetserve.api.internal import read_secret_file, read_token_file
from fleetserve.api.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_HEADER_BYTES,
    KEEP_ALIVE_S,
    STREAM_KEEPALIVE_S,
    SizeLimits,
)
from fleetserve.engine.runner import ModelRunner
from fleetserve.engine.server import Engine, EngineSettings, build_app
from fleetserve.engine.sources import resolve_source
from fleetserve.observe.logs import configure_logging, quiet_progress_bars
from fleetserve.observe.metrics import ModelIdentity


def l2_prefix(served_name: str, model_dir) -> str:
    """The Redis key prefix of one model build: its name and its files' fingerprint. Two models served under
    one name on a shared Redis read each other's blocks and answered wrongly when only the name was in it."""
    from fleetserve.engine.fingerprint import model_fingerprint
    from fleetserve.kvcache.tiers import KEY_SPACE

    return f"fleetserve:{KEY_SPACE}:{served_name}:{model_fingerprint(model_dir)}:"




def attach_prefix_cache(engine: Engine, block_size: int, engine_cache_bytes: int, l1_bytes: int,
                        l2_url: str | None, tenant_l2: dict[str, str] | None = None,
                        l2_password: str | None = None) -> None:
    """Give the engine its prefix KV cache: working set, optional L1 (CPU bytes) and L2 (Redis URL)."""
    from fleetserve.engine.prefix_cache import PrefixCache
    from fleetserve.kvcache.redis_urls import same_server_password
    from fleetserve.kvcache.tiers import L1Store, RedisStore
    from fleetserve.observe.metrics import PrefixCacheCollector

    runner = engine.runner
    if runner.sliding_window is not None:
        logging.getLogger(__name__).warning(
            "the prefix KV cache is off for this model: its sliding-window attention layers (a %d-token window, "
            "under the %d-token context) keep only the window's last positions, so a prompt's blocks cannot be "
            "stored for reuse", runner.sliding_window, runner.context_length)
        return
    if block_size >= runner.context_length:  # validate can say it only of a contextLength written in the spec
        logging.getLogger(__name__).warning(
            "--block-size %d is not below the model's context length %d: a prompt leaves one token to compute, so "
            "no block ever fills and nothing is cached; use at most %d (kvCache.blockSize)", block_size,
            runner.context_length, runner.context_length // 2)
    runner.block_size = block_size
    shape = runner.block_shape(block_size)
    block_bytes = runner.torch_dtype.itemsize
    for dim in shape:
        block_bytes *= dim
    prefix = l2_prefix(engine.settings.served_model_name, runner.path) if l2_url or tenant_l2 else ""
    cache = PrefixCache(shape, runner.torch_dtype, max(1, engine_cache_bytes // block_bytes),
                        l1=L1Store(l1_bytes) if l1_bytes else None,
                        l2=RedisStore(l2_url, prefix=prefix, password=l2_password) if l2_url else None,
                        tenant_l2={t: RedisStore(u, prefix=prefix,
                                                 password=same_server_password(u, l2_url, l2_password))
                                   for t, u in (tenant_l2 or {}).items()})
    runner.prefix_cache = cache
    engine.metrics.registry.register(PrefixCacheCollector(cache, engine.settings.served_model_name))


def run_engine(
    *,
    model: str,
    host: str,
    port: int,
    served_model_name: str | None,
    model_version: str = "1",
    namespace: str = "default",
    instance_type: str = "local",
    replica: str = "r0",
    threads: int | None = None,
    dtype: str = "auto",
    context_length: int | None = None,
    max_tokens_default: int = 512,
    max_waiting: int = 256,
    revision: str | None = None,
    block_size: int = 256,
    kv_cache: bool = True,
    engine_cache_bytes: int = 512 << 20,
    l1_bytes: int = 0,
    l2_url: str | None = None,
    max_batch: int = 8,
    prefill_chunk: int = 256,
    tenant_l2: dict[str, str] | None = None,
    internal_token_file: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    l2_password_file: str | None = None,
    log_format: str = "text",
    log_prompts: bool = False,
    drain_timeout: float = 5.0,
    orphan_drain: float | None = None,
    stream_keepalive: float = STREAM_KEEPALIVE_S,
) -> None:
    configure_logging(log_format, "engine" if log_format == "json" else f"engine[{replica}]", replica)
    if log_format == "json":
        quiet_progress_bars()
    # The generation thread and the event loop share the GIL; the default 5 ms switch interval adds up to
    # several ms per token while the loop waits to deliver it (measured: 38.7 -> 28.8 ms/token at 0.2 ms).
    sys.setswitchinterval(0.0002)
    sock = bind_port(host, port)  # before the model loads (minutes): nothing else takes the port meanwhile
    path = resolve_source(model, revision)
    runner = ModelRunner(path, dtype=dtype, threads=threads, context_length=context_length)
    name = served_model_name or path.name
    identity = ModelIdentity(namespace, name, model_version, instance_type, replica)
    engine = Engine(runner, EngineSettings(
        name, identity, max_tokens_default, max_waiting, runner.dtype, max_batch, prefill_chunk,
        size_limits=SizeLimits(max_body_bytes, max_header_bytes),
        internal_token=read_token_file(internal_token_file) if internal_token_file else None,
        log_prompts=log_prompts, stream_keepalive_s=stream_keepalive))
    if kv_cache:
        password = read_secret_file(l2_password_file) if l2_password_file else None
        attach_prefix_cache(engine, block_size, engine_cache_bytes, l1_bytes, l2_url, tenant_l2, password)
    logging.getLogger(__name__).info("serving %s (%s) on http://%s:%d", name, path, host, port)
    serve(build_app(engine), engine.stop_answers, orphan_drain, sock, host=host, port=port, log_level="warning",
          timeout_graceful_shutdown=drain_timeout,
          timeout_keep_alive=KEEP_ALIVE_S)
