"""Kubernetes: `render(endpoint) -> objects` (pure, shared with the operator), by object family."""
