"""One engine replica as a step model: the same object runs in virtual time (sim/fleet.py) and in real time
(engine/simulated.py, behind the engine's HTTP surface).

A caller asks `begin_step()` for the next step's duration, lets that much time pass (an event or a sleep) and
calls `end_step()`, which says whose first token and whose last token the step produced. A step admits
waiting requests (prefix lookup engine -> L1 -> L2, memory reserved), runs one prefill chunk of at most
`prefill_chunk` tokens over the admitted prompts in order, and one decode step for the whole running batch.
Decoding costs O(1) per step however large the batch: each sequence records the step at which it will have
produced all its tokens (a heap), and the attended context is one running sum.

Memory: the engine's `cache_blocks` hold the prefix cache (an LRU of block keys) *and* the blocks reserved by
admitted sequences (prompt + output, minus the prefix found in the engine). A request is admitted only when
its reservation fits after evicting unreferenced cache blocks (new blocks are written through to L1 and L2 as
the engine writes them; an evicted block is found there while those tiers still hold it); a request that
does not fit even in an empty engine is admitted alone (vLLM would reject it; here it runs, and says so in
`oversized`). Cache blocks a sequence uses (the prefix it found, then the blocks its prefill stored) are
pinned until it finishes, as vLLM's reference counts keep them out of its free queue: they are never
evicted under it, and a request whose reservation fits only by evicting them waits. Until 2026-12-03 they
were not pinned: a cold prompt's reservation evicted the system prompt that the running requests were
reading, and 31 % of the blocks evicted on a tight trace were in use; the next request for that prompt
then missed what a real engine still held. Simplification, written down: reservations cover the whole
output at admission (no preemption).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from fleetserve.kvcache.blocks import reusable_blocks
from fleetserve.kvcache.prefix_match import match_prefix, touch_chain
from fleetserve.sim.memory import BlockLRU, Listener
from fleetserve.sim.perf import PerfProfile

_ids = itertools.count()


class Seq:
    """A request inside a replica. `payload` is the caller's (the simulator's request, an HTTP job)."""

    __slots__ = ("id", "prompt", "output", "keys", "payload", "left", "reserved", "entry_step", "cached",
                 "hit_l1", "hit_l2", "first_at", "done_at", "cancelled", "state", "load_s", "prefill_s", "visible",
                 "pinned")

    def __init__(self, prompt: int, output: int, keys: Sequence = (), payload: Any = None):
        self.id = next(_ids)
        self.prompt = max(1, prompt)
        self.output = max(1, output)
        self.keys = keys
        self.payload = payload
        self.left = 0
        self.reserved = 0
        self.pinned: Sequence = ()  # cache blocks this sequence uses, kept from eviction until it finishes
        self.entry_step = 0
        self.cached = 0  # prompt tokens found in any tier
        self.hit_l1 = 0  # of which, blocks loaded from L1
        self.hit_l2 = 0  # and from L2
        self.first_at: float | None = None
        self.done_at: float | None = None
        self.cancelled = False
        self.state = "waiting"  # waiting | prefill | decode | done
        self.load_s = 0.0
        self.prefill_s = 0.0  # prefill compute attributed to this sequence
        # the token with which a streaming client first receives text (an engine sends no chunk for a token
        # whose text is still empty, e.g. an incomplete UTF-8 sequence); capped at the output: then the end
        self.visible = 1


class ReplicaModel:
    def __init__(self, profile: PerfProfile, l1_blocks: int = 0, l2: BlockLRU | None = None,
                 listener: Listener | None = None):
        self.profile = profile
        self.block = profile.block_size
        self.capacity = profile.cache_blocks
        self.cache: OrderedDict = OrderedDict()  # engine-tier prefix cache
        self.listener = listener
        # L1 and L2 are written through with every new block, as the engine's prefix cache does (its
        # background writer puts each stored block into both); what L1 evicts is dropped, not moved to L2
        self.l1 = BlockLRU("l1", l1_blocks, listener=listener) if l1_blocks else None
        self.l2 = l2
        self.reserved = 0
        self.pins: dict = {}  # cache block -> sequences using it (never evicted while listed)
        self.waiting: deque[Seq] = deque()
        self.prefilling: deque[Seq] = deque()
        self.running: dict[Seq, None] = {}
        self._finish: list[tuple[int, int, Seq]] = []
        self._shown: list[tuple[int, int, Seq]] = []  # (decode step, id, seq): first text after the first token
        self.shown: list[Seq] = []  # set by end_step: sequences whose first text the step produced (visible > 1)
        self.steps = 0  # decode steps so far
        self.ctx = 0  # context tokens attended by one decode step of the running batch
        self.waiting_tokens = 0  # prompt tokens not prefilled yet (queued or in prefill)
        self.busy_s = 0.0
        self.oversized = 0
        # per-tier prompt-token hits and lookups (hit rate = hits / queried)
        self.queried = 0
        self.hit_engine = 0
        self.hit_l1_tokens = 0
        self.hit_l2_tokens = 0
        self._completing: list[Seq] = []
        self._decoded = False
        self._planned = 1  # decode steps in the planned step (more than one: a run of pure decode steps)
        self._a = 0.0  # duration of the first planned decode step
        self._c = 0.0  # growth of each further one (its context grew by the batch)

    # --- queue ---------------------------------------------------------------------------------------------

    def add(self, seq: Seq) -> None:
        seq.state = "waiting"
        self.waiting.append(seq)
        self.waiting_tokens += seq.prompt

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running) + len(self.prefilling)

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.prefilling or self.running)

    def kv_usage(self) -> float:
        return min(1.0, (len(self.cache) + self.reserved) / max(self.capacity, 1))

    def produced(self, seq: Seq) -> int:
        if seq.state == "decode":
            return 1 + self.steps - seq.entry_step
        return seq.output if seq.state == "done" else 0

    def cancel(self, seq: Seq) -> None:
        if seq.cancelled or seq.state == "done":
            return
        seq.cancelled = True
        if seq.state == "waiting":
            self.waiting.remove(seq)
            self.waiting_tokens -= seq.prompt
        elif seq.state == "prefill":
            self.prefilling.remove(seq)
            self.waiting_tokens -= seq.prompt
            self._release(seq)
        elif seq.state == "decode":
            del self.running[seq]
            self.ctx -= seq.prompt + self.produced(seq)
            self._release(seq)
        seq.state = "done"

    # --- memory --------------------------------------------------------------------------------------------

    def _release(self, seq: Seq) -> None:
        self.reserved -= seq.reserved
        seq.reserved = 0
        if seq.pinned:
            # released head last, as vLLM returns a finished request's blocks to its free queue: `_evict` may have
            # moved the tail it met in use ahead of a head another request touched since
            touch_chain(self.cache, seq.pinned)
            self._unpin(seq)
            self._evict(0)  # what an oversized sequence held beyond the capacity goes now, not at the next lookup

    def _pin(self, seq: Seq, keys: Sequence) -> None:
        pins = self.pins
        for key in keys:
            pins[key] = pins.get(key, 0) + 1
        seq.pinned = (*seq.pinned, *keys)

    def _unpin(self, seq: Seq) -> None:
        pins = self.pins
        for key in seq.pinned:
            n = pins[key] - 1
            if n:
                pins[key] = n
            else:
                del pins[key]
        seq.pinned = ()

    def _evict(self, need: int) -> None:
        """Evict LRU cache blocks that no sequence uses until `need` more blocks fit (L1 and L2 hold them
        already, if they still do). A block in use met on the way goes to the recent end: it is released as
        recently used, as vLLM returns a finished request's blocks to the tail of its free queue."""
        cache, pins = self.cache, self.pins
        over = len(cache) + self.reserved + need - self.capacity
        if over <= 0 or not cache:
            return
        evicted = []
        for _ in range(len(cache)):  # every block looked at once at most
            key = next(iter(cache))
            if key in pins:
                cache.move_to_end(key)
                continue
            del cache[key]
            evicted.append(key)
            if len(evicted) == over:
                break
        if self.listener is not None and evicted:
            self.listener("removed", evicted, "engine")

    def _tier_match(self, keys: Sequence, start: int) -> tuple[int, int]:
        """Blocks after the engine's prefix found block by block in L1 or L2: (from L1, from L2). L1 is touched
        over the whole prefix found (its copies of the engine's part too, as the engine's lookup does), L2 over
        what it gave."""
        l1 = self.l1.blocks if self.l1 is not None else {}
        l2 = self.l2.blocks if self.l2 is not None else {}
        h1 = 0
        found2 = []
        for key in keys[start:]:
            if key in l1:
                h1 += 1
            elif key in l2:
                found2.append(key)
            else:
                break
        if self.l1 is not None:
            touch_chain(l1, keys[:start + h1 + len(found2)])
        if found2:
            touch_chain(l2, found2)
        return h1, len(found2)

    def _admit(self) -> float:
        """Move waiting requests into prefill while slots and memory allow; returns tier load time."""
        load = 0.0
        waiting, block, prof = self.waiting, self.block, self.profile
        while waiting and len(self.running) + len(self.prefilling) < prof.max_batch:
            seq = waiting[0]
            keys = seq.keys
            usable = reusable_blocks(seq.prompt, block)  # a prompt of whole blocks reported cached == prompt
            if len(keys) > usable:
                keys = keys[:usable]
            hit = match_prefix(self.cache, keys, touch=True) if keys else 0
            h1 = h2 = 0
            if keys and hit < len(keys) and (self.l1 is not None or self.l2 is not None):
                h1, h2 = self._tier_match(keys, hit)
            elif keys and self.l1 is not None:
                touch_chain(self.l1.blocks, keys)  # the engine served it all: L1's copies stay as fresh
            total = (seq.prompt + seq.output + block - 1) // block
            need = max(0, total - hit)
            if hit:
                self._pin(seq, keys[:hit])
            if len(self.cache) + self.reserved + need > self.capacity:
                # every cached block in use is pinned; only the others can go. A request that would not fit even
                # then waits, evicting nothing (vLLM checks its free blocks before it touches any): evicting first
                # threw away reusable prefixes for a request that waited anyway, and walked the pinned blocks at
                # every step
                if len(self.pins) + self.reserved + need > self.capacity and (self.running or self.prefilling):
                    if seq.pinned:
                        self._unpin(seq)
                    break  # wait for memory: what the running sequences use cannot be evicted
                self._evict(need)
                if len(self.cache) + self.reserved + need > self.capacity:
                    self.oversized += 1  # alone, and larger than the engine
            waiting.popleft()
            self.reserved += need
            seq.reserved = need
            seq.cached = min(seq.prompt, (hit + h1 + h2) * block)
            seq.hit_l1, seq.hit_l2 = h1, h2
            seq.left = seq.prompt - seq.cached
            seq.state = "prefill"
            seq.load_s = prof.load_time(h1, h2) if (h1 or h2) else 0.0
            load += seq.load_s
            self.prefilling.append(seq)
            self.queried += seq.prompt
            if seq.cached:
                e = min(seq.cached, hit * block)
                self.hit_engine += e
                t1 = min(seq.cached - e, h1 * block)
                self.hit_l1_tokens += t1
                self.hit_l2_tokens += seq.cached - e - t1
        return load

    # --- steps ---------------------------------------------------------------------------------------------

    def begin_step(self, max_steps: int = 1) -> float | None:
        """Plan the next step; its duration in seconds, or None when there is nothing to do.

        With `max_steps` > 1, a run of pure decode steps (nothing to prefill) up to the next finishing
        sequence is planned as one: the same steps, one event. A caller that must stop early (a request
        arrived) asks `steps_by(elapsed)` and `truncate(j)`.
        """
        load = self._admit() if self.waiting else 0.0
        prof = self.profile
        tokens = 0
        completing = self._completing = []
        if self.prefilling:
            budget = prof.prefill_chunk
            if prof.whole_prefill_when_idle and not self.running:  # alone, the built-in engine takes it whole
                budget = max(budget, self.prefilling[0].left)
            for seq in self.prefilling:
                take = seq.left if seq.left < budget - tokens else budget - tokens
                seq.left -= take
                tokens += take
                seq.prefill_s += prof.prefill_per_token_s * take
                if seq.left == 0:
                    completing.append(seq)
                if tokens >= budget:
                    break
        batch = len(self.running)
        self._decoded = batch > 0
        self._planned = 1
        if not tokens and not batch and not completing:
            return None
        if max_steps > 1 and batch and not tokens and not completing and not load:
            a = prof.decode_base_s + prof.decode_per_seq_s * batch + prof.decode_per_ctx_token_s * self.ctx
            c = prof.decode_per_ctx_token_s * batch
            k = max(1, min(max_steps, self._finish[0][0] - self.steps)) if self._finish else 1
            if self._shown:  # a run also ends where a client sees its first text
                k = max(1, min(k, self._shown[0][0] - self.steps))
            self._planned, self._a, self._c = k, a, c
            duration = k * a + c * k * (k - 1) / 2
            self.busy_s += duration
            return duration
        duration = load
        if tokens or completing:
            duration += prof.prefill_base_s + prof.prefill_per_token_s * tokens
        if batch:
            duration += prof.decode_base_s + prof.decode_per_seq_s * batch + prof.decode_per_ctx_token_s * self.ctx
        self.busy_s += duration
        return duration

    @property
    def planned_steps(self) -> int:
        return self._planned

    def steps_by(self, elapsed: float) -> int:
        """In a planned run of decode steps: how many have ended or are running after `elapsed` seconds."""
        a, c, k = self._a, self._c, self._planned
        if c > 0:
            j = (-(a - c / 2) + ((a - c / 2) ** 2 + 2 * c * elapsed) ** 0.5) / c
        else:
            j = elapsed / a if a > 0 else k
        j = max(1, min(k, int(j) + 1 if j > int(j) + 1e-9 else int(j)))
        while j < k and j * a + c * j * (j - 1) / 2 < elapsed - 1e-12:
            j += 1
        return max(1, j)

    def truncate(self, j: int) -> float:
        """Cut the planned run to its first `j` steps; returns their duration."""
        k = self._planned
        j = max(1, min(j, k))
        full = k * self._a + self._c * k * (k - 1) / 2
        part = j * self._a + self._c * j * (j - 1) / 2
        self.busy_s -= full - part
        self._planned = j
        return part

    def end_step(self, now: float) -> tuple[list[Seq], list[Seq]]:
        """Apply the planned step at its end time: (sequences with their first token, finished sequences)."""
        finished: list[Seq] = []
        if self.shown:
            self.shown = []
        if self._decoded:
            k = self._planned
            self.steps += k
            self.ctx += len(self.running) * k
            heap, steps = self._finish, self.steps
            shown = self._shown
            if shown and shown[0][0] <= steps:
                out = self.shown = []
                while shown and shown[0][0] <= steps:
                    seq = heapq.heappop(shown)[2]
                    if not seq.cancelled:
                        out.append(seq)
            while heap and heap[0][0] <= steps:
                seq = heapq.heappop(heap)[2]
                if seq.state != "decode":
                    continue  # cancelled
                del self.running[seq]
                self.ctx -= seq.prompt + seq.output
                self._release(seq)
                seq.state = "done"
                seq.done_at = now
                finished.append(seq)
        firsts = [s for s in self._completing if s.state == "prefill"]  # the wrapper may have cancelled some
        self._completing = []
        prefilling = self.prefilling
        for seq in firsts:
            if prefilling[0] is seq:
                prefilling.popleft()
            else:
                prefilling.remove(seq)
            self.waiting_tokens -= seq.prompt
            seq.first_at = now
            if seq.keys:
                self._store(seq)
            if seq.output <= 1:
                self._release(seq)
                seq.state = "done"
                seq.done_at = now
                finished.append(seq)
            else:
                seq.state = "decode"
                seq.entry_step = self.steps
                self.running[seq] = None
                self.ctx += seq.prompt + 1
                heapq.heappush(self._finish, (self.steps + seq.output - 1, seq.id, seq))
                if seq.visible > 1:
                    heapq.heappush(self._shown, (self.steps + min(seq.visible, seq.output) - 1, seq.id, seq))
        return firsts, finished

    def _store(self, seq: Seq) -> None:
        """The prompt's full blocks enter the engine cache; reserved blocks become cached ones."""
        cache = self.cache
        stored = []
        for key in reversed(seq.keys):  # the head ends most recent: the chain is evicted from its tail
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = None
                stored.append(key)
        stored.reverse()
        moved = min(len(stored), seq.reserved)
        seq.reserved -= moved
        self.reserved -= moved
        self._pin(seq, seq.keys[len(seq.pinned):])  # what its prefill stored is its own KV until it finishes
        if self.listener is not None and stored:
            self.listener("stored", stored, "engine")
        first = seq.cached // self.block
        computed = seq.keys[first:]  # what this prefill computed (not what it loaded)
        if computed:  # written through to L1 and L2, as the engine's background writer puts them
            head = seq.keys[:first]
            if self.l1 is not None:
                self.l1.put(computed, head)
            if self.l2 is not None:
                self.l2.put(computed, head)
        self._evict(0)
