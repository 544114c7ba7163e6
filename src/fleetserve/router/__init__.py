"""Gateway: routing policies, backend health, proxy."""
