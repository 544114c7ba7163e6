import json
from pathlib import Path

import pytest

from tests.helpers import fleetserve


def said(result) -> str:
    """stderr with rich's box borders and line wrapping undone."""
    return " ".join(result.stderr.replace("│", " ").split())

MOONCAKE = Path(__file__).parents[1] / "data" / "mooncake_synthetic_trace.jsonl"
SAMPLE = Path(__file__).parents[1] / "data" / "mooncake_sample.jsonl"
KEYS = ("requests", "ideal_hit_rate", "hit_rate_by_cache_blocks", "strategy_hit_rate", "recommendation")


def analyze_json(*args):
    result = fleetserve("analyze", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_mooncake_synthetic_trace_ideal_hit_rate_is_0_64():
    out = analyze_json(str(MOONCAKE))
    assert out["requests"] == 3993 and round(out["ideal_hit_rate"], 2) == 0.64
    assert out["ideal_token_hit_rate"] == pytest.approx(0.6512, abs=1e-4)
    rates = out["strategy_hit_rate"]
    assert rates["session"] is None and "session keys" in out["strategy_notes"]["session"]
    assert rates["prefixaware"] > 2 * rates["roundrobin"]


def test_hash_trace_figures_and_recommendation():
    out = analyze_json(str(SAMPLE), "--replicas", "2", "--cache-blocks", "300")
    assert all(k in out for k in KEYS)
    assert out["requests"] == 200 and 0 < out["ideal_hit_rate"] < 1
    curve = out["hit_rate_by_cache_blocks"]
    assert curve[-1]["cache_blocks"] == out["unique_blocks"] and curve[-1]["hit_rate"] == out["ideal_hit_rate"]
    assert out["strategy_hit_rate"]["kvaware"] is None  # blind: no KV events
    assert out["strategies"]["informed"]["kvaware"]["hit_rate"] is not None
    rec = out["recommendation"]
    assert rec["reasons"] and rec["tiers"] in ("none", "engine only", "L1 only", "L2 only", "L1+L2")
    assert (rec["summary"] == "caching will not pay") == (out["ideal_hit_rate"] < 0.10)


def test_prompt_log_is_tokenized_with_the_models_tokenizer(tmp_path, tiny_model):
    log = tmp_path / "chat.jsonl"
    made = fleetserve("trace", "generate", "chat", "-o", str(log), "--format", "prompts", "--duration", "120",
                      "--input-tokens", "100", "--system-tokens", "300", "--seed", "1")
    assert made.returncode == 0, made.stderr
    out = analyze_json(str(log), "--model", str(tiny_model), "--block-size", "64")
    assert out["format"] == "prompts" and out["block_tokens"] == 64
    assert out["ideal_hit_rate"] > 0.5  # every turn resends the conversation
    assert out["strategy_hit_rate"]["session"] > out["strategy_hit_rate"]["roundrobin"]
    fresh = tmp_path / "fresh.jsonl"
    fleetserve("trace", "generate", "bursts", "-o", str(fresh), "--format", "prompts", "--duration", "60",
               "--input-tokens", "300", "--rate", "1")
    none = analyze_json(str(fresh), "--model", str(tiny_model), "--block-size", "64")
    assert none["recommendation"]["summary"] == "caching will not pay"


def test_bad_input_exits_2_naming_the_parameter(tmp_path):
    azure = Path(__file__).parents[1] / "data" / "azure_code_sample.csv"
    result = fleetserve("analyze", str(azure))
    assert result.returncode == 2 and "no prompt content" in said(result) and "allowed" in said(result)
    # BurstGPT was called "format azure", as if it were an Azure file; a CSV of neither layout names its columns
    burst = tmp_path / "burst.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n8,ChatGPT,5,1,6,API\n")
    result = fleetserve("analyze", str(burst))
    assert result.returncode == 2 and "a BurstGPT trace has no prompt content" in said(result), said(result)
    other = tmp_path / "other.csv"
    other.write_text("time,prompt_len,completion_len\n0,5,1\n")
    result = fleetserve("analyze", str(other))
    assert result.returncode == 2 and "the header has time, prompt_len, completion_len" in said(result)
    log = tmp_path / "log.jsonl"
    log.write_text('{"timestamp": 0, "prompt": "hello"}\n')
    result = fleetserve("analyze", str(log))
    assert result.returncode == 2 and "--model" in said(result)
    result = fleetserve("analyze", str(SAMPLE), "--mode", "psychic")
    assert result.returncode == 2 and "blind, informed" in said(result)
    result = fleetserve("analyze", str(SAMPLE), "--profile", "tpu-9000")
    assert result.returncode == 2 and "--profile" in said(result) and "h100-llama-8b" in said(result)


def test_strategy_hit_rates_come_from_the_fleet_simulator():
    out = analyze_json(str(SAMPLE), "--replicas", "2", "--cache-blocks", "300")
    assert "simulator" in out["engine"]
    row = out["strategies"]["blind"]["prefixaware"]
    assert row["ttft_ms"]["p95"] is not None  # queues and batching: a simulation, not a cache replay
    assert sum(row["decisions"].values()) >= out["requests"]  # every request went through the live policy
    assert out["strategy_hit_rate"]["prefixaware"] == row["hit_rate"]


def test_strategy_hit_rates_follow_the_cache_size_and_never_beat_one_pooled_lru(tmp_path):
    """The strategies ran with a spec's default L1 (2 GiB per replica) beside caches of `--cache-blocks`: with
    one block per replica they reported what 896 blocks gave, above one LRU holding the fleet's four."""
    from fleetserve.analyze.report import analyze
    from fleetserve.traces.generate import WorkloadSpec, generate
    from fleetserve.traces.write import write_trace

    path = write_trace(generate(WorkloadSpec(content="rag", duration_s=120, rate=3, seed=2, documents=20)),
                       tmp_path / "rag.jsonl", "mooncake")
    tiny, roomy = analyze(path, cache_blocks=1), analyze(path, cache_blocks=64)
    for name in ("prefixaware", "roundrobin", "leastload"):
        assert tiny["strategy_hit_rate"][name] <= tiny["tiers"]["engine"]["hit_rate"] + 1e-9, name
        assert roomy["strategy_hit_rate"][name] > tiny["strategy_hit_rate"][name], name


def test_block_size_on_a_mooncake_trace_is_refused_not_ignored():
    trace = str(Path(__file__).parents[1] / "data" / "mooncake_sample.jsonl")
    result = fleetserve("analyze", trace, "--block-size", "100")
    assert result.returncode == 2 and "--block-size" in said(result) and "512 tokens" in said(result)
    result = fleetserve("analyze", trace, "--model", "builtin:no-such-model")  # a tokenizer it would not use
    assert result.returncode == 2 and "--model" in said(result) and "prompt logs" in said(result)


def test_the_oracle_counts_tokens_as_the_strategies_do(tmp_path):
    """Prompts of 513 tokens sharing their first 512-token block: counted in blocks the oracle (0.475) sat
    under every strategy (0.798, prompt tokens); counted in tokens, nothing beats one pooled LRU."""
    from fleetserve.analyze.report import analyze

    path = tmp_path / "partial.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i * 1000, "input_length": 513, "output_length": 5,
                                        "hash_ids": [1, 100 + i]}) + "\n" for i in range(20)))
    out = analyze(path)
    assert out["ideal_hit_rate"] == 0.475  # blocks, as the issue defines it
    assert out["oracle_hit_rate"] == out["ideal_token_hit_rate"] == round(19 * 512 / (20 * 513), 4)
    for name, rate in out["strategy_hit_rate"].items():
        assert rate is None or rate <= out["oracle_hit_rate"] + 1e-9, name


def test_a_mooncake_trace_whose_prompts_fill_no_block_says_so():
    """Hash ids seen again gave an ideal 0.667 beside 0 everywhere else, no warning, and "reuse is too far apart in
    time" for requests 1 s apart: no 100-token prompt fills a 512-token block, which engines store whole."""
    import tempfile

    from fleetserve.analyze.report import analyze

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "short.jsonl"
        path.write_text("".join(json.dumps({"timestamp": t, "input_length": 100, "output_length": 10,
                                            "hash_ids": [1]}) + "\n" for t in (0, 1000, 2000)))
        out = analyze(path)
    assert out["ideal_hit_rate"] == 0.6667 and out["oracle_hit_rate"] == 0
    (warning,) = [w for w in out["warnings"] if "no prompt fills one 512-token block" in w]
    assert "hash ids stand for 512-token blocks" in warning and "--block-size" not in warning
    reasons = " ".join(out["recommendation"]["reasons"])
    assert "no prompt fills one 512-token block" in reasons and "too far apart" not in reasons


def test_what_the_figures_do_not_show_is_warned(tmp_path):
    """Prompts shorter than one block read as "prompts share too little", and requests over the model's context
    (which simulate refuses) were analysed without a word."""
    short = tmp_path / "short.jsonl"
    short.write_text("".join(json.dumps({"timestamp": i, "messages": [{"role": "system", "content": "be brief"},
                                                                      {"role": "user", "content": f"hi {i}"}]})
                             + "\n" for i in range(20)))
    r = fleetserve("analyze", str(short), "--model", "builtin:smollm2-135m", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    said = [w for w in out["warnings"] if "no prompt fills one 256-token block" in w]
    assert out["blocks"] == 0 and said and "so every hit rate is 0" in said[0], out["warnings"]  # the ideal too
    assert any(w.startswith("20 of 20 requests carry no max_tokens") for w in out["warnings"])
    assert "no prompt fills one 256-token block" in out["recommendation"]["reasons"][0]
    assert "warning: no prompt fills" in " ".join(r.stderr.split())
    assert out["hit_rate_by_cache_blocks"] == []  # it had one point, {1 block: 0.0}, where there is no curve
    text = fleetserve("analyze", str(short), "--model", "builtin:smollm2-135m").stdout
    assert "LRU hit rate by cache size (blocks): none (no prompt fills a whole block)" in text, text
    long = tmp_path / "long.jsonl"
    long.write_text("".join(json.dumps({"timestamp": i, "prompt": "word " * 9000 + str(i), "max_tokens": 10})
                            + "\n" for i in range(3)))
    out = analyze_json(str(long), "--model", "builtin:smollm2-135m")
    assert any("3 of 3 requests need more than smollm2-135m's 8192-token context" in w for w in out["warnings"])


def test_a_completion_past_the_simulated_models_context_is_cut_and_said(tmp_path):
    """Two Mooncake rows, one with 16,777,216 output tokens: analyze simulated days of decoding per strategy and
    ran past 5 minutes."""
    path = tmp_path / "long.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 16777216, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 5, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]}\n')
    result = fleetserve("analyze", str(path), "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert any(w.startswith("1 of 2 requests ask for more output tokens than the 131,072-token context")
               for w in report["warnings"]), report["warnings"]
    assert report["strategies"]["blind"]["prefixaware"]["ttft_ms"]["p50"] is not None


def test_a_mooncake_trace_in_seconds_is_warned_as_simulate_warns_it(tmp_path):
    """analyze said nothing while simulate warned: its strategy figures were those of 1,000 x the load."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    seconds = tmp_path / "seconds.jsonl"
    seconds.write_text("".join(json.dumps({**r, "timestamp": r["timestamp"] / 1000}) + "\n" for r in rows))
    out = analyze_json(str(seconds), "--replicas", "2", "--cache-blocks", "300")
    assert any("Mooncake timestamps are milliseconds" in w for w in out["warnings"]), out["warnings"]
    assert not any("milliseconds" in w for w in analyze_json(str(SAMPLE), "--replicas", "2", "--cache-blocks",
                                                                "300")["warnings"])


def test_rows_without_hash_ids_count_as_misses_in_every_figure(tmp_path):
    """A row without ids (others having them) was left out of the block figures and counted as misses in the
    token figures, without a word."""
    rows = [{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
            {"timestamp": 1000, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}]
    both = tmp_path / "both.jsonl"
    both.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = analyze_json(str(both), "--replicas", "1")
    assert base["ideal_hit_rate"] == base["ideal_token_hit_rate"] == 0.5
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(both.read_text() + json.dumps({"timestamp": 2000, "input_length": 1024,
                                                    "output_length": 1}) + "\n")
    out = analyze_json(str(mixed), "--replicas", "1")
    assert out["blocks"] == 6 and out["ideal_hit_rate"] == out["ideal_token_hit_rate"] == round(2 / 6, 4)
    assert any("1 of 3 requests carry no hash_ids" in w for w in out["warnings"]), out["warnings"]


def test_the_oracle_stores_whole_blocks_only_as_the_engines_do(tmp_path):
    """A prompt's partial last block took room in the oracle's LRU, which no engine gives it: with one replica the
    oracle (the same cache) read 0.694 where the replica itself found 0.846."""
    from fleetserve.analyze.report import analyze
    from fleetserve.traces.generate import WorkloadSpec, generate
    from fleetserve.traces.write import write_trace

    path = write_trace(generate(WorkloadSpec(content="rag", duration_s=300, rate=3, seed=2, documents=10,
                                             doc_tokens=500, docs_per_request=2, input_tokens=50,
                                             output_tokens=30)), tmp_path / "rag.jsonl", "mooncake")
    one = analyze(path, replicas=1, cache_blocks=64)
    assert one["oracle_hit_rate"] >= max(v for v in one["strategy_hit_rate"].values() if v is not None)


def test_a_strategy_above_the_oracle_is_named():
    from fleetserve.analyze.report import _above_oracle

    rows = {"blind": {"prefixaware": {"hit_rate": 0.31}, "session": {"hit_rate": None}},
            "informed": {"kvaware": {"hit_rate": 0.2}}}
    (warning,) = _above_oracle(rows, 0.25)
    assert "blind prefixaware 0.310" in warning and "kvaware" not in warning
    assert _above_oracle(rows, 0.4) == []


def test_a_qwen_bailian_trace_is_analysed_with_its_conversations_as_sessions(tmp_path):
    """Alibaba's public Qwen traces (16-token ids) were refused: read as Mooncake blocks, their conversations
    share their history, and the session strategy has keys to act on."""
    from tests.traces.test_load_inputs import _bailian_rows

    path = tmp_path / "qwen_traceB_blksz_16.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in sorted(_bailian_rows(), key=lambda r: r["timestamp"])))
    out = analyze_json(str(path), "--replicas", "2")
    assert out["requests"] == 6 and out["format"] == "mooncake" and out["block_tokens"] == 512
    assert 0 < out["ideal_hit_rate"] < 1  # each second turn finds its first turn's two whole blocks
    assert out["strategy_hit_rate"]["session"] is not None, out["strategy_hit_rate"]
    r = fleetserve("analyze", str(path), "--block-size", "16")
    assert r.returncode == 2 and "512 tokens each" in said(r)
