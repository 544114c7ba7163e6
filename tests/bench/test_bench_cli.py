import json

from tests.helpers import fleetserve


def test_scale_from_zero_bench_prints_figures_and_loses_nothing():
    result = fleetserve("bench", "scale-from-zero", "--requests", "4", "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["requests"] == 4 and figures["lost"] == 0
    assert figures["cold_start_s"] > 0 and figures["first_response_s"] > 0
    assert figures["ratio"]["first_response_cold_vs_warm"] > 0
