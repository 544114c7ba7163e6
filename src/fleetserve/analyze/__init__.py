"""Prefix-reuse analysis of real prompt samples: will a KV cache pay, which tiers, which routing strategy."""
