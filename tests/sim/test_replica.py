"""The replica step model: batching, prefix cache, memory shared by sequences and cache, tiers, decode runs."""

import pytest

from fleetserve.sim.core import Simulation
from fleetserve.sim.memory import BlockLRU
from fleetserve.sim.perf import PerfProfile
from fleetserve.sim.replica import ReplicaModel, Seq

PROF = PerfProfile("t", prefill_base_s=0.01, prefill_per_token_s=0.001, decode_base_s=0.02, decode_per_seq_s=0.001,
                   decode_per_ctx_token_s=0.0, cache_blocks=20, block_size=4, max_batch=8, prefill_chunk=16)


def drive(model: ReplicaModel, max_steps: int = 1) -> dict:
    """Run to idle; returns seq id -> (first token time, done time)."""
    t, out = 0.0, {}
    while (d := model.begin_step(max_steps)) is not None:
        t += d
        firsts, done = model.end_step(t)
        for s in firsts:
            out.setdefault(s.id, [None, None])[0] = t
        for s in done:
            out.setdefault(s.id, [None, None])[1] = t
    return out


def test_events_at_the_same_time_run_in_scheduling_order_and_the_clock_is_virtual():
    sim, seen = Simulation(seed=1), []
    for name in "abc":
        sim.at(5.0, seen.append, name)
    sim.at(1.0, seen.append, "first")
    sim.run()
    assert seen == ["first", "a", "b", "c"] and sim.now == 5.0


def test_an_arrival_stream_interleaves_with_events_in_time_order():
    sim, seen = Simulation(), []
    sim.at(2.0, seen.append, "event at 2")
    sim.stream([1.0, 2.0, 3.0], lambda i: seen.append(f"arrival {i}"))
    sim.run()
    assert seen == ["arrival 0", "arrival 1", "event at 2", "arrival 2"] and sim.now == 3.0 and sim.events == 4


def test_prefill_is_chunked_and_decode_batches_every_running_sequence():
    m = ReplicaModel(PROF)
    a, b = Seq(20, 3), Seq(4, 3)
    m.add(a)
    m.add(b)
    times = drive(m)
    # a needs 2 chunks (16 + 4 tokens); b's 4 tokens ride in a's second chunk: same first-token time
    assert times[a.id][0] == pytest.approx(times[b.id][0])
    assert times[a.id][1] == pytest.approx(times[b.id][1])  # then both decode in the same steps
    assert m.idle and m.reserved == 0 and m.ctx == 0


def test_a_shared_prefix_is_cached_and_computes_less():
    m = ReplicaModel(PROF)
    keys = (1, 2, 3)
    first = Seq(13, 2, keys)
    m.add(first)
    drive(m)
    again = Seq(14, 2, keys)
    m.add(again)
    drive(m)
    assert first.cached == 0 and again.cached == 12 and again.prefill_s < first.prefill_s
    assert m.hit_engine == 12 and m.queried == 27


def test_a_prompt_of_whole_blocks_computes_its_last_block_again():
    """vLLM and the built-in engine always compute at least one prompt token (the logits come from it): a prompt
    found whole reported cached == prompt here, against at most a block less live."""
    m = ReplicaModel(PROF)
    m.add(Seq(16, 2, (1, 2, 3, 4)))
    drive(m)
    whole, longer = Seq(16, 2, (1, 2, 3, 4)), Seq(17, 2, (1, 2, 3, 4))
    m.add(whole)
    drive(m)
    m.add(longer)
    drive(m)
    assert whole.cached == 12 and longer.cached == 16


def test_running_sequences_and_cache_share_memory_and_l1_l2_keep_what_the_engine_evicts():
    l2 = BlockLRU("l2", 100)
    m = ReplicaModel(PROF, l1_blocks=2, l2=l2)
    for i in range(6):  # 6 prompts x 4 blocks: more than the engine's 20 blocks with their reservations
        m.add(Seq(16, 2, tuple(range(i * 10, i * 10 + 4))))
        drive(m)
        assert len(m.cache) + m.reserved <= PROF.cache_blocks
    assert len(m.l1) == 2 and len(l2) > 0
    back = Seq(17, 2, (0, 1, 2, 3))  # the oldest prompt (and a token): evicted from the engine, still in L2
    m.add(back)
    drive(m)
    assert back.cached == 16 and back.hit_l2 + back.hit_l1 == 4 and back.load_s > 0


def test_blocks_a_running_sequence_uses_are_never_evicted_a_request_that_needs_them_waits():
    """vLLM keeps a running request's blocks out of its free queue (reference counts). Unpinned, a cold prompt's
    reservation evicted the prefix a running request was reading, and the next request for it missed."""
    m = ReplicaModel(PROF)  # 20 blocks of 4 tokens
    prefix = tuple(range(8))
    m.add(Seq(32, 2, prefix))
    drive(m)  # the prefix is cached: 8 blocks
    reader = Seq(36, 20, prefix + (100,))  # finds the prefix, reserves 6 blocks: 14 of 20 in use
    cold = Seq(24, 8, (200, 201, 202, 203, 204, 205))  # 8 blocks: fits only by evicting the prefix
    m.add(reader)
    m.add(cold)
    t, seen = 0.0, {}
    while (d := m.begin_step()) is not None:
        t += d
        firsts, done = m.end_step(t)
        for s in firsts + done:
            seen.setdefault(s.id, []).append(t)
        assert len(m.cache) + m.reserved <= PROF.cache_blocks
        if reader.state != "done":
            assert all(k in m.cache for k in prefix)  # never evicted under the reader
    assert seen[cold.id][0] > seen[reader.id][-1]  # the cold prompt waited for the reader to finish
    assert m.pins == {} and m.reserved == 0
    again = Seq(33, 2, prefix)
    m.add(again)
    drive(m)
    assert again.cached == 32


def test_a_request_that_must_wait_for_blocks_in_use_evicts_nothing():
    """vLLM checks its free blocks before touching any: evicting first threw away a reusable prefix for a request
    that waited anyway."""
    m = ReplicaModel(PROF)  # 20 blocks of 4 tokens
    kept = (50, 51)
    m.add(Seq(8, 1, kept))
    drive(m)  # 2 reusable blocks cached
    reader = Seq(36, 20, tuple(range(8)) + (100,))  # 9 blocks stored and pinned, 6 reserved
    m.add(reader)
    m.begin_step()
    m.end_step(0.1)
    big = Seq(24, 8, (200, 201, 202, 203, 204, 205))  # 8 blocks: 2 evictable are not enough while the reader runs
    m.add(big)
    m.begin_step()
    assert big.state == "waiting" and all(k in m.cache for k in kept)


def test_an_oversized_request_holds_its_blocks_only_while_it_runs():
    """Pinned, a request larger than the engine kept its 30 blocks cached after it finished, and the next request
    found them in an engine of 20 (a 1-block engine reported hits above one pooled LRU of the fleet's 4)."""
    m = ReplicaModel(PROF)
    big = Seq(120, 2, tuple(range(30)))
    m.add(big)
    drive(m)
    assert m.oversized == 1 and len(m.cache) <= PROF.cache_blocks and m.pins == {}


def test_new_blocks_are_written_through_to_l1_and_the_shared_l2_as_the_engine_writes_them():
    """The live prefix cache writes every new block to L1 and L2 in the background; the step model put blocks
    there only on eviction, so a second replica found none of a prompt the first had just computed."""
    l2 = BlockLRU("l2", 100)
    first, second = ReplicaModel(PROF, l1_blocks=8, l2=l2), ReplicaModel(PROF, l1_blocks=8, l2=l2)
    first.add(Seq(32, 2, tuple(range(8))))
    drive(first)
    assert len(first.l1) == 8 and len(l2) == 8  # nothing evicted yet, both tiers hold the prompt
    again = Seq(33, 2, tuple(range(8)))
    second.add(again)
    drive(second)
    assert again.hit_l2 == 8 and again.cached == 32
    assert len(second.l1) == 0  # loaded from L2, not computed: the engine writes only what it computed


def test_a_run_of_decode_steps_in_one_event_gives_the_same_times():
    def run(max_steps):
        m = ReplicaModel(PROF)
        seqs = [Seq(8, n) for n in (3, 9, 30)]
        for s in seqs:
            m.add(s)
        times = drive(m, max_steps)
        return [times[s.id] for s in seqs], m.busy_s

    (single, busy1), (coalesced, busy2) = run(1), run(1 << 20)
    flat = [t for pair in single for t in pair]
    assert flat == pytest.approx([t for pair in coalesced for t in pair]) and busy1 == pytest.approx(busy2)


def test_a_decode_run_can_be_cut_at_the_step_that_is_running():
    m = ReplicaModel(PROF)
    m.add(Seq(4, 50))
    m.begin_step()
    m.end_step(0.0)
    full = m.begin_step(1 << 20)
    assert m.planned_steps == 49
    j = m.steps_by(0.05)  # 0.021 s per step: the third step is running at 0.05 s
    assert j == 3 and m.truncate(j) == pytest.approx(3 * 0.021) and full == pytest.approx(49 * 0.021)
    m.end_step(0.063)
    assert m.steps == 3


def test_first_text_is_reported_at_its_token_in_single_steps_and_in_decode_runs():
    def run(max_steps):
        m = ReplicaModel(PROF)
        seqs = [Seq(8, n) for n in (3, 9, 30, 6)]
        for s, visible in zip(seqs, (1, 5, 12, 40), strict=True):  # 40 > 6 tokens: text only at the end
            s.visible = visible
            m.add(s)
        t, shown, steps_at = 0.0, {}, {}
        while (d := m.begin_step(max_steps)) is not None:
            t += d
            firsts, done = m.end_step(t)
            for s in m.shown:
                shown[s.id] = (t, m.produced(s))
            for s in done:
                steps_at[s.id] = t
        return seqs, shown, steps_at

    for max_steps in (1, 1 << 20):
        seqs, shown, done = run(max_steps)
        assert seqs[0].id not in shown  # its first token shows text: the caller uses `firsts`
        assert shown[seqs[1].id][1] == 5 and shown[seqs[2].id][1] == 12
        assert shown[seqs[3].id][0] == pytest.approx(done[seqs[3].id])  # capped at the output: the end
    (a, single, _), (b, coalesced, _) = run(1), run(1 << 20)
    assert [single[s.id][0] for s in a[1:]] == pytest.approx([coalesced[s.id][0] for s in b[1:]])


def test_a_chain_is_evicted_from_its_tail_so_what_stays_is_still_a_prefix():
    """vLLM frees a request's blocks last-first and SGLang evicts radix leaves: what a tight cache keeps of a
    prompt is its head. Evicting the first block first left the rest held and unusable (a hit of 0)."""
    m = ReplicaModel(PROF)  # 20 blocks of 4 tokens
    doc = tuple(range(100, 110))
    m.add(Seq(41, 1, doc))  # 10 blocks of prompt, 11 with the token: the cache keeps its 10 whole ones
    drive(m)
    m.add(Seq(45, 1, tuple(range(200, 211))))  # 12 blocks to reserve: two of the first prompt's must go
    drive(m)
    assert len(m.cache) + m.reserved <= PROF.cache_blocks
    assert [k in m.cache for k in doc] == [True] * 8 + [False] * 2
    again = Seq(41, 1, doc)
    m.add(again)
    drive(m)
    assert again.cached == 32  # 8 of its 10 blocks


def test_l1_and_l2_keep_a_chain_head_first_too():
    l1 = BlockLRU("l1", 6)
    l1.put((1, 2, 3, 4))
    assert l1.match((1, 2, 3, 4), touch=True) == 4
    l1.put((7, 8, 9))  # one of the first chain's blocks must go: its last
    assert l1.match((1, 2, 3, 4)) == 3 and 4 not in l1


def test_a_finished_request_releases_its_blocks_head_last_as_vllm_frees_them():
    """Eviction walks past blocks in use by moving them to the recent end: a running request's tail, met first,
    went ahead of its head (touched since by a request sharing it); once it finished, the head went first."""
    prof = PerfProfile("t", prefill_base_s=0.01, prefill_per_token_s=0.001, decode_base_s=0.02,
                       decode_per_seq_s=0.001, decode_per_ctx_token_s=0.0, cache_blocks=20, block_size=4,
                       max_batch=8, prefill_chunk=64)
    m = ReplicaModel(prof)

    def steps(n):
        for _ in range(n):
            if (d := m.begin_step(1)) is None:
                return
            m.end_step(d)

    head = (1, 2, 3, 4)
    m.add(Seq(17, 12, head))  # prefilled, then decoding a long time: its blocks are in use
    steps(2)
    m.add(Seq(9, 1, (900, 901)))
    steps(3)
    m.add(Seq(9, 1, (1, 50)))  # shares the first block only
    steps(3)
    m.add(Seq(41, 1, tuple(range(60, 70))))  # needs room: the eviction meets 4, 3, 2 in use
    steps(3)
    drive(m)
    m.add(Seq(29, 1, tuple(range(80, 87))))  # more pressure once the first request finished
    drive(m)
    again = Seq(17, 1, head)
    m.add(again)
    drive(m)
    assert again.cached > 0  # what stayed of it is its head
