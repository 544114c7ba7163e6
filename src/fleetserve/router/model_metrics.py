"""HyperPod's `model_*` invocation metrics, exported by the router for engines that do not export them.

HyperPod puts a reverse-proxy sidecar in every model pod that counts invocations, errors, concurrent requests,
latency and time to first byte per pod, whatever the serving framework (docs: "Implement your own observability
integration"). The built-in engine exports these series itself; vLLM and SGLang do not, so in front of them the
recording rules, burn alerts, dashboard model panels and HyperPod's own example trigger
(`sum(model_concurrent_requests{model_name=...})`) read nothing. With `--model-metrics` the router counts the
requests it proxies per replica (label `replica`: the name its fleet gave it, r0 under `up`, as its engine labels
its own series; else the backend's address: a pod IP on Kubernetes), with the endpoint's namespace, model name,
version and instance type: a concurrent request from the moment it is sent there (a non-streamed answer's headers
come only at its end), and one invocation per client request, where it ended: the replica whose answer the client
got (an error for an error status), or, when no attempt answered, the last replica tried (an error for the
status the client got: a timeout, 504, or replicas unreachable, 502). An attempt the router retried elsewhere is
in `fleetserve_router_retries_total` and the ejections, not here: a request answered 200 after a dead replica had
counted an invocation and a 502 there, so the error ratio and the burn alerts read errors no client got.
Requests it answers itself before any replica (a full queue, a bad body, no replica left) are counted under
`replica="router"`; a bad key (401, 403) and a model it does not serve (404) are no invocation of this model.

Scope `router` (in front of the built-in engine, which counts its own invocations): only what the router
produces itself, which no engine counts: its refusals before any replica (429 overflow, 503 at zero or
replicas failing), and a request that ended on a replica it timed out (504: the engine finished later and counted
a success) or could not reach (502). Without it the error ratio, its burn-rate alerts and the error panels read
0 % while the router refused most requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve.api.errors import MODEL_NOT_FOUND
from fleetserve.observe import vocabulary as v
from fleetserve.observe.metrics import PRESET_ERROR_STATUSES, ModelIdentity, child, forget
from fleetserve.observe.rules import is_server_error

ENGINES_WITHOUT = ("vllm", "sglang", "container")  # engine kinds that export no model_* series of their own
ENGINES_WITH = ("builtin",)  # engine kinds that export them: the router adds only its own errors (scope router)
ROUTER_REPLICA = "router"  # the replica label of requests refused before one was chosen
SCOPES = ("all", "router")
NOT_AN_INVOCATION = (401, 403, 404)  # a bad key, and a model this endpoint does not serve


@dataclass
class FailedAttempts:
    """A request's attempts that got no usable answer, as `ModelMetrics.gave_up` counts them once it has none."""

    any: bool = False  # a replica was tried
    ended: bool = False  # the client left while one was tried (`ModelMetrics.abandoned` counted it)
    last: str = ROUTER_REPLICA  # the last replica tried
    engine_saw: bool = False  # an engine received one (it counts that invocation itself, beside scope router)
    engine_counted_error: bool = False  # an engine answered one with an error status (it counted that error)

    def add(self, replica: str, saw: bool, counted_error: bool) -> None:
        self.last = replica
        self.engine_saw |= saw
        self.engine_counted_error |= counted_error


class ModelMetrics:
    def __init__(self, identity: ModelIdentity, registry, scope: str = "all") -> None:
        self.base = (identity.namespace, identity.model_name, identity.model_version, identity.instance_type)
        self.every_request = scope == "all"  # else only the router's own errors (the module's docstring)
        self.invocations = v.MODEL_INVOCATIONS.make(registry)
        self.errors = v.MODEL_ERRORS.make(registry)
        self.concurrent = v.MODEL_CONCURRENT.make(registry)
        self.latency_ms = v.MODEL_LATENCY.make(registry)
        self.ttfb_ms = v.MODEL_TTFB.make(registry)
        self._started: set[str] = set()
        self.start(ROUTER_REPLICA)

    def start(self, replica: str) -> None:
        """A replica's series at 0 from the moment it joins (observe/metrics.py `start_model_series`, as the engines
        do): rate() reads a series' first sample as its start, so an outage's errors on a replica whose error
        series did not exist yet (all 502s of a replica that hung) read 0 % in the error ratio, its burn alerts
        and every panel. Idempotent."""
        if replica in self._started:
            return
        self._started.add(replica)
        labels = (*self.base, replica)
        child(self.invocations, *labels)
        for status in PRESET_ERROR_STATUSES:
            child(self.errors, *labels, status)
        if self.every_request and replica != ROUTER_REPLICA:
            for metric in (self.concurrent, self.latency_ms, self.ttfb_ms):
                child(metric, *labels)

    def sent(self, replica: str) -> None:
        """An attempt went to a replica: in flight there until it ends or fails."""
        if self.every_request:
            child(self.concurrent, *self.base, replica).inc()

    def answered(self, replica: str, status: int, ttfb_ms: float, first: bytes = b"") -> None:
        """The replica's status and first bytes are here: the request's one invocation, on the replica that gave the
        client its answer. Not one where the replica refused the client's own key or named the model unknown (as
        `refused`); any other 404 (a container without the invocation path) is the fleet's error."""
        if not self.every_request or status in (401, 403) or (status == 404 and MODEL_NOT_FOUND.encode() in first):
            return
        labels = (*self.base, replica)
        child(self.invocations, *labels).inc()
        child(self.ttfb_ms, *labels).observe(ttfb_ms)
        if status >= 400:
            child(self.errors, *labels, str(status)).inc()

    def failed(self, replica: str) -> None:
        """An attempt got no usable answer (a retryable status, a timeout, unreachable): no longer in flight there.
        Nothing is counted yet: the request may be answered elsewhere (`gave_up` when it is not)."""
        if self.every_request:
            child(self.concurrent, *self.base, replica).dec()

    def abandoned(self, replica: str) -> None:
        """The client left before any answer: an invocation (the engine counts the one it saw), no error."""
        if self.every_request:
            child(self.concurrent, *self.base, replica).dec()
            child(self.invocations, *self.base, replica).inc()

    def left(self, replica: str) -> None:
        """The client left between attempts (none in flight): its invocation, on the last replica tried."""
        if self.every_request:
            child(self.invocations, *self.base, replica).inc()

    def gave_up(self, tried: FailedAttempts, status: int) -> None:
        """No replica tried answered: the request's one invocation and error (the status the client got), on the
        last replica tried. Beside engines that count their own (scope router), only where none did: an engine
        that answered an attempt with an error counted the request's error; one that saw it (a timeout, a dropped
        connection) counted its invocation."""
        labels = (*self.base, tried.last)
        if self.every_request:
            child(self.invocations, *labels).inc()
            child(self.errors, *labels, str(status)).inc()
            return
        if tried.engine_counted_error:
            return
        if not tried.engine_saw:
            child(self.invocations, *labels).inc()
        child(self.errors, *labels, str(status)).inc()

    def cut(self, replica: str, status: int) -> None:
        """An answer that broke off after it began (the replica died mid-stream, or went silent): an error the
        client got, whatever the status line said (200). Counted in both scopes: an engine that died counts
        nothing, and the stream's status had read as a success in every error ratio and alert."""
        child(self.errors, *self.base, replica, str(status)).inc()

    def ended(self, replica: str, latency_ms: float) -> None:
        if not self.every_request:
            return
        labels = (*self.base, replica)
        child(self.concurrent, *labels).dec()
        child(self.latency_ms, *labels).observe(latency_ms)

    def refused(self, status: int) -> None:
        """Answered by the router itself before any replica: an invocation that failed. A bad key and another
        model's name are none of this model's invocations (in front of vLLM a scanner's bad keys fed the invocation
        rate and the error panels); beside engines that count their own (scope router), only a server error or a
        refusal for load: a client's bad body is none either (it diluted the ratio, and fed triggers on the
        invocation rate)."""
        if status in NOT_AN_INVOCATION or (not self.every_request and not is_server_error(str(status))):
            return
        labels = (*self.base, ROUTER_REPLICA)
        child(self.invocations, *labels).inc()
        child(self.errors, *labels, str(status)).inc()


    def families(self) -> tuple:
        """The metrics with a series per replica."""
        return self.invocations, self.errors, self.concurrent, self.latency_ms, self.ttfb_ms

    def forget(self, replicas) -> None:
        """Remove the series of replicas that left (router/departed.py); the router's own stay."""
        gone = set(replicas) - {ROUTER_REPLICA}
        for metric in self.families():
            forget(metric, len(self.base), gone)
        self._started -= gone


def router_args(namespace: str, model_name: str, model_version: str, instance_type: str,
                scope: str = "all") -> list[str]:
    """The router's command-line options for these series (`fleetserve up` and `render k8s` alike)."""
    return ["--model-metrics", "--namespace", namespace, "--served-model-name", model_name, "--model-version",
            model_version, "--instance-type", instance_type] + (["--model-metrics-scope", scope] if scope != "all"
                                                                 else [])


def scope_for(engine_kind: str) -> str | None:
    """What the router counts of the model_* series for this engine kind: all, only its own errors, or none
    (an external engine: which series it exports is unknown)."""
    return "all" if engine_kind in ENGINES_WITHOUT else "router" if engine_kind in ENGINES_WITH else None
