"""The engines' own prefix-cache counters the router reads beside what responses report (router/watcher.py)."""

from fleetserve.router.watcher import prefix_cache_totals

VLLM = """# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="m"} 320.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 160.0
"""
SGLANG = """# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{model_name="m"} 1000.0
# TYPE sglang:cached_tokens counter
sglang:cached_tokens_total{model_name="m",cache_source="device"} 500.0
sglang:cached_tokens_total{model_name="m",cache_source="host"} 250.0
"""


def test_vllm_and_sglang_counters_give_queried_and_hit_tokens():
    """SGLang names them its own way: its replicas' hit rate stayed empty."""
    assert prefix_cache_totals(VLLM) == (320.0, 160.0)
    assert prefix_cache_totals(SGLANG) == (1000.0, 750.0)  # every cache source
    assert prefix_cache_totals("# TYPE other counter\nother_total 1\n") is None
    assert prefix_cache_totals("not { metrics") is None


class GpuEngineLike:
    """vLLM's or SGLang's answers to what the watcher asks: healthy, no KV layout, no KV events (404)."""

    def __init__(self):
        self.asked: list[str] = []

    async def get(self, url: str, timeout: float, credentials: bool = True, headers=()):
        path = "/" + url.split("/", 3)[3]
        self.asked.append(path)
        return (200, b"{}") if path == "/health" else (200, b"") if path == "/metrics" else (404, b"")

    async def get_json(self, url: str, timeout: float):
        status, _ = await self.get(url, timeout)
        return status, None

    async def aclose(self):
        pass


def test_a_replica_without_kv_events_or_layout_is_not_asked_again_every_round():
    """kvaware in front of vLLM: every probe round sent each replica a /kv/blocks and a /get_model_info that
    could only be 404s. Asked once, remembered while the replica stays in the pool."""
    import asyncio

    from fleetserve.router.gateway import Gateway, RouterSettings
    from fleetserve.router.pool import BackendPool
    from tests.virtual_loop import run_virtual

    async def scenario():
        engine = GpuEngineLike()
        pool = BackendPool(["http://10.0.0.1:8000"], interval=1.0)
        pool.client = engine
        gw = Gateway(pool, RouterSettings(strategy="kvaware"), upstream=engine)
        await gw.start()
        await asyncio.sleep(30)  # 30 probe rounds, virtual time
        await gw.stop()
        return engine.asked, gw.watcher.no_events

    asked, no_events = run_virtual(scenario())
    assert asked.count("/health") >= 25
    assert asked.count("/kv/blocks") == 1 and asked.count("/get_model_info") == 1, sorted(set(asked))
    assert no_events == {"10.0.0.1:8000"}


def test_an_older_vllm_s_counter_names_are_read_and_the_current_ones_win():
    """vLLM V1 around 0.8-0.9 publishes vllm:gpu_prefix_cache_* only: its replicas' hit rate stayed empty."""
    legacy = VLLM.replace("vllm:prefix_cache", "vllm:gpu_prefix_cache")
    assert prefix_cache_totals(legacy) == (320.0, 160.0)
    both = VLLM + legacy.replace("320.0", "999.0")  # releases that publish both: the current names
    assert prefix_cache_totals(both) == (320.0, 160.0)
