"""Backends from DNS: every address a name resolves to is one replica (a Kubernetes headless Service).

A ClusterIP Service would hide the replicas behind one virtual IP, and cache-aware routing needs to see
each replica: the router instead resolves the engines' headless Service (its A/AAAA records are the ready
pods' IPs) every `interval` seconds and replaces the backend set with `http://IP:PORT` for each address.
Replicas that stay keep their health, load and index state; a resolution that fails keeps the last set.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (IPv4 and IPv6), sorted, without duplicates."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


@dataclass(frozen=True)
class DnsBackends:
    """`HOST:PORT` (or `scheme://HOST:PORT`) of a name whose addresses are the replicas."""

    host: str
    port: int
    scheme: str = "http"

    @classmethod
    def parse(cls, value: str) -> DnsBackends:
        scheme, sep, rest = value.partition("://")
        if not sep:
            scheme, rest = "http", value
        host, colon, port = rest.rpartition(":")
        if scheme not in ("http", "https") or not colon or not host or not port.isdigit() \
                or not 0 < int(port) < 65536:
            raise ValueError(f"{value!r}: expected HOST:PORT or http(s)://HOST:PORT (e.g. "
                             "engines-pods.default.svc.cluster.local:8000)")
        return cls(host, int(port), scheme)

    def urls(self, resolver: Resolver = system_resolver) -> list[str]:
        out = []
        for address in resolver(self.host, self.port):
            shown = f"[{address}]" if ":" in address else address
            out.append(f"{self.scheme}://{shown}:{self.port}")
        return out
