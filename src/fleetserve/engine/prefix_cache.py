"""The engine's prefix KV cache: its working set of blocks, then L1 (CPU) and L2 (Redis) below it.

Lookup is prefix-contiguous across tiers: engine blocks first, then one batched L1 read, then the L2 blocks
for what is still missing, stopping at the first miss; those are read ahead with the prompt's tokenizing
(`prefetch_l2`, within a byte budget), so the generation thread does not wait for Redis; what was not read
ahead it reads only while the last call to that Redis answered (`RedisStore.trusted`). Blocks found
below the engine are promoted into it (and L2's into L1). New blocks enter the working set at once and are
written to L1/L2 by a background thread, so the decode loop never waits for Redis; the writes queued for it
hold at most the engine tier's size in blocks (past it a prompt's blocks stay in the engine tier only, counted
and said), and an engine that stops gives them a bounded time to land. Every change is published as a KV
event per tier, Redis's own evictions too (kvcache.l2watch). The engine tier is changed by the generation
thread and read by the event loop (`/kv/blocks`, `/admin/kv/clear`): both hold its lock.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import weakref
from collections import OrderedDict

import numpy as np
import torch

from fleetserve.kvcache.events import KVEventLog
from fleetserve.kvcache.l2watch import L2EvictionWatcher
from fleetserve.kvcache.prefix_match import match_prefix, touch_chain
from fleetserve.kvcache.tiers import L1Store, RedisStore, pack_block, packed_size, unpack_block

log = logging.getLogger(__name__)
# a stopping engine's wait for its queued L1/L2 writes: within what it has after its drain before it is killed (a
# pod's EXIT_SECONDS, 5 s; `up`'s 10 s after SIGTERM): 10 s had outlived both, and the warning never came
STOP_FLUSH_S = 3.0


class Prefetched:
    """A prompt's blocks read from L2 before its job was queued: `values` of the keys from `start` (the first key
    neither the engine tier nor L1 held then) to `end` (as far as the prefetch budget reached). Its bytes count
    against the cache's prefetch budget until `release()` (called at admission) or until the job is dropped
    (garbage collected: a refused or cancelled job)."""

    def __init__(self, values: dict[int, bytes], start: int, end: int, cache: PrefixCache):
        self.values = values
        self.start, self.end = start, end
        size = sum(len(v) for v in values.values())
        cache._prefetch_held(size)
        self.release = weakref.finalize(self, cache._prefetch_held, -size)


class PrefixCache:
    def __init__(self, block_shape: tuple[int, ...], dtype: torch.dtype, engine_blocks: int,
                 l1: L1Store | None = None, l2: RedisStore | None = None, events: KVEventLog | None = None,
                 tenant_l2: dict[str, RedisStore] | None = None):
        self.block_shape = block_shape  # (layers, 2, kv_heads, block_size, head_dim)
        self.dtype = dtype
        self.block_bytes = int(np.prod(block_shape)) * torch.empty((), dtype=dtype).element_size()
        self.engine_blocks = engine_blocks
        self.l1 = l1
        self.l2 = l2
        self.tenant_l2 = tenant_l2 or {}  # hard separation: these tenants' blocks live in their own Redis
        self.events = events or KVEventLog()
        self._blocks: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._lock = threading.RLock()  # the engine tier: changed by the generation thread, read by the event loop
        self.engine_evictions = 0
        self._writes: queue.Queue = queue.Queue()
        # the queued blocks are tensors the engine tier may have let go: bounded by bytes, the engine tier's size
        # (a count of 1,024 prompts held 512 x that tier's memory behind a slow Redis)
        self.write_budget = engine_blocks * self.block_bytes
        self.write_bytes = 0
        self._write_lock = threading.Lock()
        self.dropped_blocks = 0
        self._dropped_said_at = -math.inf
        self._writer = threading.Thread(target=self._write_loop, name="kv-writer", daemon=True)
        self._writer.start()
        self.l2_watchers = [L2EvictionWatcher(store, self._l2_evicted, on_restarted=self.events.resync).start()
                            for store in self._l2_stores()]
        # every tier's key made here: a scrape iterates it while the generation thread counts
        self.hits = {"engine": 0, "l1": 0, "l2": 0, **{f"l2:{t}": 0 for t in self.tenant_l2}}
        self.queries = 0  # blocks looked up
        self.query_tokens = 0  # prompt tokens looked up, all of them (vLLM's prefix_cache_queries)
        self.engine_misses = 0  # blocks looked up that the engine tier did not hold
        # L2 bytes read ahead for queued jobs: at most half the engine tier's size (a queue of 256 long prompts
        # held gigabytes), or one whole prompt when none is held; past it a job's L2 blocks are read at admission
        # while that Redis answers (`RedisStore.trusted`)
        self.prefetch_budget = engine_blocks * self.block_bytes // 2
        self._prefetched = 0
        self._prefetch_lock = threading.Lock()
        one = packed_size(self.block_bytes)
        if l1 is not None and l1.max_bytes < one:  # it stored nothing, and no metric said so
            log.warning("the L1 tier (--l1-bytes, a spec's kvCache.l1.maxBytes: %d bytes) is smaller than one KV "
                        "block of this model (%d bytes at %d tokens a block): it stores nothing; give it at least "
                        "%d bytes, or disable it", l1.max_bytes, one, block_shape[3], one * 64)

    # --- (de)serialisation ---------------------------------------------------------------------------------

    def _to_bytes(self, block: torch.Tensor) -> bytes:
        return block.contiguous().view(torch.uint8).numpy().tobytes()

    def _from_bytes(self, payload: bytes) -> torch.Tensor | None:
        expected = self.block_bytes
        if len(payload) != expected:
            return None
        raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        return raw.view(self.dtype).reshape(self.block_shape)

    # --- lookup and store ----------------------------------------------------------------------------------

    def l2_for(self, tenant: str | None) -> RedisStore | None:
        return self.tenant_l2.get(tenant, self.l2) if tenant else self.l2

    def tier_of(self, store, tenant: str | None) -> str:
        """The tier label of a store's hits: a tenant's own Redis is `l2:TENANT`, as its misses, bytes and
        evictions are (its hits had been counted as the shared L2's, whose ratio could pass 1)."""
        if tenant and store is not self.l1 and self.tenant_l2.get(tenant) is store:
            return f"l2:{tenant}"
        return store.name

    def _prefetch_held(self, delta: int) -> None:
        with self._prefetch_lock:
            self._prefetched += delta

    def prefetch_l2(self, keys: list[int], tenant: str | None = None) -> Prefetched | None:
        """Read from L2 the blocks of `keys` past what the engine tier holds now, on the caller's thread (the
        tokenizer pool): the generation thread's lookup then takes them from here, and the step loop does not
        wait for Redis (a slow or hung Redis stalled every running stream at each new request's lookup). As many
        as the prefetch budget has room for, and a whole prompt when nothing else is held. None: no L2."""
        store = self.l2_for(tenant)
        if store is None:
            return None
        start = match_prefix(self._blocks, keys)  # `in` per key: safe beside the generation thread's changes
        if self.l1 is not None:  # what L1 holds is read from L1 at admission: reading it from Redis as well
            start += match_prefix(self.l1, keys[start:])  # cost a full L1 hit the network's time
        rest = keys[start:] if store.available else []
        one = packed_size(self.block_bytes)
        with self._prefetch_lock:  # reserved here: two tokenizer threads each took the whole room
            room = len(rest) if self._prefetched == 0 else max(0, self.prefetch_budget - self._prefetched) // one
            rest = rest[:room]  # a prefix of the rest: a lookup stops at its first miss anyway
            self._prefetched += len(rest) * one
        try:
            values = {k: v for k, v in zip(rest, store.get_many(rest), strict=True) if v is not None} if rest else {}
        finally:
            self._prefetch_held(-len(rest) * one)
        return Prefetched(values, start, start + len(rest), self)

    def lookup(self, keys: list[int], tenant: str | None = None,
               prefetched: Prefetched | None = None, prompt_tokens: int | None = None
               ) -> list[tuple[str, torch.Tensor]]:
        """The longest cached prefix of `keys`, as (tier, block) pairs; `prefetched`: what `prefetch_l2` read
        (the rest, blocks the engine tier held at the prefetch and has let go since or those past the budget, is
        read here, and L2 wholly without it, only while that Redis answered its last call: else they are misses);
        `prompt_tokens`: the prompt's length, for the queries counter (default: the blocks' tokens)."""
        self.queries += len(keys)
        self.query_tokens += prompt_tokens if prompt_tokens is not None else len(keys) * self.block_shape[3]
        blocks = self._blocks
        with self._lock:
            found = [("engine", blocks[key]) for key in keys[:match_prefix(blocks, keys)]]
        self.engine_misses += len(keys) - len(found)
        for store in (self.l1, self.l2_for(tenant)):
            rest = keys[len(found):]
            if store is None:
                continue
            if not rest:
                if store is self.l1:
                    store.touch(keys)  # the engine tier served it all: L1's copies of it stay as fresh
                continue
            promoted, raw, tier = [], [], self.tier_of(store, tenant)
            if store is self.l1:
                values = store.get_many(rest, keys[:len(found)])
            else:
                values = self._l2_values(store, rest, len(found), prefetched)
            for key, value in zip(rest, values, strict=True):
                payload = unpack_block(key, value) if value is not None else None
                block = self._from_bytes(payload) if payload is not None else None
                if block is None:
                    if value is not None:
                        store.stats.rejected += 1  # someone else's block under this key: never use it
                    break
                store.stats.hits += 1
                found.append((tier, block))
                promoted.append((key, block))
                raw.append((key, value))
            # a prefix ends at its first miss: every block of the rest that this tier did not give is missed
            # here, so hits / (hits + misses) is the share of the blocks reaching the tier that it held
            store.stats.misses += len(rest) - len(promoted)
            head = keys[:len(found) - len(promoted)]
            self._admit(promoted, head)
            if store is not self.l1 and self.l1 is not None and raw:
                # a block read from L2 is likely read again: next time, not over the network
                self._promote_to_l1(raw, head)
        if found and found[-1][0] == "engine":  # else the last `_admit` touched the whole prefix
            with self._lock:
                touch_chain(blocks, keys[:len(found)])
        for tier, _ in found:
            self.hits[tier] = self.hits.get(tier, 0) + 1
        return found

    @staticmethod
    def _l2_values(store: RedisStore, rest: list[int], offset: int, prefetched: Prefetched | None
                   ) -> list[bytes | None]:
        """L2's values of `rest` (the keys from position `offset` on): the prefetched ones from `prefetched`, the
        others in one read on this (the generation) thread, only while the store is trusted: a hung Redis costs
        running streams at most the one read that found it hung, not one per new request."""
        ahead = range(prefetched.start, prefetched.end) if prefetched is not None else range(0)
        missing = []  # to read here: up to the first key the prefetch found absent, where the prefix ends
        for i, k in enumerate(rest, offset):
            if i not in ahead:
                missing.append(k)
            elif k not in prefetched.values:
                break
        read = dict(zip(missing, store.get_many(missing), strict=True)) if missing and store.trusted else {}
        return [prefetched.values.get(k) if i in ahead else read.get(k) for i, k in enumerate(rest, offset)]

    def _promote_to_l1(self, raw: list[tuple[int, bytes]], head: list[int]) -> None:
        stored = self.l1.put_many(raw, head)  # the values as stored (key header included): no copy, no packing
        self.events.publish("stored", stored, self.l1.name)
        evicted = self.l1.drain_evicted()
        if evicted:
            self.events.publish("removed", evicted, self.l1.name)

    def _admit(self, items: list[tuple[int, torch.Tensor]], head: list[int]) -> None:
        """Blocks into the engine tier, the prompt's `head` (its blocks before them) touched after them, so the
        chain's first block ends most recent (`touch_chain`); then the least recent go beyond the capacity."""
        blocks = self._blocks
        stored, removed = [], []
        with self._lock:  # the events too: a snapshot's sequence number covers exactly what it lists
            for key, block in reversed(items):
                if key not in blocks:
                    stored.append(key)
                blocks[key] = block
                blocks.move_to_end(key)
            stored.reverse()
            touch_chain(blocks, head)
            self.events.publish("stored", stored, "engine")
            while len(blocks) > self.engine_blocks:
                key, _ = blocks.popitem(last=False)
                removed.append(key)
            self.engine_evictions += len(removed)
            self.events.publish("removed", removed, "engine")

    def store(self, items: list[tuple[int, torch.Tensor]], tenant: str | None = None,
              head: list[int] | None = None) -> None:
        """New blocks: into the working set now, into L1/L2 in the background. `head`: the keys of the prompt's
        blocks before them (its cached prefix), touched again so that they outlive the new tail."""
        if not items:
            return
        head = head or []
        self._admit(items, head)
        if self.l1 is None and self.l2_for(tenant) is None:
            return
        size = len(items) * self.block_bytes
        with self._write_lock:  # never block the decode loop on a slow tier: past the budget, drop
            dropped = bool(self.write_bytes) and self.write_bytes + size > self.write_budget
            if dropped:
                self.dropped_blocks += len(items)
            else:
                self.write_bytes += size
        if dropped:
            self._say_dropped()
            return
        self._writes.put_nowait((items, tenant, head))

    def _say_dropped(self) -> None:
        """Once a minute at most: the L1/L2 writes fall behind the prefills."""
        now = time.monotonic()
        if now - self._dropped_said_at < 60.0:
            return
        self._dropped_said_at = now
        log.warning("KV block writes to L1/L2 fall behind the prefills: %d blocks kept in the engine tier only so "
                    "far (the writes queued hold %d of at most %d bytes; fleetserve_kv_writes_dropped_blocks_total)",
                    self.dropped_blocks, self.write_bytes, self.write_budget)

    def _write_loop(self) -> None:
        while True:
            work = self._writes.get()
            if work is None:
                return
            try:
                self._write(*work)
            finally:
                with self._write_lock:
                    self.write_bytes -= len(work[0]) * self.block_bytes
                self._writes.task_done()

    def _write(self, items: list[tuple[int, torch.Tensor]], tenant: str | None, head: list[int]) -> None:
        values = [(key, pack_block(key, self._to_bytes(block))) for key, block in items]
        for store in (self.l1, self.l2_for(tenant)):
            if store is None:
                continue
            try:
                stored = store.put_many(values, head)
                self.events.publish("stored", stored, store.name)
                if isinstance(store, L1Store):
                    evicted = store.drain_evicted()
                    if evicted:
                        self.events.publish("removed", evicted, store.name)
            except Exception:  # a tier failure must never take the engine down
                log.exception("writing KV blocks to %s failed", store.name)

    def _l2_stores(self) -> list[RedisStore]:
        stores = {id(s): s for s in [self.l2, *self.tenant_l2.values()] if s is not None}
        return list(stores.values())

    def _l2_evicted(self, keys: list[int]) -> None:
        self.events.publish("removed", keys, "l2")

    def close(self, timeout: float = STOP_FLUSH_S) -> None:
        """The engine stops: give the queued writes to L1/L2 `timeout` seconds to land (a rolling restart lost
        every one queued, without a word), say how many did not, and stop the L2 eviction watchers, all within
        `timeout`."""
        deadline = time.monotonic() + timeout
        if not self.flush(timeout):
            log.warning("stopping with KV block writes to L1/L2 not done after %.0f s: %d bytes of blocks dropped",
                        timeout, self.write_bytes)
        for watcher in self.l2_watchers:
            watcher.stop(max(0.0, deadline - time.monotonic()))

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until queued background writes are done (an admin call, benchmarks, stopping); False when some
        were still queued after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self._writes.unfinished_tasks or not self._writes.empty():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def clear(self, tiers: set[str]) -> None:
        """Drop tiers (benchmarks measure each tier alone this way)."""
        if "engine" in tiers:
            with self._lock:
                self.events.publish("removed", list(self._blocks), "engine")
                self._blocks.clear()
        if "l1" in tiers and self.l1 is not None:
            self.events.publish("removed", self.l1.keys(), "l1")
            self.l1.clear()
            self.l1.evicted.clear()
        if "l2" in tiers:
            for store in self._l2_stores():
                self.events.publish("removed", store.clear(), "l2")

    def snapshot(self) -> dict:
        """The blocks held, each with every tier that holds it (`tiers`; `tier`: the nearest, for routers that
        read one) and the sequence number of the last event it reflects. L2 is not listed (a shared Redis's keys
        are not this engine's to scan): a router learns them from later events. A block in the engine tier and
        in L1 had been listed as the engine's alone, and a resynchronised router lost its L1 credit once the
        engine tier evicted it."""
        with self._lock:  # the generation thread reorders the engine tier: iterating it beside that raised
            seq = self.events.seq
            entries: dict[int, list[str]] = {k: ["engine"] for k in self._blocks}
        if self.l1 is not None:
            for k in self.l1.keys():
                entries.setdefault(k, []).append("l1")
        return {"seq": seq, "blocks": [{"key": k, "tier": t[0], "tiers": t} for k, t in entries.items()]}
