"""Benchmarks: real processes, figures as JSON, ratios measured side by side in one run."""
