"""Minimal proxies of the gateway's per-request work on candidate HTTP stacks (`bench router-stacks`).

Each reads the body, parses it with the stdlib json, picks the least-loaded of its backends by an in-flight
counter, forwards with a pooled keep-alive client and relays the answer; nothing else, so the stacks differ
only in their server and client.
"""
