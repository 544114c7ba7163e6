"""Metric names and labels: vLLM's names for engine state, HyperPod's model_* names for invocations."""
