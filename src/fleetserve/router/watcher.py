"""The replica watcher: what the gateway knows about its replicas besides what requests tell it.

Every `interval`: the DNS names of a headless Service are resolved into backends (every few rounds), each
backend is probed for health, the engines' KV layout (block size, key namespace, cache capacity) is learned
once from /get_model_info, the served models' cards are kept from a replica's /v1/models (the router answers
with them while no replica is ready: `max_model_len` and all, as the engines give them), the fleet's reason no
replica can start is read from `--failing-file` (Kubernetes: the operator's word, `k8s/failing.py`), and, for a policy
that needs them (`Needs.kv_events`), one long-poll of KV events per healthy backend keeps the router's KV
index current, resynchronising from /kv/blocks when behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

from fleetserve.observe.metrics import child
from fleetserve.observe.rules import LEGACY_VLLM_PREFIX_CACHE, PREFIX_CACHE_COUNTERS
from fleetserve.router.discovery import system_resolver
from fleetserve.router.features import KVLayout
from fleetserve.router.kvindex import KVIndex
from fleetserve.router.policies import needs_of
from fleetserve.router.pool import Backend
from fleetserve.router.served import write_model_cards
from fleetserve.router.upstream import UpstreamError

log = logging.getLogger(__name__)

DISCOVERY_EVERY = 5  # health rounds between DNS resolutions of backend names
ENGINE_COUNTERS_EVERY = 10  # health rounds between reads of the engines' prefix-cache counters
CARDS_EAGER_ROUNDS = 30  # the served models' cards are asked every round for this many at first, then as above
CARDS_ASKED = 3  # replicas asked for them at once
MODELS_TRIES = 3  # health rounds a replica's served models are asked in before it is taken to list none
# (hits, queries) counter families of each engine (observe/rules.PREFIX_CACHE_COUNTERS: vLLM's names, which the
# built-in engine exports too, and SGLang's cached and prompt tokens, summed over its cache sources)
_FAMILIES = [tuple(name.removesuffix("_total") for name in pair)
             for pair in [*PREFIX_CACHE_COUNTERS.values(), LEGACY_VLLM_PREFIX_CACHE]]  # the current names first


def prefix_cache_totals(text: str) -> tuple[float, float] | None:
    """(queried tokens, hit tokens) summed over an engine's /metrics text, or None if it publishes neither."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            name = family.name.removesuffix("_total")  # a TYPE line with or without it
            if any(name in pair for pair in _FAMILIES):
                total = sum(s.value for s in family.samples if s.name.endswith("_total"))
                totals[name] = totals.get(name, 0.0) + total
    except ValueError:
        return None
    for hits, queries in _FAMILIES:
        if hits in totals and queries in totals:
            return totals[queries], totals[hits]
    return None


class ReplicaWatcher:
    def __init__(self, gateway):
        self.gw = gateway
        self.resolver = system_resolver  # injectable: discovery tests resolve names they make up
        self.static_backends = [b.url for b in gateway.pool.backends.values()]
        self.layout_known = False
        self.subscribed: set[str] = set()
        self._kv_tasks: dict[str, asyncio.Task] = {}
        # replicas that answered 404 (vLLM, SGLang: no KV events, no KV layout): not asked again every round while
        # they stay in the pool (each probe round sent every one a request that could only be a 404)
        self.no_events: set[str] = set()
        self._no_layout: set[str] = set()
        # each replica's served model names, asked once when first healthy (None-free: an unanswered ask is retried)
        self.models_of: dict[str, frozenset[str]] = {}
        self._mismatch_said: set[frozenset[frozenset[str]]] = set()
        self._models_tries: dict[str, int] = {}
        self._engine_totals: dict[str, tuple[float, float]] = {}  # (queries, hits) at the last read
        self.engine_hit_rate: dict[str, float] = {}  # per replica, over the last interval with lookups
        self.failing: str | None = None  # the reason in --failing-file, as last read
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self.read_failing()
        if self.gw.settings.backend_dns:
            await self.discover()
        await self.gw.pool.probe_all()
        self._task = asyncio.create_task(self._maintain())

    async def stop(self) -> None:
        for task in self._kv_tasks.values():
            task.cancel()
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def discover(self) -> None:
        """Replace the backends with what the DNS names resolve to now (plus the static ones)."""
        loop = asyncio.get_running_loop()
        urls = list(self.static_backends)
        for name in self.gw.settings.backend_dns:
            try:
                urls += await loop.run_in_executor(None, name.urls, self.resolver)
            except OSError as exc:
                log.warning("could not resolve %s (%s); keeping the last backends", name.host, exc)
                return
        known = {b.url for b in self.gw.pool.backends.values()}
        if set(urls) != known:
            log.info("backends from DNS: %s", ", ".join(urls) or "none")
            self.gw.set_backends(urls, failing=self.failing)

    def read_failing(self) -> None:
        """Apply the reason in --failing-file when it changed. A file that cannot be read is no reason: the
        requests are held as before (a refusal on a guess would be an outage of its own)."""
        path = self.gw.settings.failing_file
        if not path:
            return
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                reason = " ".join(f.read(2000).split()) or None
        except FileNotFoundError:
            reason = None
        except OSError as exc:
            log.warning("could not read %s (%s); held requests keep waiting", path, exc)
            reason = None
        if reason != self.failing:
            if reason:
                log.warning("no replica can start: %s; held and new requests are refused (503) until that changes",
                            reason)
            else:
                log.info("the fleet's replicas can start again (%s is empty)", path)
            self.failing = reason
            self.gw.gate.set_failing(reason)

    async def _maintain(self) -> None:
        """The health loop: one round every interval, for the router's whole life. A round that fails is logged
        and the next one runs (an error that escaped once ended the task without a word, and a replica that died
        afterwards was never taken out, nor one that came back let in)."""
        rounds = 0
        while True:
            rounds += 1
            try:
                await self._round(rounds)
            except Exception:
                log.exception("health round %d failed; the next one runs in %.1f s", rounds, self.gw.pool.interval)
            await asyncio.sleep(self.gw.pool.interval)

    async def _round(self, rounds: int) -> None:
        pool = self.gw.pool
        self.read_failing()
        if self.gw.settings.backend_dns and (rounds - 1) % DISCOVERY_EVERY == 0:
            try:
                await self.discover()
            except Exception:  # the backends stay as they were, and are probed all the same
                log.exception("backend discovery failed; the known backends are kept")
        await pool.probe_all()
        await self._check_models()
        if not self.layout_known:
            await self._learn_layout()
        if rounds % ENGINE_COUNTERS_EVERY == 1:
            await asyncio.gather(*(self._read_engine_counters(b) for b in pool.healthy()))
        if self.gw.settings.served_models and (rounds % ENGINE_COUNTERS_EVERY == 1 or (
                not self.gw.model_cards and rounds <= CARDS_EAGER_ROUNDS)):
            await self._learn_model_cards()  # every round at first until a replica gave them, then now and then
        if needs_of(self.gw.policy).kv_events:
            for b in pool.backends.values():
                task = self._kv_tasks.get(b.id)
                if b.healthy and b.id not in self.no_events and (task is None or task.done()):
                    self._kv_tasks[b.id] = asyncio.create_task(self._follow_kv_events(b))
            for gone in [bid for bid in self._kv_tasks if bid not in pool.backends]:
                self._kv_tasks.pop(gone).cancel()
                if self.gw.kv_index is not None:
                    self.gw.kv_index.forget(gone)
        self.no_events &= pool.backends.keys()
        self._no_layout &= pool.backends.keys()
        self.gw.forget_departed()  # a departure is timed from here, not from the next scrape, if any comes
        live = getattr(self.gw, "dashboard", None)
        if live is not None:  # the dashboard's history, whole in every worker while a page watches
            await live.keep_sampling(self.gw)
        if self.gw.peers is not None:  # workers: a scrape reads every worker's file, answered by one of them,
            self.gw.refresh_gauges()  # so each keeps its own fresh (they were as old as its last scrape)

    async def _check_models(self) -> None:
        """Ask each replica once, when first healthy, which models it serves; say (once for each two lists) when
        two replicas share none. One router sends any request to any replica: behind it, replicas of two models
        answered half the requests 404 "model does not exist" for a model its /v1/models had just listed, with
        nothing in the log but "healthy"."""
        pool = self.gw.pool
        new = [b for b in pool.healthy() if b.id not in self.models_of][:CARDS_ASKED]

        async def served(b: Backend) -> frozenset[str] | None:  # no list (no /v1/models): empty, not compared
            cards = await self._model_cards_of(b)
            return None if cards is None else frozenset(str(c["id"]) for c in cards if c.get("id"))

        for b, names in zip(new, await asyncio.gather(*(served(b) for b in new)), strict=True):
            tries = self._models_tries[b.id] = self._models_tries.get(b.id, 0) + 1
            if names is not None or tries >= MODELS_TRIES:  # one that never answers is not asked every round
                self.models_of[b.id] = names or frozenset()
        for gone in [bid for bid in self._models_tries if bid not in pool.backends]:
            self.models_of.pop(gone, None)
            del self._models_tries[gone]
        lists = {names: bid for bid, names in self.models_of.items() if names}
        for a, b in itertools.combinations(sorted(lists, key=sorted), 2):
            if a & b or frozenset((a, b)) in self._mismatch_said:
                continue
            self._mismatch_said.add(frozenset((a, b)))
            log.warning("replicas behind this router serve different models: %s serves %s, %s serves %s; every "
                        "request goes to any replica, and one that lacks the model answers 404: run one router "
                        "per model", pool.backends[lists[a]].url, sorted(a), pool.backends[lists[b]].url, sorted(b))

    async def _model_cards_of(self, b: Backend) -> list[dict] | None:
        """The model cards a replica's /v1/models lists; [] when it lists none (or answers no list), None when it
        did not answer."""
        try:
            status, listing = await self.gw.upstream.get_json(b.url + "/v1/models", timeout=2.0)
        except UpstreamError:
            return None
        data = listing.get("data") if status == 200 and isinstance(listing, dict) else None
        return [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []

    async def _learn_layout(self) -> None:
        for b in self.gw.pool.healthy():
            if b.id in self._no_layout:
                continue
            try:
                status, info = await self.gw.upstream.get_json(b.url + "/get_model_info", timeout=2.0)
                if status == 404:
                    self._no_layout.add(b.id)
                if status != 200 or not isinstance(info, dict):
                    continue
                self.gw.layout = KVLayout(int(info.get("block_size", 256)), str(info.get("kv_model", "")),
                                          str(info.get("kv_version", "1")), str(info.get("kv_dtype", "")))
                for other in self.gw.pool.backends.values():
                    other.cache_blocks = other.cache_blocks or int(info.get("num_gpu_blocks", 0))
                self.layout_known = True
                return
            except (UpstreamError, ValueError, TypeError):
                continue

    async def _learn_model_cards(self) -> None:
        """The served models' cards as a ready replica lists them, for the router's own answers at zero replicas
        (its bare card lacked `max_model_len`, which clients size their prompts by); kept until a replica says
        otherwise, so a fleet scaled to zero lists what it served."""
        names = set(self.gw.settings.served_models)

        async def cards_of(b: Backend) -> dict:
            return {c["id"]: c for c in await self._model_cards_of(b) or () if c.get("id") in names}

        # a few replicas at once (a slow one holds the health round for its timeout at most once, not per replica)
        for cards in await asyncio.gather(*(cards_of(b) for b in self.gw.pool.healthy()[:CARDS_ASKED])):
            if cards:
                if any(_card_changed(self.gw.model_cards.get(n), c) for n, c in cards.items()):
                    write_model_cards(self.gw.settings.model_cards_file, {**self.gw.model_cards, **cards})
                self.gw.model_cards.update(cards)
                return

    async def _read_engine_counters(self, backend: Backend) -> None:
        """The engine's own prefix-cache counters (vLLM's names, which the built-in engine publishes too): the hit
        rate over the last interval, per replica, beside what the router predicted and what responses reported."""
        try:
            status, body = await self.gw.upstream.get(backend.url + "/metrics", timeout=2.0)
        except UpstreamError:
            return
        if status != 200:
            return
        totals = prefix_cache_totals(body.decode("utf-8", "replace"))
        if totals is None:
            return
        last = self._engine_totals.get(backend.id)
        self._engine_totals[backend.id] = totals
        if last is not None and totals[0] > last[0] and totals[1] >= last[1]:
            self.engine_hit_rate[backend.id] = round((totals[1] - last[1]) / (totals[0] - last[0]), 4)
            child(self.gw.metrics.backend_engine_hit_rate, backend.id).set(self.engine_hit_rate[backend.id])

    async def _follow_kv_events(self, backend: Backend) -> None:
        """Long-poll the backend's KV events into the index; resynchronise from /kv/blocks when behind."""
        seq = -1
        get = self.gw.upstream.get_json
        try:
            while True:
                if seq < 0:
                    status, data = await get(backend.url + "/kv/blocks", timeout=10.0)
                    if status == 404:
                        self.no_events.add(backend.id)  # this engine publishes no events: not asked again
                        return
                    if status != 200 or not isinstance(data, dict):
                        raise ValueError(f"/kv/blocks answered {status}")
                    if self.gw.kv_index is None:
                        self.gw.kv_index = KVIndex()
                    if "blocks" in data:  # the built-in engine: every tier (`tiers`; an older one: the nearest)
                        entries = {int(b["key"]): b.get("tiers") or b["tier"] for b in data["blocks"]}
                    else:  # the simulated engine: one tier
                        entries = {int(k): data.get("tier", "engine") for k in data["keys"]}
                    self.gw.kv_index.replace(backend.id, entries)
                    seq = int(data["seq"])
                    self.subscribed.add(backend.id)
                    continue
                status, data = await get(f"{backend.url}/kv/events?since={seq}&wait=10", timeout=15.0)
                if status != 200 or not isinstance(data, dict):
                    raise ValueError(f"/kv/events answered {status}")
                if data.get("resync"):
                    seq = -1
                    continue
                for event in data.get("events", []):
                    keys = [int(k) for k in event.get("keys", [])]
                    if event.get("type") == "stored":
                        self.gw.kv_index.stored(backend.id, keys, event.get("tier", "engine"))
                    elif event.get("type") == "removed":
                        self.gw.kv_index.removed(backend.id, keys, event.get("tier"))
                seq = int(data.get("seq", seq))
        except (UpstreamError, ValueError, KeyError, TypeError) as exc:
            log.info("KV events of %s interrupted (%s); will resubscribe", backend.url, exc)
        finally:
            self.subscribed.discard(backend.id)


def _card_changed(known: dict | None, card: dict) -> bool:
    """A card worth writing down again: another replica's differs in `created` (its own start) alone."""
    return known is None or {k: v for k, v in known.items() if k != "created"} != \
        {k: v for k, v in card.items() if k != "created"}
