"""Request scheduling for the engine: a bounded waiting queue and one generation thread.

The asyncio server never blocks on the model: jobs go to the generation thread, whose tokens come back as
events on the job's asyncio queue. Cancelling a job (client gone) stops it at the next token step; a job
cancelled while waiting never starts.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetserve.api.errors import APIError
from fleetserve.api.protocol import SamplingParams
from fleetserve.engine.runner import ModelRunner
from fleetserve.engine.textstream import TextStream

log = logging.getLogger(__name__)


@dataclass(eq=False)  # compared and hashed by identity: one request each (Engine.live_jobs)
class Job:
    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.monotonic)
    root: int = 0  # block-key namespace: model build and tenant salt
    tenant: str | None = None  # the router-authenticated tenant (selects a tenant's own L2, if it has one)
    prefetched: object | None = None  # the prompt's L2 blocks (prefix_cache.Prefetched), read before queueing

    def post(self, *event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class JobQueue:
    """The bounded waiting queue every scheduler shares: beyond `max_waiting`, 503 with Retry-After."""

    max_waiting: int
    _queue: queue.Queue

    @property
    def waiting(self) -> int:
        """Jobs queued whose client still waits: one that hung up stays in the queue until the generation thread
        skips it, and had counted in num_requests_waiting and against `max_waiting` (a 503 for a live client
        while the queue held only cancelled ones)."""
        with self._queue.mutex:  # at most max_waiting jobs and those cancelled since the last submit
            return sum(1 for job in self._queue.queue if job is not None and not job.cancelled.is_set())

    def free_slots(self) -> int:
        """Batch slots no sequence holds: the jobs that will take them are queued, not waiting for room."""
        return 0

    def full(self, waiting: int | None = None) -> bool:
        """Whether a new job is refused: `max_waiting` jobs queued beyond those the free batch slots take. The
        scheduler takes one job at a time while a prompt prefills, so the others sat in the queue with slots free,
        and 6 requests to an idle engine with --max-waiting 4 had 2 refused."""
        return (self.waiting if waiting is None else waiting) >= self.max_waiting + self.free_slots()

    def submit(self, job: Job) -> None:
        with self._queue.mutex:  # jobs whose clients hung up go now: they had filled the queue without a bound,
            # each scan slower (20,000 hung-up clients: 20,000 queued, 12 s of CPU in scans)
            queued = self._queue.queue
            live = [j for j in queued if j is None or not j.cancelled.is_set()]
            if len(live) < len(queued):
                queued.clear()
                queued.extend(live)
            waiting = sum(1 for j in live if j is not None)
        if self.full(waiting):
            raise APIError(503, f"engine queue is full ({self.max_waiting} waiting); retry later",
                           code="overloaded", headers={"Retry-After": "1"})
        self._queue.put(job)


class SerialScheduler(JobQueue):
    """One sequence at a time (`--max-batch 1`); `running`/`waiting` feed the vLLM-named gauges."""

    def __init__(self, runner: ModelRunner, max_waiting: int = 256, on_token: Callable[[], None] | None = None):
        self.runner = runner
        self._count_token = on_token or (lambda: None)
        self.max_waiting = max_waiting
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="generation", daemon=True)
        self.running = 0

    def free_slots(self) -> int:
        return max(0, 1 - self.running)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.cancelled.is_set():
                continue
            self.running = 1
            try:
                self._run(job)
            except Exception as exc:  # the server must answer, whatever the model did
                log.exception("generation failed")
                job.post("error", f"generation failed: {type(exc).__name__}")
            finally:
                self.running = 0

    def _run(self, job: Job) -> None:
        stream = TextStream(self.runner.decode, job.sampling.stop)

        def on_token(token: int) -> bool:
            self._count_token()
            delta = stream.push(token)
            job.post("token", delta)
            return not stream.stopped

        result = self.runner.generate(job.prompt_ids, job.sampling, job.max_new_tokens, on_token, job.cancelled,
                                      job.root, job.tenant, job.prefetched)
        tail = stream.finish()
        if tail:
            job.post("token", tail)
        job.post("done", result.finish_reason, len(job.prompt_ids), result.completion_tokens, result.cached_tokens)
