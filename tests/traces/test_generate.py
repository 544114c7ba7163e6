import numpy as np
import pytest

from fleetserve.traces import arrivals
from fleetserve.traces.generate import KINDS, WorkloadSpec, generate
from fleetserve.traces.load import load_trace
from fleetserve.traces.write import write_trace


def ideal(requests) -> float:
    seen, hits, total = set(), 0, 0
    for r in requests:
        hits += sum(h in seen for h in r.hash_ids)
        total += len(r.hash_ids)
        seen.update(r.hash_ids)
    return hits / total


@pytest.mark.parametrize("kind", list(KINDS))
def test_same_seed_same_workload_other_seed_other_workload(kind):
    spec = WorkloadSpec.for_kind(kind, duration_s=120, rate=2, seed=7)
    a, b = generate(spec), generate(spec)
    assert a == b and len(a) > 20
    assert generate(WorkloadSpec.for_kind(kind, duration_s=120, rate=2, seed=8)) != a
    assert all(len(r.hash_ids) == -(-r.input_tokens // 512) for r in a)
    assert [r.arrival_s for r in a] == sorted(r.arrival_s for r in a)


def test_independent_prompts_share_nothing_and_shared_content_does():
    assert ideal(generate(WorkloadSpec.for_kind("bursts", duration_s=300, seed=1))) == 0.0
    for kind in ("chat", "system-prompt", "rag"):
        assert ideal(generate(WorkloadSpec.for_kind(kind, duration_s=300, seed=1))) > 0.2, kind


def test_chat_turns_resend_the_conversation():
    reqs = generate(WorkloadSpec.for_kind("chat", duration_s=300, rate=3, turns=5, seed=2))
    sessions: dict[str, list] = {}
    for r in reqs:
        sessions.setdefault(r.session, []).append(r)
    multi = [turns for turns in sessions.values() if len(turns) >= 3]
    assert multi
    for turns in multi:
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt.arrival_s > prev.arrival_s
            assert nxt.messages[: len(prev.messages)] == prev.messages  # text: the whole history again
            full = prev.input_tokens // 512
            assert nxt.hash_ids[:full] == prev.hash_ids[:full]  # ids: the same prefix blocks
            assert nxt.messages[len(prev.messages)]["role"] == "assistant"


def test_system_prompts_are_shared_prefixes_with_zipf_popularity():
    reqs = generate(WorkloadSpec.for_kind("system-prompt", duration_s=600, rate=4, system_prompts=4,
                                          system_tokens=1024, seed=3))
    firsts = [r.hash_ids[:2] for r in reqs]  # 1024 system tokens: two whole blocks
    counts = sorted((firsts.count(f) for f in set(firsts)), reverse=True)
    assert len(counts) == 4 and counts[0] > 1.5 * counts[-1]
    by_system = {}
    for r in reqs:
        by_system.setdefault(r.messages[0]["content"], set()).add(r.hash_ids[:2])
    assert all(len(ids) == 1 for ids in by_system.values())  # same text, same ids


def test_rag_documents_come_back_in_later_prompts():
    reqs = generate(WorkloadSpec.for_kind("rag", duration_s=300, rate=2, documents=20, docs_per_request=2,
                                          doc_tokens=512, seed=4))
    docs = [r.messages[1]["content"].split("\n\n")[0] for r in reqs]  # the most relevant document first
    assert len(set(docs)) < len(docs) / 3


def test_arrival_processes_keep_their_rate_shape():
    rng = np.random.default_rng(0)
    day = arrivals.diurnal(1.0, 86400, rng, peak_to_trough=3.0, peak_at_s=14 * 3600)
    hourly = np.histogram(day, bins=24, range=(0, 86400))[0]
    assert abs(len(day) / 86400 - 1.0) < 0.02
    assert int(np.argmax(hourly)) in (13, 14) and int(np.argmin(hourly)) in (1, 2)
    assert 2.3 < hourly.max() / hourly.min() < 3.8
    b = arrivals.bursts(2.0, 3600, np.random.default_rng(1), factor=8, every_s=300, burst_s=20)
    per_10s = np.histogram(b, bins=360, range=(0, 3600))[0]
    assert 0.7 < len(b) / 7200 < 1.3
    assert per_10s.max() > 4 * per_10s.mean()
    # bursts as long as the gaps overlap, and overlapping bursts do not stack: the mean still holds (was 0.4 x)
    for seed in range(3):
        long = arrivals.bursts(2.0, 3600, np.random.default_rng(seed), factor=5, every_s=120, burst_s=300)
        assert 0.9 < len(long) / 7200 < 1.1
    flat = arrivals.poisson(2.0, 3600, np.random.default_rng(1))
    assert np.histogram(flat, bins=360, range=(0, 3600))[0].max() < 3 * 20


def test_a_diurnal_period_keeps_the_days_shape_and_azure_stamps_follow_its_clock(tmp_path):
    """A 1-hour --period peaked at its start (14 h mod 1 h), and the Azure stamps began at 18:00 while the curve
    counted from midnight: cron floors read off them missed the peak by four hours. The curve now runs on the
    clock the simulator replays a clockless trace on (from 10:00 UTC), and the Azure stamps follow it."""
    from fleetserve.cli.analyze_commands import trace_generate
    from fleetserve.traces.load import load_timed_trace

    hour = arrivals.diurnal(10.0, 3600, np.random.default_rng(0), period_s=3600, peak_to_trough=3.0)
    per_minute = np.histogram(hour, bins=60, range=(0, 3600))[0]
    smooth = np.convolve(per_minute, np.ones(7) / 7, mode="same")[3:-3]
    assert 5 <= int(np.argmax(smooth)) + 3 <= 15  # 4/24 of the way through: minute 10
    reqs = generate(WorkloadSpec.for_kind("diurnal", duration_s=86400, rate=0.05, seed=1), with_text=False)
    out = tmp_path / "day.csv"
    trace_generate("diurnal", str(out), fmt="azure", duration=86400, rate=0.05, seed=1)
    loaded, start = load_timed_trace(str(out))
    assert len(loaded) == len(reqs) and (start.hour, start.minute) == (10, 0)
    t = np.array([r.arrival_s for r in loaded])
    phase = np.angle(np.sum(np.exp(2j * np.pi * t / 86400)))  # the day's first harmonic: where it peaks
    assert abs(phase % (2 * np.pi) * 24 / (2 * np.pi) - 4) < 0.5  # 14:00, 4 h after the 10:00 start


def test_written_workloads_read_back(tmp_path):
    reqs = generate(WorkloadSpec.for_kind("chat", duration_s=60, rate=2, seed=5))
    hashes = load_trace(write_trace(reqs, tmp_path / "chat.jsonl", "mooncake"))
    assert [(r.hash_ids, r.input_tokens, r.session) for r in hashes] == [
        (r.hash_ids, r.input_tokens, r.session) for r in reqs]
    log = load_trace(write_trace(reqs, tmp_path / "chat-log.jsonl", "prompts"))
    assert [r.messages for r in log] == [r.messages for r in reqs]
    azure = load_trace(write_trace(reqs, tmp_path / "chat.csv", "azure"))
    assert [r.input_tokens for r in azure] == [r.input_tokens for r in reqs]
    assert azure[-1].arrival_s == pytest.approx(reqs[-1].arrival_s - reqs[0].arrival_s, abs=1e-3)


def test_bad_settings_name_the_setting():
    with pytest.raises(ValueError, match="allowed: diurnal, bursts, chat, system-prompt, rag"):
        WorkloadSpec.for_kind("weekly")
    with pytest.raises(ValueError, match="rate must be positive"):
        generate(WorkloadSpec.for_kind("chat", rate=0))
    with pytest.raises(ValueError, match="allowed: poisson, diurnal, bursts"):
        generate(WorkloadSpec.for_kind("chat", arrivals="spiky"))
    # bounds checked before any work: these ran for minutes into gigabytes
    with pytest.raises(ValueError, match="--turns must be at most 1,000"):
        generate(WorkloadSpec.for_kind("chat", turns=10_000))
    with pytest.raises(ValueError, match="--think x --turns makes chat's warm-up"):
        generate(WorkloadSpec.for_kind("chat", think_s=100_000))
    with pytest.raises(ValueError, match="--think x --turns makes chat's warm-up") as info:  # a short trace at a low
        generate(WorkloadSpec.for_kind("chat", think_s=1e12, duration_s=60))  # rate: --think, not --duration/--rate
    assert info.value.option == "--think"
    with pytest.raises(ValueError, match="20000 requests/s would make") as info:  # a --rate too high is the rate's,
        generate(WorkloadSpec.for_kind("chat", rate=20_000, duration_s=300))  # not the default --think's
    assert info.value.option == "--duration/--rate"
    with pytest.raises(ValueError, match="--input-tokens must be at most 16,777,216"):
        generate(WorkloadSpec.for_kind("diurnal", input_tokens=100_000_000))
    with pytest.raises(ValueError, match="--documents must be at most 100,000"):
        generate(WorkloadSpec.for_kind("rag", documents=10_000_000))
    with pytest.raises(ValueError, match="--burst-factor must be at most 1,000"):  # 894 GiB allocated
        generate(WorkloadSpec.for_kind("bursts", burst_factor=1e9))
    with pytest.raises(ValueError, match="drawn at the bursts' 1000 x"):
        generate(WorkloadSpec.for_kind("bursts", burst_factor=1000, rate=100, duration_s=86_400))
    with pytest.raises(ValueError, match="tokens each would carry"):  # a minute and more of work
        generate(WorkloadSpec.for_kind("rag", docs_per_request=16, doc_tokens=1_000_000))
    with pytest.raises(ValueError, match="in a prompt log"):  # 1.1 GB of text in 7 s
        generate(WorkloadSpec.for_kind("chat", system_tokens=16_000_000, duration_s=10, rate=1))
    with pytest.raises(ValueError, match="prompt text"):
        write_trace(generate(WorkloadSpec.for_kind("chat", duration_s=30), with_text=False), "/tmp/x", "prompts")


def test_chat_carries_its_rate_from_the_first_second():
    """Sessions started only from zero ramped up for a session's length, and their late turns fell past the end:
    `--duration 300 --rate 2` carried 445 and 425 requests for 600 (a black-box check). Sessions now start a
    warm-up earlier, so a short trace carries its rate on average (seed to seed it varies ~10 %: sessions)."""
    counts = [len(generate(WorkloadSpec.for_kind("chat", duration_s=300, rate=2, seed=s), with_text=False))
              for s in range(10)]
    assert 0.9 * 600 <= sum(counts) / len(counts) <= 1.1 * 600, counts
    first_minute = [r for r in generate(WorkloadSpec.for_kind("chat", duration_s=300, rate=2, seed=1),
                                        with_text=False) if r.arrival_s < 60]
    assert len(first_minute) > 0.7 * 120  # no ramp: later turns of sessions begun before zero are there too
    assert all(r.arrival_s >= 0 for r in first_minute)


def test_one_generated_workload_simulates_alike_in_every_format(tmp_path):
    """The Azure copy of a generated diurnal workload was stamped from midnight while its Mooncake copy ran from
    the simulator's 10:00: under a business-hours cron floor the same seed gave TTFT p95 1,057 ms in one format
    and 8,034 ms in the other. Both now run on one clock, and their reports agree."""
    from fleetserve.cli.analyze_commands import trace_generate
    from fleetserve.sim.run import simulate
    from fleetserve.sim.setup import SimOptions
    from fleetserve.spec.load import load_spec_data
    from fleetserve.traces.load import load_timed_trace

    spec = {"model": {"source": "catalog:llama-3.1-8b-instruct"}, "placement": {"instanceTypes": ["g6e.xlarge"]},
            "autoscaling": {"minReplicaCount": 0, "maxReplicaCount": 2, "pollingInterval": 30,
                            "cooldownPeriod": 300, "triggers": [{"metric": "concurrency", "target": 2}],
                            "schedules": [{"name": "lunch", "start": "0 12 * * 1-5", "end": "0 14 * * 1-5",
                                           "minReplicas": 2}]}}
    endpoint = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "d"},
                               "spec": spec}).endpoint
    reports = []
    for fmt, name in (("mooncake", "day.jsonl"), ("azure", "day.csv")):
        trace_generate("diurnal", str(tmp_path / name), fmt=fmt, duration=6 * 3600, rate=0.05, seed=3)
        requests, start = load_timed_trace(str(tmp_path / name))
        options = SimOptions(start=start.isoformat()) if start is not None else SimOptions()
        reports.append(simulate(endpoint, requests, options).report)
    mooncake, azure = reports  # the Azure copy has no hash ids and millisecond stamps: latencies differ a little
    assert mooncake["requests"] == azure["requests"] > 0 and mooncake["replicas_max"] == azure["replicas_max"]
    assert abs(mooncake["ttft_ms"]["p95"] - azure["ttft_ms"]["p95"]) < 0.02 * mooncake["ttft_ms"]["p95"]
    assert abs(mooncake["cost_usd"] - azure["cost_usd"]) < 0.01 * mooncake["cost_usd"]
