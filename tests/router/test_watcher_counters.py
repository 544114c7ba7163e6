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
