"""Continuous batching: same tokens as one-at-a-time, rows join and leave, prefill does not starve decodes."""

import asyncio
import random
import threading

import pytest
import torch

from fleetserve.api.protocol import SamplingParams
from fleetserve.engine.batching import BatchScheduler, SlotCache
from fleetserve.engine.runner import ModelRunner
from fleetserve.engine.scheduler import Job


@pytest.fixture(scope="module")
def runner(slow_model):
    return ModelRunner(slow_model, threads=1)


def serial_tokens(runner, prompt, n, sampling):
    out = []
    runner.generate(prompt, sampling, n, lambda t: (out.append(t), True)[1], threading.Event())
    return out


async def collect(job):
    tokens = 0
    while True:
        event = await job.events.get()
        if event[0] == "token":
            tokens += 1
        elif event[0] == "done":
            return event
        else:
            raise AssertionError(event)


def run_batched(runner, prompts, n, sampling, **kw):
    captured: list[list[int]] = [[] for _ in prompts]

    async def main():
        loop = asyncio.get_running_loop()
        sched = BatchScheduler(runner, **kw)
        original = sched._accept

        def spy(row, logits):
            keep = original(row, logits)
            captured[row.job.index].append(row.last if keep or row.produced else -1)
            return keep

        sched._accept = spy
        sched.start()
        jobs = []
        for i, p in enumerate(prompts):
            job = Job(p, sampling, n, loop)
            job.index = i
            jobs.append(job)
            sched.submit(job)
        done = [await collect(j) for j in jobs]
        sched.stop()
        return done

    return asyncio.run(main()), captured


def test_batched_tokens_equal_one_at_a_time(runner):
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 250) for _ in range(length)] for length in (5, 300, 37, 120, 9, 260)]
    sampling = SamplingParams(temperature=0, ignore_eos=True)
    expected = [serial_tokens(runner, p, 12, sampling) for p in prompts]
    done, captured = run_batched(runner, prompts, 12, sampling, max_batch=3, prefill_chunk=32)
    assert [d[1] for d in done] == ["length"] * len(prompts)
    assert captured == expected  # six requests through three slots: rows joined, left and were re-packed


def test_seeded_sampling_matches_too(slow_model):
    # float32: in bfloat16 (chosen automatically on CPUs with AVX-512 BF16) batched and single-row kernels round
    # differently, and a sampled (not greedy) token can flip on the last bit of a logit
    runner = ModelRunner(slow_model, threads=1, dtype="float32")
    prompts = [[7, 8, 9, 10] * 10, [11, 12] * 30]
    sampling = SamplingParams(temperature=0.9, top_p=0.9, seed=42, ignore_eos=True)
    expected = [serial_tokens(runner, p, 10, sampling) for p in prompts]
    _, captured = run_batched(runner, prompts, 10, sampling, max_batch=4, prefill_chunk=16)
    assert captured == expected


def test_long_prefill_does_not_starve_running_decodes(runner):
    sampling = SamplingParams(temperature=0, ignore_eos=True)

    async def main():
        loop = asyncio.get_running_loop()
        sched = BatchScheduler(runner, max_batch=4, prefill_chunk=16)
        sched.start()
        a = Job([1, 2, 3], sampling, 400, loop)
        sched.submit(a)
        await a.events.get()  # A is decoding
        b = Job(list(range(1, 250)) * 2, sampling, 2, loop)  # ~500 prompt tokens: 31 chunks
        sched.submit(b)
        first_b = await b.events.get()
        progressed = a.events.qsize()  # A's tokens delivered before B's first token
        a.cancelled.set()
        await collect(b) if first_b[0] != "done" else None
        sched.stop()
        return progressed

    assert asyncio.run(main()) >= 20


def test_cancel_frees_the_slot(runner):
    sampling = SamplingParams(temperature=0, ignore_eos=True)

    async def main():
        loop = asyncio.get_running_loop()
        sched = BatchScheduler(runner, max_batch=1, prefill_chunk=64)
        sched.start()
        a = Job([1, 2, 3], sampling, 10_000, loop)
        b = Job([4, 5, 6], sampling, 3, loop)
        sched.submit(a)
        await a.events.get()
        sched.submit(b)
        a.cancelled.set()  # b can only run once a's slot is free
        done = await collect(b)
        sched.stop()
        return done

    assert asyncio.run(main())[1] == "length"


def test_a_lone_prefill_whose_client_left_stops_at_its_next_chunk(slow_model):
    """A prompt alone in the engine went in one pass: a client that hung up during it kept the replica busy until the
    whole prompt was computed (tens of seconds near the context length on CPU), and every request waited."""
    runner = ModelRunner(slow_model, threads=1)
    sampling = SamplingParams(temperature=0, ignore_eos=True)
    passes: list[int] = []
    model = runner.model

    class Counting:
        def __call__(self, input_ids, **kw):
            passes.append(input_ids.shape[1])
            if len(passes) == 1 and leaving is not None:
                leaving.cancelled.set()  # the client hangs up while the first chunk computes
            return model(input_ids=input_ids, **kw)

        def __getattr__(self, name):
            return getattr(model, name)

    runner.model = Counting()
    leaving = None

    async def main():
        nonlocal leaving
        loop = asyncio.get_running_loop()
        sched = BatchScheduler(runner, max_batch=2, prefill_chunk=16, lone_prefill_chunk=64)
        sched.start()
        leaving = Job([5, 6, 7, 8] * 500, sampling, 5, loop)  # 2,000 tokens: 32 passes of 64
        sched.submit(leaving)
        after = Job([1, 2, 3], sampling, 2, loop)
        sched.submit(after)
        done = await collect(after)
        sched.stop()
        return done

    assert asyncio.run(main())[1] == "length"
    assert passes[:1] == [64] and sum(passes[:-1]) <= 128, passes  # at most one more chunk, then the next request


def test_slot_cache_admit_remove_repack():
    cache = SlotCache(layers=1, kv_heads=1, head_dim=1, slots=3, dtype=torch.float32, capacity=4)

    def seq(values):
        t = torch.tensor(values, dtype=torch.float32).view(1, -1, 1)
        return [t], [t.clone()]

    cache.admit(*seq([1, 2]))
    cache.admit(*seq([5, 6, 7, 8, 9]))  # longer than the shared position: it moves, the buffer grows
    assert cache.pos == 5 and cache.capacity >= 6
    row0 = cache.k[0, 0, 0, cache.valid[0]].flatten().tolist()
    row1 = cache.k[0, 1, 0, cache.valid[1]].flatten().tolist()
    assert row0 == [1, 2] and row1 == [5, 6, 7, 8, 9]
    cache.admit(*seq([3]))
    cache.remove(0)  # the last row moves into slot 0
    assert cache.rows == 2 and cache.k[0, 0, 0, cache.valid[0]].flatten().tolist() == [3]
    cache.repack()
    assert cache.pos == 5 and cache.k[0, 1, 0, cache.valid[1]].flatten().tolist() == [5, 6, 7, 8, 9]
    assert cache.valid[0].nonzero().squeeze(1).tolist() == [4]  # right-aligned


def test_one_at_a_time_a_long_prompt_is_chunked_the_same_tokens_and_a_client_that_left_stops_it(slow_model,
                                                                                                   monkeypatch):
    """--max-batch 1 generates one request at a time (runner.generate), which computed a prompt in one pass: a
    client that hung up during it was seen only after the whole prompt."""
    import threading

    from fleetserve.engine import runner as runner_module

    runner = ModelRunner(slow_model, threads=1, dtype="float32")
    sampling = SamplingParams(temperature=0, ignore_eos=True)
    prompt = [5, 6, 7, 8] * 100
    whole = serial_tokens(runner, prompt, 6, sampling)
    monkeypatch.setattr(runner_module, "PREFILL_CHUNK", 64)
    assert serial_tokens(runner, prompt, 6, sampling) == whole  # chunks give the same tokens
    passes, model = [], runner.model
    left = threading.Event()

    class Counting:
        def __call__(self, input_ids, **kw):
            passes.append(input_ids.shape[1])
            left.set()  # the client hangs up during the first chunk
            return model(input_ids=input_ids, **kw)

        def __getattr__(self, name):
            return getattr(model, name)

    runner.model = Counting()
    result = runner.generate(prompt, sampling, 6, lambda _t: True, left)
    assert result.finish_reason == "cancelled" and passes == [64]


@pytest.mark.parametrize("scheduler", ["serial", "batch"])
def test_a_queued_job_whose_client_left_neither_counts_as_waiting_nor_fills_the_queue(scheduler, runner):
    """A client that hung up while queued left its job in the queue until the generation thread reached it: it
    counted in num_requests_waiting (the autoscaler's and the router's queue signal) and against max_waiting, so
    a live client got 503 "queue is full" from a queue of cancelled jobs. (The threads are not started here.)"""
    from fleetserve.api.errors import APIError
    from fleetserve.engine.scheduler import SerialScheduler

    sched = SerialScheduler(runner, max_waiting=2) if scheduler == "serial" else \
        BatchScheduler(runner, max_waiting=2, max_batch=1)
    jobs = [Job([1, 2], SamplingParams(), 4, loop=None) for _ in range(4)]
    for job in jobs[:3]:  # two waiting, and one for the free batch slot
        sched.submit(job)
    with pytest.raises(APIError):
        sched.submit(jobs[3])
    jobs[0].cancelled.set()
    assert sched.waiting == 2
    sched.submit(jobs[3])  # the hung-up client's place is free
    assert sched.waiting == 3


def test_jobs_queued_for_free_batch_slots_do_not_count_against_max_waiting(runner):
    """The scheduler takes one job at a time while a prompt prefills, so the others sat in the queue with batch
    slots free and counted as waiting: 6 requests to an idle engine with --max-waiting 4 (--max-batch 8) had 2
    refused, and a burst of 30 with --max-batch 2 --max-waiting 2 had 28 refused. (The thread is not started.)"""
    from fleetserve.api.errors import APIError

    sched = BatchScheduler(runner, max_waiting=4, max_batch=8)
    for _ in range(12):  # 8 for the free slots, 4 waiting
        sched.submit(Job([1, 2], SamplingParams(), 4, loop=None))
    assert sched.full()
    with pytest.raises(APIError) as err:
        sched.submit(Job([1, 2], SamplingParams(), 4, loop=None))
    assert err.value.status == 503
    sched.rows = [object()] * 8  # every slot busy: only max_waiting may wait
    assert sched.free_slots() == 0 and sched.full(4) and not sched.full(3)


def test_hung_up_clients_do_not_grow_the_queue_without_bound(runner):
    """Cancelled jobs stayed queued until the generation thread reached them: a flood of clients that hung up
    grew the queue past max_waiting without limit, and each count of it scanned them all."""
    from fleetserve.engine.scheduler import SerialScheduler

    sched = SerialScheduler(runner, max_waiting=4)  # not started: nothing takes jobs off the queue
    for _ in range(200):
        job = Job([1, 2], SamplingParams(), 4, loop=None)
        sched.submit(job)
        job.cancelled.set()
    assert sched._queue.qsize() <= 1 and sched.waiting == 0
