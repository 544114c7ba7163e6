"""`fleetserve status --watch`: a live table from the state files, tested without a terminal."""

from __future__ import annotations

import io
import os

from rich.console import Console
from typer.testing import CliRunner

from fleetserve.cli.app import app
from fleetserve.cli.status_view import render, watch
from fleetserve.fleet.state import FleetState, NodeState, ReplicaState, process_start, write_state


def fleet(name="demo", ready=2, status="ready") -> FleetState:
    return FleetState(name=name, namespace="team-a", model="tiny", spec_path="x.yaml", supervisor_pid=os.getpid(),
                      supervisor_start=process_start(os.getpid()),  # this process stands for a live supervisor
                      status=status, url="http://127.0.0.1:8000/v1", strategy="prefixaware", desired=3, ready=ready,
                      cost_per_hour=1.234, cost_total=0.5,
                      last_decision={"desired": 3, "reason": "concurrency 9.0 > target 4"},
                      replicas=[ReplicaState("r0", "http://127.0.0.1:9001", 11, "ready", node="n0",
                                             instance_type="g5.xlarge", cold_start_s=12.5),
                                ReplicaState("r1", "http://127.0.0.1:9002", 12, "starting", restarts=1)],
                      nodes=[NodeState("n0", "g5.xlarge", "spot", 1.234, 4, 2, True)])


def text_of(renderable) -> str:
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def test_render_is_one_table_of_fleets_and_replicas():
    text = text_of(render([fleet(), fleet("other", ready=0, status="starting")], now=0, interval=2))
    for fragment in ("demo", "other", "3/2", "3/0", "1.234", "r0", "r1", "g5.xlarge", "12.5s", "starting",
                     "concurrency 9.0 > target 4", "every 2s; Ctrl-C to stop"):
        assert fragment in text, fragment
    assert "no fleets" in text_of(render([]))


def test_watch_redraws_from_the_loader_each_interval():
    calls, sleeps = [], []

    def loader(name):
        calls.append(name)
        return [fleet(ready=len(calls))]

    console = Console(file=io.StringIO(), width=160, color_system=None, force_terminal=False)
    assert watch("demo", 0.5, 3, console, loader=loader, sleep=sleeps.append) == 3
    assert calls == ["demo"] * 4 and sleeps == [0.5, 0.5]  # first frame + 3 redraws, no sleep after the last
    assert "3/4" in console.file.getvalue()  # the last frame: the loader's fourth answer


def test_cli_status_watch_iterations_reads_the_state_file(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    write_state(fleet())
    result = CliRunner().invoke(app, ["status", "--watch", "--iterations", "2", "--interval", "0.1"])
    assert result.exit_code == 0, result.output
    assert "demo" in result.output and "r1" in result.output and "prefixaware" in result.output
    bad = CliRunner().invoke(app, ["status", "--watch", "--interval", "0"])
    assert bad.exit_code == 2
    both = CliRunner().invoke(app, ["status", "--watch", "--json", "--iterations", "1"])  # --json was dropped
    assert both.exit_code == 2 and "--watch/--json" in both.output
    pruned = CliRunner().invoke(app, ["status", "--watch", "--prune", "--iterations", "1"])  # had pruned, exit 0
    assert pruned.exit_code == 2 and "--watch/--prune" in pruned.output
    unknown = CliRunner().invoke(app, ["status", "--watch", "nosuch", "--iterations", "1"])  # "no fleets", exit 0
    assert unknown.exit_code == 2 and "no fleet named 'nosuch' (known: demo)" in unknown.output
    named = CliRunner().invoke(app, ["status", "--watch", "demo", "--iterations", "1", "--interval", "0.1"])
    assert named.exit_code == 0 and "r1" in named.output


def test_a_ready_fleet_without_a_serving_replica_says_so(tmp_path, monkeypatch):
    """`status` read "ready" for a fleet that could not place a replica: nothing served, only the error line hinted."""
    from fleetserve.fleet.state import serving_note

    assert serving_note(fleet(ready=3)) == "" and serving_note(fleet(ready=0, status="starting")) == ""
    assert serving_note(fleet(ready=2)) == "2 of 3 replicas serving"
    placed_none = fleet(ready=0)
    placed_none.error = "cannot place a replica: no offering fits"
    assert serving_note(placed_none) == "no replica serving; see error"
    asleep = fleet(ready=0)
    asleep.desired = 0
    assert serving_note(asleep) == "scaled to zero: the next request wakes it"
    waking = fleet(ready=0)  # a burst woke it: "no replica serving" read as stuck
    waking.last_decision = {"desired": 3, "reason": "activated from zero: 16 request(s) held by the router"}
    assert serving_note(waking) == "waking from zero: requests are held until a replica is ready"
    waking.error = "every replica slot of this machine is taken (2 of capacity.localSlots = 2)"  # the third's
    assert serving_note(waking) == "waking from zero: requests are held until a replica is ready; see error"
    # a poll shorter than the cold start replaced the decision that woke it: the replica on its way still says so
    polled = fleet(ready=0)
    polled.last_decision = {"desired": 1, "reason": "steady at 1: concurrency=1 (target 1/replica)"}
    assert serving_note(polled) == "a replica is starting: requests are held until one is ready"
    polled.replicas = [ReplicaState("r0", "http://127.0.0.1:9001", 11, "restarting")]
    assert serving_note(polled) == "no replica serving"
    assert "ready: no replica serving; see error" in text_of(render([placed_none], now=0))
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    write_state(placed_none)
    shown = CliRunner().invoke(app, ["status"])
    assert shown.exit_code == 0 and "ready (no replica serving; see error)" in shown.output, shown.output
    as_json = CliRunner().invoke(app, ["status", "--json"])
    assert '"serving": "no replica serving; see error"' in as_json.output


def test_a_replica_the_router_has_out_says_so_in_both_views(tmp_path, monkeypatch):
    stalled = fleet(ready=1)
    stalled.replicas[0].router_healthy = False
    assert "ready (router: out)" in text_of(render([stalled], now=0))
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    write_state(stalled)
    shown = CliRunner().invoke(app, ["status"])
    assert "(router:" in shown.output and "failing" in shown.output, shown.output  # the table may wrap the cell


def test_a_detached_start_says_when_the_l2_redis_does_not_answer(capsys):
    """`up --detach` printed "ready" alone: the warning was in the supervisor's log only."""
    from dataclasses import replace

    from fleetserve.cli.app import _startup_warnings

    _startup_warnings(replace(fleet(), l2_url="redis://127.0.0.1:16399/0", l2_status="up"))
    assert capsys.readouterr().err == ""
    _startup_warnings(replace(fleet(), l2_url="redis://127.0.0.1:16399/0", l2_status="unreachable (ConnectionError)"))
    assert "L2 Redis at redis://127.0.0.1:16399/0 is unreachable (ConnectionError)" in capsys.readouterr().err


def test_the_watch_shows_the_alerts_firing():
    """`status` listed a critical burn-rate alert; the live table of `status --watch` showed "ready 2/2" alone."""
    firing = fleet()
    firing.alerts = ["FleetserveErrorBudgetBurnFast (critical)"]
    assert "demo: alerts firing: FleetserveErrorBudgetBurnFast (critical)" in text_of(render([firing], now=0))
    firing.status = "stopped"  # its Prometheus is gone with it: nothing fires
    assert "alerts firing" not in text_of(render([firing], now=0))
