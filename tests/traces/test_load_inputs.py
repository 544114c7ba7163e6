"""Trace files as users bring them: what loads (and replays as it happened) and what is refused naming the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetserve.traces.load import TraceError, load_trace

AZURE_ROWS = ["2023-11-16 18:15:46.6805900,100,10", "2023-11-16 18:15:47.1000000,200,20",
              "2023-11-16 18:15:49.0000000,300,30"]


def _azure(tmp_path, header="TIMESTAMP,ContextTokens,GeneratedTokens", rows=AZURE_ROWS, prefix="", name="t.csv"):
    path = tmp_path / name
    path.write_text(prefix + header + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def _times(requests):
    return [round(r.arrival_s, 6) for r in requests], [r.input_tokens for r in requests]


def test_azure_variants_load_as_the_canonical_file(tmp_path):
    canonical = _times(load_trace(_azure(tmp_path)))
    assert canonical == ([0.0, 0.41941, 2.31941], [100, 200, 300])
    variants = {
        "bom": _azure(tmp_path, prefix="\ufeff", name="bom.csv"),  # Excel
        "case and spaces": _azure(tmp_path, header="timestamp, contexttokens , GENERATEDTOKENS", name="c.csv"),
        "reordered rows": _azure(tmp_path, rows=AZURE_ROWS[::-1], name="r.csv"),
        # the same instants with offsets: 7 fractional digits used to cut the offset off
        "offsets": _azure(tmp_path, rows=["2023-11-16 19:15:46.6805900+01:00,100,10",
                                          "2023-11-16 18:15:47.1000000+00:00,200,20",
                                          "2023-11-16 17:15:49.0000000-01:00,300,30"], name="o.csv"),
        "mixed naive and aware": _azure(tmp_path, rows=["2023-11-16 18:15:46.6805900,100,10", AZURE_ROWS[1],
                                                        "2023-11-16T18:15:49Z,300,30"], name="m.csv"),
    }
    for name, path in variants.items():
        assert _times(load_trace(path)) == canonical, name


def test_mooncake_epoch_stamps_and_unsorted_rows_replay_from_zero(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("\n\ufeff".lstrip("\n") + '{"timestamp": 1700000002000, "input_length": 3, "output_length": 1}\n'
                    '\n{"timestamp": 1700000000000, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n')
    reqs = load_trace(path)
    assert [(r.arrival_s, r.input_tokens) for r in reqs] == [(0.0, 5), (2.0, 3)]


@pytest.mark.parametrize(("name", "text", "says"), [
    ("short.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100\n",
     "short.csv:2: 2 fields"),
    ("neg.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-5,1\n",
     "neg.csv:2: ContextTokens and GeneratedTokens must be from 0"),
    ("frac.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5.5,1\n",
     "frac.csv:2: ContextTokens and GeneratedTokens must be whole numbers, got '5.5'"),
    ("burst.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n-3,ChatGPT,5,1,6,API log\n",
     "burst.csv:2: Timestamp must be seconds from the trace start"),
    ("cols.csv", "time,in,out\n2023-11-16 18:15:46,5,1\n", "cols.csv:1: an Azure trace needs the columns"),
    ("date.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n", "date.csv:2: TIMESTAMP 'yesterday'"),
    ("nan.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": NaN, "input_length": 5, '
                  '"output_length": 1}\n', "nan.jsonl:2: timestamp must be a finite number"),
    ("inf.jsonl", '{"timestamp": Infinity, "input_length": 5, "output_length": 1}\n', "inf.jsonl:1: timestamp"),
    ("negin.jsonl", '{"timestamp": 0, "input_length": -5, "output_length": 1}\n', "negin.jsonl:1: input_length"),
    ("first.jsonl", "{not json\n", "first.jsonl:1: not JSON"),
    ("num.jsonl", "42\n", "num.jsonl:1: expected a JSON object"),
    ("ts.jsonl", '{"timestamp": "abc", "prompt": "hi"}\n', "ts.jsonl:1: timestamp must be a finite number"),
    ("msgs.jsonl", '{"messages": ["hi"]}\n', "msgs.jsonl:1: messages must be a non-empty list of objects"),
    ("prompt.jsonl", '{"prompt": 123}\n', "prompt.jsonl:1: prompt must be a non-empty string"),
    ("max.jsonl", '{"prompt": "hi", "max_tokens": -4}\n', "max.jsonl:1: max_tokens must be a whole number from 1"),
    ("maxc.jsonl", '{"prompt": "hi", "max_completion_tokens": 0}\n', "maxc.jsonl:1: max_completion_tokens must be"),
    # a mistyped message became a 1-token prompt
    ("c42.jsonl", '{"messages": [{"role": "user", "content": 42}]}\n',
     "c42.jsonl:1: messages.0..content: must be a string or a list of text parts"),
    ("cobj.jsonl", '{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": {"type": "text"}}]}\n',
     "cobj.jsonl:1: messages.1..content: must be a string or a list of text parts"),
    ("cpart.jsonl", '{"messages": [{"role": "user", "content": ["hi"]}]}\n', "cpart.jsonl:1: messages.0..content"),
    ("nolen.jsonl", '{"timestamp": 0, "input_length": 5}\n', "nolen.jsonl:1: output_length is missing"),
    ("ctext.jsonl", '{"messages": [{"role": "user", "content": [{"type": "text", "text": 123}]}]}\n',
     "ctext.jsonl:1: messages.0..content.0..text: must be a string"),
    ("cnotext.jsonl", '{"messages": [{"role": "user", "content": [{"type": "text"}]}]}\n', "cnotext.jsonl:1: messages"),
    ("cnull.jsonl", '{"messages": [{"role": "user", "content": null}]}\n',
     "cnull.jsonl:1: messages.0..content: is required for a user message"),
    ("norole.jsonl", '{"messages": [{"content": "hi"}]}\n',
     "norole.jsonl:1: messages.0..role: is required; allowed values: system, developer, user"),
    # what the engines refuse (only text parts; roles they know), so a replay would fail where the simulator passed
    ("cimage.jsonl", '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}\n',
     "cimage.jsonl:1: messages.0..content.0..type: only text content parts are supported"),
    ("crole.jsonl", '{"messages": [{"role": "bot", "content": "hi"}]}\n', "crole.jsonl:1: messages.0..role: got"),
    ("sname.jsonl", '{"messages": [{"role": "user", "name": "\\ud800", "content": "x"}]}\n', "sname.jsonl:1: holds"),
    ("both.jsonl", '{"prompt": "hello", "messages": [{"role": "user", "content": 42}]}\n',
     "both.jsonl:1: has both messages and prompt"),
    ("surrogate.jsonl", '{"prompt": "hi \\ud800 there"}\n', "surrogate.jsonl:1: holds .*not Unicode text"),
    # one id per 512-token block: 5,000 tokens under one id gave hit rates above the ideal, 10 under 100 ids none
    ("ids.jsonl", '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}\n'
                  '{"timestamp": 1, "input_length": 5000, "output_length": 1, "hash_ids": [1]}\n',
     "ids.jsonl:2: hash_ids has 1 id, but input_length 5000 is 10 Mooncake blocks of 512 tokens"),
    # a trace hashed in 16-token blocks (as some engines' own traces are) was refused without saying why
    ("ids16.jsonl", '{"timestamp": 0, "input_length": 64, "output_length": 1, "hash_ids": [1, 2, 3, 4]}\n',
     "is 1 Mooncake block of 512 tokens .one id per block.; these ids stand for ~16 tokens each"),
    # said "must be a finite number, got None" where the other fields say what is missing
    ("nostamp.jsonl", '{"input_length": 64, "output_length": 1, "hash_ids": [1]}\n',
     "nostamp.jsonl:1: timestamp is missing (a finite number)"),
])
def test_unreadable_rows_are_refused_naming_file_and_line(tmp_path, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=says.replace("(", r"\(").replace(")", r"\)")):
        load_trace(path)


def test_not_utf8_text_is_named(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1 \xff\n")
    with pytest.raises(TraceError, match="latin1.csv:2 .byte 25 of the line.: not UTF-8 text"):
        load_trace(path)
    with pytest.raises(TraceError, match="is a directory"):
        load_trace(tmp_path, fmt="mooncake")


def test_a_prompt_log_gives_every_request_a_timestamp_or_none(tmp_path):
    """A row without one was put at 0 s, ahead of every timed request; a log with none replays in file order."""
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"timestamp": 5, "prompt": "a b c"}\n{"prompt": "d e f"}\n{"timestamp": 10, "prompt": "g"}\n')
    with pytest.raises(TraceError, match="mixed.jsonl:2: timestamp is missing, while .*mixed.jsonl:1 has one"):
        load_trace(path)
    path.write_text('{"prompt": "a b c"}\n{"prompt": "d e f"}\n')
    assert [r.prompt for r in load_trace(path)] == ["a b c", "d e f"]


@pytest.mark.parametrize("rows,message", [
    ([[1, 1]], "id 1 comes twice in this prompt"),
    ([[1, 2], [4, 2]], "id 2 comes after 1 in an earlier request and after 4 here"),
    ([[1, 2], [2]], "id 2 comes after 1 in an earlier request and at the start of the prompt here"),
])
def test_mooncake_ids_must_be_prefix_chains(tmp_path, rows, message):
    """An id names its block and the prefix before it: [1, 1] made analyze's oracle 0.5 over an ideal of 0."""
    import json

    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(ids), "output_length": 1,
                                        "hash_ids": ids}) + "\n" for i, ids in enumerate(rows)))
    with pytest.raises(TraceError, match=message):
        load_trace(path)


def test_a_prompt_logs_length_is_counted_as_the_simulator_and_the_writers_count_it(tmp_path):
    """Characters / 4 on load, a word each in the simulator and the Mooncake writer: the same log written as Azure
    came out a third longer than written as Mooncake."""
    import json

    from fleetserve.traces.load import load_trace
    from fleetserve.traces.write import write_trace

    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"timestamp": 0, "messages": [
        {"role": "system", "content": "You are a careful assistant with a long preamble " * 20},
        {"role": "user", "content": "explain prefix caching in vLLM"}], "max_tokens": 20}) + "\n")
    (req,) = load_trace(log)
    assert req.input_tokens == len(req.text().split())
    write_trace([req], tmp_path / "m.jsonl", "mooncake")
    write_trace([req], tmp_path / "a.csv", "azure")
    (mooncake,), (azure,) = load_trace(tmp_path / "m.jsonl"), load_trace(tmp_path / "a.csv")
    assert mooncake.input_tokens == azure.input_tokens == req.input_tokens


def test_message_content_in_the_list_form_or_none_counts_its_text_only():
    from fleetserve.traces.model import TraceRequest

    req = TraceRequest(0.0, 1, 1, messages=(
        {"role": "user", "content": [{"type": "text", "text": "hello world"}, {"type": "image_url", "image_url": {}}]},
        {"role": "assistant", "content": None}))
    assert req.text() == "user: hello world\nassistant: \n"


def test_the_newer_completion_limit_counts(tmp_path):
    """`max_completion_tokens` (OpenAI's name since max_tokens was deprecated for chat) was ignored: 64 tokens."""
    path = tmp_path / "log.jsonl"
    path.write_text('{"timestamp": 0, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 50}\n'
                    '{"timestamp": 1, "prompt": "hi", "max_tokens": 7, "max_completion_tokens": 9}\n'
                    '{"timestamp": 2, "messages": [{"role": "assistant", "content": null, "tool_calls": []}, '
                    '{"role": "user", "content": [{"type": "text", "text": "a b"}]}]}\n')
    assert [r.output_tokens for r in load_trace(path)] == [50, 9, 64]


def test_text_without_spaces_counts_a_token_per_character(tmp_path):
    """A 20,000-character Chinese prompt was 2 stand-in tokens (split on spaces): it passed a context limit that
    refused 20,000 English words, 10,000 x under analyze's real tokenizer."""
    from fleetserve.sim.workload import build_workload

    path = tmp_path / "cjk.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "messages": [{"role": "user", "content": "请" * 20000}]},
                               ensure_ascii=False) + "\n"
                    + json.dumps({"timestamp": 1, "prompt": "hello 世界 abc中文def"}, ensure_ascii=False) + "\n")
    cjk, mixed = load_trace(path)
    assert cjk.input_tokens == 20001  # "user:" and each character
    assert mixed.input_tokens == 7  # hello 世 界 abc 中 文 def
    work = build_workload([cjk, mixed], 16, informed=False)
    assert [w.prompt for w in work] == [20001, 7] and len(work[0].engine_keys) == 20001 // 16
    from fleetserve.traces.model import stand_in_words

    for script in ("ㄅㄆㄇㄈ", "⺀⺁⼀⼁", "㈠㈡㍿㋐", "ཀཁགང", "ꀀꀁꀂꀃ", "ꦄꦅꦆꦇ", "ᬅᬆᬇᬈ",
                   "\U0001b001\U0001b002\U0001f200\U0001f201"):
        assert len(stand_in_words(f"a {script} b")) == 6, script  # Bopomofo, CJK radicals, enclosed and
        # compatibility CJK, Tibetan, Yi, Javanese, Balinese, kana supplement and enclosed ideographs


def test_a_span_of_absurd_length_is_said_in_a_few_digits(tmp_path):
    path = tmp_path / "far.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                    '{"timestamp": 1e300, "input_length": 5, "output_length": 1}\n')
    with pytest.raises(TraceError, match=r"spans 1.16e\+292 days between"):
        load_trace(path)


def test_a_mooncake_trace_in_seconds_is_said_to_be_read_as_milliseconds(tmp_path):
    """Seconds in Mooncake's millisecond field load as a rate a thousand times the real one; every figure is an
    overload's. The unit is the writer's: said, with the conversion, and the file is read as the format says."""
    from fleetserve.traces.load import load_trace, millisecond_warning
    from tests.helpers import fleetserve

    def trace(step: float, n: int = 40) -> Path:
        path = tmp_path / f"step{step}x{n}.jsonl"
        path.write_text("".join(json.dumps({"timestamp": i * step, "input_length": 600, "output_length": 8,
                                            "hash_ids": [0, i + 1]}) + "\n" for i in range(n)))
        return path

    seconds, millis = trace(0.25), trace(250)
    said = millisecond_warning(load_trace(seconds), "mooncake")
    assert said.startswith("40 requests in 0.00975 s is 4,000 requests/s") and "--time 1000" in said
    assert millisecond_warning(load_trace(millis), "mooncake") is None
    assert millisecond_warning(load_trace(trace(0.25, 5)), "mooncake") is None  # too few to tell a rate
    spec = str(Path(__file__).parents[2] / "examples" / "quickstart.yaml")
    result = fleetserve("simulate", spec, "--trace", str(seconds), "--json")
    assert result.returncode == 0 and "4,000 requests/s: Mooncake timestamps are milliseconds" in result.stderr
    assert "requests/s" not in fleetserve("simulate", spec, "--trace", str(millis), "--json").stderr


def test_session_keys_are_text_and_anything_else_is_refused(tmp_path):
    """Session 0 fell out as "no key" where a test of truth read it, a list or an object gave session routing no
    key at all under session's name, and `bench replay` crashed on a number."""
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "prompt": "hi", "session": s}) + "\n"
                            for i, s in enumerate((0, 1, "a", None, ""))))
    assert [r.session for r in load_trace(path)] == ["0", "1", "a", None, None]  # an empty field is no session
    for bad in ([0], {"a": 1}, True, 1.5):
        path.write_text(json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1, "session": bad}) + "\n")
        with pytest.raises(TraceError, match=r"s.jsonl:1: session must be a string or a whole number"):
            load_trace(path)


def test_an_agent_log_with_tool_calls_in_assistant_turns_loads(tmp_path):
    """The engines' refusal of tool calls in the history reached the trace loader: agent logs, which vLLM and
    SGLang fleets answer, were refused."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    log = tmp_path / "agent.jsonl"
    log.write_text(json.dumps({"messages": [{"role": "user", "content": "weather?"},
                                            {"role": "assistant", "content": None, "tool_calls": [call]},
                                            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}) + "\n")
    assert len(load_trace(log)) == 1


def test_limit_counts_requests_not_lines(tmp_path):
    """Two blank lines first, --limit 3 took one request of a JSON-lines file (an Azure CSV's limit counted
    requests already)."""
    row = '{"timestamp": %d, "input_length": 10, "output_length": 2}\n'
    path = tmp_path / "blank.jsonl"
    path.write_text("\n\n" + "".join(row % (i * 1000) for i in range(5)))
    assert len(load_trace(path, limit=3)) == 3
    assert len(load_trace(path)) == 5


@pytest.mark.parametrize("ids,says", [("[-1]", "0 or more, got -1"), ("0", "list of integers"),
                                      ('""', "list of integers"), ("false", "list of integers")])
def test_hash_ids_that_are_no_list_of_block_ids_are_refused(tmp_path, ids, says):
    """A negative id's copy under rate scaling landed on another block's id; `0`, `""` and `false` had read as
    "no ids" while `5` was refused."""
    path = tmp_path / "ids.jsonl"
    path.write_text(f'{{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": {ids}}}\n')
    with pytest.raises(TraceError, match=says):
        load_trace(path)


@pytest.mark.parametrize("stamp", ["9999-12-31 23:59:58.0000000", "0001-01-01 00:00:00.0000000"])
def test_azure_stamps_outside_the_years_start_allows_are_refused(tmp_path, stamp):
    path = _azure(tmp_path, rows=[stamp + ",100,10"])
    with pytest.raises(TraceError, match=r"t.csv:2: .*the year must be within 1970..9000"):
        load_trace(path)


@pytest.mark.parametrize("row", ["2023-11-16 18:15:46.6805900,100", "2023-11-16 18:15:46.6805900,100,10,7"])
def test_an_azure_row_of_another_width_than_its_header_is_refused(tmp_path, row):
    """A short row was refused and a long one (a comma inside a value, another file's row) read as if whole."""
    path = _azure(tmp_path, rows=[row])
    with pytest.raises(TraceError, match=r"t.csv:2: \d fields; the header has 3"):
        load_trace(path)


def test_gzip_compressed_traces_load_as_their_text(tmp_path):
    """Public traces are often published compressed (.jsonl.gz, .csv.gz); one was refused as "not UTF-8 text".
    A gzip file loads as the text inside it, whatever its name; one cut short is named as such."""
    import gzip
    import shutil

    plain = _azure(tmp_path)
    packed = tmp_path / "azure.csv.gz"
    with open(plain, "rb") as src, gzip.open(packed, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert _times(load_trace(packed)) == _times(load_trace(plain))
    shared = Path(__file__).parents[1] / "data" / "mooncake_synthetic_trace.jsonl"
    mooncake = tmp_path / "mooncake"  # no suffix at all: the bytes say what it is
    mooncake.write_bytes(gzip.compress(shared.read_bytes()[:200_000]))
    whole = [r for r in load_trace(shared, limit=50)]
    assert [(r.arrival_s, r.input_tokens, r.hash_ids) for r in load_trace(mooncake, limit=50)] == \
        [(r.arrival_s, r.input_tokens, r.hash_ids) for r in whole]
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(shared.read_bytes()[:200_000])[:5_000])
    with pytest.raises(TraceError, match="cut.jsonl.gz: a gzip file that cannot be decompressed"):
        load_trace(cut)
    bad = tmp_path / "latin1.csv.gz"
    bad.write_bytes(gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1 \xff\n"))
    with pytest.raises(TraceError, match="latin1.csv.gz:2 .byte 25 of the line.: not UTF-8 text"):
        load_trace(bad)


def test_a_device_is_not_said_to_be_missing():
    """`--trace /dev/null` said "does not exist"."""
    with pytest.raises(TraceError, match="/dev/null is not a regular file"):
        load_trace("/dev/null")


@pytest.mark.parametrize(("name", "text", "column", "line"), [
    ("empty.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [7]}\n'
                    '{"timestamp": 1, "input_length": 0, "output_length": 3, "hash_ids": []}\n', "input_length", 2),
    ("empty.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,12,3\n"
                  "2023-11-16 18:15:47.6805900,0,3\n", "ContextTokens", 3),
    ("burst.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                  "0,ChatGPT,0,0,0,API log\n1.5,ChatGPT,12,3,15,API log\n", "Request tokens", 2),
])
def test_an_empty_prompt_is_left_out_and_said_not_a_refusal_of_the_file(tmp_path, name, text, column, line):
    """One row with an empty prompt (which no engine serves; it had been simulated as a request, then refused)
    refused a whole week of Azure traffic: it is left out, counted in the trace's notes."""
    from fleetserve.traces.load import read_trace

    path = tmp_path / name
    path.write_text(text)
    read = read_trace(path)
    assert [(r.input_tokens, r.output_tokens) for r in read.requests] == [(5, 1) if "jsonl" in name else (12, 3)]
    assert read.notes == (f"1 row with {column} 0 left out (an empty prompt is no request an engine serves; the "
                          f"first at {path}:{line})",)
    lines = text.splitlines()
    only = tmp_path / f"only-{name}"  # the empty row alone (under its header): no request is left
    only.write_text("\n".join(lines[line - 1:line] if "jsonl" in name else [lines[0], lines[line - 1]]) + "\n")
    with pytest.raises(TraceError, match="no requests .1 row with"):
        load_trace(only)


def test_token_counts_written_as_whole_floats_load(tmp_path):
    """pandas writes a count column as 100.0 once it held a gap: refused as 'not whole numbers'."""
    path = tmp_path / "floats.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,100.0,1e1\n")
    (r,) = load_trace(path)
    assert (r.input_tokens, r.output_tokens) == (100, 10)


def test_burstgpt_loads_with_its_failures_and_models_said(tmp_path):
    """BurstGPT's CSV (seconds from the start, Request/Response tokens) read as an Azure file missing its
    columns; it is a format of its own, and what it cannot say the notes do."""
    from fleetserve.traces.load import detect_format, read_trace

    path = tmp_path / "BurstGPT_1.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\r\n"
                    "5,ChatGPT,1155,178,1333,Conversation log\r\n8,GPT-4,400,0,400,API log\r\n"
                    "12.5,ChatGPT,300,20,320,API log\r\n")
    assert detect_format(path) == "burstgpt"
    read = read_trace(path)
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in read.requests] == [
        (0.0, 1155, 178), (3.0, 400, 0), (7.5, 300, 20)]
    assert read.start is None  # no wall clock in the file: simulated from the default start
    assert read.notes[0].startswith("1 of 3 requests has Response tokens 0 (BurstGPT logs a failed request so)")
    assert read.notes[1] == "the trace mixes models (ChatGPT: 2, GPT-4: 1): all are replayed against the spec's " \
                            "one model"
    assert len(load_trace(path, limit=2)) == 2


def test_a_csv_of_no_known_layout_names_both_layouts(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("time,prompt_len,completion_len\n0,5,1\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    said = str(info.value)
    assert "the header has time, prompt_len, completion_len" in said
    assert "Azure's TIMESTAMP, ContextTokens, GeneratedTokens" in said and "BurstGPT's Timestamp" in said


def test_a_prompt_log_without_token_limits_says_what_it_assumed(tmp_path):
    from fleetserve.traces.load import read_trace

    path = tmp_path / "log.jsonl"
    path.write_text('{"timestamp": 0, "messages": [{"role": "user", "content": "hi"}]}\n'
                    '{"timestamp": 1, "prompt": "hello"}\n'
                    '{"timestamp": 2, "prompt": "hello", "max_tokens": 5}\n')
    read = read_trace(path)
    assert [r.output_tokens for r in read.requests] == [64, 16, 5]
    assert read.notes == ("2 of 3 requests carry no max_tokens: their output length is assumed, 1 chat request as "
                          "64 tokens and 1 completion as 16 tokens (every engine's default) (give max_tokens to each "
                          "line for the lengths the log saw)",)


def test_mooncake_rows_without_ids_are_noted_by_the_loader(tmp_path):
    from fleetserve.traces.load import read_trace

    path = tmp_path / "ids.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                    '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": []}\n')
    assert read_trace(path).notes == ("1 of 2 requests carry no hash_ids: their prompts are counted as blocks no "
                                      "other request shares (all misses)",)
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1}\n')
    assert read_trace(path).notes[0].startswith("no request carries hash_ids (1 request)")


def _bailian_rows():
    """Alibaba's Qwen Bailian layout: seconds, 16-token ids, turns linked by parent_chat_id; a turn's prompt holds
    its parent's prompt (here 1,100 tokens: 68 whole ids and a partial one) and new text."""
    rows, next_id = [], 0

    def ids(n):
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    for conv in range(3):
        first = ids(69)  # ceil(1100 / 16)
        rows.append({"chat_id": conv * 10, "parent_chat_id": -1, "timestamp": 10.5 * conv, "input_length": 1100,
                     "output_length": 50, "type": "text", "turn": 1, "hash_ids": first})
        second = first[:68] + ids(60)  # the parent's whole blocks, then this turn's: 2,048 tokens, 128 ids
        rows.append({"chat_id": conv * 10 + 1, "parent_chat_id": conv * 10, "timestamp": 10.5 * conv + 4.25,
                     "input_length": 2048, "output_length": 20, "type": "search", "turn": 2, "hash_ids": second})
    return rows


def test_a_qwen_bailian_trace_loads_as_mooncake_blocks_with_its_conversations_as_sessions(tmp_path):
    """Its 16-token ids had been refused ("these ids stand for ~16 tokens each: ... must be re-hashed in 512-token
    blocks"): the public Qwen traces could not be used without a script of one's own."""
    import json

    from fleetserve.traces.load import detect_format, read_trace

    path = tmp_path / "qwen_traceA_blksz_16.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in sorted(_bailian_rows(), key=lambda r: r["timestamp"])))
    assert detect_format(path) == "bailian"
    read = read_trace(path)
    assert read.notes == () and len(read.requests) == 6
    by_time = {r.arrival_s: r for r in read.requests}
    first, second = by_time[10.5], by_time[14.75]  # seconds, not milliseconds
    assert (first.session, second.session) == ("chat-10", "chat-10")
    assert len(first.hash_ids) == 3 and len(second.hash_ids) == 4  # ceil(1100 / 512), 2048 / 512
    assert second.hash_ids[:2] == first.hash_ids[:2]  # the 1,024 tokens of whole blocks they share
    assert second.hash_ids[2] != first.hash_ids[2]  # 1,024..1,100 shared, the rest not: a block apart
    others = {r.hash_ids[0] for r in read.requests if r.session != "chat-10"}
    assert first.hash_ids[0] not in others and len(others) == 2  # no conversation shares another's blocks


def test_a_bailian_row_whose_ids_are_not_16_token_blocks_is_refused(tmp_path):
    import json

    row = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 100, "output_length": 5,
           "hash_ids": [1, 2]}
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(TraceError, match="hash_ids has 2 ids, but input_length 100 takes 6 or 7 .a Qwen Bailian"):
        load_trace(path)
    path.write_text(json.dumps({**row, "hash_ids": list(range(6))}) + "\n")  # whole blocks only: 6 of 16 tokens
    (r,) = load_trace(path)
    assert len(r.hash_ids) == 1  # its 100 tokens are one Mooncake block


def test_bailian_turns_join_their_conversation_whatever_the_file_order(tmp_path):
    import json

    from fleetserve.traces.load import read_trace

    def row(chat, parent, ts):
        return {"chat_id": chat, "parent_chat_id": parent, "timestamp": ts, "input_length": 16, "output_length": 1,
                "hash_ids": [chat]}

    # the third turn listed first, then the second, then the first; a cycle (7 <-> 8); a parent never listed (9)
    rows = [row(3, 2, 2.0), row(2, 1, 1.0), row(1, -1, 0.0), row(7, 8, 3.0), row(8, 7, 4.0), row(5, 9, 5.0)]
    path = tmp_path / "b.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sessions = [r.session for r in read_trace(path).requests]  # in arrival order: 1, 2, 3, 7, 8, 5
    assert sessions[:3] == ["chat-1"] * 3
    assert sessions[3] == sessions[4] and sessions[5] == "chat-9"


def test_limit_counts_the_requests_kept_and_a_row_left_out_is_still_checked(tmp_path):
    """--limit 4 gave 1 request where 3 rows before it were left out; a left-out row's bad fields passed."""
    import json

    rows = [{"timestamp": i, "input_length": 0 if i < 3 else 600, "output_length": 1, "hash_ids": [] if i < 3 else
             [i, 100 + i]} for i in range(10)]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(load_trace(path, limit=4)) == 4
    csv_path = tmp_path / "a.csv"
    csv_path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:0{i}.0000000,{0 if i < 3 else 10},1\n" for i in range(10)))
    assert len(load_trace(csv_path, limit=4)) == 4
    rows[1]["output_length"] = -5
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TraceError, match="m.jsonl:2: output_length must be a whole number"):
        load_trace(path)


def test_a_burstgpt_header_missing_a_column_is_named_as_burstgpt(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("Timestamp,Model,Request tokens\n1,A,10\n")
    with pytest.raises(TraceError, match="a BurstGPT trace needs the columns Timestamp, Request tokens, Response"):
        load_trace(path)
