"""Prices a user knows better than the shipped catalog: `--prices FILE` for simulate, verify and plan.

The catalog holds EC2 list prices. A team pays its own: SageMaker's `ml.*` rates (above EC2's), a savings plan,
a negotiated discount, another cloud's bill for the same GPU. The file maps instance types to $/hour, YAML or
JSON:

    ml.g5.xlarge: 1.41                        # on-demand; spot keeps the catalog's spot/on-demand ratio
    g6e.xlarge: {onDemand: 1.50, spot: 0.70}

A name prices the hardware it runs on for the whole run (`ml.g5.xlarge` and `g5.xlarge` are one machine in the
catalog), so a file that prices both is refused rather than one silently winning.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import yaml

from fleetserve.capacity.catalog import Catalog

PRICE_KEYS = ("onDemand", "spot")


class PriceError(ValueError):
    """A price file that cannot be used; the message names the file and the entry."""


def load_prices(path: str | Path, catalog: Catalog | None = None) -> dict[str, tuple[float, float]]:
    """(on-demand, spot) $/hour by each type's name as the file gives it (`Catalog.with_prices` reads both)."""
    p = Path(path)
    if not p.is_file():
        raise PriceError(f"{p}: {'is a directory, not a price file' if p.is_dir() else 'does not exist'}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8-sig"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PriceError(f"{p}: not YAML or JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not data:
        raise PriceError(f"{p}: expected a mapping of instance types to $/hour, e.g. 'ml.g5.xlarge: 1.41'")
    catalog = catalog or Catalog.builtin()
    spot_ratio = _spot_ratio(catalog)
    prices: dict[str, tuple[float, float]] = {}
    named: dict[str, str] = {}  # catalog name -> the file's name for it
    for name, value in data.items():
        where = f"{p}: {name}"
        if name == "local":
            raise PriceError(f"{where}: this machine is priced by the spec (spec.capacity.localPricePerHour)")
        if not isinstance(name, str) or name not in catalog:
            known = ", ".join(n for n in catalog.names() if n != "local")
            raise PriceError(f"{where}: unknown instance type; known: {known} (each also as ml.NAME)")
        key = Catalog.canonical(name)
        if key in named:
            raise PriceError(f"{where}: prices the same hardware as {named[key]} (ml.NAME and NAME are one type "
                             "in a run): give one of them")
        named[key] = name
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(PRICE_KEYS))
            if unknown or "onDemand" not in value:
                raise PriceError(f"{where}: {'unknown key ' + repr(unknown[0]) if unknown else 'onDemand is missing'}"
                                 f"; allowed keys: {', '.join(PRICE_KEYS)} (onDemand required)")
            on_demand = _dollars(value["onDemand"], f"{where}.onDemand")
            spot = _dollars(value["spot"], f"{where}.spot") if "spot" in value else on_demand * spot_ratio
            if spot > on_demand:  # a spot-first placement would then pay more for capacity that can be taken away
                raise PriceError(f"{where}.spot: ${spot:g}/h is above onDemand ${on_demand:g}/h; spot capacity "
                                 "never costs more than on-demand (AWS caps it there): check the numbers")
        else:
            on_demand = _dollars(value, where)
            spot = on_demand * spot_ratio
        prices[name] = (on_demand, round(spot, 6))
    return prices


def _dollars(value, where: str) -> float:
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9.]+[eE][+-]?[0-9]+\s*", value):
        value = float(value)  # YAML 1.1 reads 2e0 as a string (a float needs its dot there); JSON's number
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PriceError(f"{where}: must be a finite number of $/hour >= 0, got {json.dumps(value, default=str)}")
    return float(value)


def _spot_ratio(catalog: Catalog) -> float:
    """The catalog's spot price over on-demand (one fraction for every type in the shipped data)."""
    priced = [t for t in catalog.types() if t.on_demand > 0]
    return priced[0].spot / priced[0].on_demand if priced else 1.0


def sagemaker_pricing(spec, prices: dict | None = None) -> list[str]:
    """SageMaker's `ml.*` names are priced as the EC2 type they run on (the catalog holds EC2 on-demand prices);
    SageMaker bills them at its own, higher rates, so the cost figures are a lower bound, and the report says so
    (of the types `--prices` does not price)."""
    from fleetserve.capacity.catalog import Catalog

    catalog = Catalog.builtin()
    named = set(spec.placement.instance_types) | set(strings_in(spec.placement.node_affinity))
    sagemaker = sorted(n for n in named if n.startswith("ml.") and n in catalog
                       and catalog.canonical(n) not in {catalog.canonical(p) for p in prices or ()})
    if not sagemaker:
        return []
    spot = "spot" in spec.capacity.capacity_types

    def rates(n: str) -> str:  # what the figures used: the spot rate too where the fleet may run on spot
        t = catalog.get(n)
        return f"{catalog.canonical(n)}'s ${t.on_demand:.2f}/h on demand" + (f", ${t.price('spot'):.2f}/h spot"
                                                                              if spot else "")

    priced = ", ".join(f"{n} at {rates(n)}" for n in sagemaker)
    return [f"SageMaker instance types are priced at EC2 rates ({priced}): SageMaker bills ml.* instances "
            "at its own, higher rates (a 15-20 % premium is reported for ml.p5), so cost figures are a lower bound "
            "(--prices FILE gives your own rates)"]


def strings_in(tree) -> list[str]:
    """Every string in a nested dict/list (a node affinity's values, wherever its terms put them)."""
    if isinstance(tree, str):
        return [tree]
    items = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, list) else ()
    return [s for item in items for s in strings_in(item)]
