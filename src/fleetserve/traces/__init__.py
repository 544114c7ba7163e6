"""Request traces: loaders for Mooncake JSONL, Azure CSV and our own prompt logs."""
