"""Simulation: engine performance models (used by the simulated engine and, later, the fleet simulator)."""
