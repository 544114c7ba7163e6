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


def test_a_trace_written_to_a_file_is_whole_or_not_at_all_and_a_full_disk_is_said(tmp_path, monkeypatch):
    """Ctrl-C or a full disk mid-write left a shorter trace that loads as a valid one, over the file it replaced;
    -o /dev/full was a traceback."""
    from fleetserve.traces import write as write_module
    from fleetserve.traces.model import TraceRequest
    from fleetserve.traces.write import write_trace

    path = tmp_path / "t.jsonl"
    path.write_text("the trace that was there\n")
    requests = [TraceRequest(arrival_s=i, input_tokens=10, output_tokens=2, hash_ids=(i,)) for i in range(3)]

    def cut(reqs, f, fmt, epoch):
        f.write("{\"timestamp\": 0")
        raise KeyboardInterrupt

    monkeypatch.setattr(write_module, "_write", cut)
    with pytest.raises(KeyboardInterrupt):
        write_trace(requests, path, "mooncake")
    assert path.read_text() == "the trace that was there\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]
    monkeypatch.undo()
    write_trace(requests, path, "mooncake")
    assert len(path.read_text().splitlines()) == 3
    import os

    if os.path.exists("/dev/full"):
        from tests.helpers import fleetserve

        full = fleetserve("trace", "generate", "chat", "-o", "/dev/full")
        assert full.returncode == 2 and "--output: cannot write /dev/full" in full.stderr, full.stderr
        assert not os.path.isfile("/dev/full")  # written to as a device, never replaced by a file


def test_a_trace_written_to_a_fifo_reaches_its_one_reader(tmp_path):
    """The path check opened the FIFO to probe it: the reader saw an empty file and left, and the command then
    blocked for ever on a pipe nobody read."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    try:
        writer = subprocess.run([sys.executable, "-m", "fleetserve", "trace", "generate", "chat", "--duration", "60",
                                 "-o", str(fifo)], capture_output=True, text=True, timeout=120)
        out, _ = reader.communicate(timeout=60)
    finally:
        reader.kill()
    assert writer.returncode == 0, writer.stderr
    assert len(out.splitlines()) > 10 and all(line.startswith("{") for line in out.splitlines())
