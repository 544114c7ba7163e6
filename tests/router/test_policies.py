"""Routing policies in isolation: frozen snapshots in, choices out, no I/O and no clock."""

from collections import Counter

import pytest

from fleetserve.kvcache.blocks import chain_keys
from fleetserve.router.kvindex import KVIndex
from fleetserve.router.policies import (
    FleetSnapshot,
    ReplicaView,
    RouteRequest,
    create_policy,
    registered_policies,
)


def snap(*replicas, now=0.0, kv=None):
    return FleetSnapshot(tuple(replicas), now, kv)


def R(rid, **kw):
    return ReplicaView(rid, f"http://{rid}", **kw)


def req(tokens=(), block=16, **kw):
    tokens = list(tokens)
    return RouteRequest("/v1/completions", blocks=tuple(chain_keys(tokens, block)), block_tokens=block,
                        prompt_tokens=len(tokens), **kw)


def test_registry_lists_names_and_rejects_unknown():
    assert set(registered_policies()) == {"roundrobin", "leastload", "session", "prefixaware", "kvaware"}
    with pytest.raises(ValueError, match="allowed: .*roundrobin"):
        create_policy("fastest")


def test_roundrobin_rotates_over_healthy_only():
    policy = create_policy("roundrobin")
    s = snap(R("a"), R("b", healthy=False), R("c"))
    picks = Counter(policy.choose(RouteRequest("/"), s).replica.id for _ in range(10))
    assert picks == {"a": 5, "c": 5}


def test_leastload_prefers_idle_and_uses_reported_queue():
    policy = create_policy("leastload")
    s = snap(R("a", in_flight=3), R("b", in_flight=0, waiting=5), R("c", in_flight=1))
    assert policy.choose(RouteRequest("/"), s).replica.id == "c"


@pytest.mark.parametrize("name", ["roundrobin", "leastload", "session", "prefixaware", "kvaware"])
def test_excluded_and_empty(name):
    policy = create_policy(name)
    s = snap(R("a"), R("b"))
    assert policy.choose(RouteRequest("/", excluded=frozenset({"a"})), s).replica.id == "b"
    assert policy.choose(RouteRequest("/", excluded=frozenset({"a", "b"})), s) is None
    assert policy.choose(RouteRequest("/"), snap()) is None


def session_req(user, **kw):
    return RouteRequest("/v1/chat/completions", body={"user": user}, **kw)


def test_session_sticks_and_spreads_users():
    policy = create_policy("session")
    s = snap(R("a"), R("b"), R("c"))
    homes = {u: policy.choose(session_req(u), s).replica.id for u in (f"user{i}" for i in range(60))}
    assert all(policy.choose(session_req(u), s).replica.id == home for u, home in homes.items())
    assert set(Counter(homes.values())) == {"a", "b", "c"}
    assert policy.choose(session_req("user1"), s).branch == "sticky"


def test_session_key_from_configured_header():
    policy = create_policy("session", session_key="x-tenant-session")
    s = snap(R("a"), R("b"))
    one = policy.choose(RouteRequest("/", headers={"x-tenant-session": "s1"}), s)
    assert all(policy.choose(RouteRequest("/", headers={"x-tenant-session": "s1"}), s).replica.id == one.replica.id
               for _ in range(5))
    assert policy.choose(RouteRequest("/"), s).branch == "no_key"


def test_session_falls_back_when_sticky_replica_dies_and_only_its_sessions_move():
    policy = create_policy("session")
    full = snap(R("a"), R("b"), R("c"))
    homes = {f"u{i}": policy.choose(session_req(f"u{i}"), full).replica.id for i in range(90)}
    without_b = snap(R("a"), R("b", healthy=False), R("c"))
    moved = {u: policy.choose(session_req(u), without_b) for u in homes}
    for user, choice in moved.items():
        if homes[user] == "b":
            assert choice.replica.id in ("a", "c") and choice.branch == "reassigned"
        else:
            assert choice.replica.id == homes[user] and choice.branch == "sticky"  # others do not move


def test_session_reassigns_when_sticky_replica_is_overloaded():
    policy = create_policy("session", overload_abs=4, overload_rel=2.0)
    calm = snap(R("a"), R("b"))
    user = next(u for u in (f"u{i}" for i in range(50)) if policy.choose(session_req(u), calm).replica.id == "a")
    busy = snap(R("a", in_flight=10), R("b", in_flight=0))
    choice = policy.choose(session_req(user), busy)
    assert choice.replica.id == "b" and choice.branch == "overload_fallback"


def test_prefixaware_follows_the_prefix_and_spreads_misses():
    policy = create_policy("prefixaware")
    s = snap(R("a"), R("b"), R("c"), R("d"))
    doc = list(range(1000, 1000 + 16 * 20))
    first = policy.choose(req(doc + [1, 2]), s)
    assert first.branch == "miss"
    again = policy.choose(req(doc + [3, 4]), s)
    assert again.replica.id == first.replica.id and again.branch == "hit"
    assert again.prefill_tokens == 2  # only the unshared tail is expected to be computed
    # cold prompts spread over replicas instead of piling on one
    misses = Counter(policy.choose(req(list(range(k * 1000, k * 1000 + 64))), s).replica.id for k in range(40))
    assert len(misses) == 4


def test_prefixaware_spreads_a_hot_prefix_when_its_replica_is_backed_up():
    policy = create_policy("prefixaware")
    doc = list(range(16 * 8))
    s = snap(R("a"), R("b"))
    home = policy.choose(req(doc), s).replica.id
    other = "b" if home == "a" else "a"
    backed_up = snap(R(home, prefill_backlog=10_000, in_flight=20), R(other))
    choice = policy.choose(req(doc), backed_up)
    assert choice.replica.id == other and choice.branch == "load_over_hit"


def test_prefixaware_index_memory_is_bounded():
    policy = create_policy("prefixaware")
    s = snap(R("a", cache_blocks=100), R("b", cache_blocks=100))
    import random

    rng = random.Random(1)
    for _ in range(2000):  # a long random trace: every prompt new
        policy.choose(req([rng.randrange(10**9) for _ in range(64)]), s)
    assert policy.index_size() <= 200


def test_kvaware_uses_engine_events_with_tier_credit_and_speculation():
    index = KVIndex(speculative_ttl=2.0)
    tokens = list(range(16 * 10))
    keys = chain_keys(tokens, 16)
    index.stored("b", keys, "engine")
    index.stored("c", keys, "l2")
    policy = create_policy("kvaware")
    s = snap(R("a"), R("b"), R("c"), now=10.0, kv=index)
    choice = policy.choose(req(tokens + [7]), s)
    assert choice.replica.id == "b" and choice.branch == "hit" and choice.prefill_tokens == 1
    index.removed("b", keys)
    choice = policy.choose(req(tokens + [7]), snap(R("a"), R("b"), R("c"), now=10.5, kv=index))
    # b's events say gone, but the router just sent this prefix to b: the speculative entry still counts
    assert choice.replica.id == "b"
    later = snap(R("a"), R("b"), R("c"), now=20.0, kv=index)
    choice = policy.choose(req(tokens + [7]), later)
    assert choice.replica.id == "c"  # speculation expired; the L2 copy gets partial credit


def test_kvaware_without_events_falls_back_to_router_index():
    policy = create_policy("kvaware")
    choice = policy.choose(req(list(range(64))), snap(R("a"), R("b")))
    assert choice.branch.startswith("no_events_")


def test_cache_aware_balance_guard_moves_a_small_stake_off_a_busy_holder():
    policy = create_policy("prefixaware")
    shared = list(range(16 * 4))
    home = policy.choose(req(shared + list(range(500, 756))), snap(R("a"), R("b"), R("c"))).replica.id
    # the holder is only two requests busier than the others: still the hit wins
    views = {rid: R(rid, in_flight=2 if rid == home else 1) for rid in "abc"}
    assert policy.choose(req(shared + list(range(600, 856))), snap(*views.values())).replica.id == home
    # busier than the mean + 1, and a fifth of the prompt is at stake: the request goes elsewhere
    views = {rid: R(rid, in_flight=4 if rid == home else 1) for rid in "abc"}
    choice = policy.choose(req(shared + list(range(700, 956))), snap(*views.values()))
    assert choice.replica.id != home and choice.branch == "load_over_hit"
    off = create_policy("prefixaware", balance_rel=0)  # the guard off: the hit outweighs the queue
    off.choose(req(shared + list(range(500, 756))), snap(R(home)))
    assert off.choose(req(shared + list(range(700, 956))), snap(*views.values())).replica.id == home


def test_balance_guard_yields_for_a_long_prefix_few_requests_share():
    policy = create_policy("prefixaware")
    document = list(range(1000, 1000 + 16 * 8))
    home = policy.choose(req(document + [1]), snap(R("a"), R("b"), R("c"))).replica.id
    for i in range(20):  # other traffic: the document is not a large share of it
        policy.choose(req(list(range(5000 + 100 * i, 5000 + 100 * i + 40))), snap(R("a"), R("b"), R("c")))
    # its holder is busier than the mean + 1, but elsewhere the whole document would be recomputed: the TTFT
    # estimate decides, and the hit wins
    views = {rid: R(rid, in_flight=4 if rid == home else 1) for rid in "abc"}
    choice = policy.choose(req(document + [2]), snap(*views.values()))
    assert choice.replica.id == home and choice.branch == "hit"
    # much busier: the queue behind the hit costs more than recomputing it elsewhere
    views = {rid: R(rid, in_flight=4 if rid == home else 1, prefill_backlog=5000 if rid == home else 0)
             for rid in "abc"}
    assert policy.choose(req(document + [3]), snap(*views.values())).replica.id != home
    # with the stake exception off, the guard moves it at once
    strict = create_policy("prefixaware", balance_stake=0)
    strict.choose(req(document + [1]), snap(R(home)))
    views = {rid: R(rid, in_flight=4 if rid == home else 1) for rid in "abc"}
    assert strict.choose(req(document + [2]), snap(*views.values())).replica.id != home


def test_prefix_popularity_finds_the_leading_keys_much_of_the_traffic_carries():
    from fleetserve.router.policies.popularity import PrefixPopularity

    pop = PrefixPopularity(window=8, hot_share=0.6, sample=8)
    for i in range(8):  # every request carries s1 s2; half carry d; each its own tail
        pop.add(("s1", "s2", "d", f"t{i}") if i % 2 else ("s1", "s2", f"u{i}"))
    assert pop.hot_depth(("s1", "s2", "d", "x"), replicas=4) == 3  # d: 4 of 8, the bar 2
    assert pop.hot_depth(("s1", "s2", "d", "x"), replicas=1) == 2  # one replica: the bar is 5
    assert pop.hot_depth(("z", "s1"), replicas=4) == 0  # the scan stops at the first key below the bar
    assert pop.hot_keys(replicas=4) == 3 and pop.hot_keys(replicas=1) == 2  # s1, s2 (and d at the lower bar)
    for i in range(8):
        pop.add((f"n{i}",))  # the old requests leave the window, and their counts with them
    assert pop.hot_depth(("s1",), replicas=4) == 0 and pop.carried("s1") == 0 and len(pop._counts) == 8
    assert pop.hot_keys(replicas=4) == 0  # the replica count changed since the last count: recounted


def test_a_prefix_every_request_carries_reaches_a_replica_that_never_had_it():
    policy = create_policy("prefixaware")
    system = list(range(16 * 8))
    replicas = [R("a"), R("b"), R("c"), R("d")]
    # sequential, idle fleet: without the credit the first holder would get them all
    warm = [policy.choose(req(system + [100 + i, 200 + i]), snap(*replicas)) for i in range(40)]
    counts = Counter(policy.choose(req(system + [1000 + i]), snap(*replicas)).replica.id for i in range(200))
    assert set(counts) == {"a", "b", "c", "d"} and min(counts.values()) > 20
    # each of the three copies is the credit's doing, not a holder too busy (the label said "load_over_hit")
    branches = Counter(c.branch for c in warm)
    assert branches["hot_copy"] == 3 and "load_over_hit" not in branches, branches


def test_hot_prefixes_that_would_crowd_the_caches_stay_with_their_holders():
    """The same traffic as above, on replicas that state caches of 10 blocks: the 8-block prefix every request
    carries would take most of each; copying it everywhere would evict the rest, so it is not credited."""
    policy = create_policy("prefixaware")
    system = list(range(16 * 8))
    replicas = [R(rid, cache_blocks=10) for rid in "abcd"]
    for i in range(40):
        policy.choose(req(system + [100 + i, 200 + i]), snap(*replicas))
    counts = Counter(policy.choose(req(system + [1000 + i]), snap(*replicas)).replica.id for i in range(200))
    assert counts.most_common(1)[0][1] == 200  # idle fleet, one holder: the hit decides
    roomy = create_policy("prefixaware")
    replicas = [R(rid, cache_blocks=100) for rid in "abcd"]
    for i in range(40):
        roomy.choose(req(system + [100 + i, 200 + i]), snap(*replicas))
    assert len({roomy.choose(req(system + [1000 + i]), snap(*replicas)).replica.id for i in range(200)}) == 4


def test_on_a_large_fleet_a_prefix_seen_once_or_twice_is_not_hot():
    """0.5 x 256 / 128 = 1: every prefix seen once was credited to all 128 replicas."""
    from fleetserve.router.policies.popularity import PrefixPopularity

    pop = PrefixPopularity()
    for i in range(256):
        pop.add((f"once{i}",) if i % 2 else ("shared", f"t{i}") if i < 6 else (f"other{i}",))
    assert pop.hot_depth(("once1",), replicas=128) == 0 and pop.hot_depth(("shared",), replicas=128) == 1
    assert pop.hot_keys(replicas=128) == 1


def test_prefix_popularity_counts_only_the_leading_keys_of_a_huge_prompt():
    from fleetserve.router.policies.popularity import MAX_KEYS, PrefixPopularity

    pop = PrefixPopularity(window=4, sample=1)
    huge = tuple(range(MAX_KEYS * 4))
    for _ in range(4):
        pop.add(huge)
    assert len(pop._counts) == MAX_KEYS  # memory bounded by the window, not by what a client sends
    assert pop.hot_depth(huge, replicas=1) == MAX_KEYS


def test_a_stale_report_does_not_outweigh_the_routers_own_count():
    """A replica's health report is up to an interval old and the router's in-flight count is fresh: taking the
    larger kept a drained replica "busy" (informed leastload's TTFT p95 3.4 x roundrobin's on identical
    requests). The report counts for what it held beyond ours then: another router's requests."""
    from fleetserve.router.policies.base import ReplicaView

    drained = ReplicaView("a", "http://a", running=3, in_flight=0, reported_in_flight=3)
    assert drained.load == 0
    shared = ReplicaView("b", "http://b", running=4, waiting=1, in_flight=1, reported_in_flight=2)
    assert shared.load == 1 + 3  # ours now, and the 3 of another router's the report held
    unknown = ReplicaView("c", "http://c", running=3, in_flight=1)  # no time for the report: the larger
    assert unknown.load == 3
    policy = create_policy("leastload")
    choice = policy.choose(req([1, 2]), snap(R("busy", in_flight=1), ReplicaView("drained", "http://d", running=3,
                                                                                 reported_in_flight=3)))
    assert choice.replica.id == "drained"


def test_the_cost_score_reads_only_the_queue_beyond_our_requests():
    """The cost score's backlog took the whole reported queue: informed prefixaware and kvaware still saw a drained
    replica as busy until the next probe."""
    from fleetserve.router.policies.base import ReplicaView
    from fleetserve.router.policies.cost import CostWeights, ttft_cost

    w = CostWeights()
    drained = ReplicaView("a", "http://a", in_flight=0, waiting=3, running=1, reported_in_flight=4)
    busy = ReplicaView("b", "http://b", in_flight=1, prefill_backlog=100)
    assert ttft_cost(drained, 100, 0, w) < ttft_cost(busy, 100, 0, w)
    shared = ReplicaView("c", "http://c", in_flight=1, waiting=3, running=1, reported_in_flight=2)  # 2 others'
    assert ttft_cost(shared, 0, 0, w) == 2 * w.reported_weight + w.decode_weight * shared.load


def test_prefixaware_forgets_a_prompt_from_its_tail_as_the_engines_evict_it():
    """The engines evict a chain from its tail (`kvcache.prefix_match.touch_chain`); an index that forgot the
    head first predicted no hit at all for a prompt whose first blocks the engine still held."""
    policy = create_policy("prefixaware")
    s = snap(R("a", cache_blocks=10))
    doc = list(range(8 * 16))
    policy.choose(req(doc), s)
    policy.choose(req(range(10**6, 10**6 + 3 * 16)), s)  # three more blocks: one of the doc's must go
    assert policy.choose(req(doc + [1]), s).prefill_tokens == 16 + 1  # its first 7 blocks are still predicted


def test_replica_view_init_keeps_every_field_and_stays_frozen():
    """ReplicaView writes its fields itself (speed): the hand-written __init__ must take every dataclass field, in
    order, with the same defaults, compute the load, and leave the view immutable and replace()-able."""
    import dataclasses
    import inspect

    fields = [f for f in dataclasses.fields(ReplicaView) if f.init]
    params = list(inspect.signature(ReplicaView.__init__).parameters.values())[1:]
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [f.default if f.default is not dataclasses.MISSING
                                           else inspect.Parameter.empty for f in fields]
    view = ReplicaView("r0", "u", True, 2, 3, 4, 100, 8, None)
    assert view.load == 7  # the report (3 + 4) is larger than ours (2)
    assert ReplicaView("r0", "u", True, 2, 3, 4, reported_in_flight=1).load == 2 + 6
    same = ReplicaView("r0", "u", True, 2, 3, 4, 100, 8)
    assert view == same and hash(view) == hash(same)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.in_flight = 1
    moved = dataclasses.replace(view, in_flight=9)
    assert moved.load == 9 and moved.prefill_backlog == 100 and view.in_flight == 2
