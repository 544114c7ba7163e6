"""Build the capacity manager of a local fleet from its spec (local machine or simulated cloud)."""

from __future__ import annotations

from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.from_spec import capacity_manager, local_slots
from fleetserve.capacity.manager import CapacityManager

__all__ = ["build_capacity", "local_slots"]


def build_capacity(spec, namespace: str, now: float) -> CapacityManager:
    catalog = Catalog.builtin(local_price=spec.capacity.local_price_per_hour)
    return capacity_manager(spec, catalog, now, namespace, cloud=spec.capacity.provider == "simulated")
