"""The OpenAI-compatible HTTP surface shared by the engine and the router: errors, request parsing, streaming."""
