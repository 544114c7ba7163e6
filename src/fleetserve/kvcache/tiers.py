"""KV block tiers below the engine's working set: L1 (CPU memory, LRU by bytes) and L2 (Redis).

A block value carries its own key and a CRC-32 of its bytes in a header and is checked on load, so a foreign or
corrupted value is never used (a reordered block would still give plausible logits; identity is what proves
reuse is right). The checksum catches accidents, not a writer who means harm: the L2 Redis is the fleet's, behind
its password.
L2 keeps one Redis value per block (never two keys that can disagree), reads with one MGET, writes with one
pipeline, has per-operation timeouts, and when Redis is down it is skipped for a back-off period and
retried by itself: the engine keeps serving from L1 and recompute.
"""

from __future__ import annotations

import bisect
import logging
import struct
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field

from fleetserve.kvcache.prefix_match import touch_chain

log = logging.getLogger(__name__)

MAGIC = b"FSKV2"  # FSKV1 values (no checksum) read as foreign: recomputed once, then written again as FSKV2
# the value format in the Redis key space: engines of two versions on one Redis (a rolling upgrade) never read or
# overwrite each other's blocks (under one key space they rejected and rewrote each other's, and the hit ratio
# fell for the whole rollout)
KEY_SPACE = "kv2"
_HEADER = struct.Struct(">5sQII")  # magic, block key, payload length, CRC-32 of the payload


def packed_size(payload_bytes: int) -> int:
    """The bytes a block of `payload_bytes` takes as stored (its header included)."""
    return _HEADER.size + payload_bytes


def pack_block(key: int, payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, key, len(payload), zlib.crc32(payload)) + payload


def unpack_block(key: int, value: bytes) -> bytes | None:
    """The payload if `value` is the block stored under `key`, else None (foreign, torn or corrupt). The checksum
    is what catches bytes changed inside a value of the right length (a bad write, bit rot, a tool that edited
    it): such a block had been used, and the model answered from tensors that were not its own."""
    if len(value) < _HEADER.size:
        return None
    magic, stored_key, length, checksum = _HEADER.unpack_from(value)
    if magic != MAGIC or stored_key != key or len(value) - _HEADER.size != length:
        return None
    payload = memoryview(value)[_HEADER.size:]
    if zlib.crc32(payload) != checksum:
        return None
    return bytes(payload)


TIER_LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass
class Latency:
    """Every operation's time since the start, as a Prometheus histogram counts: per bucket, count and sum. A
    window of the last 512-1,024 samples had been exported as the histogram, so its count fell back every ~512
    operations and `rate()` and quantiles read counter resets."""

    buckets: tuple[float, ...] = TIER_LATENCY_BUCKETS_S
    per_bucket: list[int] = field(default_factory=lambda: [0] * len(TIER_LATENCY_BUCKETS_S))
    count: int = 0
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self.buckets, seconds)
        if i < len(self.per_bucket):
            self.per_bucket[i] += 1
        self.count += 1
        self.total += seconds

    def cumulative(self) -> list[int]:
        """Counts at or below each bucket's bound (`le`), then +Inf."""
        out, n = [], 0
        for c in self.per_bucket:
            n += c
            out.append(n)
        return out + [self.count]


@dataclass
class TierStats:
    """Counters of one tier. `add` is for counters that several threads change (L2's: the tokenizer pool
    reads, the writer thread writes): `+=` from two threads can lose a count."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    failures: int = 0
    rejected: int = 0  # values whose header did not match the key
    get_seconds: Latency = field(default_factory=Latency)
    put_seconds: Latency = field(default_factory=Latency)

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def timing(self, kind: str, seconds: float) -> None:
        with self._lock:
            (self.get_seconds if kind == "get" else self.put_seconds).observe(seconds)


class L1Store:
    """CPU memory, least recently used first out, bounded in bytes. Thread-safe."""

    name = "l1"

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats = TierStats()
        self.evicted: list[int] = []  # keys evicted since the last drain (for KV events)

    def get_many(self, keys: list[int], head: list[int] | tuple = ()) -> list[bytes | None]:
        """The values of `keys` up to the first one absent (None from there: a prefix ends at its first miss, and
        the values past it, never loaded, had been counted as bytes out); counted as L2's reads are (bytes out,
        latency), so the tier metrics of L1 are not zeros beside its hits. `head`: the chain's blocks before
        `keys` (the engine tier served them), touched with them so that L1's copy of the head does not age under
        its tail."""
        out: list[bytes | None] = []
        started = time.perf_counter()
        with self._lock:
            for key in keys:
                value = self._blocks.get(key)
                if value is None:
                    break
                self.stats.bytes_out += len(value)
                out.append(value)
            touch_chain(self._blocks, [*head, *keys[:len(out)]])
            out += [None] * (len(keys) - len(out))
        if keys:
            self.stats.timing("get", time.perf_counter() - started)
        return out

    def put_many(self, items: list[tuple[int, bytes]], head: list[int] | tuple = ()) -> list[int]:
        """Store a chain's blocks (or part of one) last first, then touch its `head` (the blocks before them)
        where held, so the chain's first block is evicted last (`touch_chain`): a prompt whose head the engine
        tier served had left that head in L1 to age as if unused. Returns the keys that were new, in chain
        order."""
        stored = []
        started = time.perf_counter()
        with self._lock:
            for key, value in reversed(items):
                if len(value) > self.max_bytes:
                    continue
                old = self._blocks.pop(key, None)
                if old is not None:
                    self._bytes -= len(old)
                else:
                    stored.append(key)
                self._blocks[key] = value
                self._bytes += len(value)
                self.stats.bytes_in += len(value)
            touch_chain(self._blocks, head)  # before the evictions: the new tail must not push out the old head
            while self._bytes > self.max_bytes:
                evicted_key, evicted = self._blocks.popitem(last=False)
                self._bytes -= len(evicted)
                self.stats.evictions += 1
                self.evicted.append(evicted_key)
        if items:
            self.stats.timing("put", time.perf_counter() - started)
        stored.reverse()
        return stored

    def __contains__(self, key: int) -> bool:
        with self._lock:
            return key in self._blocks

    def touch(self, keys: list[int]) -> None:
        """Mark a chain's blocks held here recently used, the head last (`touch_chain`)."""
        with self._lock:
            touch_chain(self._blocks, keys)

    def drain_evicted(self) -> list[int]:
        """The keys evicted since the last call (for KV events); under the lock, as puts from the writer thread
        and promotions from the generation thread both evict."""
        with self._lock:
            evicted, self.evicted = self.evicted, []
        return evicted

    def keys(self) -> list[int]:
        with self._lock:
            return list(self._blocks)

    def clear(self) -> None:
        with self._lock:
            self.evicted.extend(self._blocks)
            self._blocks.clear()
            self._bytes = 0

    @property
    def used_bytes(self) -> int:
        return self._bytes


def redis_health(url: str, password: str | None = None, timeout: float = 0.5) -> str:
    """"up", or why not ("unreachable (ConnectionError)", "not answering (TimeoutError)", "refused
    (AuthenticationError)"): what `status` shows for the L2 tier, probed by the supervisor."""
    import redis

    bare, user, in_url = split_credentials(url)
    auth = {k: v for k, v in (("username", user), ("password", password or in_url)) if v}
    client = redis.Redis.from_url(bare, socket_timeout=timeout, socket_connect_timeout=timeout, **auth)
    try:
        client.ping()
        try:
            memory = client.info("memory")
        except redis.ResponseError:  # an ACL user without +info, a managed Redis that hides it: GET/SET still work
            return "up"
        try:  # a replica refuses every write (`replicaof`, a failed-over primary): engines said so, `status` "up"
            replication = client.info("replication")
        except redis.ResponseError:
            replication = {}
        if replication.get("role") in ("slave", "replica"):
            primary = f"{replication.get('master_host', '?')}:{replication.get('master_port', '?')}"
            return (f"read-only (a replica of {primary}: every write is refused, blocks already there are read; "
                    "point kvCache.l2.url at the primary)")
        try:  # writes refused for memory since Redis started (Redis 6.2+; a managed Redis may hide it)
            refused = int((client.info("errorstats").get("errorstat_OOM") or {}).get("count", 0))
        except (redis.ResponseError, TypeError, ValueError, AttributeError):
            refused = 0
        return _full(memory, refused) or "up"
    except redis.TimeoutError as exc:
        return f"not answering ({type(exc).__name__})"
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        return f"refused ({type(exc).__name__}: {refusal_reason(str(exc))})"
    except (redis.RedisError, OSError) as exc:
        return f"unreachable ({type(exc).__name__})"
    finally:
        client.close()


NEAR_FULL = 0.9  # with writes refused for memory, this much of maxmemory used is full: a block does not fit


def _full(memory: dict, refused: int = 0) -> str | None:
    """A Redis at its memory limit that cannot evict refuses every write: the engines say so in their logs, and
    `status` had read "up". `noeviction` never evicts; a `volatile-*` policy evicts only keys with a TTL, and the
    blocks have none (ElastiCache's default is volatile-lru). Its own Redis (fleetserve's) is allkeys-lru. A
    block is large (0.7 MB for the demo model, megabytes for an 8B one): a Redis a block short of its limit
    refuses it and stays below the limit, so `refused` (writes refused for memory since it started) with most of
    the memory used counts as full too (it had read "up" at 96 % used while every write was refused)."""
    limit, used = int(memory.get("maxmemory") or 0), int(memory.get("used_memory") or 0)
    policy = str(memory.get("maxmemory_policy") or "")
    writes = f", {refused:,} writes refused for memory since it started" if refused else ""
    # what eviction counts (replication and AOF buffers are not): at the limit while evicting as it should, a
    # replicated Redis's used_memory may stay above maxmemory
    counted = used - int(memory.get("mem_not_counted_for_evict") or 0)
    if limit and refused and counted >= limit and policy.startswith("allkeys-"):  # evicting all it may, still
        # over: a maxmemory below Redis's own use (about 1 MB) or a block's size (`l2.maxBytes: 512` read "up")
        return (f"full (used {used:,} of maxmemory {limit:,} bytes with policy {policy}{writes}): maxmemory is too "
                "small for Redis and a block; give it more (l2.maxBytes for the Redis fleetserve starts)")
    if not limit or not (policy == "noeviction" or policy.startswith("volatile-")):
        return None
    if used >= limit or (refused and used >= NEAR_FULL * limit):
        return (f"full (used {used:,} of maxmemory {limit:,} bytes, maxmemory-policy {policy}{writes}): new blocks "
                "are not written; set an allkeys-lru policy, or more memory")
    return None


def refusal_reason(message: str) -> str:
    """A Redis refusal in a few words: the password ones said plainly, any other to its first sentence (cut at 80
    characters it had ended mid-sentence: "...otherwise the HELLO )")."""
    if any(sign in message for sign in ("NOAUTH", "Authentication required", "already authenticated")):
        return "the server needs a password: give it in the URL (redis://:PASSWORD@HOST:PORT)"
    if "WRONGPASS" in message or "invalid username-password" in message:
        return "wrong user name or password"
    first = message.split(". ")[0].split(", otherwise")[0].strip()
    return first if len(first) <= 120 else first[:117].rsplit(" ", 1)[0] + " ..."


def _failure(exc: Exception) -> str:
    """What failed, for the log: the exception's type, and a refusal's reason (never another message: redis-py
    quotes the command it sent, block bytes and all)."""
    import redis

    if isinstance(exc, redis.AuthenticationError) or (isinstance(exc, redis.ResponseError) and any(
            sign in str(exc) for sign in ("NOAUTH", "WRONGPASS", "Authentication required"))):
        return f"{type(exc).__name__}: {refusal_reason(str(exc))}"
    return type(exc).__name__


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """(the URL without its user and password, user, password). redis-py's URL parser stops a password at its
    first `/` (the 'Port could not be cast to integer' of a base64 password); the host never holds an `@`, so
    the credentials are what comes before the last one. Percent-escapes are undone, as in any URL."""
    from urllib.parse import unquote

    scheme, sep, rest = url.partition("://")
    if not sep:
        return url, None, None
    credentials, at, host = rest.rpartition("@")
    if not at:
        return url, None, None
    user, colon, password = credentials.partition(":")
    return (f"{scheme}://{host}", unquote(user) or None, unquote(password) if colon and password else None)


def has_credentials(url: str) -> bool:
    """The URL names a user or a password (keep it off command lines)."""
    _, user, password = split_credentials(url)
    return bool(user or password)


class MalformedReply(Exception):
    """Redis (or what answers at its address) replied something that is not the reply to what was asked."""


class RedisStore:
    """L2 in Redis: one value per block under `prefix + key`, batched, with timeouts and back-off."""

    name = "l2"

    def __init__(self, url: str, prefix: str = f"fleetserve:{KEY_SPACE}:", timeout: float = 0.5, backoff: float = 2.0,
                 password: str | None = None):
        import redis

        url, user, in_url = split_credentials(url)
        self.url = url  # never the password: it is logged
        self.prefix = prefix
        self.backoff = backoff
        password = password or in_url
        auth = {"password": password} if password else {}
        if user:
            auth["username"] = user
        self._auth = auth
        self._timeout = timeout
        self._client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                            health_check_interval=0, max_connections=16, **auth)
        self._down_until = 0.0
        self._full_until = 0.0  # writes only: a Redis at maxmemory with noeviction still serves reads
        self._refusing: str | None = None  # "full" or "read_only" while writes are refused: said once per episode
        # what the last operation found (the engine's /metrics: fleetserve_kv_tier_state): up, full (writes refused
        # for memory, reads go on), unavailable, or unknown before the first one; only `status` had said it
        self.state = "unknown"
        self._touch = True  # TOUCH a chain's head with its new blocks (off once the server refuses it)
        self.stats = TierStats()
        # the last call to this Redis answered: the engine's generation thread reads it only then, so that after a
        # failure the first call (up to the read timeout) is a prefetch's or the writer's, never a running stream's
        self.trusted = False

    def _k(self, key: int) -> str:
        return f"{self.prefix}{key:016x}"

    def block_key(self, name: bytes | str | None) -> int | None:
        """The block key of a Redis key name under this store's prefix (None for anybody else's)."""
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        if not isinstance(name, str) or not name.startswith(self.prefix):
            return None
        try:
            return int(name[len(self.prefix):], 16)
        except ValueError:
            return None

    def watch_client(self):
        """A client of its own for a long-lived subscription (no read timeout; pings while idle)."""
        import redis

        return redis.Redis.from_url(self.url, socket_connect_timeout=self._timeout, health_check_interval=10,
                                    **self._auth)

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, exc: Exception) -> None:
        """Said once per outage (it had been said again after every back-off, as long as requests came), with the
        refusal in words when it is one (a wrong or missing password read alike as AuthenticationError)."""
        self.trusted = False
        self.stats.add("failures")
        if self.state != "unavailable":
            log.warning("L2 Redis at %s unavailable (%s); serving from L1 and recompute, trying again every %gs "
                        "(a line when it answers)", self.url, _failure(exc), self.backoff)
        self.state = "unavailable"
        self._down_until = time.monotonic() + self.backoff

    def _answered(self) -> None:
        self.trusted = True
        if self.state == "unavailable":
            log.info("L2 Redis at %s answers again", self.url)

    def _full(self, exc: Exception) -> None:
        """A write refused for memory, or refused outright (a read-only replica, a primary that failed over, a user
        whose ACL allows no writes): writes pause, reads go on. Either had gone the way of a dead server, and every
        read of blocks already there missed for the back-off."""
        import redis

        self.stats.add("failures")
        memory = isinstance(exc, redis.exceptions.OutOfMemoryError)
        self.state = "full" if memory else "read_only"
        if self._refusing != self.state:  # once per episode: it had been said after every back-off, every 2 s
            self._refusing = self.state
            why = ("is full ({}: a write refused for memory: its maxmemory-policy does not evict these blocks, or "
                   "its maxmemory is too small for one)" if memory else
                   "refuses writes ({}: a read-only replica, or a user whose ACL allows no SET)").format(
                       type(exc).__name__)  # not the message: redis-py quotes the refused command, block bytes and all
            log.warning("L2 Redis at %s %s; new blocks are not written (tried again every %.0fs), blocks already there "
                        "are still read (a line when it takes writes again)", self.url, why, self.backoff)
        self._full_until = time.monotonic() + self.backoff

    def get_many(self, keys: list[int]) -> list[bytes | None]:
        if not keys or not self.available:
            return [None] * len(keys)

        started = time.perf_counter()
        try:
            values = self._client.mget([self._k(k) for k in keys])
            if not isinstance(values, list) or len(values) != len(keys) or \
                    not all(v is None or isinstance(v, bytes) for v in values):
                raise MalformedReply(f"MGET of {len(keys)} keys answered {type(values).__name__}"
                                     + (f" of {len(values)}" if isinstance(values, list) else ""))
        except Exception as exc:  # a server or proxy that answers garbage (redis-py raises
            # TypeError, AttributeError, ValueError on it) had failed every request with a 500: recompute instead
            self._failed(exc)
            return [None] * len(keys)
        self.stats.timing("get", time.perf_counter() - started)
        self.stats.add("bytes_out", sum(len(v) for v in values if v is not None))
        self._answered()
        if self.state not in ("full", "read_only") or time.monotonic() >= self._full_until:  # a read says nothing
            self.state = "up"  # of the writes
        return list(values)

    def put_many(self, items: list[tuple[int, bytes]], head: list[int] | tuple = ()) -> list[int]:
        """Write a chain's new blocks last first, then TOUCH its `head` (the blocks before them) so Redis's LRU
        (approximate, by idle time in seconds) keeps the head at least as long as the tail. TOUCH is best effort:
        a server or proxy that refuses it (an ACL without +touch) is told once in the log and not asked again,
        and the blocks are written all the same (in one pipeline, its error had failed the write and the store)."""
        if not items or not self.available or time.monotonic() < self._full_until:
            return []
        import redis

        started = time.perf_counter()
        try:
            pipe = self._client.pipeline(transaction=False)
            for key, value in reversed(items):
                pipe.set(self._k(key), value)
            touching = bool(head) and self._touch
            if touching:
                pipe.touch(*[self._k(k) for k in head])
            results = pipe.execute(raise_on_error=False)
            for result in results[:len(items)]:
                if isinstance(result, Exception):
                    raise result
            if touching and isinstance(results[-1], Exception):
                self._touch = False
                log.warning("L2 Redis at %s refused TOUCH (%s): a prompt's earlier blocks are no longer refreshed "
                            "when its new ones are written, so Redis may evict them first", self.url,
                            type(results[-1]).__name__)
        except (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
                redis.exceptions.NoPermissionError) as exc:
            self._full(exc)
            return []
        except Exception as exc:  # garbage answered (as for get_many): the store is down a while
            self._failed(exc)
            return []
        self.stats.timing("put", time.perf_counter() - started)
        self.stats.add("bytes_in", sum(len(v) for _, v in items))
        self._answered()
        self.state = "up"
        if self._refusing is not None:
            self._refusing = None
            log.info("L2 Redis at %s takes writes again", self.url)
        return [k for k, _ in items]

    def clear(self) -> list[int]:
        """Delete this store's blocks; returns their keys (for the removed event)."""

        try:
            names = list(self._client.scan_iter(match=self.prefix + "*", count=1000))
            if names:
                self._client.delete(*names)
        except Exception as exc:  # as get_many
            self._failed(exc)
            return []
        return [k for k in map(self.block_key, names) if k is not None]
