"""Which process answers a replica's port: the id its supervisor gave this start of it, echoed in /health.

A replica that crashes frees its port, and any local process may bind it before the restart does. The supervisor
and the router had taken whatever answered /health 200 there for the replica: a squatter got client requests,
prompts and the fleet's internal token, and `status` read it as ready. Each start now gets a fresh random id in
its environment (`FLEETSERVE_INSTANCE`: the process's own environment is its owner's alone, /proc/PID/environ),
the built-in engines put it in their /health body, and the supervisor counts the replica ready, and the router
sends it requests, only while the id it gave is the one answering.
"""

from __future__ import annotations

import os
import secrets

ENV = "FLEETSERVE_INSTANCE"


def new_instance_id() -> str:
    return secrets.token_hex(12)


def instance_field() -> dict[str, str]:
    """The /health body's `instance` (none for an engine started by hand)."""
    value = os.environ.get(ENV)
    return {"instance": value} if value else {}


def answered_by(body: object, expected: str | None) -> bool:
    """Whether a /health body is the expected instance's (any body when none is expected)."""
    return expected is None or (isinstance(body, dict) and body.get("instance") == expected)
