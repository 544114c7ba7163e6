"""Names and labels of rendered objects: `app.kubernetes.io/*` conventions, DNS-safe, deterministic.

Every object carries name=fleetserve, instance=<endpoint>, component=<engine|router|redis|...>,
part-of=fleetserve, managed-by=fleetserve and version=<fleetserve version>; the spec's `metadata.labels` are
added underneath (ours win). Selectors use only the stable subset (name, instance, component[, tier]).
Names longer than a DNS label (63) are cut and end in a short hash of the full name, so they stay unique.
"""

from __future__ import annotations

import hashlib
import re

from fleetserve import __version__

APP = "fleetserve"
TIER_LABEL = "fleetserve.io/tier"
COMPONENT_LABEL = "app.kubernetes.io/component"
TENANT_LABEL = "fleetserve.io/tenant"
DISCOVERY_LABEL = "fleetserve.io/discovery"  # on the headless engine Service: DNS for the router, never scraped
REDIS_LABEL = "fleetserve.io/redis"  # which rendered Redis a pod is: the shared one's selectors took tenants' too
ENDPOINT_LABEL = "fleetserve.io/endpoint"
MAX_NAME = 63


MAX_STATEFULSET_NAME = 52  # its pods' controller-revision-hash label is the name, `-` and 10 characters (63)


def dns_name(*parts: str, limit: int = MAX_NAME) -> str:
    """`a-b-c` as a DNS label; over `limit` characters: cut, then `-` and 8 hex digits of the full name."""
    raw = "-".join(p for p in parts if p)
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-") or "x"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:limit - 9].rstrip('-')}-{digest}"


def label_value(text: str) -> str:
    """`text` as a label value (at most 63 of [A-Za-z0-9._-], alphanumeric at both ends); longer: cut, then `-`
    and 8 hex digits of the whole, so two long values stay apart."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    if len(value) <= MAX_NAME:
        return value
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{value[:MAX_NAME - 9].rstrip('-._')}-{digest}"


def node_owner(namespace: str, name: str) -> str:
    """The `fleetserve.io/endpoint` value of an endpoint's nodes: its NodePools label them, and its engine pods
    require it, so one endpoint's pods never launch nodes from (or count against the GPU limit of) another's."""
    return label_value(f"{namespace}.{name}")


def selector(instance: str, component: str, **extra: str) -> dict[str, str]:
    out = {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": instance,
           COMPONENT_LABEL: component}
    out.update(extra)
    return out


RESERVED_PREFIX = "fleetserve.io/"  # fleetserve's own labels: selectors (discovery, tiers, Redis) read them


def labels(instance: str, component: str, user: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The spec's labels, less those under fleetserve.io/ (a user's `fleetserve.io/discovery` on every Service
    had hidden them all from their ServiceMonitors: nothing scraped, every scaling query empty), then ours."""
    out = {k: v for k, v in sorted((user or {}).items()) if not k.startswith(RESERVED_PREFIX)}
    out.update(selector(instance, component, **extra))
    out.update({"app.kubernetes.io/part-of": APP, "app.kubernetes.io/managed-by": APP,
                "app.kubernetes.io/version": __version__})
    return out


def env_name(text: str) -> str:
    """An environment variable name made from free text (tenant names)."""
    return re.sub(r"[^A-Z0-9_]", "_", text.upper())
