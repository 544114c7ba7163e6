"""KV cache blocks: chained, tenant-salted block keys shared by engines and the router."""
