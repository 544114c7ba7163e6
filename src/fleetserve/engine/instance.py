"""Which process answers a replica's port: the one its supervisor started last, proved in /health.

A replica that crashes frees its port, and any local process may bind it before the restart does. The supervisor
and the router had taken whatever answered /health 200 there for the replica: a squatter got client requests,
prompts and the fleet's internal token, and `status` read it as ready. An id echoed as is would not do either:
/health is open, so a squatter replays the body it read from the real replica. Each start gets a fresh random
secret in its environment (`FLEETSERVE_INSTANCE`: a process's environment is its owner's alone,
/proc/PID/environ); the supervisor and the router send a fresh challenge with each probe
(`x-fleetserve-challenge`), and the built-in engines answer HMAC(secret, challenge) in the body's `instance`.
Only the process started with the secret can; the supervisor counts the replica ready, and the router sends it
requests, only while it does.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from fleetserve.api.internal import same_secret

ENV = "FLEETSERVE_INSTANCE"
CHALLENGE_HEADER = "x-fleetserve-challenge"
MAX_CHALLENGE = 128


def new_instance_id() -> str:
    """A start's secret (given to the engine, the supervisor and the router; never in a /health body)."""
    return secrets.token_hex(16)


def new_challenge() -> str:
    return secrets.token_hex(12)


def proof(secret: str, challenge: str) -> str:
    return hmac.new(secret.encode(), challenge.encode(), hashlib.sha256).hexdigest()[:32]


def instance_field(challenge: str | None) -> dict[str, str]:
    """The /health body's `instance`: the proof for the probe's challenge (none without a secret or challenge)."""
    secret = os.environ.get(ENV)
    if not secret or not challenge or len(challenge) > MAX_CHALLENGE:
        return {}
    return {"instance": proof(secret, challenge)}


def answered_by(body: object, secret: str | None, challenge: str | None) -> bool:
    """Whether a /health body proves the expected start (any body when none is expected)."""
    if secret is None:
        return True
    answer = body.get("instance") if isinstance(body, dict) else None
    return isinstance(answer, str) and challenge is not None and same_secret(answer, proof(secret, challenge))
