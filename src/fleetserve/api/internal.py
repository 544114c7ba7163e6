"""Trust between the gateway and its engines: a shared secret that the fleet generates.

Engines hear tenant identity from the router only. Without this, any local process could call an engine with
`x-fleetserve-tenant: alpha` and read alpha's cached prefixes, or wipe them through the admin API. The fleet
writes a random token to a 0600 file and hands its path (never the token) to the router and the engines. The
router sends it on every upstream request, as `x-fleetserve-internal` and as a bearer token; Prometheus sends
the bearer form. vLLM and SGLang get a key of their own instead (`router --engine-token-file`, see
`engine/adapters.py`), engines outside the fleet (`engine.kind: external`) nothing: the token also opens the
router's admin API and keys the tenant salts.

`EngineGuard` is the engine's front door (a pure ASGI middleware):
- with a token: everything but `/health` and `/ping` needs it (401 otherwise: the OpenAI API, the KV event
  feed, `/metrics`, the admin API);
- without a token (a standalone engine): the tenant header is dropped, so a client can never claim a
  tenant, and the admin API answers 403.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from fleetserve.api.browser import scope_post_refusal
from fleetserve.api.errors import APIError
from fleetserve.api.limits import RequestSizeLimit, SizeLimits, send_error
from fleetserve.api.request_id import RequestIdEcho

INTERNAL_HEADER = "x-fleetserve-internal"
TENANT_HEADER = "x-fleetserve-tenant"
HEADER_TEXT = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")  # a tenant as a header carries it, whole
NO_TENANT = "-"  # the tenant label of requests without one (no auth, or refused before their key was read)
OPEN_PATHS = frozenset({"/health", "/ping", "/openapi.json"})  # the contract is public, like /health


def write_token_file(path: Path) -> Path:
    """A fresh random token in a file only the owner can read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32))
    return path


def read_secret_file(path: str | Path) -> str:
    """A password another program set (Redis's AUTH), of any length: only an empty file is refused."""
    secret = Path(path).read_text().strip()
    if not secret:
        raise ValueError(f"{path} is empty")
    return secret


def read_token_file(path: str | Path) -> str:
    token = Path(path).read_text().strip()
    if len(token) < 16:
        raise ValueError(f"token file {path}: the token must be at least 16 characters")
    return token


def same_secret(given: str, expected: str) -> bool:
    """A constant-time comparison of a secret a client sent with ours, for any text it sends: `compare_digest` on
    strings refuses non-ASCII ones with a TypeError, and a header `Bearer é` on the public /health answered 500
    with a traceback in the log for each request."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def header_has_secret(value: str, secret: str) -> bool:
    """`same_secret` for a header value, which ASGI servers and Starlette decode as latin-1: compared as the bytes
    the client sent, against the secret in UTF-8 (httpx, curl) and in latin-1 (our router's upstream headers,
    Python's http.client), both compared in constant time."""
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:  # not from the wire (a mapping a caller built): its text as UTF-8
        raw = value.encode("utf-8", "surrogatepass")
    as_utf8 = hmac.compare_digest(raw, secret.encode("utf-8", "surrogatepass"))
    try:
        as_latin1 = hmac.compare_digest(raw, secret.encode("latin-1"))
    except UnicodeEncodeError:
        as_latin1 = False
    return as_utf8 or as_latin1


class InternalAuth:
    """Checks the internal token in a request's headers (constant-time)."""

    def __init__(self, token: str | None):
        self.token = token

    @property
    def enabled(self) -> bool:
        return bool(self.token)

    def headers(self) -> dict[str, str]:
        """What the router adds to each upstream request."""
        return {INTERNAL_HEADER: self.token, "authorization": f"Bearer {self.token}"} if self.token else {}

    def trusted(self, headers: list[tuple[bytes, bytes]] | Mapping[str, str]) -> bool:
        """`headers`: an ASGI scope's raw list, or any mapping (a dict, Starlette's Headers)."""
        if not self.token:
            return False
        items = headers.items() if isinstance(headers, Mapping) else (
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in headers)
        for key, value in items:
            key = key.lower()
            if key == INTERNAL_HEADER and header_has_secret(value, self.token):
                return True
            if key == "authorization" and value[:7].lower() == "bearer " and \
                    header_has_secret(value[7:].strip(), self.token):
                return True
        return False


class EngineGuard:
    def __init__(self, app, auth: InternalAuth):
        self.app = app
        self.auth = auth

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        if self.auth.enabled:
            if not self.auth.trusted(headers):
                await send_error(send, APIError(401, "this engine serves its fleet's router only: missing or wrong "
                                                f"{INTERNAL_HEADER} token", code="invalid_api_key"))
                return
            await self.app(scope, receive, send)
            return
        if path.startswith("/admin/"):
            await send_error(send, APIError(403, "engine admin API: start the engine with --internal-token-file "
                                                 f"and send the token in {INTERNAL_HEADER}", code="forbidden"))
            return
        # an engine on its own (no router in front, which refuses these): a web page could drive it on loopback
        if scope.get("method") == "POST" and (refused := scope_post_refusal(headers)) is not None:
            await send_error(send, refused)
            return
        untrusted = [(k, v) for k, v in headers if k.lower() not in (TENANT_HEADER.encode(), INTERNAL_HEADER.encode())]
        await self.app({**scope, "headers": untrusted}, receive, send)


def engine_front_door(app, limits: SizeLimits, auth: InternalAuth):
    """The engines' front door (built-in and simulated): size limits (every header counted, the request id's too:
    the echo in front of them had dropped a 1 MB id before they saw it), the request id's echo, then the internal
    token."""
    return RequestSizeLimit(RequestIdEcho(EngineGuard(app, auth)), limits)


def router_trust_args(engine_kind: str, tenants: bool) -> list[str]:
    """The router flags that fit its engines (local fleet and Kubernetes alike): engines outside the fleet never
    get the internal token, nor does an image run as given (`container`: what it logs is not ours to know); vLLM
    and SGLang ignore the tenant header, so tenants reach them as `cache_salt`."""
    if engine_kind in ("external", "container"):
        return ["--no-send-internal-token"]
    if engine_kind in ("vllm", "sglang") and tenants:
        return ["--tenant-cache-salt"]
    return []
