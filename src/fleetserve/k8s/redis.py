"""The L2 KV tier on Kubernetes: a Redis StatefulSet + Service per rendered Redis, or the spec's URL.

- `kvCache.l2.enabled` without `url`: a Redis `<name>-redis` is rendered (no persistence, `maxmemory` =
  `l2.maxBytes`, `allkeys-lru`, AUTH from the Secret `<name>-redis-auth`, key `password`), as the local
  fleet starts its own redis-server;
- with `url`: that Redis is used as is (nothing rendered);
- `l2.tenantUrls` (hard isolation): a URL whose host is a bare Service name (no dot, not localhost or an IP)
  names a Redis to render in the endpoint's namespace for that tenant, with its own Secret
  `<service>-auth`; any other URL is an external Redis, used as is.
Engines get the password through `$(VAR)` expansion of an environment variable read from the Secret, so
the password is never written into a manifest. Each Redis's pods, Service and StatefulSet carry and select
`fleetserve.io/redis: <service>` (and the tenant's label), so no Redis selects another's pods; a StatefulSet's
selector cannot change in place, so an L2 Redis rendered before this label is replaced, not patched.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fleetserve.k8s.context import REDIS_PORT, Context
from fleetserve.k8s.labels import MAX_STATEFULSET_NAME, REDIS_LABEL, TENANT_LABEL, dns_name, env_name, label_value
from fleetserve.k8s.security import restricted_redis
from fleetserve.kvcache.tiers import split_credentials
from fleetserve.spec.endpoint import rendered_tenant_service

PASSWORD_ENV = "REDIS_PASSWORD"


L2_ENGINES = ("builtin", "vllm")  # engines wired to a Redis L2 (vLLM through LMCache); SGLang's HiCache is not


def _l2_wired(ctx: Context) -> bool:
    return ctx.endpoint.spec.kv_cache.l2.enabled and ctx.endpoint.spec.engine.kind in L2_ENGINES


def tenant_service(tenant: str, url: str) -> str | None:
    """The Service a tenant's bare host becomes, a Kubernetes Service name (DNS-1035: it starts with a letter), or
    None for a Redis of the user's. `redis://9redis` had rendered Services `9redis` and `9redis-headless` that the
    API server refuses, and the operator retried them every 30 s."""
    service = rendered_tenant_service(url)
    if service is None:
        return None
    name = dns_name(service)
    if not name[0].isalpha():
        raise ValueError(f"spec.kvCache.l2.tenantUrls[{tenant}]: the bare host {service!r} names the Redis "
                         "rendered for this tenant, and a Kubernetes Service name starts with a letter: name it so "
                         "(or give a Redis of yours by a host with a dot)")
    return name


def redis_instances(ctx: Context) -> list[tuple[str, str | None]]:
    """(service name, tenant or None) of every Redis this endpoint renders."""
    l2 = ctx.endpoint.spec.kv_cache.l2
    if not _l2_wired(ctx):
        return []
    out: list[tuple[str, str | None]] = [] if l2.url else [(ctx.redis_name, None)]
    for tenant, url in sorted(_tenant_urls(ctx).items()):
        service = tenant_service(tenant, url)
        if service:
            out.append((service, tenant))
    return out


def _tenant_urls(ctx: Context) -> dict[str, str]:
    """A tenant's own Redis is the built-in engine's: vLLM and SGLang share the one L2 (a warning says so), so
    theirs are neither rendered (a 4 GiB StatefulSet nobody used) nor given to the engine (a Secret it waited for)."""
    spec = ctx.endpoint.spec
    return dict(spec.kv_cache.l2.tenant_urls) if spec.engine.kind == "builtin" else {}


def auth_secret(service: str) -> str:
    return dns_name(service, "auth")


def engine_l2(ctx: Context) -> tuple[str | None, dict[str, str], list[dict]]:
    """(L2 URL, tenant -> URL, env entries with the passwords) as the engines see them."""
    l2 = ctx.endpoint.spec.kv_cache.l2
    if not _l2_wired(ctx):
        return None, {}, []
    env: list[dict] = []

    def secret_env(name: str, service: str) -> None:
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": auth_secret(service), "key": "password"}}})

    url = l2.url
    if not url:
        secret_env(PASSWORD_ENV, ctx.redis_name)
        url = f"redis://:$({PASSWORD_ENV})@{ctx.host(ctx.redis_name)}:{REDIS_PORT}/0"
    tenants: dict[str, str] = {}
    for tenant, turl in sorted(_tenant_urls(ctx).items()):
        service = tenant_service(tenant, turl)
        if service is None:
            tenants[tenant] = turl
            continue
        var = f"{PASSWORD_ENV}_{env_name(service)}"  # one per Redis: tenants a-b and a.b may not share it
        secret_env(var, service)
        parts = urlsplit(turl)
        db = parts.path.strip("/") or "0"
        tenants[tenant] = f"redis://:$({var})@{ctx.host(service)}:{parts.port or REDIS_PORT}/{db}"
    return url, tenants, env


def _identity(service: str, tenant: str | None) -> dict[str, str]:
    """The labels that tell one rendered Redis from another, selectors included: with only name, instance and
    component the shared Redis's Service and StatefulSet also selected every tenant's Redis pod (a shared-L2
    connection could reach a tenant's Redis)."""
    return {REDIS_LABEL: service, **({TENANT_LABEL: label_value(tenant)} if tenant else {})}


def _statefulset(ctx: Context, service: str, tenant: str | None) -> dict:
    l2 = ctx.endpoint.spec.kv_cache.l2
    extra = _identity(service, tenant)
    sel = ctx.selector("redis", **extra)
    # Redis needs room beyond maxmemory for its own structures and client buffers
    limit = l2.max_bytes + max(64 << 20, l2.max_bytes // 4)
    probe = {"tcpSocket": {"port": "redis"}, "periodSeconds": 10, "timeoutSeconds": 3}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        # at most 52 characters (a 63-character one never made a pod: its revision label would be 74)
        "metadata": ctx.meta(dns_name(service, limit=MAX_STATEFULSET_NAME), "redis", **extra),
        "spec": {
            "serviceName": dns_name(service, "headless"),  # a StatefulSet's governing Service is headless
            "replicas": 1,
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": ctx.labels("redis", **extra)},
                "spec": {
                    "containers": [{
                        "name": "redis",
                        "image": ctx.options.redis_image,
                        "command": ["redis-server"],
                        "args": ["--port", str(REDIS_PORT), "--save", "", "--appendonly", "no",
                                 "--maxmemory", str(l2.max_bytes), "--maxmemory-policy", "allkeys-lru",
                                 "--requirepass", f"$({PASSWORD_ENV})"],
                        "env": [{"name": PASSWORD_ENV, "valueFrom": {"secretKeyRef": {
                            "name": auth_secret(service), "key": "password"}}}],
                        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
                        "resources": {"requests": {"memory": str(limit)}, "limits": {"memory": str(limit)}},
                        "readinessProbe": probe,
                        "livenessProbe": {**probe, "failureThreshold": 3},
                        "securityContext": restricted_redis()[1],
                    }],
                    # `command` replaced the image's entrypoint, which is what drops root for the redis user:
                    # redis-server ran as root with every default capability
                    "securityContext": restricted_redis()[0],
                    **({"imagePullSecrets": ctx.image_pull_secrets()} if ctx.image_pull_secrets() else {}),
                },
            },
        },
    }


def _service(ctx: Context, service: str, tenant: str | None) -> dict:
    extra = _identity(service, tenant)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.meta(service, "redis", **extra),
        "spec": {"selector": ctx.selector("redis", **extra),
                 "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis", "protocol": "TCP"}]},
    }


def _governing_service(ctx: Context, service: str, tenant: str | None) -> dict:
    """The headless Service a StatefulSet names (its pods' stable DNS); clients use the other, `_service`."""
    extra = _identity(service, tenant)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.meta(dns_name(service, "headless"), "redis", **extra),
        "spec": {"clusterIP": "None", "selector": ctx.selector("redis", **extra),
                 "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis", "protocol": "TCP"}]},
    }


def redis_objects(ctx: Context, warn) -> list[dict]:
    kind = ctx.endpoint.spec.engine.kind
    if ctx.endpoint.spec.kv_cache.l2.enabled and kind not in (*L2_ENGINES, "container"):  # container: spec.kvCache
        warn("spec.kvCache.l2", f"{kind} engines are not wired to a Redis L2 (built-in and vLLM through LMCache "
                                "are): no Redis is rendered and the engines keep L1 only")
    for tenant, url in sorted(_tenant_urls(ctx).items()) if _l2_wired(ctx) else ():  # rendered only when wired
        service = rendered_tenant_service(url)
        if service and split_credentials(url)[2]:  # it had been warned as "in the manifests as plain text"
            warn(f"spec.kvCache.l2.tenantUrls.{tenant}",
                 f"the password in the URL is not used: {service!r} is a bare Service name, so the render deploys "
                 "this tenant's Redis there, with a password of its own in the Secret "
                 f"{auth_secret(dns_name(service))} (for a Redis of your own, give its address: a host with a dot, or rediss://)")
    out: list[dict] = []
    for service, tenant in redis_instances(ctx):
        out += [_statefulset(ctx, service, tenant), _service(ctx, service, tenant),
                _governing_service(ctx, service, tenant)]
    return out
