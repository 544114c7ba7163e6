from fleetserve.engine.textstream import TextStream

VOCAB = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "\n", 6: "EN", 7: "D", 8: "!"}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def run(ids, stop=()):
    stream = TextStream(decode, stop)
    parts = []
    for i in ids:
        parts.append(stream.push(i))
        if stream.stopped:
            break
    parts.append(stream.finish())
    return "".join(parts), stream


def test_plain_text_is_emitted_incrementally():
    stream = TextStream(decode)
    assert stream.push(1) == "Hel"
    assert stream.push(2) == "lo"
    assert stream.finish() == ""


def test_stop_string_is_cut_and_never_emitted():
    text, stream = run([1, 2, 6, 7, 3], stop=("END",))
    assert text == "Hello" and stream.stopped


def test_stop_string_split_across_tokens_is_held_back():
    stream = TextStream(decode, ("END",))
    emitted = stream.push(1) + stream.push(6)  # "HelEN": "EN" may be the start of "END"
    assert emitted == "Hel"
    assert stream.push(8) == "EN!"  # "HelEN!" can no longer become "END"
    assert stream.finish() == ""
    text, _ = run([1, 6, 8], stop=("END",))
    assert text == "HelEN!"


def test_incomplete_utf8_is_held():
    bytes_vocab = {1: b"\xc3", 2: b"\xa9", 3: b"x"}

    def dec(ids):
        return b"".join(bytes_vocab[i] for i in ids).decode("utf-8", errors="replace")

    stream = TextStream(dec)
    assert stream.push(1) == ""
    assert stream.push(2) == "é"
    assert stream.push(3) == "x"
