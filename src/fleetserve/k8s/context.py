"""What every object family reads: the endpoint, render options, names, and the shared policy objects.

The policy objects are built once, by the same code the live fleet and the simulator use:
`tiers_from_spec` (placement), `ScalingPolicy.from_spec` (autoscaling) and the consolidation policy, so a
rendered NodePool or ScaledObject says what the live controller does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fleetserve.autoscale.policy import ScalingPolicy
from fleetserve.autoscale.schedule import Cron
from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.consolidation import Budget, ConsolidationPolicy
from fleetserve.capacity.placement import Tier, pins_nodes, replica_request, tiers_from_spec, tiers_that_fit
from fleetserve.k8s.labels import dns_name, labels, selector
from fleetserve.spec.endpoint import Endpoint

ENGINE_PORT = 8000
ROUTER_PORT = 8080
REDIS_PORT = 6379
INTERNAL_TOKEN_DIR = "/var/run/fleetserve/internal"
GPU_ENGINES = frozenset({"vllm", "sglang"})
ENGINE_TOKEN_KEY = "engine-token"  # NAME-internal: the API key vLLM/SGLang require (never the internal token)
MODELS_DIR = "/models"
EXIT_SECONDS = 5  # a pod's grace after its process's own drain: time to exit before SIGKILL


DEFAULT_IMAGE = "ghcr.io/fleetserve/fleetserve:0.1.0"  # container/Containerfile; container/Containerfile.cuda: -cuda


@dataclass(frozen=True)
class RenderOptions:
    """Cluster facts the spec does not hold; every one has a CLI flag."""

    image: str = DEFAULT_IMAGE  # built-in engines on GPUs take its -cuda build
    vllm_image: str = "lmcache/vllm-openai:v0.3.7"
    sglang_image: str = "lmsysorg/sglang:v0.5.4"
    redis_image: str = "redis:7.4-alpine"
    prometheus_url: str = "http://prometheus-operated.monitoring.svc.cluster.local:9090"
    node_class: str = "default"
    node_class_group: str = "karpenter.k8s.aws"
    node_class_kind: str = "EC2NodeClass"
    zones: tuple[str, ...] = ()
    router_replicas: int = 2
    service_account: str | None = None
    model_pvc: str | None = None  # claim holding local-path models (FSx, NFS); default <name>-model
    prestop_seconds: int = 10  # endpoints and router health probes notice the pod is going
    kubernetes_version: str = "1.33"
    # labels the Prometheus operator selects ServiceMonitors and PrometheusRules by (kube-prometheus-stack:
    # `release: <its Helm release>`); without them it loaded neither, and nothing said so
    monitoring_labels: tuple[tuple[str, str], ...] = ()
    cluster_domain: str = "cluster.local"  # the cluster's DNS domain (kubelet --cluster-domain)


@dataclass(frozen=True)
class Context:
    endpoint: Endpoint
    options: RenderOptions
    tiers: tuple[Tier, ...]
    policy: ScalingPolicy | None
    consolidation: ConsolidationPolicy
    catalog: Catalog = field(repr=False, default_factory=Catalog.builtin)
    left_out: tuple[str, ...] = ()  # why each type the spec's node affinity allows takes no replica
    tier_ids: tuple[int, ...] = ()  # each tier's index among the spec's (names and labels keep it)
    spec_tiers: int = 0  # how many tiers the spec lists, those left out included

    @classmethod
    def build(cls, endpoint: Endpoint, options: RenderOptions) -> Context:
        spec = endpoint.spec
        catalog = Catalog.builtin()
        capacity_types = tuple(c for c in ("spot", "on-demand") if c in spec.capacity.capacity_types)
        listed = tiers_from_spec(spec.placement, catalog, capacity_types)
        tiers, left_out, ids = placeable_tiers(spec, listed, catalog)
        if pins_nodes(spec.placement.node_affinity):
            # the types are no NodePool's: the pods go to the named nodes, whatever their type, in one tier (the
            # preferred terms' tiers had each been a Deployment, all on the same nodes)
            tiers, ids, left_out, listed = tiers[-1:], (0,), (), listed[-1:]
        scaling = spec.autoscaling
        policy = ScalingPolicy.from_spec(scaling) if scaling is not None and scaling.enabled else None
        return cls(endpoint, options, tiers, policy, consolidation_policy(spec), catalog, left_out, ids, len(listed))

    # --- names ---------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.endpoint.metadata.name

    @property
    def namespace(self) -> str:
        return self.endpoint.metadata.namespace

    @property
    def drain_seconds(self) -> int:
        """How long a terminating engine may finish its in-flight requests (`engine.drainTimeoutSeconds`, whole
        seconds): the built-in engine's own wait after SIGTERM; the pod's grace adds preStop and `EXIT_SECONDS`."""
        return math.ceil(self.endpoint.spec.engine.drain_timeout_seconds)

    @property
    def router_drain_seconds(self) -> int:
        """A stopping router's wait for what it serves: the streams it proxies (the engines' drain) and the requests
        it holds at zero replicas (`router.bufferTimeoutSeconds`), whichever is shorter."""
        return self.endpoint.spec.router_drain_seconds

    @property
    def placed(self) -> bool:
        """True when the spec names instance types or node affinity (else: no node constraints, no NodePool).
        `local` is this machine (`fleetserve up`, the simulator), no cluster node type: a NodePool for it matched
        no node and left every pod Pending."""
        p = self.endpoint.spec.placement
        return bool([t for t in p.instance_types if t != "local"] or p.node_affinity)

    @property
    def pinned(self) -> bool:
        """The spec's node affinity names existing nodes by hostname (`placement.pins_nodes`): the pods take that
        affinity as given and no NodePool is rendered. fleetserve's own terms (the endpoint's NodePool label, the
        capacity type) had been added to the pods' affinity, which no existing node carries: Pending for ever."""
        return pins_nodes(self.endpoint.spec.placement.node_affinity)

    def tier_id(self, tier: int) -> str:
        """The tier's name in object names and labels: its index among the spec's tiers, whichever were left out
        (renumbered, a kept tier's NodePool took the next one's name, and its nodes drifted to another type)."""
        return str(self.tier_ids[tier] if self.tier_ids else tier)

    def engine_name(self, tier: int) -> str:
        # one tier in the spec: no suffix; a second one left out keeps the first's name (NAME-engine-t0)
        return dns_name(self.name, "engine") if max(len(self.tiers), self.spec_tiers) == 1 else \
            dns_name(self.name, "engine", f"t{self.tier_id(tier)}")

    def image_pull_secrets(self) -> list[dict]:
        """spec.pod.imagePullSecrets, for every pod the endpoint renders: a private registry's images are the
        engine's, and often the router's and Redis's mirrors too."""
        return [{"name": name} for name in self.endpoint.spec.pod.image_pull_secrets]

    def engine_deployments_regex(self) -> str:
        """The engine Deployments of every tier, for a PromQL `deployment=~` (names: [a-z0-9-], nothing to escape).
        A prefix such as NAME-engine.* missed the hashed names of long endpoints."""
        return "|".join(self.engine_name(t) for t in range(len(self.tiers)))

    def tier_pods(self, tier: int, series: str, bridge: str = "") -> str:
        """PromQL: `series` (a kube-state-metrics pod series of this namespace) for the engine pods of one tier,
        selected by their owner, the tier's ReplicaSets (DEPLOYMENT-HASH, never cut). By pod name it could not be
        done: Kubernetes cuts a generated name's base to 58 characters, which can drop the tier's suffix, and a
        prefix such as `NAME-engine-.*` also matched the pods of an endpoint named NAME-engine. `bridge` (a
        range such as 1m): both series as their max over it, so a missed scrape is no gap."""
        ns = self.namespace
        owner = (f'kube_pod_owner{{namespace="{ns}",owner_kind="ReplicaSet",'
                 f'owner_name=~"{self.engine_name(tier)}-[a-z0-9]+"}}')
        if bridge:
            series, owner = f"max_over_time({series}[{bridge}])", f"max_over_time({owner}[{bridge}])"
        return f"{series} * on(namespace, pod) group_left() {owner}"

    @property
    def engine_service(self) -> str:
        return dns_name(self.name, "engine")

    @property
    def engine_pods_service(self) -> str:
        """The headless Service whose DNS answers are the ready engine pods (the router's backends)."""
        return dns_name(self.name, "engine", "pods")

    @property
    def router_name(self) -> str:
        return dns_name(self.name, "router")

    @property
    def router_state(self) -> str:
        """The ConfigMap the router pods mount: the operator's word on why no engine pod can start (failing.py)."""
        return dns_name(self.name, "router", "state")

    @property
    def redis_name(self) -> str:
        return dns_name(self.name, "redis")

    @property
    def internal_secret(self) -> str:
        return dns_name(self.name, "internal")

    @property
    def api_keys_secret(self) -> str:
        return dns_name(self.name, "api-keys")

    @property
    def tls_secret(self) -> str:
        return dns_name(self.name, "tls")

    @property
    def model_claim(self) -> str:
        return self.options.model_pvc or dns_name(self.name, "model")

    def host(self, service: str) -> str:
        return f"{service}.{self.namespace}.svc.{self.options.cluster_domain}"

    def labels(self, component: str, **extra: str) -> dict[str, str]:
        return labels(self.name, component, self.endpoint.metadata.labels, **extra)

    def selector(self, component: str, **extra: str) -> dict[str, str]:
        return selector(self.name, component, **extra)

    def meta(self, name: str, component: str, namespaced: bool = True, **extra: str) -> dict:
        out: dict = {"name": name}
        if namespaced:
            out["namespace"] = self.namespace
        out["labels"] = self.labels(component, **extra)
        return out


def placeable_tiers(spec, tiers: list[Tier], catalog: Catalog
                    ) -> tuple[tuple[Tier, ...], tuple[str, ...], tuple[int, ...]]:
    """The spec's placement `tiers` without the instance types that cannot take a replica, as `fleetserve up` and the
    simulator place (`tiers_that_fit`; `validate` names each type left out): a type of more GPUs than a replica
    asks is used only with capacity.allowLargerInstances (a NodePool had offered it anyway, and Karpenter packed
    replicas onto 8-GPU nodes the local fleet and `plan` never pay for), and a too small one had left its tier's
    pods Pending. A spec with no type left is not rendered (ValueError). Second: why each type the node affinity
    allows was left out (`validate` names those of instanceTypes); third, each kept tier's index among the spec's."""
    asked = replica_request(spec.engine, spec.model, spec.kv_cache)
    larger = spec.capacity.allow_larger_instances
    kept, dropped = tiers_that_fit(tiers, catalog, asked, larger)
    gone = {i for i, types in dropped if len(types) == len(tiers[i].instance_types)}
    ids = tuple(i for i in range(len(tiers)) if i not in gone)
    names = list(dict.fromkeys(n for _, types in dropped for n in types))
    hint = "" if larger or all(catalog.get(n).gpus <= asked.gpus for n in names) else \
        "; a type of more GPUs than a replica asks needs capacity.allowLargerInstances"
    if not kept:
        from fleetserve.spec.effects import capacity_type_conflict

        conflict = capacity_type_conflict(spec) if not names else None
        if conflict:
            raise ValueError(f"spec.placement.nodeAffinity: {conflict.replace(' (render k8s refuses the spec)', '')}")
        raise ValueError(f"spec.placement: no listed instance type ({', '.join(names)}) can take {asked}: no replica "
                         f"would start{hint}")
    if spec.placement.instance_types or not names:
        return tuple(kept), (), ids
    listed = ", ".join(f"{t.name} ({t.gpus} GPU(s))" for t in (catalog.get(n) for n in names))
    return tuple(kept), (f"{len(names)} instance type(s) the node affinity allows cannot take {asked}: {listed}; "
                         f"left out of the NodePools and the pods' affinity{hint}",), ids


def consolidation_policy(spec) -> ConsolidationPolicy:
    """The spec's consolidation section as the policy object the fleet and the simulator build.

    (fleet/capacity.py and sim/setup.py build it the same way inline; a `ConsolidationPolicy.from_spec`
    in capacity/consolidation.py would let all three share one line.)
    """
    c = spec.capacity.consolidation
    return ConsolidationPolicy(
        c.policy, c.consolidate_after,
        tuple(Budget(b.nodes, Cron.parse(b.schedule) if b.schedule else None, b.duration_seconds, b.timezone)
              for b in c.budgets))


def num(value: float) -> str:
    """A number as KEDA wants trigger metadata: a string, without a needless `.0`, and exact (the shortest that reads
    back as the same float: `:g` rounded 1234.5678 to 1234.57, which KEDA then scaled on)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
