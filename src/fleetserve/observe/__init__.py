"""Observability: the one metrics vocabulary (vocabulary.py; HyperPod's model_* names for invocations, vLLM's
names for engine state, fleetserve_* for the rest), the servers' collectors built from it (metrics.py),
docs/metrics.md generated from it (docs.py), and structured request logs (logs.py)."""
