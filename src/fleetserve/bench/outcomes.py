"""What became of each request a fault benchmark sent: one classification shared by every fault scenario.

- answered: a complete response (2xx, or a 4xx in OpenAI error JSON: bad input answered clearly);
- rejected_with_retry_after: 429/503 with a Retry-After header (load shedding the client can act on);
- cut_with_error_event: a stream that had started and ended with an OpenAI error event;
- failed_with_error: another 5xx, in OpenAI error JSON (a clear failure, not a silent one);
- refused: the connection was refused (the request was never accepted: no server listening);
- lost: everything else: no answer at all (a timeout, a reset after the request was sent, a stream cut
  without an error event, a body that is not OpenAI error JSON). This must be 0.

With `retries`, a client that honours Retry-After tries again (up to that many times) and the outcome is the
last attempt's; `attempts` says how many it took.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

FAILING_TRIES = 3  # answers "no replica can start" (replicas_failing) a request takes before it gives up
KINDS = ("answered", "rejected_with_retry_after", "cut_with_error_event", "failed_with_error", "refused", "lost")


@dataclass
class Outcome:
    kind: str
    status: int = 0
    latency_s: float = 0.0  # to the end of the answer
    started_at: float = 0.0  # monotonic, when the first attempt was sent
    attempts: int = 1
    detail: str = ""
    retry_after: float | None = None  # seconds, when the server said when to come back
    code: str = ""  # the OpenAI error's code, when it had one


def _is_openai_error(data: object) -> bool:
    return isinstance(data, dict) and isinstance(data.get("error"), dict) and "message" in data["error"]


def _classify_response(r: httpx.Response, body: bytes) -> Outcome:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    if r.status_code < 300:
        return Outcome("answered", r.status_code)
    if not _is_openai_error(data):
        return Outcome("lost", r.status_code, detail=f"status {r.status_code} without OpenAI error JSON")
    if r.status_code in (429, 503) and r.headers.get("retry-after"):
        try:
            wait = float(r.headers["retry-after"])
        except ValueError:
            wait = 1.0
        return Outcome("rejected_with_retry_after", r.status_code, detail=data["error"]["message"][:120],
                       retry_after=wait, code=str(data["error"].get("code") or ""))
    if r.status_code < 500:
        return Outcome("answered", r.status_code, detail=data["error"]["message"][:120])
    return Outcome("failed_with_error", r.status_code, detail=data["error"]["message"][:120])


def _encode(body: dict, headers: dict) -> tuple[bytes, dict]:
    """ASCII-escaped JSON: a fault scenario may send what a UTF-8 encoder refuses (lone surrogates)."""
    return json.dumps(body).encode(), {"content-type": "application/json", **headers}


def _stream(client: httpx.Client, url: str, body: dict, headers: dict) -> Outcome:
    content, headers = _encode(body, headers)
    with client.stream("POST", url, content=content, headers=headers) as r:
        if r.status_code != 200:
            return _classify_response(r, r.read())
        done = errored = False
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: ") and '"error"' in line:
                try:
                    errored = _is_openai_error(json.loads(line[6:]))
                except ValueError:
                    pass
        if errored:
            return Outcome("cut_with_error_event", 200)
        return Outcome("answered" if done else "lost", 200, detail="" if done else "stream ended without [DONE]")


def send(client: httpx.Client, url: str, body: dict, headers: dict | None = None, retries: int = 0,
         max_retry_wait: float = 10.0) -> Outcome:
    """One request (streaming when body["stream"]), classified; retried on Retry-After up to `retries` times."""
    started = time.monotonic()
    attempts = failing = 0
    while True:
        attempts += 1
        try:
            if body.get("stream"):
                outcome = _stream(client, url, body, headers or {})
            else:
                content, all_headers = _encode(body, headers or {})
                r = client.post(url, content=content, headers=all_headers)
                outcome = _classify_response(r, r.content)
        except httpx.ConnectError as exc:
            outcome = Outcome("refused", detail=type(exc).__name__)
        except httpx.HTTPError as exc:
            outcome = Outcome("lost", detail=f"{type(exc).__name__}: {exc}"[:160])
        failing += outcome.code == "replicas_failing"
        # no replica can start (the router says why): a shortage or a crash loop may pass, so a few tries, not 30
        # (a burst's had taken 10 minutes to report a model that cannot load)
        if outcome.kind != "rejected_with_retry_after" or attempts > retries or failing >= FAILING_TRIES:
            break
        time.sleep(min(max_retry_wait, max(0.1, outcome.retry_after or 1.0)))
    outcome.attempts, outcome.started_at = attempts, started
    outcome.latency_s = time.monotonic() - started
    return outcome


@dataclass
class Load:
    """Requests sent at a steady rate from a thread pool while a fault happens; `stop()` returns outcomes."""

    url: str
    body: Callable[[int], dict]
    rate_per_s: float
    max_requests: int
    headers: dict = field(default_factory=dict)
    retries: int = 0
    timeout_s: float = 120.0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(4, int(self.rate_per_s * 4)), thread_name_prefix="load")
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=5.0), trust_env=False,
                                    limits=httpx.Limits(max_connections=256))
        self._futures = []
        self._stop = threading.Event()
        self._pacer = threading.Thread(target=self._pace, daemon=True)
        self._pacer.start()

    def _pace(self) -> None:
        start = time.monotonic()
        for i in range(self.max_requests):
            due = start + i / self.rate_per_s
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            self._futures.append(self._pool.submit(self._one, i))

    def _one(self, i: int) -> None:
        outcome = send(self._client, self.url, self.body(i), self.headers, self.retries)
        with self._lock:
            self.outcomes.append(outcome)

    def stop(self) -> list[Outcome]:
        """Stop sending new requests, wait for every sent one to be answered (or time out), return outcomes."""
        self._stop.set()
        self._pacer.join()
        for f in list(self._futures):
            f.result()
        self._pool.shutdown()
        self._client.close()
        return self.outcomes

    def sent(self) -> None:
        """Wait until every planned request was sent (their answers may still be under way)."""
        self._pacer.join()

    def finish(self) -> list[Outcome]:
        """Wait until every planned request was sent and answered."""
        self._pacer.join()
        return self.stop()


def tally(outcomes: list[Outcome]) -> dict:
    counts = Counter(o.kind for o in outcomes)
    out = {"sent": len(outcomes), **{k: counts.get(k, 0) for k in KINDS}}
    # `answered` holds the clear 4xx answers to bad input too: how many were a success, how many such a refusal
    out["answered_ok"] = sum(1 for o in outcomes if o.kind == "answered" and o.status < 300)
    out["answered_client_error"] = out["answered"] - out["answered_ok"]
    out["retried"] = sum(1 for o in outcomes if o.attempts > 1)
    lost = [o.detail for o in outcomes if o.kind == "lost"][:3]
    if lost:
        out["lost_examples"] = lost
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rounded(value: float | None) -> float | None:
    """A figure to the millisecond (seconds to 3 decimals), None kept: not measured."""
    return None if value is None else round(value, 3)
