"""Why no replica can start now: the fleet supervisor tells the router, and the simulator refuses alike.

While a fleet serves nothing, the router holds requests for the replica on its way (scale from zero). When
none can come, a held request would wait out the buffer timeout (10 minutes by default) for a 503 naming
nothing; the fleet's reason lets the router answer 503 `replicas_failing` at once (`router/gate.py`). One
rule, two places: the supervisor and the simulator ask `why_failing` (the simulator had held every request of
a `replicas: 0` fleet for the buffer timeout where the live one refused at once).
"""

from __future__ import annotations

STATIC_ZERO = "spec.replicas is 0 and the fleet has no autoscaling: no replica starts (set replicas, or autoscaling)"
UNPLACED = "cannot place a replica"  # the start of the reason a launch that found no capacity leaves
# what clients hear of a crash loop: the replica's own error (a log line: model paths, a traceback's words) is the
# operator's, in `status` and the logs; the API's clients are tenants, and it had reached them in every 503
CRASH_LOOP = "every replica fails to start (the fleet's status and its replica logs say why)"


def unplaced(reason: str) -> str:
    """The fleet's error after a launch that found no capacity: `why_failing` reads it."""
    return f"{UNPLACED}: {reason}"


def why_failing(desired: int, autoscaled: bool, external: bool, serving: bool, on_the_way: bool, error: str,
                crash_looping: bool = False) -> str | None:
    """The reason no replica can start now, or None while one may.

    `desired`: replicas the fleet wants; `autoscaled`: something can raise it; `external`: the engines are not
    ours to start; `serving`: a replica takes requests; `on_the_way`: one is pending or starting; `error`: the
    fleet's last error (`unplaced(...)` after a launch found no capacity, cleared when one is placed);
    `crash_looping`: a replica failed to start twice in a row. The reason goes to the API's clients: it names the
    cause (a static zero, no capacity) but never a replica's own error."""
    if desired == 0 and not autoscaled and not external:
        return STATIC_ZERO  # nothing wakes it
    if desired == 0 or serving:
        return None
    if error.startswith(UNPLACED) and not on_the_way:
        return error  # nothing on its way: the held requests get the reason now
    if crash_looping:
        return CRASH_LOOP
    return None
