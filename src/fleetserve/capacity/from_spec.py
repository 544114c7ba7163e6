"""The endpoint's `CapacityManager`, built one way for the live fleet (`fleetserve up`) and the simulator.

Each had its own copy of this, and they drifted: the GPU memory a model needs was asked in the simulator only,
so `fleetserve up` on a simulated cloud placed what `verify` refused. What differs between the two is said in
arguments: whether replicas land on cloud nodes (the live fleet: `capacity.provider: simulated`; the
simulator: whenever the spec lists GPU instance types), and the simulator's overrides of provisioning delay,
spot interruptions, seed and slots.
"""

from __future__ import annotations

from fleetserve.autoscale.schedule import Cron
from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.consolidation import Budget, ConsolidationPolicy
from fleetserve.capacity.manager import CapacityManager
from fleetserve.capacity.placement import Availability, ReplicaRequest, Tier, replica_request, tiers_from_spec
from fleetserve.capacity.providers import LocalProvider, Shortage, SimulatedCloud

DEFAULT_PROVISIONING_DELAY_S = 90.0  # a cloud other than the simulated one: a GPU node's usual launch to ready


def local_slots(spec, at_least: int = 0) -> int:
    """Replicas the local machine takes: `capacity.localSlots`, else as many as the spec can ask for."""
    if spec.capacity.local_slots:
        return spec.capacity.local_slots
    most = spec.autoscaling.max_replica_count if spec.autoscaling and spec.autoscaling.enabled else 0
    return max(1, spec.replicas, most, at_least)


def capacity_manager(spec, catalog: Catalog, now: float, namespace: str, *, cloud: bool,
                     provisioning_delay: float | None = None, spot_interruption_rate: float | None = None,
                     seed_offset: int = 0, at_least_slots: int = 0) -> CapacityManager:
    """Placement by the spec's tiers on a simulated cloud (`cloud`), else slots on the local machine; the L2
    Redis's price (`kvCache.l2.pricePerHour`) is booked from `now`, as it runs whatever the replicas do."""
    manager = _manager(spec, catalog, now, namespace, cloud=cloud, provisioning_delay=provisioning_delay,
                       spot_interruption_rate=spot_interruption_rate, seed_offset=seed_offset,
                       at_least_slots=at_least_slots)
    l2 = spec.kv_cache.l2
    if l2.enabled and l2.price_per_hour:
        manager.ledger.service_started("l2", l2.price_per_hour, now)
    return manager


def _manager(spec, catalog: Catalog, now: float, namespace: str, *, cloud: bool, provisioning_delay: float | None,
             spot_interruption_rate: float | None, seed_offset: int, at_least_slots: int) -> CapacityManager:
    cap = spec.capacity
    capacity_types = tuple(c for c in ("spot", "on-demand") if c in cap.capacity_types)
    consolidation = ConsolidationPolicy(
        cap.consolidation.policy, cap.consolidation.consolidate_after,
        tuple(Budget(b.nodes, Cron.parse(b.schedule) if b.schedule else None, b.duration_seconds, b.timezone)
              for b in cap.consolidation.budgets))
    common = dict(availability=Availability(cap.unavailable_offering_ttl), allow_larger=cap.allow_larger_instances,
                  consolidation=consolidation, namespace=namespace, model_version=spec.model.version)
    if not cloud:
        slots = local_slots(spec, at_least_slots)
        return CapacityManager(LocalProvider(slots, cap.local_price_per_hour, now), catalog,
                               [Tier(("local",), ("on-demand",))], ReplicaRequest(), local_slots=slots, **common)
    sim = cap.simulated
    simulated = cap.provider == "simulated"  # its shortages and delay are the spec's; another cloud's are not
    if provisioning_delay is None:
        provisioning_delay = sim.provisioning_delay_seconds if simulated else DEFAULT_PROVISIONING_DELAY_S
    provider = SimulatedCloud(
        catalog, limits={Catalog.canonical(k): v for k, v in sim.limits.items()},
        shortages=[Shortage(Catalog.canonical(s.instance_type), now + s.start_seconds, now + s.end_seconds,
                            s.capacity_type) for s in sim.shortages] if simulated else [],
        provisioning_delay=provisioning_delay,
        spot_interruption_rate=sim.spot_interruption_rate_per_hour if spot_interruption_rate is None
        else spot_interruption_rate,
        seed=sim.seed + seed_offset)
    # with the GPU memory the model its spec states needs (model_fit): a 70B on one 24 GB GPU is never placed
    return CapacityManager(provider, catalog, tiers_from_spec(spec.placement, catalog, capacity_types),
                           replica_request(spec.engine, spec.model, spec.kv_cache), **common)
