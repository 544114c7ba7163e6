"""The instance catalog: hardware and $/hour per type, shipped as versioned data with its sources.

HyperPod's `ml.` names (ml.g5.8xlarge) map onto the same hardware as the EC2 names. The `local` type is
this machine: no GPU, and a price of 0 unless the fleet says otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources

CAPACITY_TYPES = ("spot", "on-demand")


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    gpu_memory_gb: float
    vcpu: int
    memory_gb: float
    on_demand: float  # $/hour
    spot: float  # $/hour
    gpu: str = ""
    source: str = ""

    def price(self, capacity_type: str) -> float:
        return self.spot if capacity_type == "spot" else self.on_demand


class Catalog:
    def __init__(self, types: list[InstanceType], version: str = "", sources: dict | None = None):
        self._types = {t.name: t for t in types}
        self.version = version
        self.sources = sources or {}

    @classmethod
    def builtin(cls, local_price: float = 0.0, local_vcpu: int = 2, local_memory_gb: float = 24) -> Catalog:
        data = json.loads(resources.files("fleetserve.capacity").joinpath("data/instances.json").read_text())
        fraction = data["spot_fraction"]
        types = [
            InstanceType(i["name"], i["gpus"], i["gpu_memory_gb"], i["vcpu"], i["memory_gb"], i["on_demand"],
                         round(i["on_demand"] * fraction, 4), i.get("gpu", ""), i.get("source", ""))
            for i in data["instances"]
        ]
        types.append(InstanceType("local", 0, 0, local_vcpu, local_memory_gb, local_price, local_price,
                                  source="this machine"))
        return cls(types, data["version"], data["sources"])

    @staticmethod
    def canonical(name: str) -> str:
        return name.removeprefix("ml.")

    def get(self, name: str) -> InstanceType:
        try:
            return self._types[self.canonical(name)]
        except KeyError:
            raise KeyError(f"unknown instance type {name!r}; known: {', '.join(sorted(self._types))}") from None

    def __contains__(self, name: str) -> bool:
        return self.canonical(name) in self._types

    def first_unknown(self, names) -> tuple[int, str] | None:
        """(index, name) of the first of `names` this catalog does not price, or None."""
        return next(((i, n) for i, n in enumerate(names) if n not in self), None)

    def names(self) -> list[str]:
        return sorted(self._types)

    def types(self) -> list[InstanceType]:
        return list(self._types.values())

    def with_prices(self, prices: dict[str, tuple[float, float]]) -> Catalog:
        """A copy with current (on-demand, spot) prices for some types (by either name: `ml.g5.xlarge` prices
        the g5.xlarge the catalog holds)."""
        prices = {self.canonical(name): price for name, price in prices.items()}
        types = [replace(t, on_demand=prices[t.name][0], spot=prices[t.name][1]) if t.name in prices else t
                 for t in self._types.values()]
        return Catalog(types, self.version + "+prices", self.sources)
