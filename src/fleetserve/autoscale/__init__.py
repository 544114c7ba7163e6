"""Autoscaling: the pure KEDA/HPA policy, time-of-day floors, and the local controller."""
