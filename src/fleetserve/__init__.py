"""fleetserve: an open, portable inference operations layer for LLMs."""

__version__ = "0.1.0"
