"""Tenants kept apart inside engines that separate their prefix caches only by `cache_salt` (vLLM, SGLang).

The built-in engine hears the tenant from the router (`x-fleetserve-tenant`, trusted with the internal token)
and salts its block keys itself. vLLM and SGLang ignore that header: their prefix caches are divided only by
the request's `cache_salt`. Without one, two tenants of an endpoint share cached prefixes, and a tenant can
tell whether another sent a prompt from `usage.prompt_tokens_details.cached_tokens` or from the time to
first token. So in front of these engines (`fleetserve router --tenant-cache-salt`) the router writes the
salt of every request it authenticated: an HMAC-SHA256, keyed with the fleet's internal token, of the tenant
and of any salt the client gave (`kvcache.blocks.kv_salt`, each in its own namespace). One tenant always gets
the same salt, on every router replica (they share the token), so its requests still share their cache; no
client can name or guess another tenant's salt; a client's own `cache_salt` divides its tenant's cache
further and never reaches another tenant's.
"""

from __future__ import annotations

import hashlib
import hmac

from fleetserve.api.errors import APIError
from fleetserve.api.protocol import GENERATION_PATHS, cache_salt_of
from fleetserve.kvcache.blocks import kv_salt
from fleetserve.router.rewrite import encoded, reencodable, spliced


class TenantSalt:
    def __init__(self, secret: str):
        if not secret:
            raise ValueError("tenant cache salts are keyed with the fleet's internal token; none was given")
        self._key = secret.encode("utf-8")

    def salt(self, tenant: str, client_salt: str | None = None) -> str:
        message = kv_salt(tenant, client_salt).encode("utf-8", errors="surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def salted(self, path: str, body: dict, raw: bytes, tenant: str | None) -> bytes | None:
        """The body to send instead of the client's, or None to send it unchanged (no tenant, another path).
        A `cache_salt` that is not a non-empty string is refused (400 naming it), as the engine would.

        Everything else goes out as the client wrote it: the field is spliced into the raw bytes, or a body that
        already has one is re-encoded exactly (router/rewrite.py)."""
        if not tenant or path not in GENERATION_PATHS:
            return None
        salt = self.salt(tenant, cache_salt_of(body))
        if "cache_salt" not in body:
            return spliced(raw, b'"cache_salt":"' + salt.encode() + b'"')
        out = reencodable(raw)
        if out is None:  # a value re-encoding would change (1e400): the engine refuses the body anyway
            raise APIError(400, "request body has a number outside the range of a double (such as 1e400); it "
                                "cannot be forwarded with the tenant's cache_salt", code="invalid_value")
        out["cache_salt"] = salt
        return encoded(out)
