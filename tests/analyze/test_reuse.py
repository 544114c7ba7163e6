from collections import OrderedDict

import pytest

from fleetserve.analyze.reuse import COLD, HitCurve, ideal_reuse, stack_distances
from fleetserve.traces.generate import WorkloadSpec, generate


def lru_hits(keys, capacity: int) -> int:
    """The plain LRU the curve must agree with: a request looked up first, then its blocks touched last first
    (`touch_chain`)."""
    lru, hits = OrderedDict(), 0
    for ks in keys:
        hits += sum(k in lru for k in ks)
        for k in reversed(ks):
            lru[k] = None
            lru.move_to_end(k)
        while len(lru) > capacity:
            lru.popitem(last=False)
    return hits


def test_ideal_counts_blocks_seen_in_earlier_requests():
    keys = [(1, 2, 3), (1, 2, 4), (5,), (1, 9, 3)]
    ideal = ideal_reuse(keys, [1536, 1536, 100, 1536], 512)
    assert ideal.hit_rate == pytest.approx(4 / 10)  # 1,2 | 1 and 3 (3 anywhere in the prompt)
    assert ideal.prefix_hit_rate == pytest.approx(3 / 10)  # leading runs only: 1,2 | 1
    assert ideal.unique_blocks == 6 and ideal.requests_with_hit == pytest.approx(2 / 4)


def test_stack_distances_give_the_lru_hit_rate_at_every_size():
    reqs = generate(WorkloadSpec.for_kind("chat", duration_s=400, rate=3, seed=11))
    keys = [r.hash_ids for r in reqs]
    distances = stack_distances(keys)
    assert len(distances) == sum(len(k) for k in keys)
    curve = HitCurve(distances)
    for capacity in (1, 4, 16, 50, 200, 10_000):
        assert curve.hit_rate(capacity) * curve.total == lru_hits(keys, capacity), capacity
    ideal = ideal_reuse(keys, [r.input_tokens for r in reqs], 512)
    points = curve.points(ideal.unique_blocks)
    assert points[-1]["hit_rate"] == pytest.approx(ideal.hit_rate, abs=1e-4)
    rates = [p["hit_rate"] for p in points]
    assert rates == sorted(rates) and rates[0] < rates[-1]


def test_distance_is_distinct_blocks_in_between():
    # a request is looked up before its own touches; (1, 2, 1) touches 1, 2, 1, so 2 has 1 after it
    assert stack_distances([(1, 2, 1), (3, 2)]) == [COLD, COLD, COLD, COLD, 1]
    assert stack_distances([(1, 2, 3), (4,), (1, 2, 3)]) == [COLD] * 4 + [1, 2, 3]  # the head outlives the tail


def test_a_document_longer_than_the_cache_keeps_its_first_blocks():
    """Looked up as each block was touched, in prompt order, a prompt's own first blocks counted against its later
    ones: a 10-block document asked again missed whole in a cache of 8 that held 8 of its blocks."""
    doc = tuple(range(1, 11))
    distances = stack_distances([doc, doc])
    assert distances[10:] == list(range(10))  # block j has the j blocks before it touched after it
    assert HitCurve(distances).hit_rate(8) * 20 == 8  # its first 8 blocks: a prefix


def test_a_weighted_curve_counts_tokens():
    from fleetserve.analyze.reuse import HitCurve, block_tokens_of

    keys = [(1, 2), (1, 3)]
    weights = block_tokens_of(keys, [300, 300], 256)
    assert weights == [256, 0, 256, 0]  # an engine caches whole blocks: the 44-token tail is never a hit
    curve = HitCurve(stack_distances(keys), weights, total=600)
    assert curve.hit_rate(10) == 256 / 600  # the shared whole block, by its tokens
    # prompt logs key whole blocks only: the tail no key covers still counts in the prompt's tokens
    full_only = [(1,)] * 20
    curve = HitCurve(stack_distances(full_only), block_tokens_of(full_only, [300] * 20, 256), total=300 * 20)
    assert curve.hit_rate(10) == pytest.approx(19 * 256 / (20 * 300))
    assert curve.hit_rate(10) <= ideal_reuse(full_only, [300] * 20, 256).token_hit_rate + 1e-12


def test_a_block_computed_partial_saves_no_more_than_it_holds():
    """A trace that reuses a partial last block's id as a fuller block: 88 tokens were computed under id 2, and the
    later request was credited its 488 (token hit rate 0.625 where at most 600 of 1,600 tokens were ever cached)."""
    from fleetserve.analyze.reuse import HitCurve, block_tokens_of

    keys, prompts = [(1, 2), (1, 2)], [600, 1000]
    assert ideal_reuse(keys, prompts, 512).token_hit_rate == pytest.approx(600 / 1600)
    weights = block_tokens_of(keys, prompts, 512)
    assert weights == [512, 0, 512, 0]  # and a partial block, whatever it holds, is no engine's hit
    assert HitCurve(stack_distances(keys), weights, total=1600).hit_rate(10) == pytest.approx(512 / 1600)


def test_a_prompt_of_whole_blocks_saves_all_but_its_last():
    """The engine computes the prompt's last token, so its last block is computed again (the simulator's engines
    and the live one do): counted, the oracle was a block per prompt above what any strategy could reach."""
    from fleetserve.analyze.reuse import block_tokens_of

    assert block_tokens_of([(1, 2), (1, 2)], [1024, 1025], 512) == [512, 0, 512, 512]


def test_first_accesses_miss_at_any_size_even_a_huge_one():
    curve = HitCurve(stack_distances([(1, 2), (1, 2)]))
    assert curve.hit_rate(10**20) == curve.hit_rate(10**6) == 0.5


def test_a_block_never_hits_where_its_parent_misses():
    """Looked up before its own touches, which go last first: a parent's distance never exceeds its child's, so
    per-block hits are prefix hits."""
    reqs = generate(WorkloadSpec.for_kind("rag", duration_s=300, rate=3, seed=4))
    keys = [r.hash_ids for r in reqs]
    distances = iter(stack_distances(keys))
    for ks in keys:
        d = [next(distances) for _ in ks]
        assert all(d[i] <= d[i + 1] for i in range(len(d) - 1) if d[i + 1] != COLD)
