"""`--prices FILE`: a team's own $/hour over the catalog's list prices, refused naming the entry when unusable."""

import json
from pathlib import Path

import pytest

from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.prices import PriceError, load_prices
from tests.helpers import fleetserve

EXAMPLES = Path(__file__).parents[2] / "examples"
TRACE = str(Path(__file__).parents[1] / "data" / "azure_code_sample.csv")


def test_a_price_file_sets_on_demand_and_spot_by_either_name(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text("ml.g5.xlarge: 1.41\ng6e.xlarge: {onDemand: 1.5, spot: 0.7}\n")
    prices = load_prices(path)
    ratio = Catalog.builtin().get("g5.xlarge").spot / Catalog.builtin().get("g5.xlarge").on_demand
    assert prices == {"ml.g5.xlarge": (1.41, round(1.41 * ratio, 6)), "g6e.xlarge": (1.5, 0.7)}
    priced = Catalog.builtin().with_prices(prices)
    assert priced.get("ml.g5.xlarge").on_demand == priced.get("g5.xlarge").on_demand == 1.41
    assert priced.get("g6e.xlarge").price("spot") == 0.7
    assert priced.get("p5.48xlarge").on_demand == Catalog.builtin().get("p5.48xlarge").on_demand
    as_json = tmp_path / "prices.json"
    as_json.write_text(json.dumps({"g5.xlarge": 2}))
    assert load_prices(as_json) == {"g5.xlarge": (2.0, round(2 * ratio, 6))}
    exponent = tmp_path / "exponent.yaml"  # YAML 1.1 reads 2e0 as a string (its floats need a dot)
    exponent.write_text("g5.xlarge: 2e0\n")
    assert load_prices(exponent) == {"g5.xlarge": (2.0, round(2 * ratio, 6))}


@pytest.mark.parametrize(("text", "says"), [
    ("ml.zz.9: 1\n", "ml.zz.9: unknown instance type; known: g5.12xlarge"),
    ("g5.xlarge: -1\n", "g5.xlarge: must be a finite number of $/hour >= 0, got -1"),
    ("g5.xlarge: .nan\n", "g5.xlarge: must be a finite number of $/hour >= 0, got NaN"),
    ("g5.xlarge: '4'\n", 'got "4"'),
    ("g5.xlarge: true\n", "got true"),
    ("g5.xlarge: {spot: 1}\n", "g5.xlarge: onDemand is missing; allowed keys: onDemand, spot"),
    ("g5.xlarge: {onDemand: 1, spto: 1}\n", "g5.xlarge: unknown key 'spto'; allowed keys: onDemand, spot"),
    ("ml.g5.xlarge: 1\ng5.xlarge: 2\n", "g5.xlarge: prices the same hardware as ml.g5.xlarge"),
    ("local: 3\n", "local: this machine is priced by the spec (spec.capacity.localPricePerHour)"),
    ("g6e.xlarge: {onDemand: 1.5, spot: 2.0}\n", "g6e.xlarge.spot: $2/h is above onDemand $1.5/h"),
    ("- 1\n- 2\n", "expected a mapping of instance types to $/hour"),
    ("", "expected a mapping"),
    ("a: [\n", "not YAML or JSON"),
])
def test_a_price_file_that_cannot_be_used_names_the_entry(tmp_path, text, says):
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(PriceError, match=None) as caught:
        load_prices(path)
    assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value), str(caught.value)


def test_simulate_verify_and_plan_cost_with_the_given_prices(tmp_path):
    """HyperPod's ml.g5.8xlarge was billed at EC2's list price with a warning that the cost is a lower bound and
    no way to give SageMaker's rate."""
    spec = str(EXAMPLES / "hyperpod.yaml")
    listed = fleetserve("simulate", spec, "--trace", TRACE, "--limit", "100", "--json")
    assert listed.returncode == 0 and "lower bound (--prices FILE gives your own rates)" in listed.stderr
    base = json.loads(listed.stdout)
    rate = Catalog.builtin().get("g5.8xlarge").on_demand
    prices = tmp_path / "sagemaker.yaml"
    prices.write_text(f"ml.g5.8xlarge: {rate * 2}\n")
    own = fleetserve("simulate", spec, "--trace", TRACE, "--limit", "100", "--json", "--prices", str(prices))
    assert own.returncode == 0 and "lower bound" not in own.stderr
    priced = json.loads(own.stdout)
    assert priced["gpu_hours"] == base["gpu_hours"] and priced["cost_usd"] == pytest.approx(2 * base["cost_usd"],
                                                                                           rel=1e-3)
    assert priced["prices"] == {"ml.g5.8xlarge": {"on_demand": rate * 2, "spot": pytest.approx(rate * 2 * 0.4)}}
    assert base["prices"] is None
    verified = fleetserve("verify", spec, "--trace", TRACE, "--limit", "100", "--json", "--prices", str(prices))
    assert json.loads(verified.stdout)["report"]["cost_usd"] == priced["cost_usd"]
    planned = fleetserve("plan", spec, "--trace", TRACE, "--limit", "100", "--json", "--max-trials", "4",
                         "-o", str(tmp_path / "p.yaml"), "--prices", str(prices))
    assert planned.returncode in (0, 1) and json.loads(planned.stdout)["prices"] == priced["prices"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("g5.8xlarge: -2\n")
    refused = fleetserve("verify", spec, "--trace", TRACE, "--limit", "100", "--prices", str(bad))
    assert refused.returncode == 2 and "--prices" in refused.stderr and "got -2" in refused.stderr
    other = tmp_path / "other.yaml"  # prices none of the spec's types: echoed as if used, with no word
    other.write_text("g6e.xlarge: 1\n")
    unused = fleetserve("simulate", spec, "--trace", TRACE, "--limit", "20", "--json", "--prices", str(other))
    assert unused.returncode == 0 and "prices none of the spec's instance types (g5.8xlarge)" in unused.stderr
