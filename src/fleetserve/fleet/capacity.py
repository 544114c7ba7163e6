"""Build the capacity manager of a local fleet from its spec (local machine or simulated cloud)."""

from __future__ import annotations

from fleetserve.autoscale.schedule import Cron
from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.consolidation import Budget, ConsolidationPolicy
from fleetserve.capacity.manager import CapacityManager
from fleetserve.capacity.placement import Availability, ReplicaRequest, Tier, replica_request, tiers_from_spec
from fleetserve.capacity.providers import LocalProvider, Shortage, SimulatedCloud


def local_slots(spec) -> int:
    if spec.capacity.local_slots:
        return spec.capacity.local_slots
    most = spec.autoscaling.max_replica_count if spec.autoscaling and spec.autoscaling.enabled else 0
    return max(1, spec.replicas, most)


def build_capacity(spec, namespace: str, now: float) -> CapacityManager:
    cap = spec.capacity
    catalog = Catalog.builtin(local_price=cap.local_price_per_hour)
    capacity_types = tuple(c for c in ("spot", "on-demand") if c in cap.capacity_types)
    consolidation = ConsolidationPolicy(
        cap.consolidation.policy,
        cap.consolidation.consolidate_after,
        tuple(Budget(b.nodes, Cron.parse(b.schedule) if b.schedule else None, b.duration_seconds, b.timezone)
              for b in cap.consolidation.budgets),
    )
    common = dict(availability=Availability(cap.unavailable_offering_ttl), allow_larger=cap.allow_larger_instances,
                  consolidation=consolidation, namespace=namespace, model_version=spec.model.version)
    if cap.provider == "simulated":
        sim = cap.simulated
        cloud = SimulatedCloud(
            catalog,
            limits={Catalog.canonical(k): v for k, v in sim.limits.items()},
            shortages=[Shortage(Catalog.canonical(s.instance_type), now + s.start_seconds, now + s.end_seconds,
                                s.capacity_type) for s in sim.shortages],
            provisioning_delay=sim.provisioning_delay_seconds,
            spot_interruption_rate=sim.spot_interruption_rate_per_hour,
            seed=sim.seed,
        )
        request = replica_request(spec.engine, spec.model)
        return CapacityManager(cloud, catalog, tiers_from_spec(spec.placement, catalog, capacity_types), request,
                               **common)
    slots = local_slots(spec)
    return CapacityManager(LocalProvider(slots, cap.local_price_per_hour, now), catalog,
                           [Tier(("local",), ("on-demand",))], ReplicaRequest(), local_slots=slots, **common)
