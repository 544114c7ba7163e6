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
    assert ask({"stream": True, "stream_options": {"include_usage": "yes"}}) is None  # likewise: not made valid
    assert ask({"stream": True, "stream_options": None})["stream_options"] == {"include_usage": True}  # null: none
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
    sglang = CHUNK.replace(b"]}", b'],"usage":null}')  # SGLang writes a null usage into every chunk
    assert strip.feed(sglang) == sglang
    spaced = b'data: {"choices": [], "usage": {"prompt_tokens": 3}}\n\n'  # json.dumps' default separators
    assert strip.feed(spaced) == b""
    mixed = CHUNK.replace(b"\n\n", b"\n\r\n")  # an LF line end, then a CRLF blank line: an event's end too
    assert strip.feed(mixed) == mixed  # it was held back to the end of the stream
    assert strip.feed(USAGE.replace(b"\n\n", b"\n\r\n")) == b""
    assert strip.feed(b"data: {}\r\n") == b""  # one CRLF is one line end, not a blank line
    assert strip.feed(b"\r\n") == b"data: {}\r\n\r\n"
    assert strip.feed(b'data: {"choices":[],"usa') == b""  # waits for the end of its event
    assert strip.flush() == b'data: {"choices":[],"usa'  # a stream cut short: relayed as it came
    from fleetserve.router.usage import MAX_HELD

    endless = b"data: " + b"x" * MAX_HELD  # no event end in sight: relayed, not held in memory to the end
    assert strip.feed(endless) == endless and strip.flush() == b""


class _Response:
    """An upstream SSE answer whose replica dies after `parts` (the relay's view of it)."""

    def __init__(self, parts):
        self.headers = [(b"content-type", b"text/event-stream")]
        self.status, self.complete, self.content_length = 200, False, None
        self._parts = list(parts)

    def header(self, name):
        return dict(self.headers).get(name)

    async def read(self):
        from fleetserve.router.upstream import UpstreamError

        if not self._parts:
            raise UpstreamError("reset")
        return self._parts.pop(0)


class _Responder:
    def __init__(self):
        self.body, self.client_gone = b"", False

    def start(self, status, headers, length):
        self.length = length

    def write(self, data):
        self.body += data

    async def drain(self):
        pass

    def end(self):
        pass


@pytest.mark.parametrize("strip_usage", [False, True])
def test_a_replica_dying_mid_event_leaves_the_client_events_it_can_parse(strip_usage):
    """The error event was written straight after a partial event: it landed on that event's data line and
    neither parsed. Then a partial event the client got was ended on its own (openai's client failed on it with
    a JSONDecodeError); now no partial event reaches the client: it waits for its end, and is dropped."""
    import asyncio
    from types import SimpleNamespace

    from fleetserve.router.relay import relay

    partial = b'data: {"id":"c","choices":[{"index":0,"te'
    attempt = SimpleNamespace(response=_Response([partial]), first=CHUNK,
                              backend=SimpleNamespace(url="u", draining=False))
    gw = SimpleNamespace(mark_unreachable=lambda *a: None, request_failed=lambda *a: None)
    responder = _Responder()
    assert asyncio.run(relay(gw, attempt, responder, [], None, strip_usage=strip_usage)) is False
    events = [e for e in responder.body.split(b"\n\n") if e]
    assert events[0] == CHUNK.rstrip(b"\n") and events[-1] == b"data: [DONE]"
    error = json.loads(events[-2][len(b"data: "):])
    assert "failed mid-stream" in error["error"]["message"]
    assert len(events) == 3  # the partial event never reached the client


def test_bodies_are_changed_exactly_and_stay_as_small_as_the_client_sent_them():
    """Re-encoding escaped every non-ASCII character (CJK text doubled, a body under the limit got a 413 from the
    engine) and wrote a 1e400 back as Infinity."""
    from fleetserve.router.rewrite import encoded, reencodable, spliced

    raw = '{"stream": true, "stream_options": {}, "user": "日本", "seed": 123456789012345678901234567890}'.encode()
    out = asking_usage("/v1/completions", json.loads(raw), raw)
    assert len(out) <= len(raw) + len(b'"include_usage":true') and "日本".encode() in out
    assert b"123456789012345678901234567890" in out
    huge = b'{"stream": true, "stream_options": {}, "top_p": 1e400}'
    assert reencodable(huge) is None and asking_usage("/v1/completions", {"stream": True, "stream_options": {}},
                                                      huge) is None
    assert encoded(reencodable(b'{"logit_bias": {"5": -Infinity}}')) == b'{"logit_bias":{"5":-Infinity}}'
    assert spliced(b'{ }', b'"a":1') == b'{"a":1}' and spliced(b'{"b":2}\n', b'"a":1') == b'{"b":2,"a":1}'


def test_whole_events_splits_after_the_last_ended_event_whatever_its_line_ends():
    from fleetserve.router.relay import whole_events

    assert whole_events(b"data: 1\n\ndata: 2\n\n") == (b"data: 1\n\ndata: 2\n\n", b"")
    assert whole_events(b'data: 1\n\ndata: {"a') == (b"data: 1\n\n", b'data: {"a')
    assert whole_events(b"data: 1\r\n\r\ndata: 2") == (b"data: 1\r\n\r\n", b"data: 2")
    assert whole_events(b"data: 1") == (b"", b"data: 1")
    # the usage stripper's event ends (any two line ends, mixed), and no unbounded holding
    assert whole_events(b"data: 1\n\r\ndata: 2") == (b"data: 1\n\r\n", b"data: 2")
    from fleetserve.router.usage import MAX_HELD

    endless = b"data: " + b"x" * (MAX_HELD + 1)
    assert whole_events(endless) == (endless, b"")
