"""The queue of an engine that reports none in its health body, read from its Prometheus gauges (vLLM, SGLang).

A local fleet's autoscaler reads `waiting` from the router's /admin/load. The built-in engine puts its queue in
the /health body; vLLM and SGLang answer /health with an empty 200 and publish their queue only on /metrics
(`vllm:num_requests_waiting`, `sglang:num_queue_reqs`). Without this a local fleet in front of them scaled
on queue_depth saw only the requests queued in the router, where KEDA on Kubernetes (`k8s/keda.py`) and the
simulator read the engines' own gauge. With `fleetserve router --queue-metrics KIND` each successful health
probe starts a read of the gauge beside it (`BackendPool`), and /admin/load counts it as the replica's `waiting`.

The gauge feeds the autoscaler's signal only, not the routing score: the blind router of the simulator and the
router on Kubernetes get no queue from these engines, and a router that did here would route otherwise than
both (one policy, three places).
"""

from __future__ import annotations

import math

QUEUE_GAUGES = {  # engine kind -> (waiting gauge, running gauge)
    "vllm": ("vllm:num_requests_waiting", "vllm:num_requests_running"),
    "sglang": ("sglang:num_queue_reqs", "sglang:num_running_reqs"),
}


def gauge_sum(text: str, name: str) -> float | None:
    """The sum of every sample of gauge `name` in a Prometheus text exposition (vLLM has one per model and
    engine core), or None when the text has none. Lines are scanned for the name, not parsed whole: a vLLM
    /metrics page is mostly histograms, read every probe interval."""
    total, seen, start = 0.0, False, 0
    while (i := text.find(name, start)) >= 0:
        start = i + len(name)
        if i and text[i - 1] != "\n":
            continue  # inside a comment (# HELP, # TYPE) or another name's line
        end = text.find("\n", start)
        line = text[start:end if end >= 0 else len(text)]
        if line[:1] not in ("{", " ", "\t"):
            continue  # a longer name with this prefix
        value = line.rsplit("}", 1)[-1].split() if line[:1] == "{" else line.split()
        try:
            number = float(value[0])
        except (IndexError, ValueError):
            continue
        if math.isfinite(number):  # NaN or Inf is no queue length (int() of it ended the probing)
            total += number
            seen = True
    return total if seen else None


def read_queue(text: str, kind: str) -> tuple[int, int] | None:
    """(waiting, running) from an engine's /metrics text, or None when it has no waiting gauge."""
    waiting_name, running_name = QUEUE_GAUGES[kind]
    waiting = gauge_sum(text, waiting_name)
    if waiting is None:
        return None
    running = gauge_sum(text, running_name)
    return int(waiting), int(running or 0)
