"""Settings that are parsed but not acted on (yet) by the local fleet: each one becomes a visible warning.

When a component starts to honour a setting, its line goes from this table; a setting never vanishes silently.
"""

from __future__ import annotations

import re

from fleetserve.capacity.providers import SPOT_NOTICE_SECONDS
from fleetserve.spec.endpoint import Endpoint, mig_slices
from fleetserve.spec.errors import SpecProblem

#: settings that `fleetserve up` ignores but `fleetserve render k8s` and the operator render (k8s/engine.py,
#: k8s/keda.py, k8s/monitoring.py): their local warnings are not repeated by `render k8s`.
_KUBERNETES_ONLY = re.compile(
    r"^spec\.(engine\.(env|envFrom|port|command|workingDir|probes|resources)"
    r"|model\.(mountPath|volume|tokenSecret)|pod|metrics\.(scrapeIntervalSeconds|modelMetrics)"
    r"|autoscaling\.triggers\[\d+\]\.(useCachedMetrics|customHeaders|namespace))$"
    r"|^metadata\.(labels|annotations)$")


L2_SMALL_BYTES = 16 << 20  # below this, the Redis fleetserve starts holds few blocks or none


def limits_split(routers: int) -> str:
    """Per-replica limits are counted by each router process on its own (its requests in flight): N of them let a
    replica see up to N x the limit."""
    return (f"enforced by each of the {routers} router processes on its own: a replica may see up to {routers}x the "
            "limit (and the queue holds up to that many times maxQueueSize)")


def takes_effect_on_kubernetes(path: str) -> bool:
    """True for a local warning about a setting that Kubernetes rendering does honour."""
    return bool(_KUBERNETES_ONLY.match(path))


# a GPU engine given no GPU: its pod requests none (render) while simulate, verify and plan time and price it on one
# GPU of the instance, so a plan could pass a fleet that cannot run once deployed; said by validate, render, simulate
ZERO_GPUS = ("a {kind} engine given no GPU: its Kubernetes pod requests no nvidia.com/gpu (and cannot run), while "
             "the simulator times and prices it on one GPU; set the replica's GPUs")


def inert_settings(endpoint: Endpoint) -> list[SpecProblem]:
    from fleetserve.router.policies import registered_policies

    spec = endpoint.spec
    notes: list[SpecProblem] = []

    def note(path: str, message: str, everywhere: bool = False) -> None:
        notes.append(SpecProblem(path, message, everywhere))

    if spec.routing.strategy not in registered_policies():
        note(
            "spec.routing.strategy",
            f"{spec.routing.strategy!r} is not implemented by the router yet; it uses 'leastload' "
            f"(implemented: {', '.join(registered_policies())})",
        )
    from fleetserve.spec.context import context_warning

    too_long = context_warning(spec)
    if too_long:
        note("spec.model.contextLength" if spec.model.context_length else "spec.engine.args", too_long)
    if spec.routing.session_key and spec.routing.strategy != "session":
        note("spec.routing.sessionKey", f"only the session strategy uses it, not {spec.routing.strategy!r}")
    if spec.autoscaling is not None and spec.engine.kind == "external":
        note("spec.autoscaling", f"engine.kind external: the replicas are the {len(spec.engine.urls)} server(s) "
                                 "of engine.urls, which fleetserve neither starts nor stops; nothing scales (no "
                                 "ScaledObject is rendered)", everywhere=True)
    elif spec.autoscaling is not None and not spec.autoscaling.enabled:
        note("spec.autoscaling.enabled", f"false: the fleet keeps spec.replicas={spec.replicas}")
    elif spec.autoscaling is not None and not spec.autoscaling.triggers:
        from fleetserve.autoscale.policy import DEFAULT_TRIGGER

        default = DEFAULT_TRIGGER
        note("spec.autoscaling.triggers", f"none given: the fleet scales on the default trigger, {default.metric} "
             f"with target {default.target:g} per replica (here, in the simulator and in the rendered "
             "ScaledObject)", everywhere=True)
    if spec.autoscaling is not None and spec.autoscaling.enabled:
        least = spec.autoscaling.min_replica_count
        first, cooldown = spec.autoscaling.initial_cooldown_period, spec.autoscaling.cooldown_period
        if least == 0 and spec.replicas > 0 and first < cooldown:
            note("spec.autoscaling.initialCooldownPeriod",
                 f"{first:g}s with spec.replicas {spec.replicas} and minReplicaCount 0: a fleet nobody has used "
                 f"goes to zero {first:g}s after it starts, counted from before its replicas load (as KEDA counts "
                 "from the ScaledObject's creation), so the replicas it starts with may be gone before the first "
                 f"request; at least cooldownPeriod ({cooldown:g}s) keeps them that long", everywhere=True)
        for i, window in enumerate(spec.autoscaling.schedules):
            if window.min_replicas <= least:
                note(f"spec.autoscaling.schedules[{i}].minReplicas",
                     f"{window.min_replicas} is not above minReplicaCount {least}: the window {window.name!r} "
                     "changes nothing (here, in the simulator and on Kubernetes, where no cron trigger is rendered "
                     "for it: KEDA's would be active all window long and hold a replica up from zero)",
                     everywhere=True)
    if (spec.placement.instance_types or spec.placement.node_affinity) and spec.capacity.provider == "local":
        note("spec.placement", "capacity.provider is 'local': this machine is the only node, instance types "
                               "apply to the simulated provider and to Kubernetes rendering")
    cloud = spec.capacity.simulated
    if spec.capacity.provider == "simulated":
        from fleetserve.capacity.prices import sagemaker_pricing

        for said in sagemaker_pricing(spec):  # `up` and `status` price them so too (only `simulate` said it)
            note("spec.placement.instanceTypes", said.replace(" (--prices FILE gives your own rates)", ""))
        if cloud.spot_interruption_rate_per_hour and "spot" not in spec.capacity.capacity_types:
            note("spec.capacity.simulated.spotInterruptionRatePerHour",
                 f"{cloud.spot_interruption_rate_per_hour:g}/h has no effect: capacity.capacityTypes has no spot")
        fewest = (spec.autoscaling.min_replica_count if spec.autoscaling is not None and spec.autoscaling.enabled
                  else spec.replicas)
        if "spot" in spec.capacity.capacity_types and fewest <= 1 and \
                spec.engine.drain_timeout_seconds >= SPOT_NOTICE_SECONDS:
            note("spec.engine.drainTimeoutSeconds",
                 f"{spec.engine.drain_timeout_seconds:g} s on spot capacity with {fewest} replica(s) at the fewest: "
                 f"a replica drains at its node's interruption notice ({SPOT_NOTICE_SECONDS:.0f} s), so requests "
                 "wait for its replacement's cold start; under the notice, it serves on until its replacement is "
                 "ready or that long before the node goes")
        placed = {t.removeprefix("ml.") for t in spec.placement.instance_types}
        named = [(f"spec.capacity.simulated.limits.{n}", n) for n in cloud.limits]
        named += [(f"spec.capacity.simulated.shortages[{i}].instanceType", s.instance_type)
                  for i, s in enumerate(cloud.shortages)]
        for path, name in named:
            if placed and name.removeprefix("ml.") not in placed:
                note(path, f"{name} is not among placement.instanceTypes ({', '.join(spec.placement.instance_types)})"
                           ": no node of it is ever launched, so this has no effect")
    if spec.router.workers > 1 and spec.request_limits.max_concurrent_requests:
        note("spec.requestLimits.maxConcurrentRequests", f"with router.workers {spec.router.workers}: "
                                                          f"{limits_split(spec.router.workers)}")
    auto = spec.autoscaling
    if auto is not None and auto.enabled and spec.replicas > auto.max_replica_count:
        note("spec.replicas", f"{spec.replicas} is above autoscaling.maxReplicaCount ({auto.max_replica_count}): "
                              f"the fleet runs at most {auto.max_replica_count}")
    if auto is not None and auto.enabled and "replicas" in spec.model_fields_set and \
            spec.replicas < auto.min_replica_count:
        note("spec.replicas", f"{spec.replicas} is below autoscaling.minReplicaCount ({auto.min_replica_count}): "
                              f"the fleet starts at {auto.min_replica_count} and never runs fewer")
    if spec.replicas == 0 and (auto is None or not auto.enabled) and spec.engine.kind != "external":
        note("spec.replicas", "0 with no autoscaling: no replica ever starts, and every request is answered 503 "
                              "(set replicas, or autoscaling with minReplicaCount 0 to wake on requests)")
    if spec.placement.node_affinity:
        _affinity_notes(spec.placement.node_affinity, note)
        conflict = capacity_type_conflict(spec)
        if conflict:
            note("spec.placement.nodeAffinity", conflict, everywhere=True)
    _local_slots_note(spec, note)
    _simulated_limits_note(spec, note)
    if spec.placement.instance_types:
        from fleetserve.capacity.catalog import Catalog
        from fleetserve.capacity.placement import fits, replica_request

        catalog = Catalog.builtin()
        for i, name in enumerate(spec.placement.instance_types):
            if name not in catalog and spec.capacity.provider != "simulated":  # simulated: an error already
                note(f"spec.placement.instanceTypes[{i}]", f"{name!r} is not in the built-in catalog: simulate, "
                     "verify and plan refuse it and render k8s writes it as given (a misspelt type leaves pods "
                     f"Pending); known: {', '.join(catalog.names())}")
        known = [catalog.get(n) for n in spec.placement.instance_types if n in catalog and n != "local"]
        if "local" in spec.placement.instance_types:
            note("spec.placement.instanceTypes", "'local' is this machine: fleetserve up and the simulator run the "
                 "replicas on its slots (capacity.localSlots), and render k8s places them on no particular node")
        asked = replica_request(spec.engine, spec.model, spec.kv_cache)
        if known and not any(fits(t, asked, spec.capacity.allow_larger_instances) for t in known):
            shapes = ", ".join(f"{t.name}: {t.gpus} GPU(s) of {t.gpu_memory_gb / max(t.gpus, 1):g} GiB, {t.vcpu} vCPU, "
                               f"{t.memory_gb:g} GiB" for t in known)
            larger = "" if spec.capacity.allow_larger_instances or all(t.gpus <= asked.gpus for t in known) else \
                "; a type of more GPUs than a replica asks needs capacity.allowLargerInstances"
            weights = " (its GPU memory holds the bf16 weights of the size the model states)" \
                if asked.gpu_memory_gb else ""
            note("spec.placement.instanceTypes", f"no listed type takes {asked}{weights}; listed: {shapes}{larger}. "
                 "No replica would start (render k8s refuses the spec)", everywhere=True)
        elif known:  # some fit: a tier whose type none does never starts a replica (on Kubernetes its Deployment
            # stays Pending, and each scale-up waits out the overflow window before the next tier takes it)
            for i, name in enumerate(spec.placement.instance_types):
                t = catalog.get(name) if name in catalog and name != "local" else None
                if t is not None and not fits(t, asked, spec.capacity.allow_larger_instances):
                    larger = "" if spec.capacity.allow_larger_instances or t.gpus < asked.gpus else \
                        " (a type of more GPUs than a replica asks needs capacity.allowLargerInstances)"
                    note(f"spec.placement.instanceTypes[{i}]", f"{name} ({t.gpus} GPU(s), {t.vcpu} vCPU, "
                         f"{t.memory_gb:g} GiB) cannot take {asked}{larger}: no replica is placed there (render k8s "
                         "leaves it out of the NodePools and the pods' affinity); leave it out", everywhere=True)
    l2 = spec.kv_cache.l2
    if l2.enabled and not l2.url and l2.max_bytes < L2_SMALL_BYTES:
        note("spec.kvCache.l2.maxBytes", f"{l2.max_bytes:,} bytes is the maxmemory of the Redis fleetserve starts, "
             "which uses about 1 MB itself; a block is 0.7 MB for the demo model at 256 tokens and tens of MB for "
             "an 8B one, so few or none fit (every write refused): give it at least 16Mi", everywhere=True)
    if l2.enabled and l2.url and "max_bytes" in l2.model_fields_set:
        note("spec.kvCache.l2.maxBytes", "sizes the Redis fleetserve starts (and renders); the Redis at l2.url keeps "
                                         "its own maxmemory, which this does not change", everywhere=True)
    from fleetserve.spec.context import context_limit

    limit = context_limit(spec)  # the spec's, or the model's own (a local folder's config, a catalog preset)
    if limit and spec.kv_cache.block_size >= limit[0]:  # only the replica's log had said it
        context, where = limit
        note("spec.kvCache.blockSize", f"{spec.kv_cache.block_size} tokens is not below the context, {context} "
             f"({where}): a prompt leaves one token to compute, so no block ever fills and nothing is cached; "
             f"use at most {context // 2} (engines default to 256)")
    if spec.auth.api_keys and not spec.auth.enabled:
        note("spec.auth.enabled", f"is false: the {len(spec.auth.api_keys)} apiKeys listed are not checked, and "
             "anyone who reaches the router is served, with no tenant (leave enabled out, or set it true, to "
             "require them)", everywhere=True)
    if not spec.auth.enabled and not _loopback(spec.router.host):
        note("spec.router.host", f"{spec.router.host} takes requests from other machines, and without auth.apiKeys "
             "anyone who reaches it is served: list API keys, or keep the router on 127.0.0.1 behind your own "
             "gateway")
    l2_given = spec.kv_cache.l2
    if (l2_given.url or l2_given.tenant_urls) and not l2_given.enabled:
        note("spec.kvCache.l2.enabled", "is false: the L2 Redis URLs given are not used, and no block is shared "
             "between replicas (leave enabled out, or set it true, to use them)", everywhere=True)
    if (spec.tls.cert_file or spec.tls.key_file) and not spec.tls.enabled:
        note("spec.tls.enabled", "is false: the router serves plain HTTP and certFile/keyFile are not used (leave "
             "enabled out, or set it true, to serve HTTPS with them)", everywhere=True)
    if spec.kv_cache.l2.tenant_urls and not spec.auth.enabled:
        note("spec.kvCache.l2.tenantUrls", "tenants come from API keys: without auth.enabled no request has a "
                                           "tenant, so these Redis servers are never used")
    elif spec.kv_cache.l2.tenant_urls:
        keyed = {key.tenant for key in spec.auth.api_keys}
        for tenant in sorted(set(spec.kv_cache.l2.tenant_urls) - keyed):
            note(f"spec.kvCache.l2.tenantUrls[{tenant}]", f"no API key has the tenant {tenant!r} (names are "
                 f"case-sensitive; keys' tenants: {', '.join(sorted(keyed))}): this Redis is never used")
    limits = spec.request_limits
    if limits.max_queue_size is not None and limits.max_concurrent_requests is None:
        note("spec.requestLimits.maxQueueSize", "has no effect without maxConcurrentRequests")
    if spec.engine.kind in ("vllm", "sglang"):
        note("spec.engine.kind", f"{spec.engine.kind} needs a GPU; `fleetserve up` cannot start it on this machine")
        if spec.routing.strategy == "kvaware":
            note("spec.routing.strategy", f"kvaware reads the built-in engine's KV events; {spec.engine.kind} "
                 "publishes none the router reads, so it routes as prefixaware (learning each replica's cache "
                 "from the cached tokens it reports)")
    if spec.engine.kind == "container":
        note("spec.engine.kind", f"'container' runs the image {spec.engine.image} as given: `fleetserve up` runs no "
                                 "containers (render k8s does; locally, start it yourself and use kind external)")
        if spec.routing.strategy == "kvaware":
            note("spec.routing.strategy", "kvaware reads the built-in engine's KV events; an image run as given "
                                          "publishes none, so it routes as prefixaware")
        if spec.kv_cache.l1.enabled or spec.kv_cache.l2.enabled:
            note("spec.kvCache", "an image run as given keeps its own KV cache: kvCache's tiers are not wired to "
                                 "it (the simulator still models those the spec gives)")
        for i, trig in enumerate(spec.autoscaling.triggers if spec.autoscaling else []):
            if trig.metric == "queue_depth":
                note(f"spec.autoscaling.triggers[{i}]", "queue_depth: the image's own queue is not known; the "
                                                        "router's queue and buffer are read")
    _sglang_host_cache_note(spec, note)
    if spec.engine.image and spec.engine.kind != "container":
        note("spec.engine.image", "container images apply to Kubernetes rendering only")
    slices = mig_slices(spec.engine.resources)
    if spec.engine.kind in ("vllm", "sglang") and not spec.engine.gpus and not slices:  # a slice: said below
        note("spec.engine.gpus", ZERO_GPUS.format(kind=spec.engine.kind), everywhere=True)
    if slices:
        note("spec.engine.resources", f"requests the MIG slice(s) {', '.join(slices)}: the pod gets them as written, "
             "but placement, the simulator and cost accounting count whole GPUs and model no slice: they place, time "
             "and bill each replica "
             + (f"as one of {spec.engine.gpus} whole GPU(s)" if spec.engine.gpus else
                "as one that asks no GPU, which on a GPU instance type takes a whole instance apiece"),
             everywhere=True)
    if spec.engine.gpus and spec.capacity.provider != "simulated":  # the simulated cloud packs nodes by them
        note("spec.engine.gpus", "GPU requests apply to Kubernetes rendering and the simulated cloud only")
    if not spec.metrics.enabled:
        note("spec.metrics.enabled", "metrics stay on locally (/metrics is cheap); false only affects Kubernetes")
    if spec.router.stream_idle_timeout_seconds > spec.router.upstream_timeout_seconds:
        note("spec.router.streamIdleTimeoutSeconds", f"{spec.router.stream_idle_timeout_seconds:g} s is above "
             f"upstreamTimeoutSeconds ({spec.router.upstream_timeout_seconds:g} s): the silence allowed once an "
             "answer began is at most the upstream timeout", everywhere=True)
    from fleetserve.observe.vocabulary import LATENCY_BUCKETS_MS

    if spec.slo is not None and spec.slo.ttft_p95_ms > LATENCY_BUCKETS_MS[-1]:
        note("spec.slo.ttftP95Ms", f"{spec.slo.ttft_p95_ms:g} ms is above the latency histograms' largest bucket "
                                   f"({LATENCY_BUCKETS_MS[-1]} ms): the Prometheus rules count slow requests at "
             f"that bucket (a stricter target) and the TTFT alert cannot fire (a p95 read from the histograms tops "
             f"out there); verify, plan and the autoscaler use the exact target", everywhere=True)
    if spec.model.source.startswith("catalog:"):
        from fleetserve.engine.catalog import CATALOG

        entry = CATALOG[spec.model.source.removeprefix("catalog:")]
        if entry.engine != spec.engine.kind:
            note("spec.engine.kind", f"catalog model {entry.name!r} is meant for engine {entry.engine!r}, "
                                     f"not {spec.engine.kind!r}")
    k8s = "applies to Kubernetes rendering only (fleetserve render k8s, the operator)"
    if endpoint.metadata.labels:
        note("metadata.labels", f"{k8s}: labels of every rendered object")
    if endpoint.metadata.annotations:
        note("metadata.annotations", f"{k8s}: annotations of the engine Deployments and pods")
    from fleetserve.fleet import prometheus

    local_prometheus = prometheus.wanted(spec) and prometheus.binary() is not None
    if spec.observability.prometheus.enabled is None and prometheus.binary() is None:
        note("spec.observability.prometheus", "the prometheus binary is not installed (apt-get install "
                                              "prometheus): `fleetserve up` starts no Prometheus; PromQL triggers "
                                              "need a serverAddress")
    elif spec.observability.prometheus.enabled and prometheus.binary() is None:
        note("spec.observability.prometheus.enabled", "true, and the prometheus binary is not installed here "
                                                      "(apt-get install prometheus): `fleetserve up` will refuse "
                                                      "to start; Kubernetes rendering is not affected")
    for i, trig in enumerate(spec.autoscaling.triggers if spec.autoscaling else []):
        if trig.metric == "prometheus" and not trig.server_address and not local_prometheus:
            note(f"spec.autoscaling.triggers[{i}].serverAddress", "empty, and the fleet runs no Prometheus: the "
                 "local controller cannot read this trigger (reads fail, counting toward fallback); Kubernetes "
                 "rendering uses --prometheus-url")
    if spec.metrics.scrape_interval_seconds != 15 and not local_prometheus:
        note("spec.metrics.scrapeIntervalSeconds", f"{k8s}: the ServiceMonitor interval; locally /metrics is "
                                                   "read when scraped (the fleet runs no Prometheus)")
    if spec.metrics.model_metrics_path or spec.metrics.model_metrics_port:
        note("spec.metrics.modelMetrics", f"{k8s}: the engine ServiceMonitor's path and port")
    engine = spec.engine
    if engine.env:
        note("spec.engine.env", f"{k8s}: local engines inherit the environment of `fleetserve up`")
    if engine.env_from:
        note("spec.engine.envFrom", f"{k8s}: Kubernetes EnvVarSources (Secrets, ConfigMaps)")
    if engine.port and engine.kind == "builtin":
        note("spec.engine.port", f"{k8s}: local built-in replicas listen on free ports the fleet picks")
    for field, value in (("command", engine.command), ("workingDir", engine.working_dir),
                         ("probes", engine.probes), ("resources", engine.resources)):
        if value:
            note(f"spec.engine.{field}", f"{k8s}: the engine container's {field}")
    for field, value in (("mountPath", spec.model.mount_path), ("volume", spec.model.volume),
                         ("tokenSecret", spec.model.token_secret)):
        if value:
            note(f"spec.model.{field}", f"{k8s}: the model volume and its fetcher")
    if spec.pod != type(spec.pod)():
        note("spec.pod", f"{k8s}: the engine pods' init containers, scheduler, service account, volumes, "
                         "tolerations, priority class and security context, and the pods' image pull secrets")
    for i, trig in enumerate(spec.autoscaling.triggers if spec.autoscaling else []):
        for field, value in (("useCachedMetrics", trig.use_cached_metrics), ("customHeaders", trig.custom_headers),
                             ("namespace", trig.namespace)):
            if value:
                note(f"spec.autoscaling.triggers[{i}].{field}", f"{k8s}: the KEDA trigger's {field}; the local "
                                                                "controller reads the metric every pollingInterval")
    if spec.model.prefetch:
        note("spec.model.prefetch", "weights are loaded from the local cache at start; prefetch is implicit")
    return notes


def local_model_problem(endpoint: Endpoint) -> SpecProblem | None:
    """`validate`'s warning for a built-in engine's model folder that is not a model here: `up` refuses it (exit
    2), and validate had called the spec valid without a word. A warning, not an error: the spec may be meant
    for another machine (or a pod that mounts the path). Not among `inert_settings`: `up` says it as its error."""
    spec = endpoint.spec
    source = spec.model.source
    if spec.engine.kind != "builtin" or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", source):
        return None  # builtin:, hf:, catalog:, s3:// are checked where they are prepared
    from fleetserve.engine.demo import ModelSourceError
    from fleetserve.engine.sources import resolve_source

    try:
        resolve_source(source)  # a local folder here: resolved as `up` resolves it (a symlink loop, too)
    except ModelSourceError as exc:
        return SpecProblem("spec.model.source", f"{exc}: `fleetserve up` on this machine will refuse to start")
    return None


def tls_files_problem(tls) -> str | None:
    """Why `spec.tls`'s files cannot serve (missing, not PEM, not a pair), named by their fields; None when they
    can or none are given (`up` refuses them, exit 2; `validate` warns)."""
    if not (tls.enabled and tls.cert_file and tls.key_file):
        return None
    from fleetserve.router.tls import TLSFileError, check_tls_files

    try:
        check_tls_files(tls.cert_file, tls.key_file)
    except TLSFileError as exc:
        return str(exc).replace("--tls-cert", "spec.tls.certFile").replace("--tls-key", "spec.tls.keyFile")
    return None


def local_memory_problem(endpoint: Endpoint) -> SpecProblem | None:
    """`validate`'s warning for built-in engines whose L1 tiers, at the most replicas the spec runs, ask for more
    memory than this machine has: each engine holds its L1 in its own memory, so `up` ran into swap or the
    kernel's OOM killer at the first long prompts (`l1.maxBytes: 1Ti` passed without a word)."""
    import os

    spec = endpoint.spec
    if spec.engine.kind != "builtin" or not spec.kv_cache.l1.enabled:
        return None
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
    scaling = spec.autoscaling
    most = max(spec.replicas, scaling.max_replica_count if scaling is not None and scaling.enabled else 0, 1)
    asked = most * spec.kv_cache.l1.max_bytes
    if asked <= memory:
        return None
    return SpecProblem("spec.kvCache.l1.maxBytes", f"{most} replica(s) x {spec.kv_cache.l1.max_bytes:,} bytes of L1 "
                       f"is {asked / 2**30:.1f} GiB, more than this machine's {memory / 2**30:.1f} GiB of memory "
                       "(each engine holds its L1 in its own memory): `fleetserve up` here would run out of it")


def local_tls_problem(endpoint: Endpoint) -> SpecProblem | None:
    """`validate`'s warning for TLS files `up` could not serve with: validate had called the spec valid. A
    warning, as for the model folder: the files may be meant for another machine."""
    said = tls_files_problem(endpoint.spec.tls)
    if said is None:
        return None
    path = "spec.tls.keyFile" if said.startswith("spec.tls.keyFile") else "spec.tls.certFile"
    return SpecProblem(path, f"{said}: `fleetserve up` on this machine will refuse to start")


def local_auth_problem(endpoint: Endpoint) -> SpecProblem | None:
    """An API key read from an environment variable this shell does not set: `validate` had called the spec valid,
    and `up` failed with exit 1 after it had started Redis. A warning for `validate` (the key may be set where
    the fleet runs), bad input for `up`."""
    import os

    from fleetserve.router.auth import key_digest

    auth = endpoint.spec.auth
    if not auth.enabled:
        return None
    holder: dict[str, tuple[int, str]] = {}  # key digest -> the first apiKeys entry holding it
    for i, key in enumerate(auth.api_keys):
        if not key.key_sha256 and not os.environ.get(key.key_env or ""):
            return SpecProblem(f"spec.auth.apiKeys[{i}].keyEnv",
                               f"environment variable {key.key_env!r} (tenant {key.tenant!r}'s key) is not set "
                               "here: `fleetserve up` in this environment will refuse to start")
        digest = key.key_sha256.lower() if key.key_sha256 else key_digest(os.environ[key.key_env or ""])
        first = holder.setdefault(digest, (i, key.tenant))
        if first[1] != key.tenant:  # one key naming two tenants: the last had taken it, the first vanished
            return SpecProblem(f"spec.auth.apiKeys[{i}]",
                               f"tenant {key.tenant!r} holds the same key as apiKeys[{first[0]}] (tenant "
                               f"{first[1]!r}): one key can name one tenant only")
    return None


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _sglang_host_cache_note(spec, note) -> None:
    """SGLang (0.5.x) refuses to start when its host pool per GPU rank is not larger than that GPU's KV pool, and
    the KV pool is most of the GPU's memory after the weights: say so where the listed types show it."""
    if spec.engine.kind != "sglang" or not spec.kv_cache.l1.enabled:
        return
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.capacity.model_fit import (
        BYTES_PER_PARAMETER,
        GIB,
        GPU_MEMORY_UTILIZATION,
        RESERVED_PER_GPU,
        stated_size,
    )
    from fleetserve.engine.adapters import ranks, sglang_hicache_gb

    catalog = Catalog.builtin()
    gpus = ranks(spec)
    weights = (stated_size(spec.model, spec.engine) or 0) * 1e9 * BYTES_PER_PARAMETER / gpus
    pools = {t.name: t.gpu_memory_gb / t.gpus * GIB * GPU_MEMORY_UTILIZATION - RESERVED_PER_GPU - weights
             for t in (catalog.get(n) for n in spec.placement.instance_types if n in catalog and n != "local")
             if t.gpus}
    host = sglang_hicache_gb(spec) * 10**9
    short = {name: pool for name, pool in pools.items() if pool >= host}
    if short:
        name, pool = max(short.items(), key=lambda item: item[1])
        note("spec.kvCache.l1.maxBytes", f"SGLang's host cache gets {host / 1e9:g} GB per GPU rank "
             f"(--hicache-size {sglang_hicache_gb(spec)}), not above the GPU KV pool of about {pool / 1e9:.0f} GB "
             f"on {name}: SGLang refuses to start; give at least {int(pool * gpus / 1e9) + 1} GB "
             f"({(int(pool / 1e9) + 1) * gpus * 10**9} bytes), or l1.enabled: false")


def _start_counts(spec) -> list[tuple[str, int]]:
    """The replica counts a fleet must hold whatever its load: (the field that asks, the count). Autoscaling above
    capacity is no such count: the fleet reports the shortage."""
    auto = spec.autoscaling
    if auto is None or not auto.enabled:
        asked = [("spec.replicas", spec.replicas)]
    else:
        asked = [("spec.autoscaling.minReplicaCount", auto.min_replica_count)]
        asked += [(f"spec.autoscaling.schedules[{i}].minReplicas", floor.min_replicas)
                  for i, floor in enumerate(auto.schedules)]
        if "replicas" in spec.model_fields_set:
            asked.append(("spec.replicas", min(spec.replicas, auto.max_replica_count)))
    return asked


def _local_slots_note(spec, note) -> None:
    """A count the machine's slots can never hold: `up` waited out startupTimeoutSeconds (10 minutes by default)
    for a failure the spec alone showed."""
    slots = spec.capacity.local_slots
    if spec.capacity.provider != "local" or slots is None:
        return
    for path, count in _start_counts(spec):
        if count > slots:
            when = "while it holds" if "schedules" in path else "at all"
            note("spec.capacity.localSlots", f"{slots} slot(s) cannot hold the {count} replicas of {path}: `fleetserve "
                 f"up` refuses to start {when} (exit 2), and status reports the shortage; raise localSlots or lower "
                 f"{path.removeprefix('spec.')}")
            return


def local_slots_problem(spec) -> str | None:
    """Why `up` cannot start this spec on the machine's slots, before anything starts: a count wanted at the start
    (not a schedule's, which holds only in its window) above `capacity.localSlots`. It had prepared the model and
    started the fork server, the router, Prometheus and one replica before it exited 2, 11 s later."""
    slots = spec.capacity.local_slots
    if spec.capacity.provider != "local" or slots is None:
        return None
    for path, count in _start_counts(spec):
        if count > slots and "schedules" not in path:
            return (f"spec.capacity.localSlots: {slots} slot(s) cannot hold the {count} replicas of {path}; raise "
                    f"localSlots or lower {path.removeprefix('spec.')}")
    return None


def _simulated_limits_note(spec, note) -> None:
    """A count the simulated cloud's `limits` can never place, on every listed type together: validate said
    nothing, and the fleet (or the simulation) ran short of it for good."""
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.capacity.placement import fits, replica_request, replicas_per_node, tiers_from_spec

    cloud, cap = spec.capacity.simulated, spec.capacity
    if cap.provider != "simulated" or not cloud.limits:
        return
    catalog = Catalog.builtin()
    request = replica_request(spec.engine, spec.model, spec.kv_cache)
    types = {n for tier in tiers_from_spec(spec.placement, catalog, tuple(cap.capacity_types))
             for n in tier.instance_types if n in catalog and fits(catalog.get(n), request, cap.allow_larger_instances)}
    limits = {Catalog.canonical(name): most for name, most in cloud.limits.items()}
    if not types or any(t not in limits for t in types):
        return  # a type without a limit places any count (one that fits none is validate's other warning)
    most = sum(limits[t] * replicas_per_node(catalog.get(t), request) for t in types)
    for path, count in _start_counts(spec):
        if count > most:
            note("spec.capacity.simulated.limits", f"the simulated cloud places at most {most} replica(s) on the "
                 f"listed types ({', '.join(f'{t}: {limits[t]} node(s)' for t in sorted(types))}), not the {count} "
                 f"of {path}: the fleet, simulate and verify run short of it for good; raise the limits or lower "
                 f"{path.removeprefix('spec.')}")
            return


def capacity_type_conflict(spec) -> str | None:
    """Why the node affinity leaves no instance type at all, when that is the capacity types: an affinity that
    asks for spot beside the default capacityTypes [on-demand] passed validate, and render refused it with "no
    listed instance type () can take a replica of 1 GPU(s)", as if the size were the fault."""
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.capacity.placement import tiers_from_spec

    catalog = Catalog.builtin()
    placement, listed = spec.placement, tuple(spec.capacity.capacity_types)
    if any(t.instance_types for t in tiers_from_spec(placement, catalog, listed)):
        return None
    either = [t for t in tiers_from_spec(placement, catalog, ("spot", "on-demand")) if t.instance_types]
    if not either:
        return None
    wanted = sorted({c for t in either for c in t.capacity_types} - set(listed))
    return (f"allows instance types only as {', '.join(wanted)} capacity, and capacity.capacityTypes lists "
            f"{', '.join(listed)}: no instance type is left, and no replica would start (render k8s refuses the "
            f"spec); add {', '.join(wanted)} to capacity.capacityTypes")


def _affinity_notes(affinity: dict, note) -> None:
    """Instance types the catalog does not know, in nodeAffinity (they were dropped without a word: tiers and
    NodePools list catalog types only), and a misspelt instance-type key (AWS's own sample has one)."""
    from fleetserve.capacity.catalog import Catalog
    from fleetserve.capacity.placement import INSTANCE_TYPE_LABEL

    catalog = Catalog.builtin()
    required = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    preferred = [p.get("preference") or {} for p in
                 affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
    for term in [*required, *preferred]:
        for expr in term.get("matchExpressions") or []:
            key = expr.get("key")
            if key == INSTANCE_TYPE_LABEL:
                unknown = [v for v in expr.get("values") or [] if v not in catalog]
                if unknown:
                    note("spec.placement.nodeAffinity", f"{', '.join(map(repr, unknown))} not in the built-in "
                         "catalog: no tier, NodePool, simulation or plan uses them (a misspelt type would leave "
                         f"pods Pending); known: {', '.join(catalog.names())}")
            elif isinstance(key, str) and key.replace("-", "").lower().endswith("instancetype"):
                note("spec.placement.nodeAffinity", f"key {key!r} is not the instance-type label; "
                                                    f"{INSTANCE_TYPE_LABEL!r} is, and nodes carry only that")
