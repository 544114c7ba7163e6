"""Chained block keys: a block's key hashes its parent's key and its own token ids.

Equal keys mean equal prefixes up to and including the block, so a lookup walks the chain and stops at the
first miss. Keys are deterministic (sha256, never Python's hash()), namespaced by model id, model version,
dtype and a tenant salt, so the same prefix under two tenants never shares a key in any tier. Only a hash of
the salt ever enters a key.
"""

from __future__ import annotations

import hashlib
import struct
from array import array

KEY_BYTES = 8  # 64-bit keys: small in indexes and events, collisions negligible at fleet scale


def _field(value: str) -> str:
    """Escape the separator (and the escape) so joined fields split one way only: tenant "a\\0client:b" must not
    read as tenant "a" with client salt "b". Values without either character are unchanged (so are their keys)."""
    return value.replace("\\", "\\\\").replace("\0", "\\0")


def kv_salt(tenant: str | None = None, client_salt: str | None = None) -> str | None:
    """One salt from the two sources of separation, each in its own namespace.

    The tenant comes from the router (authenticated); `cache_salt` comes from the client body. A client salt
    "alpha" must never equal tenant "alpha", so each is prefixed, and a client salt under a tenant stays
    inside that tenant's namespace."""
    parts = []
    if tenant:
        parts.append("tenant:" + _field(tenant))
    if client_salt:
        parts.append("client:" + _field(client_salt))
    return "\0".join(parts) or None


def salt_digest(salt: str | None) -> bytes:
    """`salt` as made by kv_salt (already namespaced)."""
    return hashlib.sha256(salt.encode("utf-8", errors="surrogatepass")).digest()[:16] if salt else b""


def namespace_key(model: str, version: str = "1", dtype: str = "", salt: str | None = None) -> int:
    """The root of every chain for one model build and tenant."""
    h = hashlib.sha256(f"{_field(model)}\0{_field(version)}\0{_field(dtype)}".encode("utf-8", "surrogatepass"))
    h.update(salt_digest(salt))
    return int.from_bytes(h.digest()[:KEY_BYTES], "big")


def chain_keys(tokens: list[int] | tuple[int, ...], block_size: int, root: int = 0) -> list[int]:
    """Keys of the full blocks of `tokens` (a trailing partial block has no key: it cannot be shared)."""
    keys = []
    parent = root
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = array("q", tokens[start:start + block_size]).tobytes()
        digest = hashlib.sha256(struct.pack(">Q", parent) + block).digest()
        parent = int.from_bytes(digest[:KEY_BYTES], "big")
        keys.append(parent)
    return keys


def text_chunk_keys(text: str, chunk_chars: int, root: int = 0) -> list[int]:
    """Approximate keys for text when no tokenizer is at hand (about 4 characters per token)."""
    keys = []
    parent = root
    data = text.encode("utf-8", errors="surrogatepass")
    for start in range(0, len(data) - chunk_chars + 1, chunk_chars):
        digest = hashlib.sha256(struct.pack(">Q", parent) + data[start:start + chunk_chars]).digest()
        parent = int.from_bytes(digest[:KEY_BYTES], "big")
        keys.append(parent)
    return keys


def reusable_blocks(prompt_tokens: int, block_size: int) -> int:
    """The most whole blocks of a prompt an engine can find cached: it computes at least the prompt's last token
    (its logits start the answer), so a prompt of whole blocks reuses all but its last (vLLM, SGLang, ours)."""
    return max(0, prompt_tokens - 1) // block_size
