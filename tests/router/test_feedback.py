"""Learning from the engines' reported cached tokens (router.feedback) and its use by prefixaware."""

import random
from collections import OrderedDict

from fleetserve.kvcache.blocks import chain_keys
from fleetserve.router import feedback
from fleetserve.router.feedback import CapacityLearner, Prediction, cached_tokens
from fleetserve.router.policies import Choice, FleetSnapshot, ReplicaView, RouteRequest, create_policy


def R(rid, **kw):
    return ReplicaView(rid, f"http://{rid}", **kw)


def req(tokens, block=16):
    return RouteRequest("/v1/completions", blocks=tuple(chain_keys(list(tokens), block)), block_tokens=block,
                        prompt_tokens=len(tokens))


def test_cached_tokens_reads_openai_usage_and_nothing_else():
    assert cached_tokens({"prompt_tokens": 90, "prompt_tokens_details": {"cached_tokens": 64}}) == 64
    assert cached_tokens({"prompt_tokens": 90}) is None
    assert cached_tokens({"prompt_tokens_details": {"cached_tokens": True}}) is None
    assert cached_tokens({"prompt_tokens_details": {"cached_tokens": -1}}) is None
    assert cached_tokens(None) is None


def pred(ages, confirmed=None, block=16, replica="a", tail=1):
    """A prediction over len(ages) keys of a prompt `tail` tokens longer than them (a prompt's end is rarely a
    whole block; when it is, the engine computes its last block again)."""
    keys = tuple(range(len(ages)))
    confirmed = tuple(confirmed if confirmed is not None else [a >= 0 for a in ages])
    return Prediction(replica, keys, tuple(ages), confirmed, block, block * len(ages) + tail, 0)


def test_the_last_block_of_a_whole_block_prompt_is_no_miss():
    """The engine computes a prompt's last token, so a prompt of whole blocks found whole reports one block less:
    read as a miss of the last key, it lowered the horizon on every repeat (analyze's partition trace: prefixaware
    0.90 -> 0.33 once the engine model left that block, as vLLM does)."""
    learner = CapacityLearner(initial=100, rate=0.1)
    # keys 0-1 found; key 2 is skipped (the engine's block size is not learned yet); key 3 ends the prompt
    assert learner.observe(pred([10, 20, 30, 40], tail=0), cached_tokens=2 * 16) == "kept"
    assert learner.horizon("a") == 100
    assert learner.observe(pred([10, 20, 30, 40], tail=1), cached_tokens=2 * 16) == "lowered"  # there it was one


def test_learner_raises_on_hits_past_the_horizon_and_lowers_on_confirmed_misses_within_it():
    learner = CapacityLearner(initial=100, rate=0.1)
    assert learner.observe(pred([150, 160, 170]), cached_tokens=3 * 16) == "raised"
    assert learner.horizon("a") >= 171  # the engine still had a block 170 keys old
    assert learner.observe(pred([10, 20, 30]), cached_tokens=3 * 16) == "kept"  # hits well inside: no news
    h = learner.horizon("a")
    near = int(h * 0.95)
    assert learner.observe(pred([near - 2, near - 1, near]), cached_tokens=3 * 16) == "raised"  # near the edge
    assert learner.horizon("a") == int(h * 1.1)
    learner.estimates["a"].horizon = h
    learner.estimates["a"].raised -= 1
    learner.estimates["a"].observations -= 1
    h = learner.horizon("a")
    assert learner.observe(pred([40, 50, 60]), cached_tokens=16) == "lowered"  # key 2 (age 50) was gone
    assert learner.horizon("a") < h
    h = learner.horizon("a")
    # a miss of a key no response has confirmed yet (an in-flight prefill raced it) is no evidence
    assert learner.observe(pred([5, 6], confirmed=[True, False]), cached_tokens=16) == "kept"
    assert learner.observe(pred([-1, -1]), cached_tokens=0) == "kept"  # never sent there: no evidence
    assert learner.horizon("a") == h
    summary = learner.summary()["a"]
    assert summary["observations"] == 5 and summary["raised"] == 1 and summary["lowered"] == 1
    assert summary["engine_block"] is None  # too few distinct counts to tell


def test_learner_reads_misses_past_the_engines_own_block_which_it_learns_from_the_counts():
    """Router keys of 16 tokens, an engine that stores whole 64-token blocks. An earlier prompt of 120 tokens
    sent keys 0-7 (confirmed), but the engine stored only its first block: tokens 64-119 were a partial one."""
    tail = [1] * 8 + [-1] * 4  # keys 0-7 sent and confirmed (young), 8-11 never sent here
    before = CapacityLearner(initial=1000, rate=0.1)
    # not knowing the block, the learner reads key 5 as evicted (it was only ever in a partial block)
    assert before.observe(pred(tail), cached_tokens=64) == "lowered" and before.horizon("a") < 1000
    learner = CapacityLearner(initial=1000, rate=0.1)
    for n in range(1, 9):  # distinct counts, every one a multiple of 64
        learner.observe(pred([-1] * 12), cached_tokens=64 * n)
    assert learner.summary()["a"]["engine_block"] == 64
    assert learner.observe(pred(tail), cached_tokens=64) == "kept" and learner.horizon("a") == 1000
    # key 8 starts a whole block past the hit: a request that carried it filled block 64-127, so the
    # engine stored it once; now it is gone: evicted
    assert learner.observe(pred([1] * 12), cached_tokens=64) == "lowered"


def test_report_ignores_what_it_cannot_learn_from():
    policy = create_policy("prefixaware")
    choice = policy.choose(req(range(64)), FleetSnapshot((R("a"), R("b"))))
    assert choice.prediction is not None and choice.prediction.replica == choice.replica.id
    assert not feedback.report(policy, choice, None)  # the engine did not say
    assert not feedback.report(create_policy("leastload"), choice, 0)  # a policy that does not learn
    assert feedback.report(policy, choice, 0)


class EngineLRU:
    """A stand-in engine: an LRU of block keys with a fixed capacity, a chain evicted from its tail; reports cached
    tokens like vLLM."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.lru = OrderedDict()

    def serve(self, request):
        n = 0
        for key in request.blocks:
            if key not in self.lru:
                break
            n += 1
        for key in reversed(request.blocks):
            self.lru[key] = None
            self.lru.move_to_end(key)
        while len(self.lru) > self.capacity:
            self.lru.popitem(last=False)
        return n * request.block_tokens


def drive(policy, engines, learn, requests=1500, seed=3):
    """Route a reuse-heavy trace over engines the router cannot see; count predictions that came true."""
    rng = random.Random(seed)
    docs = [[rng.randrange(10**9) for _ in range(16 * 12)] for _ in range(60)]
    snapshot = FleetSnapshot(tuple(R(rid) for rid in engines))  # blind: no cache_blocks, no queue
    right = 0
    for _ in range(requests):
        doc = docs[rng.randrange(len(docs))]
        request = req(doc + [rng.randrange(10**9) for _ in range(16)])
        choice = policy.choose(request, snapshot)
        cached = engines[choice.replica.id].serve(request)
        right += cached == request.prompt_tokens - choice.prefill_tokens
        if learn:
            feedback.report(policy, choice, cached)
    return right / requests


def test_prefixaware_learns_a_small_engine_cache_from_reported_hits():
    engines = {rid: EngineLRU(200) for rid in ("a", "b")}
    learning = create_policy("prefixaware")
    accuracy = drive(learning, engines, learn=True)
    horizons = {rid: learning.learner.horizon(rid) for rid in engines}
    # from 4096 (the default) down to the engine's 200 blocks in the index's unit, new keys sent: once the 60
    # documents are all remembered, about one per request (its random block), so 15-25 requests' worth
    assert all(16 <= h <= 60 for h in horizons.values()), horizons
    blind = drive(create_policy("prefixaware"), {rid: EngineLRU(200) for rid in ("a", "b")}, learn=False)
    assert accuracy > blind + 0.1  # its predictions come true far more often than the unlearned index's


def test_prefixaware_learns_a_large_engine_cache_too():
    engines = {rid: EngineLRU(20_000) for rid in ("a", "b")}
    learning = create_policy("prefixaware")
    # start from a small guess: hits past it must raise it
    learning.learner.initial = 64
    drive(learning, engines, learn=True, requests=800)
    assert all(learning.learner.horizon(rid) > 64 * 4 for rid in engines)


def test_stated_capacity_wins_over_learning():
    policy = create_policy("prefixaware")
    snapshot = FleetSnapshot((R("a", cache_blocks=50), R("b", cache_blocks=50)))
    choice = policy.choose(req(range(16 * 8)), snapshot)
    feedback.report(policy, choice, 0)
    assert policy._horizon(snapshot.replicas[0], True) == 50


def test_kvaware_without_events_passes_feedback_to_its_router_side_index():
    policy = create_policy("kvaware")
    choice = policy.choose(req(range(64)), FleetSnapshot((R("a"), R("b"))))
    assert choice.branch.startswith("no_events_") and choice.prediction is not None
    assert feedback.report(policy, choice, 0)
    assert policy.fallback.learner.summary()[choice.replica.id]["observations"] == 1


def test_a_horizon_cut_deep_by_a_passing_miss_sees_the_hits_that_raise_it_again():
    """A miss while long prompts' reservations left the engine little room cut a replica's horizon to 66 keys, and
    with 2 x H of history the index had forgotten the older keys whose hits would raise it: it stayed there."""
    policy = create_policy("prefixaware")
    snapshot = FleetSnapshot((R("a"),))  # blind: the horizon is learned
    rng = random.Random(7)
    doc = [rng.randrange(10**9) for _ in range(16 * 8)]
    feedback.report(policy, policy.choose(req(doc + [1]), snapshot), 0)
    for _ in range(100):  # 400 newer keys
        policy.choose(req([rng.randrange(10**9) for _ in range(16 * 4)]), snapshot)
    policy.learner.observe(pred([10, 20, 30]), cached_tokens=16)  # a passing miss at age 30
    assert policy.learner.horizon("a") == 30
    for _ in range(10):  # and more traffic: the document is past 2 x H now
        policy.choose(req([rng.randrange(10**9) for _ in range(16 * 4)]), snapshot)
    again = policy.choose(req(doc + [2]), snapshot)
    assert again.prediction.predicted_tokens == 0 and min(again.prediction.ages) > 400  # not predicted, but known
    assert policy.learner.observe(again.prediction, cached_tokens=16 * 8) == "raised"  # the engine still held it
    assert policy.learner.horizon("a") > 400


def test_a_predicted_hit_reported_as_a_miss_takes_that_prefix_out_of_the_predictions():
    policy = create_policy("prefixaware")
    snapshot = FleetSnapshot((R("a"),))  # blind: the horizon is learned
    rng = random.Random(5)
    doc_a, doc_b = ([rng.randrange(10**9) for _ in range(16 * 8)] for _ in range(2))
    for doc in (doc_b, doc_a):  # both sent to a (b first), both confirmed stored by a response
        feedback.report(policy, policy.choose(req(doc + [1]), snapshot), 0)
    for _ in range(40):  # 160 newer keys: a's LRU may have dropped both documents by now
        policy.choose(req([rng.randrange(10**9) for _ in range(16 * 4)]), snapshot)
    hit = policy.choose(req(doc_a + [2]), snapshot)
    assert hit.branch == "hit" and hit.prediction.predicted_tokens == 16 * 8  # the index still predicts it
    assert policy.learner.observe(hit.prediction, 0) == "lowered"  # the engine: a miss
    # b, older than a's missed block, is out of the predictions now (a itself was just sent again: it is back)
    miss = policy.choose(req(doc_b + [3]), snapshot)
    assert miss.branch == "miss" and miss.prediction.predicted_tokens == 0


def test_record_reports_and_exports_predicted_against_reported_per_replica():
    from fleetserve.observe.metrics import RouterMetrics

    metrics = RouterMetrics()
    policy = create_policy("prefixaware")
    snapshot = FleetSnapshot((R("a"),))
    doc = list(range(16 * 4))
    assert feedback.record(metrics, policy, policy.choose(req(doc + [1]), snapshot), 0, 65)
    choice = policy.choose(req(doc + [2]), snapshot)
    assert choice.prediction.predicted_tokens == 64
    assert feedback.record(metrics, policy, choice, 32, 65)  # the engine found half of the predicted hit

    def value(name, **labels):
        return metrics.registry.get_sample_value(name, labels)

    assert value("fleetserve_router_backend_cached_tokens_total", backend="a", source="predicted") == 64
    assert value("fleetserve_router_backend_cached_tokens_total", backend="a", source="reported") == 32
    assert value("fleetserve_router_backend_prompt_tokens_total", backend="a") == 130
    assert value("fleetserve_router_cached_tokens_total", policy="prefixaware", source="reported") == 32
    assert value("fleetserve_router_backend_cache_horizon_blocks", backend="a") == policy.learner.horizon("a")
    assert not feedback.record(metrics, policy, choice, None, 65)  # no usage: nothing counted
    assert value("fleetserve_router_backend_prompt_tokens_total", backend="a") == 130
    # kvaware on engine events predicts without a Prediction: the routed request's tokens give the figure
    kv_choice = Choice(snapshot.replicas[0], "hit", prefill_tokens=16)
    assert not feedback.record(metrics, create_policy("kvaware"), kv_choice, 48, 64, routed_prompt_tokens=64)
    assert value("fleetserve_router_backend_cached_tokens_total", backend="a", source="predicted") == 64 + 48
