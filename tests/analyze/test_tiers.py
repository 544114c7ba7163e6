"""The tier figures follow the engines' write-through (every stored block is copied into the replica's L1 and the
shared L2): a tier adds only what it holds beyond the memory in front of it. Added end to end, a 32 GiB L1 smaller
than the engine's own memory read as +22 points, and "L1+L2" was advised on a trace where the simulator with those
tiers found no hit at all."""

import json

import pytest

from fleetserve.analyze.report import analyze


@pytest.fixture(scope="module")
def far_reuse(tmp_path_factory):
    """100 documents of 70 blocks, sent twice in the same order: every block returns 7,000 blocks later, beyond a
    4-replica fleet's engine memory (4 x 896 blocks of the default profile) and the default L2 (4,096)."""
    path = tmp_path_factory.mktemp("tiers") / "far.jsonl"
    docs = [[d * 1000 + j for j in range(70)] for d in range(100)]
    with path.open("w") as f:
        for i in range(200):
            ids = docs[i % 100]
            f.write(json.dumps({"timestamp": i * 1000, "input_length": len(ids) * 512, "output_length": 8,
                                "hash_ids": ids}) + "\n")
    return path


def test_tiers_smaller_than_the_memory_before_them_add_nothing(far_reuse):
    out = analyze(far_reuse)
    tiers = out["tiers"]
    assert tiers["l1_blocks_per_replica"] < out["cache_blocks_per_replica"]
    assert tiers["engine+l1"]["blocks"] == tiers["engine"]["blocks"]  # copies, not more blocks
    assert tiers["engine+l1+l2"]["hit_rate"] == 0.0
    assert out["recommendation"]["summary"] == "caching will not pay"


def test_an_l2_larger_than_the_reuse_distance_is_advised_alone(far_reuse):
    out = analyze(far_reuse, l2_gib=512)
    assert out["tiers"]["engine+l1+l2"]["hit_rate"] == pytest.approx(0.5, abs=0.01)
    rec = out["recommendation"]
    assert rec["tiers"] == "L2 only" and any("holds copies" in r for r in rec["reasons"])


def test_an_l1_larger_than_the_engines_memory_comes_with_cache_aware_routing(far_reuse):
    """The L1s are per replica: with leastload a repeat lands elsewhere (the simulator: 0.0 with a 160 GiB L1 under
    leastload, 0.49 under prefixaware), though engine memory alone shows no routing gain."""
    out = analyze(far_reuse, l1_gib=160)
    rec = out["recommendation"]
    assert rec["tiers"] == "L1 only" and rec["strategy"] == "prefixaware"
    assert "per replica" in rec["reasons"][-1]


def test_one_replica_gets_no_routing_advice_it_cannot_use(far_reuse):
    """With one replica every strategy sends it everything: "L1 only with prefixaware", because "the L1s are per
    replica", was advised where routing has no choice."""
    out = analyze(far_reuse, l1_gib=640, replicas=1)
    rec = out["recommendation"]
    assert rec["strategy"] == "leastload" and "one replica" in rec["reasons"][-1], rec
