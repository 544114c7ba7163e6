"""API keys to tenants. Keys are stored as sha256 hex digests only; the tenant travels to the engines as
the KV cache salt (header x-fleetserve-tenant, set by the router, never trusted from clients)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from fleetserve.api.errors import APIError
from fleetserve.api.internal import HEADER_TEXT, NO_TENANT


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


DIGEST = re.compile(r"[0-9a-f]{64}")


class KeyRing:
    def __init__(self, digests: dict[str, str]):
        self._tenants = {d.lower(): t for d, t in digests.items()}

    @classmethod
    def from_file(cls, path: str | Path) -> KeyRing:
        """{"keys": {sha256-hex-of-key: tenant}}; ValueError names what is wrong (a list of keys had raised
        AttributeError; plain keys in place of digests loaded, and then every request was 401)."""
        data = json.loads(Path(path).read_text())
        keys = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(keys, dict) or not keys:
            raise ValueError('expected {"keys": {"<sha256 hex of a key>": "<tenant>", ...}} with at least one key')
        for n, (digest, tenant) in enumerate(keys.items(), 1):
            if not DIGEST.fullmatch(digest.lower()):  # never echoed: it may be a key in plain text
                raise ValueError(f"key {n} of {len(keys)} is not a sha256 hex digest (64 characters 0-9a-f): keys "
                                 "are given as their digest, never in plain text: printf %s KEY | sha256sum")
            if not isinstance(tenant, str) or not HEADER_TEXT.fullmatch(tenant):  # it travels in a header
                raise ValueError(f"key {n} of {len(keys)}: its tenant must be printable ASCII, not beginning or "
                                 "ending with a space (a line break in it wrote a header into upstream requests)")
            if tenant == NO_TENANT:  # the metrics' label of requests without a tenant: the two were one series
                raise ValueError(f"key {n} of {len(keys)}: the tenant {NO_TENANT!r} names requests without a tenant "
                                 "in the metrics; give the tenant another name")
        return cls(keys)

    def tenant(self, authorization: str | None) -> str:
        """The tenant of a `Bearer KEY` header, or a 401 the openai client reports as AuthenticationError."""
        if not authorization or not authorization.lower().startswith("bearer "):
            raise APIError(401, "missing API key: send Authorization: Bearer <key>", code="invalid_api_key")
        tenant = self._tenants.get(key_digest(authorization[7:].strip()))
        if tenant is None:
            raise APIError(401, "incorrect API key provided", code="invalid_api_key")
        return tenant


def write_key_file(path: Path, digests: dict[str, str]) -> None:
    """The router's key file (digest -> tenant), readable by the owner only."""
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"keys": digests}, f)
