"""Incremental detokenisation with stop strings: emit only text that can no longer change or be cut."""

from __future__ import annotations


class TextStream:
    """Feeds token ids, yields safe text deltas, and reports when a stop string has appeared.

    Text is held back while it ends in an incomplete UTF-8 sequence or could be the start of a stop string;
    the stop string itself is never emitted (OpenAI semantics).
    """

    def __init__(self, decode, stop: tuple[str, ...] = ()):
        self._decode = decode
        self._stop = stop
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._ids: list[int] = []
        self._emitted = 0
        self.stopped = False
        self.text = ""

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self._ids.append(token_id)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""  # wait for the rest of a multi-byte character
        self.text = text
        if self._stop:
            start = max(0, self._emitted - self._holdback)
            cut = min((i for i in (text.find(s, start) for s in self._stop) if i >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                self.text = text[:cut]
                return self._take(cut)
        return self._take(self._safe_end(text))

    def _safe_end(self, text: str) -> int:
        """Length of the text that cannot turn into the start of a stop string."""
        for k in range(min(len(text), self._holdback), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._stop):
                return len(text) - k
        return len(text)

    def finish(self) -> str:
        """The held-back tail once generation ends without a stop string."""
        if self.stopped:
            return ""
        self.text = self._decode(self._ids)
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        delta = self.text[self._emitted : upto]
        self._emitted = upto
        return delta
