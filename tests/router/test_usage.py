"""router/usage.py: streams asked to report usage for the learning policy, and the client's stream unchanged."""

import json

import pytest

from fleetserve.router.usage import UsageStripper, asking_usage

CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
USAGE = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[],'
         b'"usage":{"prompt_tokens":90,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":64}}}\n\n')
DONE = b"data: [DONE]\n\n"


def ask(body: dict, path="/v1/chat/completions", raw: bytes | None = None):
    out = asking_usage(path, body, raw if raw is not None else json.dumps(body).encode())
    return None if out is None else json.loads(out)


def test_a_stream_is_asked_for_its_usage_and_nothing_else_changes():
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True, "seed": 2**70}
    sent = ask(body)
    assert sent == {**body, "stream_options": {"include_usage": True}}  # a 70-bit seed survives the splice
    assert ask({"model": "m", "prompt": "x", "stream": True}, "/v1/completions")["stream_options"] == \
        {"include_usage": True}
    assert asking_usage("/v1/completions", {}, b"{}") is None  # not a stream
    assert ask({"stream": True}, "/v1/embeddings") is None
    assert ask({"stream": True, "stream_options": {"include_usage": True}}) is None  # the client asked itself
    assert ask({"stream": True, "stream_options": {"include_usage": False, "x": 1}})["stream_options"] == \
        {"include_usage": True, "x": 1}
    assert ask({"stream": True, "stream_options": "yes"}) is None  # the engine refuses it, naming it
    assert ask({"stream": "true"}) is None  # not a stream the engine would serve either


@pytest.mark.parametrize("sizes", [[10_000], [1, 7, 50, 3, 10_000], [len(CHUNK) + 5, 10_000]])
def test_the_usage_event_is_dropped_wherever_the_reads_cut_the_stream(sizes):
    stream = CHUNK + CHUNK + USAGE + DONE
    strip, out, at = UsageStripper(), b"", 0
    for size in sizes:
        out += strip.feed(stream[at:at + size])
        at += size
    out += strip.flush()
    assert out == CHUNK + CHUNK + DONE


def test_other_events_pass_as_they_come_whatever_their_line_endings():
    crlf = CHUNK.replace(b"\n\n", b"\r\n\r\n")
    strip = UsageStripper()
    assert strip.feed(crlf) == crlf  # a whole event passes at once: streaming stays streaming
    assert strip.feed(USAGE.replace(b"\n\n", b"\r\n\r\n")) == b""
    error = b'data: {"error":{"message":"x","usage":{}}}\n\n'  # has "usage" but is not the usage chunk
    assert strip.feed(error) == error
    assert strip.feed(b'data: {"choices":[],"usa') == b""  # waits for the end of its event
    assert strip.flush() == b'data: {"choices":[],"usa'  # a stream cut short: relayed as it came
