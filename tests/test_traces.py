from pathlib import Path

import pytest

from fleetserve.traces.load import TraceError, load_trace

TRACES = Path(__file__).parent / "data"


def test_mooncake_hash_ids_become_shared_token_blocks():
    reqs = load_trace(TRACES / "mooncake_sample.jsonl", limit=50)
    assert len(reqs) == 50 and reqs[0].arrival_s == 0.0
    with_ids = [r for r in reqs if r.hash_ids]
    a, b = with_ids[0], with_ids[1]
    assert len(a.token_ids()) == a.input_tokens
    common = 0
    for x, y in zip(a.hash_ids, b.hash_ids, strict=False):
        if x != y:
            break
        common += 1
    assert a.token_ids()[: common * 512] == b.token_ids()[: common * 512]  # equal ids: equal prefixes


def test_azure_csv_and_prompt_logs(tmp_path):
    reqs = load_trace(TRACES / "azure_code_sample.csv", limit=20)
    assert len(reqs) == 20 and reqs[0].arrival_s == 0.0 and reqs[0].input_tokens == 4808
    log = tmp_path / "log.jsonl"
    log.write_text('{"timestamp": 0.5, "messages": [{"role": "user", "content": "hello there"}], "session": "s1"}\n')
    (req,) = load_trace(log)
    assert req.session == "s1" and req.messages[0]["content"] == "hello there"


def test_bad_trace_names_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n')
    with pytest.raises(TraceError, match="bad.jsonl:2"):
        load_trace(bad)
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "none.jsonl")


def test_a_prompt_log_row_without_max_tokens_takes_what_an_engine_would_answer(tmp_path):
    """A completion without max_tokens stops at 16 tokens on every engine; the log's replay asked for 64."""
    log = tmp_path / "log.jsonl"
    log.write_text('{"timestamp": 0, "prompt": "hello there"}\n'
                   '{"timestamp": 1, "messages": [{"role": "user", "content": "hi"}]}\n'
                   '{"timestamp": 2, "prompt": "x", "max_tokens": 5}\n')
    assert [r.output_tokens for r in load_trace(log)] == [16, 64, 5]
