"""Redis evictions as KV events: without them a router keeps crediting L2 blocks Redis already dropped.

Redis under `maxmemory` evicts blocks on its own. The watcher turns on keyevent notifications for evicted
(and expired) keys (`CONFIG SET notify-keyspace-events`, adding `Eex` to what is set), subscribes to them in
a background thread and hands the block keys under the store's prefix to `on_removed`. A Redis that refuses
CONFIG (managed services, ACLs) is logged once and watched anyway: it notifies only if its operator turned
notifications on. A lost connection is retried, and the configuration redone (a restarted Redis forgot it).

A Redis that restarted (its `run_id` changed between two connections) without persistence holds none of the
blocks the routers were told it had: `on_restarted` makes them forget this engine's L2 blocks (the engine's
event log asks its subscribers to resynchronise). They had kept crediting every one of them for good.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fleetserve.kvcache.tiers import RedisStore

log = logging.getLogger(__name__)

FLAGS = "notify-keyspace-events"
EVENTS = ("evicted", "expired")


def notify_flags(current: str) -> str | None:
    """The flags to set so evictions and expiries are notified as keyevents, or None if they already are."""
    have = set(current)
    need = {"E", "e", "x"} - have
    if "A" in have:  # "A" is an alias that includes "e" and "x"
        need -= {"e", "x"}
    return current + "".join(sorted(need)) if need else None


class L2EvictionWatcher:
    def __init__(self, store: RedisStore, on_removed: Callable[[list[int]], None], retry_s: float = 2.0,
                 on_restarted: Callable[[], None] | None = None):
        self.store = store
        self.on_removed = on_removed
        self.on_restarted = on_restarted
        self.run_id: str | None = None  # the Redis server's instance id at the last connection
        self.retry_s = retry_s
        self.configured: bool | None = None  # whether our CONFIG SET took (None: not tried yet)
        self.subscribed = threading.Event()
        self._stop = threading.Event()
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="l2-evictions", daemon=True)

    def start(self) -> L2EvictionWatcher:
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _warn_once(self, what: str, msg: str, *args) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(msg, *args)

    def _configure(self, client) -> None:
        import redis

        try:
            current = client.config_get(FLAGS).get(FLAGS, "")
            if isinstance(current, bytes):
                current = current.decode()
            flags = notify_flags(current)
            if flags is not None:
                client.config_set(FLAGS, flags)
            self.configured = True
        except redis.ResponseError as exc:  # CONFIG renamed, disabled or denied
            self.configured = False
            self._warn_once("config", "L2 Redis at %s refused CONFIG (%s): its evictions are published as KV "
                            "events only if notify-keyspace-events already includes Ee", self.store.url, exc)

    def _run(self) -> None:
        import redis

        while not self._stop.is_set():
            client = pubsub = None
            try:
                client = self.store.watch_client()
                self._check_restart(client)
                self._configure(client)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                db = client.connection_pool.connection_kwargs.get("db", 0)
                pubsub.subscribe(*(f"__keyevent@{db}__:{event}" for event in EVENTS))
                self.subscribed.set()
                while not self._stop.is_set():
                    self._drain(pubsub)
            except (redis.RedisError, OSError) as exc:
                self._warn_once("lost", "watching L2 Redis at %s for evictions failed (%s); retrying every %.0fs",
                                self.store.url, type(exc).__name__, self.retry_s)
                self._stop.wait(self.retry_s)
            finally:
                self.subscribed.clear()
                for closing in (pubsub, client):
                    if closing is not None:
                        try:
                            closing.close()
                        except (redis.RedisError, OSError):
                            pass

    def _check_restart(self, client) -> None:
        import redis

        try:
            run_id = str((client.info("server") or {}).get("run_id") or "") or None
        except redis.ResponseError:  # INFO denied (an ACL): a restart goes unseen, as before
            return
        if run_id and self.run_id and run_id != self.run_id:
            log.warning("L2 Redis at %s restarted (a new run_id): the blocks it held are gone unless it persists "
                        "them; routers forget this engine's L2 blocks and learn them again", self.store.url)
            if self.on_restarted is not None:
                self.on_restarted()
        self.run_id = run_id or self.run_id

    def _drain(self, pubsub) -> None:
        """Wait up to half a second for notifications; publish what arrived as one event."""
        keys = []
        message = pubsub.get_message(timeout=0.5)
        while message is not None:
            key = self.store.block_key(message.get("data"))
            if key is not None:
                keys.append(key)
            message = pubsub.get_message(timeout=0.0) if len(keys) < 4096 else None
        if keys:
            self.store.stats.evictions += len(keys)
            self.on_removed(keys)
