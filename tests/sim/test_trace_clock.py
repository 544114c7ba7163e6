"""The simulator's wall clock is the trace's own where the trace has one (Azure stamps): cron floors and
budgets then act at the hours the traffic really came. Before, every trace started on Monday 10:00 UTC."""

import json
from pathlib import Path

from fleetserve.traces.load import load_trace, wall_start
from tests.helpers import fleetserve

DATA = Path(__file__).parents[1] / "data"
AZURE = DATA / "azure_code_sample.csv"  # starts 2023-11-16 18:17:03 UTC

SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: evening}
spec:
  model: {source: builtin:smollm2-135m}
  replicas: 0
  autoscaling:
    minReplicaCount: 0
    maxReplicaCount: 3
    triggers: [{metric: concurrency, target: 50, activationTarget: 0}]
    schedules: [{name: evening, timezone: UTC, start: "0 18 * * *", end: "0 19 * * *", minReplicas: 3}]
"""


def _simulate(tmp_path, *extra, env: dict | None = None):
    spec = tmp_path / "evening.yaml"
    spec.write_text(SPEC)
    result = fleetserve("simulate", str(spec), "--trace", str(AZURE), "--json", *extra, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_an_azure_trace_keeps_its_own_clock_for_cron_floors(tmp_path):
    own = _simulate(tmp_path)
    assert own["start"].startswith("2023-11-16T18:17:03")
    assert own["replicas_max"] == 3  # the 18:00-19:00 floor holds while the trace runs
    monday = _simulate(tmp_path, "--start", "2026-01-05T10:00:00+00:00")
    assert monday["start"] == "2026-01-05T10:00:00+00:00" and monday["replicas_max"] < 3


def test_a_start_without_an_offset_is_utc_on_any_machine(tmp_path):
    """It was read in the machine's own zone: the same command gave $3.62 under TZ=UTC and $2.66 in Seoul."""
    seoul = _simulate(tmp_path, "--start", "2026-01-05T18:10:00", env={"TZ": "Asia/Seoul"})
    assert seoul["start"] == "2026-01-05T18:10:00+00:00" and seoul["replicas_max"] == 3  # inside 18:00-19:00 UTC


def test_a_trace_without_wall_times_starts_on_the_documented_monday():
    assert wall_start(DATA / "mooncake_sample.jsonl") is None
    assert wall_start(AZURE).isoformat().startswith("2023-11-16T18:17:03")


def test_trace_scale_keeps_the_wall_start(tmp_path):
    out = tmp_path / "double.csv"
    assert fleetserve("trace", "scale", str(AZURE), "--time", "2", "-o", str(out)).returncode == 0
    assert wall_start(out) == wall_start(AZURE)
    assert load_trace(out)[-1].arrival_s == 2 * load_trace(AZURE)[-1].arrival_s
