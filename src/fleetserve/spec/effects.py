"""Settings that are parsed but not acted on (yet) by the local fleet: each one becomes a visible warning.

When a component starts to honour a setting, its line goes from this table; a setting never vanishes silently.
"""

from __future__ import annotations

from fleetserve.spec.endpoint import Endpoint
from fleetserve.spec.errors import SpecProblem


def inert_settings(endpoint: Endpoint) -> list[SpecProblem]:
    from fleetserve.router.policies import registered_policies

    spec = endpoint.spec
    notes: list[SpecProblem] = []

    def note(path: str, message: str) -> None:
        notes.append(SpecProblem(path, message))

    if spec.routing.strategy not in registered_policies():
        note(
            "spec.routing.strategy",
            f"{spec.routing.strategy!r} is not implemented by the router yet; it uses 'leastload' "
            f"(implemented: {', '.join(registered_policies())})",
        )
    if spec.routing.session_key and spec.routing.strategy != "session":
        note("spec.routing.sessionKey", f"only the session strategy uses it, not {spec.routing.strategy!r}")
    if spec.autoscaling is not None and not spec.autoscaling.enabled:
        note("spec.autoscaling.enabled", f"false: the fleet keeps spec.replicas={spec.replicas}")
    if (spec.placement.instance_types or spec.placement.node_affinity) and spec.capacity.provider == "local":
        note("spec.placement", "capacity.provider is 'local': this machine is the only node, instance types "
                               "apply to the simulated provider and to Kubernetes rendering")
    if spec.kv_cache.l2.tenant_urls and not spec.auth.enabled:
        note("spec.kvCache.l2.tenantUrls", "tenants come from API keys: without auth.enabled no request has a "
                                           "tenant, so these Redis servers are never used")
    limits = spec.request_limits
    if limits.max_queue_size is not None and limits.max_concurrent_requests is None:
        note("spec.requestLimits.maxQueueSize", "has no effect without maxConcurrentRequests")
    if spec.engine.kind in ("vllm", "sglang"):
        note("spec.engine.kind", f"{spec.engine.kind} needs a GPU; `fleetserve up` cannot start it on this machine")
    if spec.engine.image:
        note("spec.engine.image", "container images apply to Kubernetes rendering only")
    if spec.engine.gpus:
        note("spec.engine.gpus", "GPU requests apply to Kubernetes rendering only")
    if not spec.metrics.enabled:
        note("spec.metrics.enabled", "metrics stay on locally (/metrics is cheap); false only affects Kubernetes")
    if spec.model.source.startswith("catalog:"):
        from fleetserve.engine.catalog import CATALOG

        entry = CATALOG[spec.model.source.removeprefix("catalog:")]
        if entry.engine != spec.engine.kind:
            note("spec.engine.kind", f"catalog model {entry.name!r} is meant for engine {entry.engine!r}, "
                                     f"not {spec.engine.kind!r}")
    if spec.model.prefetch:
        note("spec.model.prefetch", "weights are loaded from the local cache at start; prefetch is implicit")
    return notes
