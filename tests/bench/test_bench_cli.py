import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import fleetserve

TRACE = str(Path(__file__).parents[1] / "data" / "mooncake_sample.jsonl")


def test_scale_from_zero_bench_overflows_the_buffer_and_still_loses_nothing():
    result = fleetserve("bench", "scale-from-zero", "--buffer", "2", "--json", timeout=600)
    assert result.returncode == 0, result.stderr + result.stdout  # the figures say which request was lost, how
    figures = json.loads(result.stdout)
    assert figures["requests"] == 20 and figures["sent"] == 40  # ten times the buffer, cold then warm
    assert figures["lost"] == 0 and figures["answered"] == 40
    assert figures["shed_then_answered"] >= 1  # the overflow path was taken, and the clients came back
    assert 0 < figures["cold_start_s"] <= figures["last_response_s"]
    assert figures["first_response_s"] > 0 and figures["ratio"]["first_response_cold_vs_warm"] > 0
    # every outcome printed, so they add up; the cold burst's apart from both
    kinds = ("answered", "rejected_with_retry_after", "cut_with_error_event", "failed_with_error", "refused", "lost")
    assert sum(figures[k] for k in kinds) == figures["sent"]
    assert figures["cold"]["sent"] == 20 and "ten times the router's wait buffer" not in figures["note"]
    assert "10 times the router's wait buffer" in figures["note"]


def test_routing_bench_prints_the_keys_per_strategy():
    from pathlib import Path

    trace = Path(__file__).parents[1] / "data" / "mooncake_sample.jsonl"
    result = fleetserve("bench", "routing", "--live", "--trace", str(trace), "--replicas", "2", "--limit", "30",
                        "--duration", "3", "--strategies", "roundrobin,kvaware", "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert 0 <= figures["oracle_hit_rate"] <= 1
    for name in ("roundrobin", "kvaware"):
        row = figures["strategies"][name]
        assert row["lost"] == 0 and row["failed"] == 0
        assert {"hit_rate", "load_skew", "utilization", "hit_vs_oracle", "ttft_p95_vs_roundrobin"} <= set(row)
        assert row["ttft_ms"]["p50"] is not None and row["ttft_ms"]["p95"] is not None
        # load_skew and utilization recomputed from the figures the row carries; the generator's own account
        busy = row["busy_seconds"]
        assert row["load_skew"] == pytest.approx(max(busy) / (sum(busy) / len(busy)), abs=1e-3)
        assert row["generator"]["requests_sent"] == 30 and row["generator"]["lag_ms"]["p50"] is not None
    assert "ttft_p95_vs_roundrobin" in figures["ratio"] and figures["ratio"]["best_cache_aware"] == "kvaware"
    beat = (figures["strategies"]["kvaware"]["hit_vs_oracle"] or 0) > 1  # then the simulator bench's warning says so
    assert beat == any("hit rates above the oracle" in w for w in figures["warnings"])


def test_routing_bench_rejects_unknown_strategy():
    result = fleetserve("bench", "routing", "--trace", "x.jsonl", "--strategies", "fastest")
    assert result.returncode == 2 and "prefixaware" in result.stderr
    result = fleetserve("bench", "routing", "--trace", "x.jsonl", "--modes", "psychic")
    assert result.returncode == 2 and "blind, informed" in " ".join(result.stderr.replace("│", " ").split())
    for bad, says in (("busy", "utilizations such as 0.8,0.9"), ("0.8,1.2", "within 0.01..0.99"),
                      (",,", "utilizations such as 0.8,0.9"), ("0.8,,0.9", "utilizations such as 0.8,0.9"),
                      ("0.65,0.65", "given twice")):
        result = fleetserve("bench", "routing", "--trace", "x.jsonl", "--sweep", bad)
        assert result.returncode == 2 and says in " ".join(result.stderr.replace("│", " ").split()), result.stderr


def test_routing_bench_on_the_simulator_reports_every_strategy_and_mode():
    from pathlib import Path

    trace = Path(__file__).parents[1] / "data" / "mooncake_sample.jsonl"
    result = fleetserve("bench", "routing", "--trace", str(trace), "--replicas", "2", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["engine"] == "simulator" and figures["requests"] == 200
    assert figures["simulated_s"] > 0 and figures["trace"] == "mooncake_sample.jsonl"
    assert 0 < figures["oracle_hit_rate"] <= figures["ideal_hit_rate"] <= 1
    assert "busy time" in figures["load_skew_basis"]
    for mode in ("blind", "informed"):
        rows = figures["modes"][mode]
        assert set(rows) == {"roundrobin", "leastload", "session", "prefixaware", "kvaware"}
        assert rows["session"]["hit_rate"] is None and "session keys" in rows["session"]["reason"]
        for name in ("roundrobin", "leastload", "prefixaware"):
            row = rows[name]
            assert 0 <= row["hit_rate"] <= 1 and row["ttft_ms"]["p95"] is not None and row["load_skew"] >= 1
            assert abs(row["hit_vs_oracle"] - row["hit_rate"] / figures["oracle_hit_rate"]) < 0.01
        assert rows["roundrobin"]["ttft_p95_vs_roundrobin"] == 1.0
        assert rows["prefixaware"]["hit_rate"] > rows["roundrobin"]["hit_rate"]
    assert figures["modes"]["blind"]["kvaware"]["hit_rate"] is None  # no KV events to act on
    assert "KV events" in figures["modes"]["blind"]["kvaware"]["reason"]
    assert figures["modes"]["informed"]["kvaware"]["hit_rate"] is not None
    assert figures["modes"]["blind"]["prefixaware"]["learned"]  # it learned from the engines' cached tokens
    assert figures["targets"]["best_cache_aware"] == "prefixaware" and "met" in figures["targets"]
    sweep = figures["load_sweep"]  # the main load, then busier fleets, blind mode
    assert list(sweep) == ["0.65", "0.8", "0.9"] and set(figures["targets"]["by_load"]) == set(sweep)
    assert sweep["0.8"]["time_scale"] < sweep["0.65"]["time_scale"]  # busier: arrivals closer together
    for entry in sweep.values():
        assert set(entry["rows"]) == {"roundrobin", "prefixaware"} or "leastload" in entry["rows"]
        assert entry["reachable"] == (entry["ttft_floor_p95_vs_roundrobin"] <= 0.6)
    verdict = figures["targets"]["met_where_reachable"]
    assert sorted(verdict["reachable_loads"] + verdict["unreachable_loads"]) == sorted(sweep)


def test_kvcache_bench_prints_every_tier_and_ratio():
    result = fleetserve("bench", "kvcache", "--repeats", "1", "--json", timeout=900)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for key in ("cold", "engine", "l1"):
        assert figures["ttft_ms"][key] > 0
    assert {"l1_vs_cold", "l2_vs_cold", "batch8_vs_batch1"} <= set(figures["ratio"])
    assert figures["throughput"]["b1"] > 0 and figures["throughput"]["b8"] > 0
    # each figure is what it says: the whole prefix came from its tier, none of it cold
    tiers = ("engine", "l1", "l2") if shutil.which("redis-server") else ("engine", "l1")
    assert figures["cached_tokens"]["cold"] == [0] and figures["errors"] == []
    assert all(figures["cached_tokens"][t] == [2048] for t in tiers), figures["cached_tokens"]
    assert all(figures["tier_blocks_served"][t] == [8] for t in tiers), figures["tier_blocks_served"]  # by itself
    assert "starting the engine" not in result.stderr  # --json: the figures only (it had been a no-op flag)


def test_kvcache_bench_publishes_no_figure_for_a_tier_that_served_nothing(tmp_path):
    """A redis-server that never listened gave an exit 0 and an "in L2 only" TTFT (a cold one) as measured."""
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    # starts and never listens, but holds its port bound: a free port it left unbound had been taken by another
    # test's real redis-server (pytest-xdist), and the bench then measured that one as its L2
    (fake / "redis-server").write_text(
        f"#!{sys.executable}\nimport socket, sys, time\n"
        "s = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[sys.argv.index('--port') + 1])))\n"
        "time.sleep(600)\n")
    (fake / "redis-server").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    result = fleetserve("bench", "kvcache", "--repeats", "1", env=env, timeout=900)  # progress lines on stderr
    assert result.returncode == 1, result.stderr
    assert "starting the engine (tiny, Redis as L2)" in result.stderr and "round 1 of 1" in result.stderr
    figures = json.loads(result.stdout)
    assert figures["ttft_ms"]["l2"] is None and figures["ratio"]["l2_vs_cold"] is None
    assert figures["l2"].startswith("not measured") and figures["errors"][0].startswith("l2: 1 of 1 measurement")
    assert "error: l2: " in result.stderr and figures["ttft_ms"]["l1"] > 0


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install wrk)")
def test_router_overhead_bench_prints_the_keys_of_a_configuration():
    result = fleetserve("bench", "router-overhead", "--seconds", "1", "--configs", "leastload", "--json",
                        timeout=300)
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)["configs"]["leastload"]
    for key in ("rps", "p50_ms", "p99_ms", "router_cpu_us_per_request"):
        assert isinstance(row[key], (int, float)) and row[key] > 0, (key, row)
    # a difference of two measured medians: on a loaded machine it can come out below zero (-0.109 ms seen)
    assert isinstance(row["added_p50_ms"], (int, float)) and math.isfinite(row["added_p50_ms"]), row


def test_router_overhead_bench_names_the_wrk_install_when_it_is_missing(tmp_path):
    import os
    import sys

    python_only = tmp_path / "bin"
    python_only.mkdir()
    (python_only / "python").symlink_to(sys.executable)
    result = fleetserve("bench", "router-overhead", "--seconds", "1", "--json",
                        env={**os.environ, "PATH": str(python_only)}, timeout=120)
    assert result.returncode == 2
    assert "apt-get install wrk" in result.stderr


@pytest.mark.parametrize("flag,module", [("--sglang-python", "sglang_router"), ("--vllm-python", "vllm_router")])
def test_a_peer_routers_python_that_cannot_run_it_is_exit_2_naming_the_flag(tmp_path, flag, module):
    """A wrong path was a row reading "failed" after the other configurations had run; vllm-router had no flag."""
    wide = {"COLUMNS": "400"}  # the error box wraps long paths
    missing = fleetserve("bench", "router-overhead", flag, str(tmp_path / "nope"), "--json", env=wide, timeout=120)
    assert missing.returncode == 2 and flag in missing.stderr and "not an executable file" in missing.stderr
    without = fleetserve("bench", "router-overhead", flag, sys.executable, "--json", env=wide, timeout=120)
    assert without.returncode == 2 and f"cannot import {module}" in without.stderr, without.stderr


def test_a_peer_python_by_name_on_path_is_found_and_its_environment_variable_checked(monkeypatch, tmp_path):
    """`--sglang-python python3` was refused as "not an executable file", and a wrong FLEETSERVE_SGLANG_PYTHON was
    not checked at all: the peer's row failed after minutes."""
    import typer

    from fleetserve.cli.bench_commands import peer as _peer
    from fleetserve.cli.checks import peer_python

    name = os.path.basename(sys.executable)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert peer_python(name, "json", "--sglang-python") == shutil.which(name)
    monkeypatch.setenv("FLEETSERVE_SGLANG_PYTHON", str(tmp_path / "nope"))
    with pytest.raises(typer.BadParameter) as bad:
        _peer(None, "json", "--sglang-python", "FLEETSERVE_SGLANG_PYTHON")
    assert bad.value.param_hint == "FLEETSERVE_SGLANG_PYTHON" and "not an executable file" in str(bad.value)
    monkeypatch.setenv("FLEETSERVE_SGLANG_PYTHON", sys.executable)
    assert _peer(None, "json", "--sglang-python", "FLEETSERVE_SGLANG_PYTHON") == sys.executable
    monkeypatch.delenv("FLEETSERVE_SGLANG_PYTHON")
    assert _peer(None, "json", "--sglang-python", "FLEETSERVE_SGLANG_PYTHON") is None


def test_routing_targets_are_judged_where_the_ttft_floor_allows_them():
    from fleetserve.bench.routing_sim import _met_where_reachable, targets

    def row(hit, p95, skew):
        return {"hit_rate": hit, "hit_vs_oracle": hit, "ttft_p95_vs_roundrobin": p95, "load_skew": skew}

    rows = {"roundrobin": row(0.3, 1.0, 1.0), "session": row(0.99, 0.4, 1.3), "prefixaware": row(0.97, 0.5, 1.05)}
    verdict = targets({"modes": {"blind": rows}})
    assert verdict["best_cache_aware"] == "prefixaware" and verdict["met"]  # all three met beats a higher hit
    assert not verdict["by_strategy"]["session"]["met"]
    met = {"reachable": True, "targets": {"met": True}}
    unreachable = {"reachable": False, "targets": {"met": False, "hit_vs_oracle": {"met": True},
                                                   "load_skew": {"met": True}}}
    assert _met_where_reachable({"0.65": unreachable, "0.9": met}) == {
        "met": True, "reachable_loads": ["0.9"], "unreachable_loads": ["0.65"],
        "hit_and_skew_met_where_unreachable": True}
    missed = {"reachable": True, "targets": {"met": False}}
    assert not _met_where_reachable({"0.65": unreachable, "0.9": missed})["met"]
    assert not _met_where_reachable({"0.65": unreachable})["met"]  # nowhere to judge is not a pass
    no_reuse = {n: {**r, "hit_vs_oracle": None} for n, r in rows.items()}  # an Azure trace: no prefix ids
    verdict = targets({"modes": {"blind": no_reuse}})
    assert verdict["met"] is None and "no prefix reuse" in verdict["reason"]
    assert _met_where_reachable({"0.65": {"reachable": True, "targets": verdict}})["met"] is None


def test_a_load_the_calibration_missed_is_named_and_the_two_ways_to_set_it_exclude_each_other(tmp_path):
    from fleetserve.bench.routing_sim import load_warnings

    rows = {"roundrobin": {"utilization": 0.40}}
    result = {"target_utilization": 0.65, "modes": {"blind": rows},
              "load_sweep": {"0.65": {"rows": rows}, "0.8": {"rows": {"roundrobin": {"utilization": 0.78}}}}}
    (warning,) = load_warnings(result)  # 0.78 is within 15 % of 0.8; 0.40 is not 0.65
    assert "0.40 busy against the target utilization 0.65" in warning
    r = fleetserve("bench", "routing", "--trace", "tests/data/mooncake_sample.jsonl", "--time-scale", "2",
                   "--target-utilization", "0.9")
    assert r.returncode == 2 and "--time-scale" in r.stderr
    # a span past a year once scaled is refused, as `trace scale --time` refuses it (it ran for minutes)
    span = tmp_path / "span.csv"
    span.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00.0000000,100,10\n"
                    "2023-12-31 00:00:00.0000000,100,10\n")
    r = fleetserve("bench", "routing", "--trace", str(span), "--time-scale", "10000", "--json")
    assert r.returncode == 2 and "at --time-scale 10000 spans" in r.stderr, r.stderr


def test_routing_bench_runs_at_the_loads_it_labels():
    """Utilization falls slower than the arrival scale grows (decode batches shrink with the load): two
    proportional corrections left generated chat traces labelled 0.65 / 0.8 at 0.75 / 0.91; the calibration
    iterates until roundrobin's measured utilization is within 2 % of the target."""
    import tempfile
    from pathlib import Path

    from fleetserve.bench import routing_sim
    from fleetserve.traces.generate import WorkloadSpec, generate
    from fleetserve.traces.write import write_trace

    trace = generate(WorkloadSpec(content="chat", duration_s=300, rate=3.0, seed=5), with_text=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chat.jsonl"
        write_trace(trace, path, "mooncake")
        figures = routing_sim.run(str(path), strategies=("roundrobin",), modes=("blind",))
    assert figures["warnings"] == []
    for load, entry in figures["load_sweep"].items():
        got = entry["rows"]["roundrobin"]["utilization"]
        assert abs(got / float(load) - 1) <= 0.03, (load, got)  # 2 %, and the row's rounding


def test_a_cache_raised_to_fit_the_largest_request_and_a_skipped_sweep_are_said(tmp_path):
    """A third of the distinct blocks over 4 replicas is 12 blocks each, but a replica must hold the largest
    request (100 blocks): the caches held far more than the JSON's cache_fraction said, with no word. And a run
    without blind mode judged a load sweep it never ran."""
    import json

    from fleetserve.bench import routing_sim

    rows = [{"timestamp": i * 100, "input_length": 512, "output_length": 4, "hash_ids": [i]} for i in range(50)]
    rows.append({"timestamp": 6000, "input_length": 512 * 100, "output_length": 4,
                 "hash_ids": list(range(1000, 1100))})
    path = tmp_path / "one-long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = routing_sim.run(str(path), replicas=4, strategies=("roundrobin",), modes=("informed",))
    cap, unique = figures["cache_blocks_per_replica"], figures["unique_blocks"]
    assert cap > round(unique / 3 / 4) and figures["effective_cache_fraction"] > 1 / 3
    assert any("must hold the trace's largest request" in w for w in figures["warnings"]), figures["warnings"]
    said = f"the fleet's caches hold {figures['effective_cache_fraction']:.3g} x the trace's distinct blocks"
    assert any(said in w for w in figures["warnings"]), figures["warnings"]  # "holds 10.6667 of the blocks" read
    # as ten blocks
    assert figures["load_sweep"] is None and "blind" in figures["sweep_skipped"]
    assert figures["targets"]["met"] is None and "blind" in figures["targets"]["reason"]


def test_live_routing_bench_keys_a_prompt_log_as_its_engines_do(tmp_path):
    """The live bench keyed a prompt log by `token_ids`, which gives every request tokens of its own: the oracle
    said 0 while the engines, which get the text, found the shared system prompts."""
    from fleetserve.bench.routing import _keys
    from fleetserve.kvcache.blocks import chain_keys, namespace_key
    from fleetserve.traces.load import load_trace
    from fleetserve.traces.model import stand_in_tokens

    system = ["You are a careful assistant for " + topic + ". " + " ".join(f"rule{k}" for k in range(600))
              for topic in ("billing", "shipping")]
    rows = [{"timestamp": i * 0.2, "messages": [{"role": "system", "content": system[i % 2]},
                                                {"role": "user", "content": f"question {i} about my order"}],
             "max_tokens": 4} for i in range(12)]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    requests = load_trace(log)
    keys = _keys(requests, 16)
    root = namespace_key("bench-sim", "1", "sim", None)  # the engines the bench starts
    assert keys[0] == chain_keys(stand_in_tokens(requests[0].text()), 16, root)
    assert keys[0][:3] == keys[2][:3] and keys[0][:1] != keys[1][:1]  # shared where the text is
    result = fleetserve("bench", "routing", "--live", "--trace", str(log), "--replicas", "2", "--duration", "3",
                        "--cache-fraction", "1", "--strategies", "roundrobin,prefixaware", "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["cache_blocks_per_replica"] == 16  # the floor the simulator bench has too (it was 1 block,
    # and --live ignored --cache-fraction), and the JSON says why
    assert "not the 2 that --cache-fraction 1 asks for" in figures["warnings"][0]
    assert figures["oracle_hit_rate"] > 0.5  # 10 of 12 requests repeat a 600-word system prompt
    assert figures["strategies"]["prefixaware"]["hit_rate"] > 0
    for flag, value in (("--time-scale", "2"), ("--modes", "blind"), ("--sweep", "0.7"), ("--seed", "3")):
        result = fleetserve("bench", "routing", "--live", "--trace", str(log), flag, value)
        assert result.returncode == 2 and flag in result.stderr, flag  # each was ignored
    for flag, value in (("--duration", "30"), ("--prompt-format", "text"), ("--sglang-python", sys.executable)):
        result = fleetserve("bench", "routing", "--trace", str(log), flag, value)  # the reverse: --live's own
        assert result.returncode == 2 and flag in result.stderr and "applies to --live only" in result.stderr, flag


def test_a_completion_longer_than_the_bench_models_context_is_cut_and_said(tmp_path):
    """A prompt log's max_tokens of 16 M simulated 18 days of decoding in 5 minutes of wall time, with no word:
    no engine generates more than its context, so the bench cuts it there and says how many; prompts stay whole
    (Mooncake's trace has 191,000-token prompts, and the figures are about them)."""
    import json

    from fleetserve.bench import routing_sim

    rows = [{"timestamp": i * 100, "prompt": "shared words " * 200 + str(i), "max_tokens": 64} for i in range(12)]
    rows[3]["max_tokens"] = 16_000_000
    rows[7]["max_tokens"] = 131_072  # the whole context: not cut
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = routing_sim.run(str(path), replicas=2, strategies=("roundrobin",), modes=("blind",),
                              sweep_utilizations=())
    assert figures["requests"] == 12 and figures["simulated_s"] < 86_400
    assert figures["context_length"] == {"tokens": 131_072, "source": "llama-3.1-8b-instruct, the bench's model",
                                         "completions_cut": 1}
    assert any(w.startswith("1 of 12 requests ask for more output tokens than the 131,072-token context") for w in
               figures["warnings"]), figures["warnings"]


def test_kvaware_on_text_prompts_says_it_cannot_act_rather_than_report_its_fallback(tmp_path):
    """Informed kvaware on a prompt log was prefixaware's fallback, decision for decision, under kvaware's name."""
    import json

    from fleetserve.bench import routing_sim

    rows = [{"timestamp": i, "prompt": "shared system words " * 100 + f"q{i}", "max_tokens": 8} for i in range(20)]
    path = tmp_path / "text.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = routing_sim.run(str(path), replicas=2, strategies=("prefixaware", "kvaware"), modes=("informed",),
                              sweep_utilizations=())
    kv = figures["modes"]["informed"]["kvaware"]
    assert kv["hit_rate"] is None and "prefixaware fallback" in kv["reason"]
    assert figures["modes"]["informed"]["prefixaware"]["hit_rate"] > 0


def test_a_trace_without_prefix_blocks_keeps_the_engines_own_memory():
    """An Azure CSV has nothing to cache, yet its engines were sized by a share of nothing: each held its largest
    request plus one block and ran about three requests at once, and the TTFTs were those of starved engines."""
    from pathlib import Path

    from fleetserve.bench import routing_sim
    from fleetserve.sim.profiles import resolve

    trace = Path(__file__).parents[1] / "data" / "azure_code_sample.csv"
    figures = routing_sim.run(str(trace), replicas=2, strategies=("roundrobin",), modes=("blind",), limit=100,
                              sweep_utilizations=())
    assert figures["unique_blocks"] == 0 and figures["cache_blocks_per_replica"] == resolve("h100-8b").cache_blocks


def test_a_trace_of_one_instant_is_not_given_a_time_scale_or_a_load_sweep(tmp_path):
    """Every request at one timestamp: no factor on arrival times changes the load, yet the calibration reported
    a time scale of 67.8 and a sweep whose loads were all the same burst, judged "reachable"."""
    from fleetserve.bench import routing_sim

    trace = tmp_path / "burst.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 5000, "input_length": 1000, "output_length": 20,
                                         "hash_ids": [1, 10 + i]}) + "\n" for i in range(40)))
    figures = routing_sim.run(str(trace), replicas=2, strategies=("roundrobin", "prefixaware"), modes=("blind",))
    assert figures["time_scale"] == 1.0 and figures["load_sweep"] is None
    assert "same instant" in figures["sweep_skipped"] and any("one burst" in w for w in figures["warnings"])


def test_a_hit_rate_above_the_oracle_is_said_not_taken_for_the_best():
    from fleetserve.bench.routing_sim import oracle_warnings

    result = {"modes": {"blind": {"prefixaware": {"hit_vs_oracle": 1.154}, "roundrobin": {"hit_vs_oracle": 0.9},
                                  "kvaware": {"hit_rate": None}}}}
    (said,) = oracle_warnings(result)
    assert said.startswith("hit rates above the oracle (blind prefixaware 1.154 x)") and "not an upper bound" in said
    assert oracle_warnings({"modes": {"blind": {"prefixaware": {"hit_vs_oracle": 0.97}}}}) == []


def test_the_live_bench_says_the_load_it_ran_at_when_it_missed_the_target():
    """--live ran at 0.90 for 0.65 with no word: its engines are now calibrated by the simulator bench's
    roundrobin runs, and a load off by more than 5 % is said."""
    from fleetserve.bench.routing import live_load_warning

    assert live_load_warning(0.901, 0.65).startswith("roundrobin kept the engines 0.90 busy against the target")
    assert live_load_warning(0.66, 0.65) is None and live_load_warning(None, 0.65) is None


def test_bench_input_that_was_a_traceback_or_a_silent_success_is_exit_2_naming_the_flag(tmp_path):
    """A missing model printed a traceback (kvcache) or exit 1 without the flag (scale-from-zero); a URL without
    a scheme a traceback (replay); a million requests a second was accepted (fidelity) and ran out of memory."""
    def said(result):
        return " ".join(result.stderr.replace("│", " ").split())

    for args, flag in ((("kvcache", "--model", str(tmp_path / "none"), "--json"), "--model"),
                       (("scale-from-zero", "--model", "foo", "--buffer", "1", "--json"), "--model"),
                       (("scale-from-zero", "--model", "catalog:nosuch", "--json"), "smollm2-135m"),
                       (("kvcache", "--model", "catalog:nosuch", "--json"), "--model"),
                       (("replay", "--url", "notaurl", "--trace", TRACE, "--model", "m", "--limit", "3"), "--url"),
                       (("fidelity", "--requests", "50000", "--duration", "1", "--json"), "--requests")):
        r = fleetserve("bench", *args)
        assert r.returncode == 2 and flag in said(r) and "Traceback" not in r.stderr, (args, r.stderr[-600:])
    # a replay that nobody answered is a failure, not figures
    r = fleetserve("bench", "replay", "--url", "http://127.0.0.1:1", "--trace", TRACE, "--model", "m", "--limit", "2")
    assert r.returncode == 1 and json.loads(r.stdout)["answered"] == 0 and json.loads(r.stdout)["refused"] == 2
    assert "2 of 2 request(s) refused: nothing listened at http://127.0.0.1:1" in r.stderr
    # a host name that does not resolve reached no endpoint either: it had counted as lost (dropped by it)
    r = fleetserve("bench", "replay", "--url", "http://nosuchhost.invalid:80", "--trace", TRACE, "--model", "m",
                   "--limit", "1")
    assert r.returncode == 1 and json.loads(r.stdout)["refused"] == 1 and json.loads(r.stdout)["lost"] == 0
    assert "the host name of http://nosuchhost.invalid:80 does not resolve" in r.stderr


def test_live_routing_takes_the_simulators_profiles_and_names_the_flag_when_one_is_unknown():
    """--live refused h100-llama-8b, which the simulator's bench takes, with a message that did not name the flag."""
    from fleetserve.sim.perf import profile

    assert profile("h100-llama-8b").name == "h100-llama-8b" and profile("fast").name
    r = fleetserve("bench", "routing", "--trace", TRACE, "--live", "--limit", "5", "--duration", "2",
                   "--strategies", "roundrobin", "--profile", "nope", "--json")
    assert r.returncode == 2 and "--profile: unknown profile 'nope'" in r.stderr and "h100-llama-8b" in r.stderr


def test_a_bench_fleet_interrupted_while_it_stops_is_stopped_before_its_folder_goes(tmp_path, monkeypatch):
    """Ctrl-C during `down` left the supervisor shutting down after the temporary home was removed, and it wrote
    its state file back into a new one."""
    from fleetserve.bench.localfleet import LocalFleet

    fleet = LocalFleet(tmp_path, "f", "spec: {}\n")
    calls = []

    def cli(*args, timeout=300):
        calls.append(args)
        if len(calls) == 1:
            raise KeyboardInterrupt
    monkeypatch.setattr(fleet, "cli", cli)
    with pytest.raises(KeyboardInterrupt):
        fleet.down()
    assert calls == [("down", "f"), ("down", "f")]


def test_sigterm_stops_a_bench_as_ctrl_c_does_its_processes_and_temporary_folder_gone(tmp_path):
    """SIGTERM left the bench's temporary folder (a model, the internal token, a Redis password) behind."""
    import signal
    import subprocess
    import time

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "fleetserve", "bench", "kvcache", "--repeats", "1", "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("fleetserve-bench-kv-*/engine.log")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        (folder,) = tmp_path.glob("fleetserve-bench-kv-*")
        # the log opens just before the engine's fork: a signal handled inside a fork's callbacks is dropped by
        # Python (printed, not raised), so the signal comes once the engine runs
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not folder.exists()

    def names_folder(pid: Path) -> bool:
        try:
            return str(folder).encode() in (pid / "cmdline").read_bytes()
        except OSError:  # it exited meanwhile
            return False

    assert [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and names_folder(p)] == []


def test_replay_refuses_flags_a_prompt_log_ignores_and_an_endpoints_path_as_its_url(tmp_path):
    """`--vocab` and `--prompt-format text` on a prompt log changed nothing, and an endpoint's full path as --url
    sent every request to .../v1/chat/completions/v1/completions (404 each)."""
    log = tmp_path / "chat.jsonl"
    log.write_text('{"timestamp": 0, "messages": [{"role": "user", "content": "hi"}]}\n')
    for flags in (["--vocab", "100"], ["--prompt-format", "text"]):
        result = fleetserve("bench", "replay", "--url", "http://127.0.0.1:9", "--trace", str(log), "--model", "m",
                            *flags)
        assert result.returncode == 2 and flags[0] in result.stderr and "prompt log" in result.stderr, flags
    result = fleetserve("bench", "replay", "--url", "http://127.0.0.1:9/v1/chat/completions", "--trace", str(log),
                        "--model", "m")
    assert result.returncode == 2 and "--url" in result.stderr and "base URL" in result.stderr


def test_replay_over_https_to_a_plain_http_gateway_is_refused_not_lost(tmp_path):
    """Every request read "lost" (an endpoint that dropped requests it took) where none was accepted at all."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)  # plain HTTP
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        trace = Path(__file__).parents[1] / "data" / "mooncake_sample.jsonl"
        result = fleetserve("bench", "replay", "--url", f"https://127.0.0.1:{server.server_address[1]}", "--trace",
                            str(trace), "--model", "m", "--limit", "2", "--speedup", "1000")
    finally:
        server.shutdown()
        server.server_close()
    summary = json.loads(result.stdout)
    assert result.returncode == 1 and summary["refused"] == 2 and summary["lost"] == 0, result.stdout
    assert "TLS handshake failed" in result.stderr


def test_live_routing_bench_oracle_counts_what_an_engine_can_reuse_and_names_what_cannot_act(tmp_path):
    """The live oracle counted the block of each prompt's last token, which no engine reuses: 0.9 where 0.45 was
    the most possible, so every live hit_vs_oracle read half what it was. A strategy that cannot act on the trace
    (session without session keys) was run and reported under its own name with another policy's figures."""
    from fleetserve.bench.routing import run

    same = tmp_path / "same.jsonl"  # ten copies of one 512-token prompt: two blocks of 256, the last one computed
    same.write_text("".join(json.dumps({"timestamp": i * 500, "input_length": 512, "output_length": 4,
                                        "hash_ids": [7]}) + "\n" for i in range(10)))
    figures = run(str(same), replicas=2, strategies=("session",), limit=10, duration=5)  # nothing to start
    assert figures["block_size"] == 256 and figures["oracle_hit_rate"] == 0.45  # 9 x 256 of 10 x 512
    assert figures["strategies"]["session"]["hit_rate"] is None
    assert "no session keys" in figures["strategies"]["session"]["reason"]


def test_live_routing_bench_refuses_what_it_cannot_run_before_it_starts_anything(tmp_path):
    """A sparse trace made the engines slower than `engine --speedup` takes: a traceback naming a flag the user
    never gave. A missing sglang-router was said after the strategies before it had run, their figures lost."""
    from fleetserve.bench.routing import find_sglang_python

    sparse = tmp_path / "sparse.jsonl"
    sparse.write_text("".join(json.dumps({"timestamp": i * 500, "input_length": 512, "output_length": 4,
                                          "hash_ids": [i]}) + "\n" for i in range(2)))
    r = fleetserve("bench", "routing", "--live", "--trace", str(sparse), "--strategies", "roundrobin", "--json")
    assert r.returncode == 2 and "too sparse" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["valid"] is False
    if find_sglang_python() is None:
        r = fleetserve("bench", "routing", "--live", "--trace", str(sparse), "--strategies",
                       "roundrobin,sglang_cache_aware", "--prompt-format", "text")
        assert r.returncode == 2 and "needs sglang-router" in " ".join(r.stderr.replace("│", " ").split())


def test_requests_that_failed_are_said_beside_the_percentiles_they_are_not_in():
    """A row's ttft_ms is of its answered requests: 449 of 3,993 timed out unsaid, and a strategy that failed more
    could read faster."""
    from fleetserve.bench.routing_sim import failed_warnings

    rows = {"blind": {"roundrobin": {"failed": 449}, "prefixaware": {"failed": 0},
                      "session": {"hit_rate": None, "reason": "no session keys"}}}
    sweep = {"0.9": {"rows": {"prefixaware": {"failed": 12}, "roundrobin": {"failed": 0}}}}
    (said,) = failed_warnings({"requests": 3993, "modes": rows, "load_sweep": sweep})
    assert "blind roundrobin 449, blind prefixaware at utilization 0.9 12 of 3993" in said, said
    assert "answered requests only" in said
    assert failed_warnings({"requests": 10, "modes": {"blind": {"roundrobin": {"failed": 0}}}}) == []


def test_a_strategy_or_mode_given_twice_runs_once():
    """`--strategies roundrobin,roundrobin` ran it twice under one key; an unknown name is still exit 2."""
    import typer

    from fleetserve.cli.bench_commands import _bench_configs

    assert _bench_configs("roundrobin, prefixaware,roundrobin", ("roundrobin", "prefixaware"), "--strategies") == \
        ("roundrobin", "prefixaware")
    assert _bench_configs(None, ("blind", "informed"), "--modes") == ("blind", "informed")
    for bad in ("nope", " , "):
        with pytest.raises(typer.BadParameter, match="allowed values: blind, informed"):
            _bench_configs(bad, ("blind", "informed"), "--modes")


def test_engine_start_bench_times_both_starts_side_by_side():
    result = fleetserve("bench", "engine-start", "--starts", "1", "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["benchmark"] == "engine-start" and figures["starts"] == 1
    for kind in ("plain_s", "forked_s"):
        assert len(figures[kind]["all"]) == 1 and figures[kind]["p50"] > 0
    forked, plain = figures["forked_s"]["p50"], figures["plain_s"]["p50"]
    assert figures["ratio"]["forked_vs_plain_p50"] == pytest.approx(forked / plain, abs=0.002)  # unrounded medians
    assert figures["fork_server_ready_s"] > 0
    bad = fleetserve("bench", "engine-start", "--starts", "0")
    assert bad.returncode == 2 and "--starts" in bad.stderr
