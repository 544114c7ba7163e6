"""One traced request, whatever the source format."""

from __future__ import annotations

import functools
import re
import zlib
from dataclasses import dataclass

import numpy as np

from fleetserve.router.features import content_text

MOONCAKE_BLOCK_TOKENS = 512
# the most requests a trace may become in memory (generated, rate-scaled, or read from a ServeGen rate file
# without a limit): ~1 KB each, and the simulator's ~25,000 per second make this a few minutes of work
MAX_REQUESTS = 5_000_000
# the longest span a trace may have: a year. Longer is a file that mixes relative and epoch stamps, or
# milliseconds and seconds (a row at 0 and one at 1767607200000 ms span 56 years), and the simulator's control
# loop would walk every second of it with requests outstanding
MAX_SPAN_S = 366 * 86400.0


def check_request_count(expected: float, what: str) -> None:
    """ValueError naming `what` (the option that asked for them) when `expected` requests exceed MAX_REQUESTS;
    before, such a run printed nothing for minutes, or died of a 1.8 TiB allocation."""
    if expected > MAX_REQUESTS:
        raise ValueError(f"{what} would make about {expected:,.0f} requests; at most {MAX_REQUESTS:,}")


def check_span(span_s: float, what: str) -> None:
    """ValueError naming `what` when arrivals would span more than MAX_SPAN_S (a year)."""
    if not span_s <= MAX_SPAN_S:
        days = span_s / 86400
        shown = f"{days:,.0f}" if days < 1e9 else f"{days:.3g}"  # a stamp of 1e300 gave a 300-digit count
        raise ValueError(f"{what} spans {shown} days between its first and last request; at most "
                         f"{MAX_SPAN_S / 86400:.0f} (relative and epoch timestamps, or milliseconds and seconds, "
                         "mixed in one file?)")


# scripts written without spaces between words (Han with its radicals and strokes, kana, Bopomofo, Yi, Thai,
# Lao, Tibetan, Myanmar, Khmer, the Tai scripts, Balinese, Javanese) and Hangul (spaced by words, but a BPE
# tokenizer gives it about a token per syllable), and full-width, enclosed and compatibility CJK forms and CJK
# punctuation: each character is a token of the stand-in tokenizer, as a BPE tokenizer gives such text about a
# token per character; by spaces alone a 20,000-character Chinese prompt was 2 tokens (and passed a context
# limit that refused 20,000 English words)
_UNSPACED = ("\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1100-\u11ff\u1780-\u17ff\u1950-\u19df\u1a20-\u1aaf"
             "\u1b00-\u1b7f\u2e80-\u2fff\u3001-\u33ff\u3400-\u4dbf\u4e00-\u9fff\ua000-\ua4cf\ua960-\ua97f"
             "\ua980-\ua9df\uaa80-\uaadf\uac00-\ud7ff\uf900-\ufaff\ufe10-\ufe1f\ufe30-\ufe6f\uff00-\uffef"
             "\U0001b000-\U0001b2ff\U0001f200-\U0001f2ff\U00020000-\U0003134f")
_WORD = re.compile(f"[{_UNSPACED}]|[^\\s{_UNSPACED}]+")
_HAS_UNSPACED = re.compile(f"[{_UNSPACED}]")


def stand_in_words(text: str) -> list[str]:
    """The stand-in tokenizer's tokens as text: words split by white space, and each character of the scripts
    above. Exactly `text.split()` for text without such characters (ASCII text takes that path at once)."""
    if text.isascii() or not _HAS_UNSPACED.search(text):
        return text.split()
    return _WORD.findall(text)


def stand_in_tokens(text: str) -> list[int]:
    """The word-level stand-in tokenizer for text prompts where no model tokenizer is at hand (the simulator's
    engine keys, and the hash ids of a prompt log written as Mooncake): one token per word (`stand_in_words`)."""
    return [zlib.crc32(w.encode()) % 32000 for w in stand_in_words(text)]


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # seconds after the trace start
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # Mooncake prefix blocks (equal id = equal prefix)
    session: str | None = None
    messages: tuple[dict, ...] | None = None  # prompt logs: the real text
    prompt: str | None = None

    def text(self) -> str | None:
        """A prompt log's prompt as one text (chat messages as `role: content` lines), or None."""
        if self.prompt:
            return self.prompt
        if self.messages:
            return "".join(f"{m.get('role')}: {content_text(m.get('content'))}\n" for m in self.messages)
        return None

    def token_ids(self, unique_seed: int = 0) -> list[int]:
        """Deterministic prompt tokens: each hash id stands for the same 512 tokens wherever it appears;
        without hash ids every request gets tokens of its own."""
        if self.hash_ids:
            blocks = np.concatenate([_block_tokens(h) for h in self.hash_ids])
            return blocks[: self.input_tokens].tolist()
        return _block_tokens(10**9 + unique_seed, self.input_tokens).tolist()


@functools.lru_cache(maxsize=65536)
def _block_tokens(seed: int, n: int = MOONCAKE_BLOCK_TOKENS) -> np.ndarray:
    arr = np.random.default_rng(seed).integers(0, 32000, n, dtype=np.int32)
    arr.flags.writeable = False
    return arr
