"""The router's KV index keeps every tier a block is in: an L2 copy must not demote a block the engine holds."""

from fleetserve.router.kvindex import TIER_CREDIT, KVIndex


def test_a_block_written_to_l2_keeps_engine_credit_until_the_engine_evicts_it():
    index = KVIndex()
    keys = [1, 2, 3]
    index.stored("a", keys, "engine")
    index.stored("a", keys, "l2")  # the engine's background write to Redis
    assert index.tiers("a", 1) == {"engine", "l2"}
    assert index.credit("a", tuple(keys), now=0.0) == 3 * TIER_CREDIT["engine"]
    index.removed("a", [1], "engine")  # the engine evicts key 1: its L2 copy still counts, as L2
    assert index.tiers("a", 1) == {"l2"}
    assert index.credit("a", tuple(keys), now=0.0) == TIER_CREDIT["l2"] + 2 * TIER_CREDIT["engine"]
    index.removed("a", [2], "l1")  # a tier that does not hold it: nothing changes
    assert index.tiers("a", 2) == {"engine", "l2"}
    index.removed("a", [1], "l2")  # Redis evicted it too: the prefix now misses at its first block
    assert index.tiers("a", 1) == set() and index.credit("a", tuple(keys), now=0.0) == 0.0
    assert index.size("a") == 2


def test_best_tier_counts_and_removed_without_tier_drops_every_copy():
    index = KVIndex()
    index.stored("a", [1], "l2")
    index.stored("a", [1], "l1")
    assert index.credit("a", (1,), now=0.0) == TIER_CREDIT["l1"]
    index.removed("a", [1])
    assert index.size("a") == 0
    index.replace("a", {5: "l2", 6: ["engine", "l1"]})
    assert index.tiers("a", 5) == {"l2"} and index.tiers("a", 6) == {"engine", "l1"}
    assert index.credit("a", (5, 6), now=0.0) == TIER_CREDIT["l2"] + TIER_CREDIT["engine"]
