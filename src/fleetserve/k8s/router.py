"""The router (the gateway): Deployment, Service, PodDisruptionBudget, its state ConfigMap, and its key Secret when
renderable.

The router runs `fleetserve router` with the flags the local supervisor gives it (strategy, session key,
buffer at zero, request limits, size limits), so one spec means one behaviour. Secrets are referenced,
never invented (a renderer that made up tokens would not be deterministic):
- `<name>-internal`: `token` (the router-engine trust token of api/internal.py, also Prometheus' bearer
  token for /metrics), `admin-token` (the router's admin API) and, for vLLM and SGLang engines,
  `engine-token` (their API key: it stays out of reach of the router's admin API and the tenant salts);
- `<name>-api-keys`: `auth.json` (`{"keys": {sha256: tenant}}`); rendered here when every key is given
  as `keySha256` (digests are not secrets), otherwise created by the user from the plaintext keys;
- `<name>-tls`: a `kubernetes.io/tls` Secret (cert-manager or the user).
Backends: every engine pod, found through the engines' headless Service (`--backend-dns`), or `engine.urls`
for external engines. The state ConfigMap `<name>-router-state` holds why no engine pod can start (`failing`),
which the operator keeps current and the router re-reads (`--failing-file`; k8s/failing.py).
"""

from __future__ import annotations

import base64
import hashlib
import json

from fleetserve.api.internal import router_trust_args
from fleetserve.k8s.context import (
    ENGINE_TOKEN_KEY,
    EXIT_SECONDS,
    GPU_ENGINES,
    INTERNAL_TOKEN_DIR,
    ROUTER_PORT,
    Context,
)
from fleetserve.k8s.engine import engine_port, instance_label
from fleetserve.k8s.failing import STATE_KEY, static_reason
from fleetserve.k8s.security import TMP_MOUNT, TMP_VOLUME, restricted_container, restricted_pod
from fleetserve.router.model_metrics import router_args, scope_for
from fleetserve.router.served import body_check_args, served_model_args
from fleetserve.spec.effects import limits_split

AUTH_DIR = "/etc/fleetserve/auth"
TLS_DIR = "/etc/fleetserve/tls"
STATE_DIR = "/etc/fleetserve/state"


def strategy(ctx: Context) -> str:
    from fleetserve.router.policies import registered_policies

    wanted = ctx.endpoint.spec.routing.strategy
    return wanted if wanted in registered_policies() else "leastload"


def router_port(ctx: Context) -> int:
    return ctx.endpoint.spec.router.port or ROUTER_PORT


def backends(ctx: Context) -> list[str]:
    engine = ctx.endpoint.spec.engine
    if engine.kind == "external":
        return list(engine.urls)
    return [f"http://{ctx.host(ctx.engine_service)}:{engine_port(ctx)}"]


def _args(ctx: Context) -> list[str]:
    spec = ctx.endpoint.spec
    args = ["router", "--host", "0.0.0.0", "--port", str(router_port(ctx)), "--strategy", strategy(ctx),
            "--health-path", spec.engine.health_path, "--buffer-size", str(spec.router.buffer_size),
            "--buffer-timeout", f"{spec.router.buffer_timeout_seconds:g}",
            "--upstream-timeout", f"{spec.router.upstream_timeout_seconds:g}",
            "--stream-idle-timeout", f"{spec.router.stream_idle_timeout_seconds:g}",
            "--drain-timeout", str(ctx.router_drain_seconds)]  # after SIGTERM: what it serves finishes
    if ctx.endpoint.spec.engine.kind == "external":
        for url in backends(ctx):
            args += ["--backend", url]
    else:  # every engine pod, found through the headless Service and followed as pods come and go
        args += ["--backend-dns", f"{ctx.host(ctx.engine_pods_service)}:{engine_port(ctx)}"]
    if spec.router.workers > 1:
        args += ["--workers", str(spec.router.workers)]
    if spec.routing.session_key:
        args += ["--session-key", spec.routing.session_key]
    if spec.engine.invocation_path:
        args += ["--invocation-path", spec.engine.invocation_path]
    limits = spec.request_limits
    if limits.max_concurrent_requests:
        args += ["--max-concurrent-per-replica", str(limits.max_concurrent_requests),
                 "--overflow-status", str(limits.overflow_status_code)]
    if limits.max_queue_size is not None:
        args += ["--max-queue", str(limits.max_queue_size)]
    if spec.auth.enabled:
        args += ["--auth-file", f"{AUTH_DIR}/auth.json"]
    if spec.tls.enabled:
        args += ["--tls-cert", f"{TLS_DIR}/tls.crt", "--tls-key", f"{TLS_DIR}/tls.key"]
    args += ["--failing-file", f"{STATE_DIR}/{STATE_KEY}", "--internal-token-file", f"{INTERNAL_TOKEN_DIR}/token",
             "--max-body-bytes", str(limits.max_body_bytes), "--max-header-bytes", str(limits.max_header_bytes)]
    if spec.engine.kind in GPU_ENGINES:  # their API key: what their logs may show is not the internal token
        args += ["--engine-token-file", f"{INTERNAL_TOKEN_DIR}/{ENGINE_TOKEN_KEY}"]
    if scope_for(spec.engine.kind) is not None:
        args += model_metric_args(ctx)
    args += served_model_args(ctx.endpoint.served_model_name, spec.engine.kind, spec.engine.args)
    args += body_check_args(spec.engine.kind)
    return args + router_trust_args(spec.engine.kind, spec.auth.enabled)


def model_metric_args(ctx: Context) -> list[str]:
    """HyperPod's model_* series, which vLLM and SGLang do not export, counted by the router per replica
    (router/model_metrics.py), with the labels the built-in engine gives its own."""
    return router_args(ctx.namespace, ctx.endpoint.served_model_name, ctx.endpoint.spec.model.version,
                       instance_label(t for tier in ctx.tiers for t in tier.instance_types),
                       scope_for(ctx.endpoint.spec.engine.kind) or "all")


ROUTER_CPU = "500m"  # one worker: an event loop, mostly waiting on sockets
ROUTER_MEMORY_MI = 256  # per worker process: Python, the app, the prefix index and the metrics


MODEL_CONFIG_ANNOTATION = "fleetserve.io/model-config"


def model_config_digest(ctx: Context) -> str:
    """What decides the served model's card (its `max_model_len` above all): the router refuses at zero what that
    card's context cannot hold (router/served.py), so a change rolls the routers, which read the card again from
    the new engines (a longer context had still been refused at zero by the routers' old card)."""
    spec = ctx.endpoint.spec
    model = spec.model
    parts = [model.source, model.revision or "", str(model.context_length or ""), spec.engine.image or "",
             *spec.engine.args]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def router_deployment(ctx: Context) -> dict:
    spec = ctx.endpoint.spec
    scheme = "HTTPS" if spec.tls.enabled else "HTTP"
    # the router's own state, never its replicas': /health is 503 at zero replicas, where the router must stay in
    # the Service to hold the requests that wake the fleet (readiness) and must not be restarted (liveness)
    probe = {"httpGet": {"port": "http", "scheme": scheme}, "timeoutSeconds": 3}
    mounts = [{"name": "internal-token", "mountPath": INTERNAL_TOKEN_DIR, "readOnly": True}]
    items = [{"key": "token", "path": "token"}]
    if spec.engine.kind in GPU_ENGINES:
        items.append({"key": ENGINE_TOKEN_KEY, "path": ENGINE_TOKEN_KEY})
    volumes: list[dict] = [{"name": "internal-token", "secret": {"secretName": ctx.internal_secret, "items": items}}]
    if spec.auth.enabled:
        mounts.append({"name": "api-keys", "mountPath": AUTH_DIR, "readOnly": True})
        volumes.append({"name": "api-keys", "secret": {"secretName": ctx.api_keys_secret,
                                                      "items": [{"key": "auth.json", "path": "auth.json"}]}})
    if spec.tls.enabled:
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        # its two keys named (a kubernetes.io/tls Secret's): `render k8s` lists them among the Secrets to create
        volumes.append({"name": "tls", "secret": {"secretName": ctx.tls_secret, "items": [
            {"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}})
    # optional: a router whose ConfigMap is gone (deleted by hand) still starts, and holds requests as before
    mounts.append({"name": "state", "mountPath": STATE_DIR, "readOnly": True})
    volumes.append({"name": "state", "configMap": {"name": ctx.router_state, "optional": True}})
    container = {
        "name": "router",
        "image": ctx.options.image,
        "command": ["fleetserve"],
        "args": _args(ctx),
        "ports": [{"name": "http", "containerPort": router_port(ctx), "protocol": "TCP"}],
        "env": [{"name": "FLEETSERVE_ADMIN_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": ctx.internal_secret, "key": "admin-token"}}}],
        "volumeMounts": mounts,
        "readinessProbe": {**probe, "httpGet": {**probe["httpGet"], "path": "/readyz"}, "periodSeconds": 5,
                           "failureThreshold": 2},
        "livenessProbe": {**probe, "httpGet": {**probe["httpGet"], "path": "/livez"}, "periodSeconds": 10,
                          "failureThreshold": 3},
        # requests held at zero replicas wait up to bufferTimeoutSeconds; a stopping router lets them finish
        "lifecycle": {"preStop": {"sleep": {"seconds": ctx.options.prestop_seconds}}},
    }
    # requests so that the scheduler counts the routers (none: BestEffort pods, evicted first under pressure); one
    # core per worker process, or they only take turns on fewer; no limits, so a burst is never throttled
    workers = spec.router.workers
    container["resources"] = {"requests": {"cpu": str(workers) if workers > 1 else ROUTER_CPU,
                                           "memory": f"{ROUTER_MEMORY_MI * workers}Mi"}}
    grace = ctx.options.prestop_seconds + ctx.router_drain_seconds + EXIT_SECONDS
    # fleetserve's own image: the restricted Pod Security level, /tmp (the workers' peer sockets) an emptyDir
    container["securityContext"] = restricted_container()
    container["volumeMounts"].append(dict(TMP_MOUNT))
    volumes.append(dict(TMP_VOLUME))
    pod_spec: dict = {"containers": [container], "volumes": volumes, "terminationGracePeriodSeconds": grace,
                      "securityContext": restricted_pod()}
    if ctx.image_pull_secrets():
        pod_spec["imagePullSecrets"] = ctx.image_pull_secrets()
    # spread the routers over nodes so that one node going does not take the endpoint down
    pod_spec["topologySpreadConstraints"] = [{
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": ctx.selector("router")}}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": ctx.meta(ctx.router_name, "router"),
        "spec": {
            "replicas": ctx.options.router_replicas,
            "selector": {"matchLabels": ctx.selector("router")},
            "template": {"metadata": {"labels": ctx.labels("router"), "annotations": {
                MODEL_CONFIG_ANNOTATION: model_config_digest(ctx)}}, "spec": pod_spec},
        },
    }


def router_service(ctx: Context) -> dict:
    port_name = "https" if ctx.endpoint.spec.tls.enabled else "http"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.meta(ctx.router_name, "router"),
        "spec": {"selector": ctx.selector("router"),
                 "ports": [{"name": port_name, "port": router_port(ctx), "targetPort": "http", "protocol": "TCP"}]},
    }


def router_pdb(ctx: Context) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": ctx.meta(ctx.router_name, "router"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": ctx.selector("router")}},
    }


def router_state(ctx: Context) -> dict:
    """Why no engine pod can start, for the router (k8s/failing.py): as rendered, what the spec alone decides (a
    static zero); the operator writes what the pods say."""
    spec = ctx.endpoint.spec
    reason = static_reason(spec.replicas, ctx.policy is not None, spec.engine.kind == "external")
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": ctx.meta(ctx.router_state, "router"),
            "data": {STATE_KEY: reason or ""}}


def api_keys_secret(ctx: Context) -> dict | None:
    keys = ctx.endpoint.spec.auth.api_keys
    if not keys or any(k.key_sha256 is None for k in keys):
        return None
    digests = {k.key_sha256: k.tenant for k in keys}
    text = json.dumps({"keys": dict(sorted(digests.items()))}, sort_keys=True)
    # `data`, not `stringData`: the API server folds stringData into data and never returns it, so the operator
    # saw the Secret changed on every pass and patched it again
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": ctx.meta(ctx.api_keys_secret, "router"),
        "type": "Opaque",
        "data": {"auth.json": base64.b64encode(text.encode()).decode()},
    }


def router_objects(ctx: Context, warn) -> list[dict]:
    spec = ctx.endpoint.spec
    if strategy(ctx) != spec.routing.strategy:
        warn("spec.routing.strategy", f"{spec.routing.strategy!r} is not implemented by the router; it runs "
                                      "'leastload'")
    routers = ctx.options.router_replicas * spec.router.workers
    if spec.request_limits.max_concurrent_requests and routers > 1:
        warn("spec.requestLimits.maxConcurrentRequests", f"{ctx.options.router_replicas} router pod(s) x "
                                                         f"{spec.router.workers} worker(s): {limits_split(routers)}")
    if spec.tls.enabled and (spec.tls.cert_file or spec.tls.key_file):
        warn("spec.tls.certFile", f"local files are not read on Kubernetes: the router mounts the Secret "
                                  f"{ctx.tls_secret!r} (kubernetes.io/tls)")
    if spec.router.host not in ("127.0.0.1", "0.0.0.0"):
        warn("spec.router.host", "on Kubernetes the router listens on 0.0.0.0 behind its Service")
    out = [router_deployment(ctx), router_service(ctx), router_pdb(ctx), router_state(ctx)]
    secret = api_keys_secret(ctx)
    if spec.auth.enabled and secret is not None:
        out.append(secret)
    return out
