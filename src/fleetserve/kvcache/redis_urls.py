"""Which Redis server and database a URL reaches: one reading for the spec (a tenant's L2 is its own), the engine
(a tenant on the shared L2's server takes its password) and the supervisor (probing each tenant's L2)."""

from __future__ import annotations

import os
from urllib.parse import parse_qs, unquote, urlsplit

from fleetserve.kvcache.tiers import split_credentials

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"})  # one machine, several spellings


def redis_server(url: str) -> tuple:
    """("unix", socket path) or ("tcp", host, port): loopback names alike, the default port filled in."""
    parts = urlsplit(split_credentials(url)[0])
    if parts.scheme.lower() == "unix":
        return "unix", os.path.normpath(parts.path)
    host = (parts.hostname or "").lower()
    return "tcp", "loopback" if host in LOOPBACK_HOSTS else host, parts.port or 6379


def redis_database(url: str) -> tuple:
    """The server and the database number (`?db=`, else the path's, else 0, as redis-py reads them): two URLs
    alike here share data."""
    parts = urlsplit(split_credentials(url)[0])
    query_db = parse_qs(parts.query).get("db", [])
    path_db = "" if parts.scheme.lower() == "unix" else unquote(parts.path.strip("/"))
    return *redis_server(url), int(query_db[-1] if query_db else path_db or 0)


def same_server_password(url: str, l2_url: str | None, password: str | None) -> str | None:
    """A tenant's Redis on the shared L2's server (another logical database of it) takes the L2 password (the
    file's, or the one in the L2 URL), unless its URL gives its own: such a tenant had failed AUTH for ever.
    Another server is never sent it."""
    if not l2_url:
        return None
    _, _, own = split_credentials(url)
    password = password or split_credentials(l2_url)[2]
    if not password or own or urlsplit(url).scheme.lower() != urlsplit(l2_url).scheme.lower():
        return None
    return password if redis_server(url) == redis_server(l2_url) else None
