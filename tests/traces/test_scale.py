from pathlib import Path

import numpy as np
import pytest

from fleetserve.traces.generate import WorkloadSpec, generate
from fleetserve.traces.load import load_trace
from fleetserve.traces.model import TraceRequest
from fleetserve.traces.scale import compress, scale_rate, scale_time, window
from tests.traces.test_generate import ideal

DATA = Path(__file__).parents[1] / "data"


def test_scale_time_stretches_and_compress_undoes_it():
    reqs = load_trace(DATA / "azure_code_sample.csv")
    slow = scale_time(reqs, 4.0)
    assert [r.arrival_s for r in slow] == [4.0 * r.arrival_s for r in reqs]
    assert [r.input_tokens for r in slow] == [r.input_tokens for r in reqs]
    back = compress(slow, 4.0)
    assert [r.arrival_s for r in back] == pytest.approx([r.arrival_s for r in reqs])


def test_scale_rate_multiplies_requests_over_the_same_span():
    reqs = load_trace(DATA / "azure_code_sample.csv")
    big = scale_rate(reqs, 100, seed=1)
    assert len(big) == 100 * len(reqs)
    assert big[0].arrival_s == reqs[0].arrival_s and big[-1].arrival_s == reqs[-1].arrival_s  # the very same span
    assert [r.arrival_s for r in big] == sorted(r.arrival_s for r in big)
    assert scale_rate(reqs, 100, seed=1) == big  # deterministic by seed
    half = scale_rate(reqs * 20, 0.5, seed=2)
    assert 0.35 * 20 * len(reqs) < len(half) < 0.65 * 20 * len(reqs)
    with pytest.raises(ValueError, match="positive"):
        scale_rate(reqs, 0)


def test_rate_scaled_copies_keep_the_reuse_structure_without_inflating_it():
    reqs = load_trace(DATA / "mooncake_sample.jsonl")
    tripled = scale_rate(reqs, 3, seed=0)
    assert len(tripled) == 3 * len(reqs)
    assert ideal(tripled) == pytest.approx(ideal(reqs), abs=0.02)
    chat = generate(WorkloadSpec.for_kind("chat", duration_s=120, seed=1))
    copies = scale_rate(chat, 2, seed=0)
    assert len({r.session for r in copies}) == 2 * len({r.session for r in chat})
    texts = {r.messages[0]["content"] for r in copies}
    assert any(t.startswith("[copy 1] ") for t in texts)


def test_window_rebases():
    reqs = load_trace(DATA / "mooncake_sample.jsonl")
    part = window(reqs, 10.0, 20.0)
    assert part and all(0 <= r.arrival_s < 10.0 for r in part)
    assert len(part) == sum(10.0 <= r.arrival_s < 20.0 for r in reqs)


def test_a_prompt_log_written_as_mooncake_keeps_its_prefixes(tmp_path):
    """It was written with empty hash ids: analyze refused it and its simulated hit rate fell from 0.70 to 0."""
    from fleetserve.traces.write import write_trace

    chat = generate(WorkloadSpec(content="chat", duration_s=120, rate=2, seed=9))
    path = write_trace(chat, tmp_path / "chat.jsonl", "mooncake")
    back = load_trace(path)
    assert len(back) == len(chat) and all(r.hash_ids for r in back)
    assert all(len(r.hash_ids) == -(-r.input_tokens // 512) for r in back)  # one id per 512 tokens, the last partial
    assert ideal(back) > 0.4  # turns of one conversation share their prefix, sessions their system prompt


def test_a_trace_without_a_clock_is_stamped_from_the_simulators_default_start(tmp_path):
    """A Mooncake trace written as Azure began at 18:00 (Azure's own epoch) while the same trace simulated directly
    starts at 10:00: cron floors and budgets read another hour of the day after the conversion."""
    from datetime import datetime

    from fleetserve.cli.analyze_commands import trace_scale
    from fleetserve.sim.setup import DEFAULT_START
    from fleetserve.traces.load import load_timed_trace

    src = tmp_path / "t.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
                   '{"timestamp": 5000, "input_length": 600, "output_length": 5, "hash_ids": [1, 3]}\n')
    out = tmp_path / "t.csv"
    trace_scale(str(src), str(out), time_scale=2.0, fmt="azure")
    loaded, start = load_timed_trace(str(out))
    assert start == datetime.fromisoformat(DEFAULT_START) and [r.arrival_s for r in loaded] == [0.0, 10.0]


def test_copies_fill_each_requests_own_stretch_of_the_timeline():
    """The last request's copies went into the gap after it (past the span), then into the gap before it, which
    then held twice the copies of any other gap."""
    from fleetserve.traces.model import TraceRequest

    reqs = [TraceRequest(float(t), 100, 10) for t in range(101)]  # one a second
    big = scale_rate(reqs, 50, seed=3)
    per_second = np.histogram([r.arrival_s for r in big], bins=100, range=(0, 100))[0]
    assert big[0].arrival_s == 0.0 and big[-1].arrival_s == 100.0
    # the edge requests' stretches are half as long (the span is kept), the rest spread evenly; the last second
    # held ~100 (two requests' copies) before
    assert per_second[-1] < 1.7 * np.median(per_second) and per_second[0] < 1.7 * np.median(per_second)
    assert np.percentile(per_second[1:-1], 90) < 1.3 * np.median(per_second)


def test_a_copy_of_list_content_tags_its_text_not_a_repr():
    """A copy's content was "[copy 1] [{'type': 'text', ...}]" (and "[copy 1] None" for a null first message)."""
    from fleetserve.traces.model import TraceRequest, stand_in_words

    parts = ({"role": "user", "content": [{"type": "text", "text": "hello there"}]},)
    null = ({"role": "assistant", "content": None}, {"role": "user", "content": "hi"})
    trace = [TraceRequest(float(i), 2, 4, messages=m) for i, m in enumerate((parts, null))]
    copies = [r for r in scale_rate(trace, 2.0, seed=1) if r not in trace]
    assert len(copies) == 2
    texts = sorted(r.text() for r in copies)
    assert texts == ["assistant: [copy 1] \nuser: hi\n", "user: [copy 1] hello there\n"]
    assert stand_in_words("a\u3000b") == ["a", "b"]  # the ideographic space separates words, it is not one


def test_an_azure_copy_is_stamped_in_utc_whatever_zone_its_start_is_given_in(tmp_path):
    from datetime import datetime, timedelta, timezone

    from fleetserve.traces.load import load_timed_trace
    from fleetserve.traces.model import TraceRequest
    from fleetserve.traces.write import write_trace

    paris = datetime(2026, 1, 5, 11, 0, tzinfo=timezone(timedelta(hours=1)))
    out = write_trace([TraceRequest(0.0, 10, 5), TraceRequest(2.0, 10, 5)], tmp_path / "t.csv", "azure", start=paris)
    _, start = load_timed_trace(str(out))
    assert (start.hour, start.minute) == (10, 0)  # 11:00 in Paris is 10:00 UTC (it was written as 11:00)


def test_a_conversion_that_cannot_be_written_says_so_without_warnings_about_the_file_first(tmp_path):
    """`trace scale AZURE --format prompts` printed the wall-clock warning about the file it would write, then the
    error that no file could be written."""
    from tests.helpers import fleetserve

    sample = Path(__file__).parents[1] / "data" / "azure_code_sample.csv"
    r = fleetserve("trace", "scale", str(sample), "--format", "prompts", "-o", str(tmp_path / "x.jsonl"))
    assert r.returncode == 2 and "a prompt log needs prompt text" in r.stderr and "warning:" not in r.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_copies_stay_beside_their_burst_and_an_idle_gap_stays_idle():
    """Bursts half an hour apart, scaled 3.5x: copies of a burst's last request had spread halfway into the gap
    after it (the Azure code trace kept 2 of its 13 empty minutes), and verify's idle windows became stray single
    requests that met a cold start."""
    bursts = [TraceRequest(start + i * 0.5, 100, 10) for start in (0.0, 1800.0, 3600.0) for i in range(60)]
    scaled = scale_rate(bursts, 3.5, seed=1)
    assert 3.3 * len(bursts) < len(scaled) < 3.7 * len(bursts)
    assert min(r.arrival_s for r in scaled) == 0.0 and max(r.arrival_s for r in scaled) == bursts[-1].arrival_s
    in_gaps = [r.arrival_s for r in scaled if 30.5 < r.arrival_s % 1800 < 1799]
    assert in_gaps == []  # within one inner half-stretch (2 x 0.25 s) of each burst's edge
