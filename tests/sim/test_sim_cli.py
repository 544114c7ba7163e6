"""`fleetserve simulate | verify | plan | bench sim-speed` as a user runs them: outputs, files, exit codes."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fleetserve.spec import load_spec
from tests.helpers import fleetserve
from tests.sim.conftest import AZURE

EXAMPLES = Path(__file__).parents[2] / "examples"
TRACE = str(AZURE)
REPORT_KEYS = {"requests", "ttft_ms", "e2e_ms", "slo_attainment", "gpu_hours", "cost_usd", "hit_rate", "replicas_max",
               "peak", "idle"}


def test_simulate_json_and_a_self_contained_html_report(tmp_path):
    html = tmp_path / "report.html"
    r = fleetserve("simulate", str(EXAMPLES / "simulated-cloud.yaml"), "--trace", TRACE, "--limit", "800", "--json",
                   "--report", str(html))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert REPORT_KEYS <= set(report)
    for window in ("peak", "idle"):
        assert {"requests", "ttft_ms", "e2e_ms", "slo_attainment", "gpu_hours", "cost_usd"} <= set(report[window])
    assert set(report["ttft_ms"]) == {"p50", "p95", "p99"} and {"engine", "l1", "l2"} <= set(report["hit_rate"])
    page = html.read_text()
    assert "<svg" in page and "<script" not in page and "src=\"http" not in page and "href=\"http" not in page
    again = tmp_path / "again.html"  # the same seed gives the same page, byte for byte (diffable reports)
    r = fleetserve("simulate", str(EXAMPLES / "simulated-cloud.yaml"), "--trace", TRACE, "--limit", "800",
                   "--report", str(again))
    assert r.returncode == 0, r.stderr
    assert again.read_text() == page


def test_verify_fails_with_reasons_and_prints_the_default_slo(tmp_path):
    page = tmp_path / "verify.html"
    r = fleetserve("verify", str(EXAMPLES / "hyperpod.yaml"), "--trace", TRACE, "--limit", "1500",
                   "--report", str(page))
    assert r.returncode == 1, r.stderr
    assert "FAIL" in r.stdout and "SLO (defaults)" in r.stdout and "maxReplicaCount=4" in r.stdout
    assert "e+0" not in r.stdout and "30000" in r.stdout  # the table's figures as the reasons write them (3e+04)
    html = page.read_text()  # the verdict and its reasons above the plots
    assert "<h2>verify: FAIL</h2>" in html and "maxReplicaCount=4" in html and "<svg" in html
    assert "4096-token context length" in r.stdout and "warning:" in r.stderr  # its --max-model-len 4096
    longer = tmp_path / "hyperpod-8k.yaml"
    longer.write_text((EXAMPLES / "hyperpod.yaml").read_text().replace("4096", "8192"))
    r = fleetserve("verify", str(longer), "--trace", TRACE, "--limit", "300", "--json",
                   "--ttft-p95-ms", "900000", "--e2e-p95-ms", "900000")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["passed"] and out["slo"]["source"] == "defaults+flags", r.stdout[-500:]
    r = fleetserve("verify", str(EXAMPLES / "hyperpod.yaml"), "--trace", TRACE, "--limit", "300", "--json")
    json.loads(r.stdout)  # the warnings go to stderr with --json too: stdout stays JSON
    assert "need more than the 4096-token context length" in r.stderr


def test_bad_input_exits_2_naming_the_parameter(tmp_path):
    r = fleetserve("verify", str(EXAMPLES / "hyperpod.yaml"), "--trace", str(tmp_path / "missing.csv"))
    assert r.returncode == 2 and "--trace" in r.stderr
    r = fleetserve("simulate", str(EXAMPLES / "hyperpod.yaml"), "--trace", TRACE, "--knowledge", "psychic")
    assert r.returncode == 2 and "--knowledge" in r.stderr and "blind, informed" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: x}\nspec:\n  model: {source: a}\n"
                   "  slo: {ttftP95Ms: -1}\n")
    r = fleetserve("verify", str(bad), "--trace", TRACE)
    assert r.returncode == 2 and "slo.ttftP95Ms" in r.stderr
    # cloud flags on a spec they cannot change: said, not silently ignored
    r = fleetserve("simulate", str(EXAMPLES / "hyperpod.yaml"), "--trace", TRACE, "--limit", "20",
                   "--spot-interruption-rate", "5")
    assert r.returncode == 0 and "--spot-interruption-rate has no effect" in r.stderr and "on-demand" in r.stderr
    assert r.stderr.count("--spot-interruption-rate has no effect") == 1  # once, with the report's warnings
    r = fleetserve("verify", str(EXAMPLES / "hyperpod.yaml"), "--trace", TRACE, "--limit", "20",
                   "--spot-interruption-rate", "5", "--json")  # in the JSON too: a CI reads only that
    assert any("--spot-interruption-rate has no effect" in w for w in json.loads(r.stdout)["report"]["warnings"]), \
        r.stdout
    # a negative seed was blamed on --rate-scale (numpy refused it while scaling) or taken silently
    r = fleetserve("simulate", str(EXAMPLES / "hyperpod.yaml"), "--trace", TRACE, "--seed", "-3", "--rate-scale", "2")
    assert r.returncode == 2 and "--seed" in r.stderr and "--rate-scale" not in r.stderr
    r = fleetserve("trace", "scale", TRACE, "-o", str(tmp_path / "x.csv"), "--rate", "2", "--seed", "-5")
    assert r.returncode == 2 and "--seed" in r.stderr and "--rate" not in r.stderr.replace("--rate-", "")


def test_plan_writes_a_spec_that_loads_and_explains_the_changes(tmp_path):
    out = tmp_path / "planned.yaml"
    r = fleetserve("plan", str(EXAMPLES / "hyperpod.yaml"), "--trace", TRACE, "--limit", "600", "-o", str(out),
                   "--json", "--max-trials", "16", "--ttft-p95-ms", "10000", "--e2e-p95-ms", "60000")
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert {"cost_usd", "baseline_cost_usd", "verified", "changes", "warnings"} <= set(data) and data["verified"]
    assert {"cold_start_s", "chosen"} <= set(data["floors"])
    # every change of the winner is explained, beyond the SLO flags the command wrote into it
    assert all(c.get("why") for c in data["changes"]), data["changes"]
    changed = {c["path"]: c["why"] for c in data["changes"]}
    assert {"spec.placement.instanceTypes", "spec.replicas"} <= set(changed)
    assert "ml.g5.8xlarge x" in changed["spec.placement.instanceTypes"]  # the input's type, with its cost
    assert "--max-trials" in changed["spec.replicas"] or "fails (" in changed["spec.replicas"]
    assert load_spec(out).endpoint.spec.placement.instance_types
    # a HyperPod input gets a fleetserve Endpoint back: said, in the warnings and in the file (endpointName and
    # the S3 certificate output had gone without a word)
    said = [w for w in data["warnings"] if w.startswith("the planned spec is a fleetserve.io/v1 Endpoint")]
    assert len(said) == 1 and f"# {said[0]}" in out.read_text()
    # the conditions it was verified under travel with it: the command is in the JSON and the file's header
    import shlex

    command = data["verify_command"]
    assert command.endswith("--limit 600") and command.startswith(f"fleetserve verify {out} --trace {TRACE}")
    # the file's own line names its files absolutely: it is read, and run, from anywhere
    header = out.read_text().splitlines()[1].removeprefix("# verified as: ")
    assert header.endswith("--limit 600") and f"verify {out.resolve()} --trace {Path(TRACE).resolve()}" in header
    again = fleetserve(*shlex.split(header)[1:])
    assert again.returncode == 0, again.stdout[-2000:]


def test_a_plan_cut_short_says_so_beside_its_winner(tmp_path):
    """With --max-trials 2 the winner is the input as written: the text said "static peak-sized fleet: $0.00" for a
    static fleet never tried, and "no change: the input ... is the cheapest" without the search having been cut."""
    spec, out = tmp_path / "in.yaml", tmp_path / "planned.yaml"
    spec.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: cut}\nspec:\n"
                    "  model: {name: llama-8b, source: 'catalog:llama-3.1-8b-instruct', contextLength: 16384}\n"
                    "  engine: {kind: vllm}\n  placement: {instanceTypes: [g6e.xlarge]}\n"
                    "  capacity: {provider: simulated}\n"
                    "  autoscaling: {minReplicaCount: 1, maxReplicaCount: 4, triggers: [{metric: concurrency, "
                    "target: 4}]}\n  slo: {ttftP95Ms: 100000, e2eP95Ms: 300000}\n")
    r = fleetserve("plan", str(spec), "--trace", TRACE, "--limit", "300", "-o", str(out), "--max-trials", "2")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    text = " ".join(r.stdout.split())
    # one static fleet ran before the cut: that is not "none passed" (a passing static fleet may lie beyond it)
    assert "static peak-sized fleet: not found before the search was cut short" in text and "$0.00)" not in text
    assert "search cut short: --max-trials (2) ended the search" in text
    # off a terminal each trial is a line on stderr (a long search had been minutes of silence in CI)
    trials = [line for line in r.stderr.splitlines() if line.startswith("planning: trial ")]
    assert [t.split(":")[1] for t in trials] == [" trial 1 (at most 2)", " trial 2 (at most 2)"], r.stderr
    assert trials[0].endswith("input static at max replicas"), trials


def test_bench_sim_speed_reports_requests_per_second():
    r = fleetserve("bench", "sim-speed", "--json", "--rate", "2", "--limit", "500", "--trace", TRACE)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["requests_per_s"] > 0 and data["requests"] >= 900


def test_bench_sim_speed_names_the_rate_when_the_rate_is_what_cannot_run():
    """Past the 5,000,000-request cap it was a traceback; scaled to nothing it named --trace."""
    too_many = fleetserve("bench", "sim-speed", "--rate", "100000", "--limit", "500", "--trace", TRACE)
    assert too_many.returncode == 2 and "--rate" in too_many.stderr and "at most 5,000,000" in too_many.stderr
    none = fleetserve("bench", "sim-speed", "--rate", "0.001", "--limit", "100", "--trace", TRACE)
    assert none.returncode == 2 and "--rate" in none.stderr and "leaves none" in none.stderr


def test_same_seed_same_numbers_across_processes_and_hash_seeds():
    """In separate processes with different string-hash seeds: one seed, one result; another seed, another
    draw (spot interruptions and overhead draws use the seed, so the comparison is not of a run without chance)."""
    from tests.sim.conftest import MOONCAKE

    runs = {"informed": ("simulate", str(EXAMPLES / "hyperpod.yaml"), "--trace", str(MOONCAKE), "--limit", "300",
                         "--json", "--knowledge", "informed"),
            "spot": ("simulate", str(EXAMPLES / "simulated-cloud.yaml"), "--trace", TRACE, "--limit", "800",
                     "--json", "--spot-interruption-rate", "20")}
    for name, args in runs.items():
        first = fleetserve(*args, "--seed", "7", env={"PYTHONHASHSEED": "1"})
        second = fleetserve(*args, "--seed", "7", env={"PYTHONHASHSEED": "2"})
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout) == json.loads(second.stdout), name
    spot = json.loads(first.stdout)
    other = json.loads(fleetserve(*runs["spot"], "--seed", "8").stdout)
    assert spot["disruptions"]["spot_notices"] > 0
    assert (other["disruptions"], other["cost_usd"]) != (spot["disruptions"], spot["cost_usd"])


def test_inputs_that_used_to_crash_are_exit_2_and_outputs_never_lost(tmp_path):
    """Found by a black-box pass over the simulator's commands: each of these was a traceback (exit 1, what
    `verify` says for a failed SLO), a hang, or a finished run whose result could not be written."""
    cloud = str(EXAMPLES / "simulated-cloud.yaml")
    for flag, value in (("--rate-scale", "inf"), ("--window", "inf"), ("--provisioning-delay", "inf"),
                        ("--ttft-p95-ms", "inf"), ("--rate-scale", "0.001")):
        r = fleetserve("verify", cloud, "--trace", TRACE, "--limit", "20", flag, value)
        assert r.returncode == 2 and flag in r.stderr and "Traceback" not in r.stderr, (flag, value, r.stderr)
    hyperpod = tmp_path / "zz.yaml"
    hyperpod.write_text((EXAMPLES / "hyperpod.yaml").read_text().replace("ml.g5.8xlarge", "ml.zz.8xlarge"))
    r = fleetserve("verify", str(hyperpod), "--trace", TRACE, "--limit", "20")
    assert r.returncode == 2 and "spec.instanceType: 'ml.zz.8xlarge'" in r.stderr, r.stderr  # its own field
    assert "Traceback" not in r.stderr
    r = fleetserve("plan", cloud, "--trace", TRACE, "--limit", "20", "-o", str(tmp_path))
    said = re.sub(r"[\s│╭╮╰╯─]+", " ", r.stderr)  # typer's error box wraps long paths
    assert r.returncode == 2 and "is a directory" in said  # refused before the search, not after it
    r = fleetserve("plan", cloud, "--trace", TRACE, "--limit", "20", "-o", "")  # it said " is a directory"
    assert r.returncode == 2 and "an empty file name" in re.sub(r"[\s│╭╮╰╯─]+", " ", r.stderr)
    report = tmp_path / "new" / "folder" / "r.html"
    r = fleetserve("simulate", cloud, "--trace", TRACE, "--limit", "20", "--json", "--report", str(report))
    assert r.returncode == 0 and report.is_file() and json.loads(r.stdout)["requests"] == 20


def test_the_documented_slo_fields_load_and_limits_must_be_finite(tmp_path):
    spec = tmp_path / "slo.yaml"
    base = (EXAMPLES / "simulated-cloud.yaml").read_text().rstrip() + "\n"
    spec.write_text(base + "  slo: {ttftP95Ms: 1500, e2eP95Ms: 20000, costPerHourUsd: 10}\n")  # as docs/simulator.md
    assert load_spec(spec).endpoint.spec.slo.e2e_p95_ms == 20000
    spec.write_text(base + "  slo: {ttftP95Ms: .inf}\n")
    r = fleetserve("validate", str(spec))
    assert r.returncode == 2 and "spec.slo.ttftP95Ms" in r.stderr and "finite" in r.stderr


def test_report_shading_joins_windows_into_as_few_spans_as_a_plot_shows():
    """A day of 1 s windows shaded every window: 103 s and a 20 MB report for two requests."""
    from fleetserve.sim.html import shaded_spans

    assert shaded_spans([(0, 1), (1, 2), (5, 6), (2, 3)]) == [(0, 3), (5, 6)]  # touching windows join
    alternating = [(2 * i, 2 * i + 1) for i in range(10_000)]
    spans = shaded_spans(alternating, most=400)
    assert len(spans) <= 400 and spans[0][0] == 0 and spans[-1][1] == 19_999
    assert shaded_spans([]) == []


def test_the_html_report_shows_gaps_failures_the_worst_window_and_the_budgeted_cost():
    """The TTFT line was drawn across empty minutes, failures were not shown, the hit rate averaged per-request
    ratios (a 10-token hit weighed as a 10,000-token one) and the peak's $/h was not the one verify checks."""
    import math

    from fleetserve.sim.html import _per_minute, render_html
    from fleetserve.sim.run import simulate
    from fleetserve.sim.setup import SimOptions
    from fleetserve.traces.model import TraceRequest
    from tests.sim.test_verify_causes import cold_bursts_between_a_warm_peak, gpu_endpoint

    too_long = [TraceRequest(100.5 + i, 140_000, 10, (90_000 + i,)) for i in range(5)]  # over Llama's 131,072
    trace = sorted(cold_bursts_between_a_warm_peak() + too_long, key=lambda r: r.arrival_s)
    result = simulate(gpu_endpoint(), trace, SimOptions(), {"ttft_p95_ms": 20000, "e2e_p95_ms": 120000})
    fleet, report = result.fleet, result.report
    minute = _per_minute(fleet)
    assert math.isnan(minute["ttft_p95"][15]) and not math.isnan(minute["ttft_p95"][5])  # 900-960 s: no arrivals
    assert int(minute["failed"].sum()) == report["failed"] == 5 and minute["failed"][1] == 5
    assert int(minute["answered"].sum()) == report["requests"] - 5
    first = [(r.first - r.arrival) * 1000 for r in fleet.requests
             if r.error is None and r.first is not None and r.arrival - fleet.t0 < 60]
    assert abs(minute["ttft_p95"][0] - np.percentile(first, 95)) < 1e-9
    answered = [r for r in fleet.requests if r.error is None and r.done is not None and r.arrival - fleet.t0 < 60]
    share = sum(r.cached for r in answered) / sum(r.spec.prompt for r in answered)
    assert abs(minute["hit"][0] - share) < 1e-9
    page = render_html(fleet, report, "t")
    assert "most misses 1800-2100 s (idle)" in page and "Requests per minute (5 refused or failed" in page
    assert f"${report['cost_per_hour_max_usd']:.2f}/hour" in page
    # the warnings are on the page, not only inside the collapsed JSON (the 5 refusals for the context length)
    assert report["warnings"] and "<h2>Warnings</h2>" in page and "context length" in page.split("<details>")[0]


def test_every_chart_of_the_report_shares_the_runs_time_axis():
    """An all-failed run drew latency and requests over 0-4 min and replicas and cost over 0-14 min."""
    import matplotlib.pyplot as plt

    from fleetserve.sim import html as page
    from fleetserve.sim.run import simulate
    from fleetserve.sim.setup import SimOptions
    from tests.sim.test_verify_causes import cold_bursts_between_a_warm_peak, gpu_endpoint

    result = simulate(gpu_endpoint(), cold_bursts_between_a_warm_peak(), SimOptions(), {})
    limits, places, svg = [], [], page._svg
    page._svg = lambda fig, prefix: (limits.extend(ax.get_xlim() for ax in fig.axes),
                                     places.extend((ax.get_position().x0, ax.get_position().x1) for ax in fig.axes),
                                     svg(fig, prefix))[2]
    try:
        page.render_html(result.fleet, result.report, "t")
    finally:
        page._svg = svg
        plt.close("all")
    assert len(limits) >= 4 and len(set(limits)) == 1 and limits[0][0] == 0
    assert abs(limits[0][1] - result.report["duration_s"] / 60) < 1 / 60 + 1e-9
    # and at the same place on the page: each chart was cropped to its own labels, so the windows did not line up
    assert len(set(places)) == 1
    assert page.time_unit(3600) == (60.0, "minutes") and page.time_unit(86400) == (3600.0, "hours")


def test_a_plan_cut_short_by_max_trials_says_so(tmp_path):
    """Exit 1 read as "no spec can pass" when --max-trials had stopped the search after the baseline."""
    out = tmp_path / "p.yaml"
    r = fleetserve("plan", str(EXAMPLES / "hyperpod.yaml"), "--trace", TRACE, "--limit", "300", "--max-trials", "2",
                   "-o", str(out), "--json")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data["cut_short"].startswith("--max-trials (2) ended the search") and "autoscaling" in data["cut_short"]
    assert data["output"] is None and not out.exists()
    out.write_text("# an earlier run's winner\n")  # it must not pass for this run's
    r = fleetserve("plan", str(EXAMPLES / "hyperpod.yaml"), "--trace", TRACE, "--limit", "300", "--max-trials", "2",
                   "-o", str(out))
    said = " ".join(r.stdout.split())
    assert r.returncode == 1 and "a larger --max-trials may find one" in said
    assert f"nothing written to {out} (the file already there was left as it was: it is not this run's" in said


def test_costs_within_the_ranks_tolerance_tie_and_fewer_replica_hours_win():
    """x8 won over x7 by $0.00003 of drain time; a routing change was made for $0.0004 of $2.50; and rounding to
    significant digits only moved the edge (3.52650001 and 3.52649999 rounded apart)."""
    from types import SimpleNamespace

    from fleetserve.sim.plan import Trial
    from fleetserve.sim.plan_why import _versus
    from fleetserve.sim.ranking import better, compare

    def trial(cost: float, gpu: float, replicas: float, label: str = "t") -> Trial:
        report = {"cost_usd": cost, "gpu_hours": gpu, "replica_hours": replicas}
        return Trial({}, SimpleNamespace(passed=True, result=SimpleNamespace(report=report)), label)

    seven, eight = trial(3.526912, 1.344, 1.176), trial(3.526883, 1.344, 1.344, "x8")
    assert better(seven, eight) and not better(eight, seven)
    assert "the same cost and GPU-hours with 1.344 replica-h" in _versus(seven, eight)
    floors, routing = trial(2.504292, 3.110922, 3.078), trial(2.503932, 3.110475, 3.077)
    assert compare(floors, routing) == (0, 3)  # a tie: the one found first stays
    assert compare(trial(3.52650001, 1, 1), trial(3.52649999, 1, 1)) == (0, 3)
    assert better(trial(3.52, 1.0, 1.0), trial(3.53, 0.5, 0.5))  # a cent in $3.5 is not noise


def test_a_search_that_used_its_last_trial_on_its_last_step_was_not_cut_short():
    """cut_short read `trials >= max_trials`: a search whose last planned simulation used the last of the budget
    said --max-trials had ended it. Now a step must have wanted one more."""
    from fleetserve.sim.plan import Planner
    from fleetserve.sim.setup import SimOptions
    from fleetserve.traces.model import TraceRequest

    planner = Planner(load_spec(str(EXAMPLES / "hyperpod.yaml")).endpoint, [TraceRequest(0.0, 100, 10)],
                      SimOptions(), max_trials=3)
    planner.trials = 3
    assert planner._cut_short() is None  # the budget is used up, but nothing asked for more
    assert not planner._room() and planner._cut_short().startswith("--max-trials (3) ended the search")


def test_a_routing_or_cache_change_must_save_more_than_one_percent():
    """At the search's 0.1 % a p5 fleet's routing was switched for $0.014 of $3.95 that the run's drain made, with
    a worse TTFT: the winner's routing and cache tiers stay unless a change saves more than 1 %."""
    from types import SimpleNamespace

    from fleetserve.sim.plan import Trial
    from fleetserve.sim.ranking import SWITCH_TOLERANCE, better

    def trial(cost: float) -> Trial:
        report = {"cost_usd": cost, "gpu_hours": 1.0, "replica_hours": 1.0}
        return Trial({}, SimpleNamespace(passed=True, result=SimpleNamespace(report=report)), "t")

    kept, switched = trial(3.9457), trial(3.9318)
    assert better(switched, kept) and not better(switched, kept, SWITCH_TOLERANCE)
    assert better(trial(3.85), kept, SWITCH_TOLERANCE)


def test_a_block_size_the_profile_overrides_is_said(tmp_path):
    """kvCache.blockSize 16 gave the same hit rate as 256, without a word: the engines' blocks are the profile's."""
    from fleetserve.sim.run import simulate
    from fleetserve.sim.setup import SimOptions
    from fleetserve.spec import load_spec_text
    from fleetserve.traces.model import TraceRequest

    text = ("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: b}\nspec:\n"
            "  model: {source: builtin:smollm2-135m}\n  replicas: 1\n  kvCache: {blockSize: 16}\n")
    trace = [TraceRequest(i * 1.0, 300, 4, tuple(range(1))) for i in range(3)]
    warnings = simulate(load_spec_text(text).endpoint, trace, SimOptions()).report["warnings"]
    assert any("kvCache.blockSize 16 is not simulated" in w for w in warnings), warnings
    plain = load_spec_text(text.replace("  kvCache: {blockSize: 16}\n", "")).endpoint
    assert not any("blockSize" in w for w in simulate(plain, trace, SimOptions()).report["warnings"])


def test_a_lone_prompt_is_prefilled_whole_on_the_built_in_engines_profiles():
    """The built-in engine chunks a prompt only while others decode; its measured profile was charged a step's
    base per 256-token chunk, and a lone 1,020-token prompt simulated 47 % above the profile's own figure."""
    from dataclasses import replace

    from fleetserve.sim.perf import PerfProfile
    from fleetserve.sim.run import simulate
    from fleetserve.sim.setup import SimOptions
    from fleetserve.spec import load_spec_text
    from fleetserve.traces.model import TraceRequest

    text = ("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: w}\nspec:\n"
            "  model: {source: builtin:smollm2-135m}\n  replicas: 1\n")
    builtin = PerfProfile("measured", 0.002, 0.00001, 0.003, 0.0001, 0.0, cache_blocks=512, block_size=256,
                          max_batch=8, prefill_chunk=256, whole_prefill_when_idle=True)
    trace = [TraceRequest(0.0, 1020, 1, ())]

    def ttft(prof):
        report = simulate(load_spec_text(text).endpoint, trace, SimOptions(profile=prof)).report
        return report["ttft_ms"]["p50"]

    whole, chunked = ttft(builtin), ttft(replace(builtin, whole_prefill_when_idle=False))
    assert abs(whole - builtin.prefill_time(1020) * 1000) < abs(chunked - builtin.prefill_time(1020) * 1000)
    assert chunked - whole == pytest.approx(3 * builtin.prefill_base_s * 1000, rel=0.05)  # three more bases


def test_a_bad_spec_with_json_prints_its_problems_on_stdout_too(tmp_path):
    """`verify --json` on an invalid spec exited 2 with text on stderr and nothing on stdout, where `validate
    --json` gives an object: a CI script parsing verify's stdout got nothing to parse."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: x}\n"
                   "spec: {model: {source: builtin:smollm2-135m}, replicas: two}\n")
    for command in ("simulate", "verify", "plan"):
        extra = ("-o", str(tmp_path / "p.yaml")) if command == "plan" else ()
        r = fleetserve(command, str(bad), "--trace", TRACE, "--json", *extra)
        assert r.returncode == 2, (command, r.stderr)
        said = json.loads(r.stdout)
        assert said["valid"] is False and said["errors"][0]["path"] == "spec.replicas", (command, said)


def test_every_bad_input_with_json_prints_one_errors_object_on_stdout(tmp_path):
    """Only a spec's problems reached stdout: a bad --trace, a flag click refused or a check of the command
    itself printed nothing there, so a CI reading `--json` had nothing to parse for most causes of exit 2."""
    garbage = tmp_path / "bad.csv"
    garbage.write_text("garbage\n")
    spec = str(EXAMPLES / "simulated-cloud.yaml")
    for args, path in (
        (("simulate", spec, "--trace", str(tmp_path / "none.csv")), "--trace"),  # refused while parsing
        (("verify", spec, "--trace", str(garbage)), "--trace"),
        (("simulate", spec, "--trace", TRACE, "--no-such-flag"), "--no-such-flag"),
        (("plan", spec, "--trace", TRACE, "--profile", "no-such-profile", "-o", str(tmp_path / "p.yaml")),
         "--profile"),
        (("analyze", str(garbage)), "FILE"),  # the file's own errors named no path: ""
        (("bench", "routing", "--trace", str(garbage)), "--trace"),
        (("validate", str(tmp_path / "none.yaml")), "SPEC"),
        (("simulate", str(tmp_path), "--trace", TRACE), "SPEC"),
    ):
        r = fleetserve(*args, "--json")
        assert r.returncode == 2, (args, r.stderr)
        said = json.loads(r.stdout)  # one document, whatever refused the input
        assert said["valid"] is False and len(said["errors"]) == 1, (args, said)
        assert path is None or said["errors"][0]["path"] == path, (args, said)
        assert said["errors"][0]["message"] and "Traceback" not in r.stderr, (args, r.stderr)


def test_a_result_whose_file_cannot_be_written_is_printed_and_exits_2(tmp_path):
    """A full disk at the end of a run was a traceback and exit 1 (`verify`'s failed SLO) over a cut-off file that
    had replaced the last good one; a plan's search was lost with it."""
    cloud = str(EXAMPLES / "simulated-cloud.yaml")
    r = fleetserve("verify", cloud, "--trace", TRACE, "--limit", "20", "--json", "--report", "/dev/full")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "error: --report: cannot write /dev/full: No space left on device" in r.stderr
    assert json.loads(r.stdout)["passed"] in (True, False)  # the verdict is still there: one JSON document
    r = fleetserve("simulate", cloud, "--trace", TRACE, "--limit", "20", "--report", "/dev/full")
    assert r.returncode == 2 and "TTFT p50" in r.stdout and "report: /dev/full" not in r.stdout, r.stdout
    assert "cannot write /dev/full" in r.stderr
    r = fleetserve("plan", cloud, "--trace", TRACE, "--limit", "20", "--max-trials", "3", "-o", "/dev/full")
    assert r.returncode == 2 and "error: --output: cannot write /dev/full" in r.stderr, r.stderr
    assert "not written: its spec follows" in r.stdout and not re.search(r"^verified as:", r.stdout, re.M)
    planned = r.stdout[r.stdout.index("# planned by fleetserve plan"):]
    (tmp_path / "planned.yaml").write_text(planned)
    assert load_spec(tmp_path / "planned.yaml").endpoint.metadata.name  # the spec printed is the winner, whole
    r = fleetserve("plan", cloud, "--trace", TRACE, "--limit", "20", "--max-trials", "3", "-o", "/dev/full",
                   "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 2 and out["output"] is None and out["verify_command"] is None
    assert out["planned_spec"].startswith("# planned by fleetserve plan")


def test_a_week_long_report_buckets_its_series_by_the_span_and_its_figures_have_their_own_ids():
    """Two requests a week apart drew 10,080 one-minute bars a pixel too narrow to see, 5-minute peak and idle
    shades as thin, in a 3.9 MB page; the five figures shared every SVG element id (tick_1, clip paths)."""
    import re
    from collections import Counter

    from fleetserve.sim.html import bucket_for, render_html
    from fleetserve.sim.run import simulate
    from fleetserve.sim.setup import SimOptions
    from fleetserve.traces.model import TraceRequest
    from tests.sim.test_verify_causes import gpu_endpoint

    assert bucket_for(3600) == (60.0, "minute") and bucket_for(7 * 86400) == (900.0, "15 minutes")
    trace = [TraceRequest(0.0, 500, 20), TraceRequest(7 * 86400.0, 500, 20)]
    result = simulate(gpu_endpoint(), trace, SimOptions(), {})
    page = render_html(result.fleet, result.report, "week")
    assert len(page) < 1_000_000 and "Requests per 15 minutes" in page, len(page)
    ids = Counter(re.findall(r'\bid="([^"]+)"', page))
    assert ids and max(ids.values()) == 1, ids.most_common(3)


def test_simulate_and_verify_say_what_the_trace_left_out_as_analyze_does(tmp_path):
    """Mooncake rows without hash_ids were warned by analyze alone: simulate's hit rate fell from 0.16 to 0.05
    without a word. A BurstGPT file read as an Azure one missing its columns."""
    rows = [{"timestamp": i * 500, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2] if i % 2 else []}
            for i in range(10)]
    trace = tmp_path / "ids.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = str(EXAMPLES / "simulated-cloud.yaml")
    for command in ("simulate", "verify"):
        r = fleetserve(command, spec, "--trace", str(trace), "--json")
        assert r.returncode in (0, 1), r.stderr
        assert "warning: 5 of 10 requests carry no hash_ids" in r.stderr, r.stderr
        out = json.loads(r.stdout)
        warnings = out["warnings"] if command == "simulate" else out["report"]["warnings"]
        assert any(w.startswith("5 of 10 requests carry no hash_ids") for w in warnings), warnings
    burst = tmp_path / "BurstGPT.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     + "".join(f"{i * 2},ChatGPT,{300 + i},{20 if i % 3 else 0},0,API log\n" for i in range(9)))
    r = fleetserve("simulate", spec, "--trace", str(burst), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["requests"] == 9
    assert "warning: 3 of 9 requests have Response tokens 0" in r.stderr


def test_verify_says_the_spec_warnings_that_change_what_it_simulates(tmp_path):
    """A CloudWatch trigger (AWS-only) is simulated as a concurrency trigger: only validate said so, and verify and
    plan judged the replacement as if it were the user's own autoscaler."""
    import yaml

    doc = yaml.safe_load((EXAMPLES / "hyperpod.yaml").read_text())
    doc["spec"]["autoScalingSpec"].pop("prometheusTrigger", None)
    doc["spec"]["autoScalingSpec"]["cloudWatchTrigger"] = {"name": "inv", "metricName": "Invocations",
                                                           "metricStat": "Sum", "targetValue": 10}
    spec = tmp_path / "cloudwatch.yaml"
    spec.write_text(yaml.safe_dump(doc))
    r = fleetserve("verify", str(spec), "--trace", TRACE, "--limit", "20", "--json")
    assert r.returncode in (0, 1), r.stderr
    said = [w for w in json.loads(r.stdout)["report"]["warnings"] if "CloudWatch" in w]
    assert len(said) == 1 and said[0].startswith("spec.autoScalingSpec.cloudWatchTrigger: CloudWatch") and \
        "scales on concurrency" in said[0], said
    assert "CloudWatch" in r.stderr
    # one the run says itself is said once (a vLLM engine given no GPU had been said twice)
    doc = yaml.safe_load((EXAMPLES / "hyperpod.yaml").read_text())
    for section in doc["spec"]["worker"]["resources"].values():
        section.pop("nvidia.com/gpu")
    spec.write_text(yaml.safe_dump(doc))
    r = fleetserve("verify", str(spec), "--trace", TRACE, "--limit", "20", "--json")
    warnings = json.loads(r.stdout)["report"]["warnings"]
    assert sum("given no GPU" in w for w in warnings) == 1, warnings
