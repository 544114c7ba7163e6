"""Placement, pure: `place(request, tiers, catalog, availability, now) -> Placement | InsufficientCapacity`.

Tiers come from the endpoint's `instanceTypes` priority list (one tier per entry) or from `nodeAffinity`
(preferred terms by descending weight, each narrowed by the required terms, then the required terms alone).
Within a tier the cheapest fitting offering wins, spot before on-demand when both are allowed. An offering
that failed with insufficient capacity is skipped until its TTL ends, so the next tier is tried at once.
A type with more GPUs than a replica asks for is never chosen unless `allow_larger` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetserve.capacity.catalog import CAPACITY_TYPES, Catalog, InstanceType
from fleetserve.capacity.model_fit import gpu_memory_needed_gib, stated_size

DEFAULT_UNAVAILABLE_TTL = 180.0  # Karpenter's unavailable-offerings cache: 3 minutes
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def pins_nodes(affinity: dict | None) -> bool:
    """Whether every required term of a node affinity names its nodes by hostname (`kubernetes.io/hostname In`):
    nodes that exist already (a HyperPod cluster's, with the model on their local disk), which no autoscaler can
    launch, since a new node gets a name of its own."""
    required = (affinity or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    return bool(terms) and all(any(e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In"
                                   for e in term.get("matchExpressions") or []) for term in terms)


@dataclass(frozen=True)
class ReplicaRequest:
    gpus: int = 0
    gpu_memory_gb: float = 0.0
    vcpu: float = 0.0
    memory_gb: float = 0.0

    def __str__(self) -> str:
        parts = [f"{self.gpus} GPU(s)" if self.gpus else "no GPU"]
        if self.gpu_memory_gb:
            parts.append(f"{self.gpu_memory_gb:g} GiB of GPU memory together")
        if self.vcpu:
            parts.append(f"{self.vcpu:g} cpu")
        if self.memory_gb:
            parts.append(f"{self.memory_gb:g} GiB of memory")
        return "a replica of " + ", ".join(parts)


@dataclass(frozen=True)
class Offering:
    instance_type: str
    capacity_type: str  # "spot" | "on-demand"
    zone: str = "any"


@dataclass(frozen=True)
class Tier:
    instance_types: tuple[str, ...]
    capacity_types: tuple[str, ...] = ("on-demand",)


@dataclass(frozen=True)
class Placement:
    offering: Offering
    price_per_hour: float
    tier: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class InsufficientCapacity:
    reason: str
    tried: tuple[Offering, ...] = ()


@dataclass
class Availability:
    """Offerings known to be out of capacity, each until an expiry time (an ICE cache)."""

    ttl: float = DEFAULT_UNAVAILABLE_TTL
    until: dict[Offering, float] = field(default_factory=dict)

    def mark_unavailable(self, offering: Offering, now: float) -> None:
        self.until[offering] = now + self.ttl

    def available(self, offering: Offering, now: float) -> bool:
        expiry = self.until.get(offering)
        if expiry is not None and now >= expiry:
            del self.until[offering]
            return True
        return expiry is None


def allocatable(t: InstanceType) -> tuple[float, float]:
    """(cpu, memory GiB) pods may request on a node of type `t`: its capacity less what the kubelet reserves, by
    the EKS / Karpenter formula (cpu: 6 % of the first core, 1 % of the second, 0.5 % of the next two, 0.25 % of
    the rest; memory: 255 MiB + 11 MiB for each of 110 pods, and the 100 MiB eviction threshold). A pod asking a
    node's whole 16 GiB or 4 cpu counted as fitting and would stay Pending."""
    n = t.vcpu
    reserved = 0.06 * min(n, 1) + 0.01 * min(max(n - 1, 0), 1) + 0.005 * min(max(n - 2, 0), 2) \
        + 0.0025 * max(n - 4, 0)
    return n - reserved, t.memory_gb - (255 + 11 * 110 + 100) / 1024


def replicas_per_node(t: InstanceType, req: ReplicaRequest) -> int:
    """How many replicas a node of type `t` holds, the way the scheduler packs pods: its GPUs, then the cpu and
    memory each replica's pod requests (at least one: placement checked that one fits). The simulator's nodes
    and the NodePool's limits (`k8s/karpenter.py`) count the same."""
    counts = [t.gpus // req.gpus if req.gpus else 1]
    cpu, memory = allocatable(t)
    if req.vcpu:
        counts.append(int(cpu // req.vcpu))
    if req.memory_gb:
        counts.append(int(memory // req.memory_gb))
    return max(1, min(counts))


def fits(t: InstanceType, req: ReplicaRequest, allow_larger: bool) -> bool:
    if req.gpus and (t.gpus < req.gpus or (t.gpus > req.gpus and not allow_larger)):
        return False
    if req.gpu_memory_gb and t.gpu_memory_gb * (req.gpus or 1) / max(t.gpus, 1) < req.gpu_memory_gb:
        return False
    if not (req.vcpu or req.memory_gb):
        return True
    cpu, memory = allocatable(t)
    return cpu >= req.vcpu and memory >= req.memory_gb


def fitting_types(tier: Tier, catalog: Catalog, req: ReplicaRequest, allow_larger: bool) -> list[InstanceType]:
    """The tier's catalog types that can take a replica (`fits`)."""
    return [t for t in (catalog.get(n) for n in tier.instance_types if n in catalog) if fits(t, req, allow_larger)]


def tiers_that_fit(tiers: list[Tier], catalog: Catalog, req: ReplicaRequest,
                   allow_larger: bool) -> tuple[list[Tier], list[tuple[int, tuple[str, ...]]]]:
    """The tiers as a cluster should get them: without the catalog types `place` never chooses (too small, or larger
    than the replica asks without `allow_larger`), and a tier left with none dropped; then `(index, left out)` for
    each tier that lost types. A type the catalog does not know, and `local` (no cluster node), stay as given."""
    kept, left_out = [], []
    for index, tier in enumerate(tiers):
        fitting = {t.name for t in fitting_types(tier, catalog, req, allow_larger)}
        drop = tuple(n for n in tier.instance_types if n in catalog and n != "local" and n not in fitting)
        if drop:
            left_out.append((index, drop))
        types = tuple(n for n in tier.instance_types if n not in drop)
        if types:
            kept.append(Tier(types, tier.capacity_types))
    return kept, left_out


def place(req: ReplicaRequest, tiers: list[Tier], catalog: Catalog, availability: Availability, now: float,
          allow_larger: bool = False) -> Placement | InsufficientCapacity:
    tried: list[Offering] = []
    notes: list[str] = []
    for index, tier in enumerate(tiers):
        fitting = fitting_types(tier, catalog, req, allow_larger)
        if len(fitting) == 1 and len(tier.instance_types) > 1:
            notes.append(f"tier {index} collapses to the single type {fitting[0].name}: no fallback inside it")
        order = sorted(CAPACITY_TYPES, key=lambda c: CAPACITY_TYPES.index(c))
        offers = [(t.price(c), t.name, c) for t in fitting for c in order if c in tier.capacity_types]
        for price, name, capacity in sorted(offers, key=lambda o: (order.index(o[2]), o[0], o[1])):
            offering = Offering(name, capacity)
            if availability.available(offering, now):
                return Placement(offering, price, index, tuple(notes))
            tried.append(offering)
    wanted = ", ".join("/".join(t.instance_types) for t in tiers) or "no instance types"
    larger = [] if allow_larger else sorted({n for tier in tiers for n in tier.instance_types if n in catalog
                                              and not fits(catalog.get(n), req, False)
                                              and fits(catalog.get(n), req, True)})
    why = f"; {', '.join(larger)} {'has' if len(larger) == 1 else 'have'} more GPUs than a replica asks: " \
          "capacity.allowLargerInstances lets a replica take one" if larger else ""
    if tried:  # it fits, but there is no capacity: "no available offering fits" had read as a size mismatch
        short = ", ".join(f"{o.instance_type} {o.capacity_type}" for o in tried)
        return InsufficientCapacity(f"no capacity for {req} in tiers [{wanted}]: every offering that fits is out of "
                                    f"capacity for now ({short}){why}", tuple(tried))
    return InsufficientCapacity(f"no listed offering fits {req} in tiers [{wanted}]{why}", tuple(tried))


_QUANTITY_FACTORS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": 1e-3,
                     "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def quantity(value) -> float:
    """A Kubernetes quantity as a number (`500m` 0.5, `30Gi` 32212254720, `1e9`); the spec checked its grammar."""
    text = str(value).lstrip("+")
    for suffix in sorted(_QUANTITY_FACTORS, key=len, reverse=True):
        if text.endswith(suffix) and not text[: -len(suffix)].endswith(("e", "E")):
            return float(text[: -len(suffix)]) * _QUANTITY_FACTORS[suffix]
    return float(text)


def l1_memory_bytes(kv_cache, engine=None) -> int:
    """The host memory the L1 tier fills (the built-in engine's L1, LMCache's local CPU buffer under vLLM, SGLang's
    HiCache): a replica's pod must hold at least that much. Under vLLM with L2 only, LMCache's staging buffer on
    each GPU rank (engine/adapters.py)."""
    if kv_cache is None:
        return 0
    if kv_cache.l1.enabled:
        return kv_cache.l1.max_bytes
    if engine is not None and engine.kind == "vllm" and kv_cache.l2.enabled:
        from fleetserve.engine.adapters import LMCACHE_STAGING_BYTES

        return LMCACHE_STAGING_BYTES * max(engine.gpus, 1)
    return 0


def replica_request(engine, model=None, kv_cache=None) -> ReplicaRequest:
    """What one replica asks of a node: `engine.gpus` (at least one on a GPU type), and the cpu and memory its pod
    requests (`engine.resources.requests`, else its limits, as Kubernetes defaults them; memory at least the L1
    tier of `kv_cache`); with the spec's `model`, also the GPU memory the parameter count it states needs
    (`model_fit`). Without the cpu and memory, `plan` verified HyperPod's example (cpu 6, 30Gi) on a g6e.xlarge of 4
    vCPUs and 32 GiB, and render wrote a Deployment that could never be scheduled there."""
    resources = engine.resources or {}
    asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    cpu = quantity(asked["cpu"]) if "cpu" in asked else 0.0
    memory = quantity(asked["memory"]) if "memory" in asked else 0.0
    limit = (resources.get("limits") or {}).get("memory")
    host = l1_memory_bytes(kv_cache, engine)
    if limit is None or quantity(limit) >= host:  # a pod never requests past its limit (a limit below the L1 is
        memory = max(memory, host)  # warned about: k8s/engine.py)
    memory /= 2**30  # GiB, as instance types state it
    gpus = engine.gpus or 1
    size = stated_size(model, engine) if model is not None else None
    gpu_memory = gpu_memory_needed_gib(size, gpus) if size is not None else 0.0
    return ReplicaRequest(gpus=gpus, gpu_memory_gb=gpu_memory, vcpu=cpu, memory_gb=memory)


def tiers_from_spec(placement, catalog: Catalog, capacity_types: tuple[str, ...]) -> list[Tier]:
    """Tiers from the spec's placement section (instanceTypes or nodeAffinity)."""
    if placement.instance_types:
        return [Tier((catalog.canonical(n),), capacity_types) for n in placement.instance_types]
    if placement.node_affinity:
        return _affinity_tiers(placement.node_affinity, catalog, capacity_types)
    return [Tier(("local",), capacity_types)]


def _matches(expr: dict, instance: str, capacity: str) -> bool:
    key, op, values = expr.get("key"), expr.get("operator", "In"), expr.get("values") or []
    value = {INSTANCE_TYPE_LABEL: instance, CAPACITY_TYPE_LABEL: capacity}.get(key)
    if value is None:  # a label the catalog does not model (zone, a team's own): it never rules a type out
        return True      # here; the NodePool carries it (k8s/karpenter.py)
    canon = [Catalog.canonical(v) for v in values] if key == INSTANCE_TYPE_LABEL else values
    if op == "In":
        return value in canon
    if op == "NotIn":
        return value not in canon
    return op == "Exists"


def _term_allows(term: dict, instance: str, capacity: str) -> bool:
    return all(_matches(e, instance, capacity) for e in term.get("matchExpressions", []))


def _affinity_tiers(affinity: dict, catalog: Catalog, capacity_types: tuple[str, ...]) -> list[Tier]:
    required = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    preferred = sorted(affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or [],
                       key=lambda p: -int(p.get("weight", 0)))
    names = [n for n in catalog.names() if n != "local"]

    def allowed(name: str, cap: str) -> bool:
        return not required or any(_term_allows(t, name, cap) for t in required)

    tiers = []
    for pref in preferred:
        term = pref.get("preference") or {}
        types = tuple(n for n in names if any(allowed(n, c) and _term_allows(term, n, c) for c in capacity_types))
        caps = tuple(c for c in capacity_types if any(allowed(n, c) and _term_allows(term, n, c) for n in types))
        if types:
            tiers.append(Tier(types, caps))
    rest = tuple(n for n in names if any(allowed(n, c) for c in capacity_types))
    if rest:
        tiers.append(Tier(rest, tuple(c for c in capacity_types if any(allowed(n, c) for n in rest))))
    # a preference on a label the catalog does not model (a zone; AWS's sample misspells the instance-type
    # key) narrows nothing here: it rendered three identical tiers, NodePools and overflow ScaledObjects. The
    # pods carry every preference as written (k8s/engine.py), where the scheduler weighs it.
    return [t for i, t in enumerate(tiers) if t not in tiers[:i]]
