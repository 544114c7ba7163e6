"""Dispatch: choose a replica with the policy, send, and retry elsewhere until the first body bytes arrive.

A request is committed to a replica only once that replica produced its first body bytes; until then an
unreachable replica or a failed answer (502/503/504, router/retry.py) sends it to another one, with
backoff, at most `max_attempts` tries. A replica that says it is busy (503 with Retry-After) is tried no more
for this request but keeps its standing; when every replica tried was busy the client gets 503 `overloaded`
with the longest Retry-After. A replica that closes the connection under the request without answering (it may
have crashed, or the request may be what crashes it) is not taken out (its probes judge it); the request
tries one more replica, and a second such close ends it with 502 `upstream_dropped`: before, one request that
made replicas close sent itself to every replica (twice each) and took them all out. A replica that took the
request and went silent (a read timeout) is never retried elsewhere: the request itself may be what stalls it
(504).

Bookkeeping is the simulator's (router/backlog.py): in flight from the send, the prefill backlog until the
first byte, released when the answer ends or fails.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass

from fleetserve.api.errors import APIError
from fleetserve.api.protocol import GENERATION_PATHS
from fleetserve.router.gate import Refused
from fleetserve.router.model_metrics import FailedAttempts
from fleetserve.router.policies import Choice, RouteRequest
from fleetserve.router.pool import Backend
from fleetserve.router.retry import backoff, busy, exclude, retry_after_seconds, retryable
from fleetserve.router.upstream import Timeout, Unproven, UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)

MAX_DROPS = 2  # replicas that may close the connection under one request before it is answered 502


class Attempt:
    """An answer whose first body bytes arrived; owns the replica's in-flight slot until `release`."""

    __slots__ = ("backend", "response", "first", "choice", "tries", "held", "cut", "retried", "_book", "_freed",
                 "_released", "_ended")

    def __init__(self, backend: Backend, response: UpstreamResponse, first: bytes, choice: Choice, tries: int,
                 book, freed, ended=None, retried: tuple[str, ...] = ()):
        self.backend = backend
        self.response = response
        self.first = first
        self.choice = choice
        self.tries = tries  # replicas tried, this one included
        self.held = 0.0  # seconds it waited in the scale-from-zero buffer while dispatched (replicas died under it)
        self.cut: APIError | None = None  # why the answer broke off after it began (relay.py), if it did
        self.retried = retried  # "replica:reason" of each replica tried before this one (the request's log line)
        self._book = book
        self._freed = freed
        self._ended = ended  # the model metrics' end of this invocation (router/model_metrics.py), if counted
        self._released = False

    def release(self) -> None:
        """The answer ended (or failed): free the slot, close an unfinished upstream answer."""
        if not self._released:
            self._released = True
            self.response.close()
            self._book.finished(self.backend.id)
            self._freed()
            if self._ended is not None:
                self._ended()


@dataclass(frozen=True)
class Outgoing:
    """What is sent upstream: the same for every attempt."""

    method: str
    path: str  # the OpenAI route the client called (what metrics and policies read)
    headers: list[tuple[bytes, bytes]]
    body: bytes
    wire_path: str | None = None  # where the replicas serve it, when not there (a container's /invocations)


class Dispatcher:
    def __init__(self, gateway):
        self.gw = gateway  # pool, policy, upstream client, gate, metrics, settings

    async def dispatch(self, out: Outgoing, route: RouteRequest) -> Attempt:
        """The answering attempt. An APIError raised after a replica was tried carries the failed attempts
        (`after_attempts`), which the model metrics count once (`ModelMetrics.gave_up`)."""
        tried = FailedAttempts()  # per request: one Dispatcher serves every request of the gateway
        waited = [0.0]  # seconds held for a replica to come back: a cold start, not the served TTFT
        try:
            attempt = await self._dispatch(out, route, tried, waited)
            attempt.held = waited[0]
            return attempt
        except (APIError, Refused) as err:
            err.after_attempts = tried if tried.any else False
            raise
        except asyncio.CancelledError:  # the client left between attempts (a backoff, a wait for a slot): the
            model = self.gw.model_metrics  # request's invocation, which no failed attempt counted
            if model is not None and tried.any and not tried.ended and out.method == "POST" and \
                    out.path in GENERATION_PATHS:
                model.left(tried.last)
            raise

    async def _dispatch(self, out: Outgoing, route: RouteRequest, tried: FailedAttempts, waited: list[float],
                        held: bool = False, retried: tuple[str, ...] = ()) -> Attempt:
        """`held`: the request already waited once for a replica to come back (it waits at most once); `retried`:
        the replicas it failed on before that wait, and why."""
        gw = self.gw
        settings = gw.settings
        excluded: frozenset[str] = frozenset()
        last_reason = ""
        busy_for = 0  # the longest Retry-After of the replicas that said they were busy
        dropped = 0  # replicas that closed the connection under this request without answering
        failures: list[str] = []  # why each replica tried did not take it
        failed_on = list(retried)  # and which: the request's log line names them (only a counter had said why)
        for attempt in range(settings.max_attempts):
            if attempt:
                await asyncio.sleep(backoff(attempt, random.random()))
                route = _excluding(route, excluded)
            choice = gw.policy.choose(route, gw.snapshot())
            for _ in range(SLOT_WAITS):
                # every replica left is at its limit: wait in the queue for a slot, on a retry as on the first
                # attempt (a retry after a crash had been answered 502 while the survivors were busy a moment)
                if (choice is not None or not gw.gate.settings.max_concurrent_per_replica
                        or not gw.gate.ready(excluded)):
                    break
                waited[0] += await gw.gate.admit(excluded)
                choice = gw.policy.choose(route, gw.snapshot())  # None: another request took the slot first
            if choice is None:
                break
            if gw.peers is not None and route.blocks:
                gw.peers.routed(choice.replica.id, route.blocks, route.exact_keys)  # other workers' indexes
            gw.count_decision(choice.branch if not excluded else "retry", out.path)
            backend = gw.pool.get(choice.replica.id)
            outcome = await self._try(backend, out, choice.prefill_tokens, tried)
            if isinstance(outcome, tuple):
                response, first, ended = outcome
                return Attempt(backend, response, first, choice, len(failed_on) + 1, gw.pool.book,
                               gw.gate.slot_freed, ended, tuple(failed_on))
            if outcome == "timeout":
                gw.metrics.retries.labels("timeout_not_retried").inc()
                raise APIError(504, f"the model replica did not answer within {settings.upstream_read_timeout:g}s; "
                                    "the request was not retried elsewhere", code="upstream_timeout")
            if isinstance(outcome, int):  # busy: its Retry-After
                busy_for, outcome = max(busy_for, outcome), "busy"
            if outcome == "dropped":
                dropped += 1
                if dropped >= MAX_DROPS:
                    gw.metrics.retries.labels("dropped_not_retried").inc()
                    raise APIError(502, f"{dropped} model replicas closed the connection under this request without "
                                        "answering; it was not sent to more: the request itself may be what makes "
                                        "them fail", code="upstream_dropped")
            last_reason = outcome
            failures.append(outcome)
            failed_on.append(f"{backend.label}:{outcome}")
            excluded = exclude(excluded, backend.id)
            gw.metrics.retries.labels(outcome).inc()
        if failures and all(f == "busy" for f in failures):  # a 502 then a busy one is not "every replica busy"
            raise APIError(503, "every model replica tried is at capacity (its waiting queue is full); retry after "
                                f"{busy_for}s", code="overloaded", headers={"Retry-After": str(busy_for)})
        if not gw.pool.healthy():
            if failures and not held and all(f in UNDELIVERED for f in failures):
                # the replicas it went to died under it (a crash took every one) before any answer began: it
                # waits for one to come back, bounded as a request held at zero is, not a 503 at once
                waited[0] += await gw.gate.admit()
                return await self._dispatch(out, _excluding(route, frozenset()), tried, waited, held=True,
                                            retried=tuple(failed_on))
            raise APIError(503, "no healthy model replica is available; retry shortly", code="no_replica",
                           headers={"Retry-After": "2"})
        if failures and all(f == "refused_router" for f in failures):
            raise APIError(502, f"every model replica tried ({len(failures)}) refused the router's own credentials "
                                "(401): the router and its engines must share the internal token "
                                "(--internal-token-file), or the router must send the engines' API key "
                                "(--engine-token-file); not your API key", code="upstream_unauthorized")
        if failures and len(set(failures)) == 1 and failures[0].startswith("status_"):
            status = int(failures[0][len("status_"):])  # every replica said the same: say it too (a 503 was a 502)
            raise APIError(status, f"every replica tried ({len(failures)}) answered {status}", code="upstream_failed",
                           headers={"Retry-After": "1"})
        raise APIError(502, f"all attempts failed (last: {last_reason or 'no eligible replica'})",
                       code="upstream_failed", headers={"Retry-After": "1"})

    async def _try(self, backend: Backend, out: Outgoing, prefill: int, tried: FailedAttempts) -> tuple | str | int:
        """Send to one replica: (answer, first body bytes, what ends its model metrics), or why another replica
        should be tried (the seconds of its Retry-After when it said it is busy), noted in `tried`."""
        gw = self.gw
        book = gw.pool.book
        book.sent(backend.id, prefill)
        model = gw.model_metrics if out.method == "POST" and out.path in GENERATION_PATHS else None
        sent_at = gw.clock()
        if model is not None:
            model.sent(backend.label)
        tried.any = True
        response = None
        try:
            response = await gw.upstream.request(backend.url, out.method, out.wire_path or out.path, out.headers,
                                                 out.body)
            if response.status == 401:
                first = await response.read()
                if refused_router(gw.settings, first):  # told to the client as its own key's, it misled
                    response.close()
                    book.failed(backend.id, prefill)
                    gw.gate.slot_freed()
                    self._failed(model, tried, backend, saw=False, counted_error=False)  # its guard counts none
                    log_refused(backend.url)
                    return "refused_router"  # another replica may hold the right token (a rotation under way)
            elif retryable(response.status):
                response.close()
                book.failed(backend.id, prefill)
                gw.gate.slot_freed()
                self._failed(model, tried, backend, saw=True, counted_error=True)  # its own status, counted there
                retry_after = response.header(b"retry-after")
                if busy(response.status, retry_after):
                    return retry_after_seconds(retry_after)
                gw.request_failed(backend, f"status {response.status}")
                return f"status_{response.status}"
            else:
                first = await response.read()
        except Timeout:
            if response is not None:
                response.close()
            book.failed(backend.id, prefill)
            gw.gate.slot_freed()
            gw.request_failed(backend, "ReadTimeout")
            self._failed(model, tried, backend, saw=True, counted_error=False)  # it counts a success, later
            return "timeout"
        except UpstreamError as exc:
            if response is not None:
                response.close()
            book.failed(backend.id, prefill)
            gw.gate.slot_freed()
            if exc.kind == "stalled":  # its probes took it out (pool.py) before it answered: another replica
                self._failed(model, tried, backend, saw=True, counted_error=False)
                return "stalled"
            if isinstance(exc, Unproven):  # its challenge answered late (a burst): nothing was sent, and nothing is
                # held against it (not out, no breaker count): another replica takes the request, its probes judge it
                self._failed(model, tried, backend, saw=False, counted_error=False)
                return "unreachable"
            if exc.kind != "dropped":  # no connection: out until a probe passes. A drop may be this request's
                # doing: the probes judge the replica
                gw.mark_unreachable(backend, f"{exc.kind}: {exc}", getattr(exc, "refused", False))
            gw.request_failed(backend, exc.kind)
            self._failed(model, tried, backend, saw=exc.kind != "unreachable", counted_error=False)
            return "dropped" if exc.kind == "dropped" else "unreachable"
        except BaseException:  # the client went away (cancelled) or a bug: the replica sees the cut
            if response is not None:
                response.close()
            book.failed(backend.id, prefill)
            gw.gate.slot_freed()
            tried.ended = True
            if model is not None:
                model.abandoned(backend.label)
            raise
        book.first_byte(backend.id, prefill)
        if response.status < 500:
            gw.pool.request_succeeded(backend)
        elif response.status != 501:  # a server error, not retried (the request may be its cause) but held against
            # the replica: one failing them all goes out, within a cap (pool.request_failed)
            gw.request_failed(backend, f"status {response.status}", server_error=True)
        ended = None
        if model is not None:
            model.answered(backend.label, response.status, (gw.clock() - sent_at) * 1000, first)

            def ended(replica=backend.label) -> None:
                model.ended(replica, (gw.clock() - sent_at) * 1000)
        return response, first, ended


    @staticmethod
    def _failed(model, tried: FailedAttempts, backend: Backend, saw: bool, counted_error: bool) -> None:
        """An attempt without a usable answer: out of flight, and noted for the request's end (`saw`: its engine
        received it; `counted_error`: its engine answered it with an error status)."""
        tried.add(backend.label, saw, counted_error)
        if model is not None:
            model.failed(backend.label)


def refused_router(settings, first: bytes) -> bool:
    """A replica's 401 is about the router's own credentials when the router sent some (the client's
    Authorization never reaches a replica), or when it names the internal token (our engines, whose token the
    router lacks); otherwise it may be a client's own key passed through (an `api-key` header to an external
    server), and it reaches the client as it came."""
    from fleetserve.api.internal import INTERNAL_HEADER

    sent = bool(settings.engine_token) or bool(settings.internal_token and settings.send_internal_token)
    return sent or INTERNAL_HEADER.encode() in first


_REFUSED_LOGGED: dict[str, float] = {}


def log_refused(url: str, every_s: float = 60.0) -> None:
    """Once a minute per replica: the operator's signal that router and engines disagree on credentials."""
    now = time.monotonic()
    if now - _REFUSED_LOGGED.get(url, -every_s) >= every_s:
        if len(_REFUSED_LOGGED) >= 1024:  # replicas come and go (DNS discovery): forget the old ones
            _REFUSED_LOGGED.clear()
        _REFUSED_LOGGED[url] = now
        log.error("replica %s refused the router's credentials (401): give the router the engines' "
                  "--internal-token-file (or --engine-token-file for vLLM/SGLang --api-key)", url)


UNDELIVERED = ("unreachable", "dropped", "stalled")  # attempts no replica answered: nothing reached the client
SLOT_WAITS = 3  # waits for a free slot per attempt: another request may take the one that was freed


def _excluding(route: RouteRequest, excluded: frozenset[str]) -> RouteRequest:
    return RouteRequest(route.path, route.body, route.headers, route.tenant, excluded, route.blocks,
                        route.block_tokens, route.prompt_tokens, route.exact_keys)

